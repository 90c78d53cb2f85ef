/*-------------------------------------------------------------------------
 *
 * stats.h
 *	  Shared-memory counters of the idempotency extension.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_STATS_H
#define IDEM_STATS_H

/* What is counted, per endpoint and in total. */
typedef enum IdemCounter
{
	IDEM_COUNT_CLAIMS,			/* every idem_claim that got past validation */
	IDEM_COUNT_EXECUTES,		/* action execute */
	IDEM_COUNT_REPLAYS,			/* action replay */
	IDEM_COUNT_IN_PROGRESS,		/* action in_progress (409) */
	IDEM_COUNT_MISMATCHES,		/* action mismatch (422) */
	IDEM_COUNT_PENDING,			/* action pending (409) */
	IDEM_COUNT_FINISHES,		/* idem_finish */
	IDEM_COUNT_RELEASES,		/* idem_release */
	IDEM_COUNT_FAILS,			/* idem_fail */
	IDEM_COUNT_INVALID_KEYS,	/* a claim refused for a malformed key (400) */
	IDEM_COUNT_LEASES_EXPIRED,	/* stale lease seen by maintenance */
	IDEM_COUNT_RESOLVED,		/* idem_resolve, or a resolver's answer */
	IDEM_COUNT_DIAGNOSED,		/* a mismatch that named what differs */
	IDEM_COUNT_TOMBSTONE_HITS,	/* a claim without a live row met an expired
								 * key of its scope (row or tombstone) */
	IDEM_COUNT_DIAGNOSES_WITHHELD,	/* a mismatch that could have named what
									 * differs, answered without names (the
									 * key's bound, diag_bound.c) */
	IDEM_COUNT_NUM
} IdemCounter;

/*
 * With shared_preload_libraries: its shared memory, requested and set up by
 * the extension's one request hook and one startup hook (shmem.c).
 */
extern void IdemStatsShmemRequest(void);
extern void IdemStatsShmemStartup(void);

/*
 * Count one event.  endpoint may be NULL (then only the total moves).  A
 * no-op when the library is not preloaded.  Never raises an error.
 */
extern void IdemStatsCount(const char *endpoint, IdemCounter counter);

#endif							/* IDEM_STATS_H */
