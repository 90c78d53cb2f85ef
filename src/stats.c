/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Shared-memory counters of the idempotency extension, allocated when
 *	  the library is preloaded, and the SQL functions that read and reset
 *	  them.
 *
 *	  The totals and one entry per endpoint live in shared memory; entries
 *	  are kept in a shared hash table of at most
 *	  idempotency.stats_max_endpoints entries.  Counters are atomics,
 *	  incremented while holding the lock in shared mode, so that counting
 *	  in many backends at once never loses an increment; reading and
 *	  resetting take the lock exclusively, so that a reader sees the totals
 *	  and the entries of one same moment.  Events of endpoints that find
 *	  the table full are counted in the totals and in a separate
 *	  "untracked" entry.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "guc.h"
#include "idempotency.h"
#include "stats.h"

#define IDEM_STATS_TRANCHE	"idempotency_stats"

/* hash key: an endpoint name, zero-padded */
#define IDEM_STATS_KEY_LEN	(IDEM_SCOPE_MAX_LEN + 1)

typedef struct IdemStatsEntry
{
	char		endpoint[IDEM_STATS_KEY_LEN];	/* hash key, must be first */
	pg_atomic_uint64 counters[IDEM_COUNT_NUM];
} IdemStatsEntry;

typedef struct IdemStatsShared
{
	LWLock	   *lock;			/* see the head comment */
	TimestampTz reset_time;		/* when the counters were last reset */
	pg_atomic_uint64 total[IDEM_COUNT_NUM];
	pg_atomic_uint64 untracked[IDEM_COUNT_NUM];
} IdemStatsShared;

static IdemStatsShared *idem_shared = NULL;
static HTAB *idem_stats_hash = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static Size
IdemStatsShmemSize(void)
{
	return add_size(MAXALIGN(sizeof(IdemStatsShared)),
					hash_estimate_size(idem_stats_max_endpoints,
									   sizeof(IdemStatsEntry)));
}

static void
IdemStatsShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(IdemStatsShmemSize());
	RequestNamedLWLockTranche(IDEM_STATS_TRANCHE, 1);
}

static void
IdemStatsShmemStartup(void)
{
	bool		found;
	HASHCTL		info;
	int			i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	idem_shared = ShmemInitStruct("idempotency stats", sizeof(IdemStatsShared),
								 &found);
	if (!found)
	{
		idem_shared->lock = &(GetNamedLWLockTranche(IDEM_STATS_TRANCHE))->lock;
		idem_shared->reset_time = GetCurrentTimestamp();
		for (i = 0; i < IDEM_COUNT_NUM; i++)
		{
			pg_atomic_init_u64(&idem_shared->total[i], 0);
			pg_atomic_init_u64(&idem_shared->untracked[i], 0);
		}
	}

	info.keysize = IDEM_STATS_KEY_LEN;
	info.entrysize = sizeof(IdemStatsEntry);
	idem_stats_hash = ShmemInitHash("idempotency stats by endpoint",
									idem_stats_max_endpoints,
									idem_stats_max_endpoints,
									&info,
									HASH_ELEM | HASH_STRINGS | HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

void
IdemStatsInit(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = IdemStatsShmemRequest;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = IdemStatsShmemStartup;
}

/* Fail clearly where the counters do not exist. */
static void
IdemStatsRequire(const char *feature)
{
	IdemRequirePreload(feature);
	if (idem_shared == NULL || idem_stats_hash == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency statistics are not available in this process")));
}

/* the zero-padded hash key of an endpoint; false when it is too long */
static bool
IdemStatsKey(const char *endpoint, char key[IDEM_STATS_KEY_LEN])
{
	size_t		len = strlen(endpoint);

	if (len == 0 || len > IDEM_SCOPE_MAX_LEN)
		return false;
	memset(key, 0, IDEM_STATS_KEY_LEN);
	memcpy(key, endpoint, len);
	return true;
}

/*
 * Count one event.  The shared lock keeps a reset or a reader out while the
 * entry and the total move together; concurrent counters use atomics.  A
 * missing entry is added under the exclusive lock, when there is room.
 */
void
IdemStatsCount(const char *endpoint, IdemCounter counter)
{
	char		key[IDEM_STATS_KEY_LEN];
	IdemStatsEntry *entry = NULL;
	bool		keyed;

	if (idem_shared == NULL || idem_stats_hash == NULL ||
		counter < 0 || counter >= IDEM_COUNT_NUM)
		return;

	keyed = endpoint != NULL && IdemStatsKey(endpoint, key);

	LWLockAcquire(idem_shared->lock, LW_SHARED);
	if (keyed)
		entry = hash_search(idem_stats_hash, key, HASH_FIND, NULL);
	if (entry == NULL && keyed)
	{
		bool		found;

		LWLockRelease(idem_shared->lock);
		LWLockAcquire(idem_shared->lock, LW_EXCLUSIVE);
		/* HASH_ENTER_NULL: NULL instead of an error when the table is full */
		entry = hash_search(idem_stats_hash, key, HASH_ENTER_NULL, &found);
		if (entry != NULL && !found)
		{
			int			i;

			for (i = 0; i < IDEM_COUNT_NUM; i++)
				pg_atomic_init_u64(&entry->counters[i], 0);
		}
	}
	if (entry != NULL)
		pg_atomic_fetch_add_u64(&entry->counters[counter], 1);
	else if (endpoint != NULL)
		pg_atomic_fetch_add_u64(&idem_shared->untracked[counter], 1);
	pg_atomic_fetch_add_u64(&idem_shared->total[counter], 1);
	LWLockRelease(idem_shared->lock);
}

static void
IdemStatsPutRow(Tuplestorestate *store, TupleDesc desc, const char *endpoint,
				bool untracked, pg_atomic_uint64 *counters, TimestampTz reset)
{
	Datum		values[IDEM_COUNT_NUM + 3];
	bool		nulls[IDEM_COUNT_NUM + 3];
	int			ncounters = desc->natts - 3;	/* fewer under an older schema */
	int			i;

	memset(nulls, 0, sizeof(nulls));
	if (endpoint != NULL)
		values[0] = CStringGetTextDatum(endpoint);
	else
		nulls[0] = true;
	values[1] = BoolGetDatum(untracked);
	for (i = 0; i < ncounters; i++)
		values[i + 2] = Int64GetDatum((int64) pg_atomic_read_u64(&counters[i]));
	values[ncounters + 2] = TimestampTzGetDatum(reset);
	tuplestore_putvalues(store, desc, values, nulls);
}

PG_FUNCTION_INFO_V1(idem_stats);

/*
 * idem_stats(missing_ok boolean DEFAULT false) RETURNS SETOF record
 *		One row per endpoint counted, one row (endpoint NULL, untracked true)
 *		for the endpoints that found the table full, when there are any, and
 *		one row of totals (endpoint NULL, untracked false).  Without the
 *		library preloaded: an error, or no rows when missing_ok.
 */
Datum
idem_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool		missing_ok = !PG_ARGISNULL(0) && PG_GETARG_BOOL(0);
	HASH_SEQ_STATUS seq;
	IdemStatsEntry *entry;
	bool		any_untracked = false;
	int			i;

	if (missing_ok && (!IdemPreloaded || idem_shared == NULL))
	{
		InitMaterializedSRF(fcinfo, 0);
		return (Datum) 0;
	}
	IdemStatsRequire("idem_stats()");
	InitMaterializedSRF(fcinfo, 0);
	/*
	 * older declarations lack the last counters: 0.3.0's diagnoses_withheld,
	 * 0.2.0's also diagnosed and tombstone_hits
	 */
	if (rsinfo->setDesc->natts != IDEM_COUNT_NUM + 3 &&
		rsinfo->setDesc->natts != IDEM_COUNT_NUM + 2 &&
		rsinfo->setDesc->natts != IDEM_COUNT_NUM)
		elog(ERROR, "idem_stats() is declared with %d columns, expected %d",
			 rsinfo->setDesc->natts, IDEM_COUNT_NUM + 3);

	/*
	 * Exclusively, so that the rows are of one same moment.  An error in
	 * between releases the lock with the transaction's abort.
	 */
	LWLockAcquire(idem_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, idem_stats_hash);
	while ((entry = hash_seq_search(&seq)) != NULL)
		IdemStatsPutRow(rsinfo->setResult, rsinfo->setDesc, entry->endpoint,
						false, entry->counters, idem_shared->reset_time);
	for (i = 0; i < IDEM_COUNT_NUM; i++)
		if (pg_atomic_read_u64(&idem_shared->untracked[i]) != 0)
			any_untracked = true;
	if (any_untracked)
		IdemStatsPutRow(rsinfo->setResult, rsinfo->setDesc, NULL, true,
						idem_shared->untracked, idem_shared->reset_time);
	IdemStatsPutRow(rsinfo->setResult, rsinfo->setDesc, NULL, false,
					idem_shared->total, idem_shared->reset_time);
	LWLockRelease(idem_shared->lock);

	return (Datum) 0;
}

PG_FUNCTION_INFO_V1(idem_stats_reset);

/*
 * idem_stats_reset() RETURNS timestamptz
 *		Zero every counter and forget every endpoint; returns the new reset
 *		time.
 */
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	TimestampTz now = GetCurrentTimestamp();
	HASH_SEQ_STATUS seq;
	IdemStatsEntry *entry;
	int			i;

	IdemStatsRequire("idem_stats_reset()");

	LWLockAcquire(idem_shared->lock, LW_EXCLUSIVE);
	/* removing the entry just returned is allowed during a scan */
	hash_seq_init(&seq, idem_stats_hash);
	while ((entry = hash_seq_search(&seq)) != NULL)
		hash_search(idem_stats_hash, entry->endpoint, HASH_REMOVE, NULL);
	for (i = 0; i < IDEM_COUNT_NUM; i++)
	{
		pg_atomic_write_u64(&idem_shared->total[i], 0);
		pg_atomic_write_u64(&idem_shared->untracked[i], 0);
	}
	idem_shared->reset_time = now;
	LWLockRelease(idem_shared->lock);

	PG_RETURN_TIMESTAMPTZ(now);
}
