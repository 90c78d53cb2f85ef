/*-------------------------------------------------------------------------
 *
 * diag_bound.c
 *	  The bound on what mismatch answers teach.  A client holding a key can
 *	  claim it again and again with guessed requests and read from each
 *	  mismatch answer whether one member is still reported as changed: a
 *	  4-digit member falls in a few thousand claims.  So each key gets at
 *	  most idempotency.diagnostics_max_mismatches diagnosed mismatches;
 *	  later ones are answered without member names (mismatch NULL),
 *	  counted (stats: diagnoses_withheld), and the first of them is
 *	  logged, with the key's hash, never the key.
 *
 *	  The counts live in shared memory, not in the key's row: a mismatch
 *	  answer writes nothing (in atomic mode it happens outside any
 *	  business write, and a client could roll its transaction back to
 *	  undo a count kept in a row), and counting never touches a row that
 *	  another session may be finishing.  One entry per key that had a
 *	  diagnosed mismatch, found by idem_key_hash of its scope, remembers
 *	  the stored row's created_at (a new row of the key, after an expiry
 *	  or a release, is another stored request and starts at 0) and its
 *	  expires_at (an entry of an expired key makes room for another).
 *	  The table holds idempotency.diagnostics_tracked_keys entries; when
 *	  it is full of live keys, a mismatch of a key not in it is answered
 *	  without names: the bound fails closed.  Counts start again at 0 when
 *	  the server restarts, and are kept per server.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"

#include "compat.h"
#include "diag_bound.h"
#include "guc.h"
#include "idempotency.h"
#include "keygen.h"
#include "stats.h"

#define IDEM_DIAG_BOUND_TRANCHE	"idempotency_diag_bound"

typedef struct DiagBoundEntry
{
	char		key_hash[IDEM_KEY_HASH_LEN + 1];	/* hash key, must be first */
	TimestampTz created_at;		/* of the stored row counted */
	TimestampTz expires_at;
	int32		diagnosed;		/* mismatches of it that were diagnosed */
	bool		logged;			/* the bound's log line was written */
} DiagBoundEntry;

static LWLock *diag_bound_lock = NULL;
static HTAB *diag_bound_hash = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
IdemDiagBoundShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(hash_estimate_size(idem_diagnostics_tracked_keys,
											  sizeof(DiagBoundEntry)));
	RequestNamedLWLockTranche(IDEM_DIAG_BOUND_TRANCHE, 1);
}

static void
IdemDiagBoundShmemStartup(void)
{
	HASHCTL		info;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	diag_bound_lock = &(GetNamedLWLockTranche(IDEM_DIAG_BOUND_TRANCHE))->lock;
	info.keysize = IDEM_KEY_HASH_LEN + 1;
	info.entrysize = sizeof(DiagBoundEntry);
	diag_bound_hash = ShmemInitHash("idempotency diagnosed mismatches by key",
									idem_diagnostics_tracked_keys,
									idem_diagnostics_tracked_keys,
									&info,
									HASH_ELEM | HASH_STRINGS | HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

void
IdemDiagBoundInit(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = IdemDiagBoundShmemRequest;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = IdemDiagBoundShmemStartup;
}

/* Remove the entries of keys expired at now; how many. */
static int
IdemDiagBoundEvict(TimestampTz now)
{
	HASH_SEQ_STATUS seq;
	DiagBoundEntry *e;
	int			n = 0;

	/* removing the entry just returned is allowed during a scan */
	hash_seq_init(&seq, diag_bound_hash);
	while ((e = hash_seq_search(&seq)) != NULL)
		if (e->expires_at <= now)
		{
			(void) hash_search(diag_bound_hash, e->key_hash, HASH_REMOVE, NULL);
			n++;
		}
	return n;
}

bool
IdemDiagBoundAllow(const IdemScope *scope, TimestampTz created_at,
				   TimestampTz expires_at, TimestampTz now)
{
	char		key_hash[IDEM_KEY_HASH_LEN + 1];
	DiagBoundEntry *e;
	bool		found;
	bool		allow;
	bool		log_it = false;
	int			diagnosed = 0;

	if (idem_diagnostics_max_mismatches > 0 &&
		diag_bound_hash != NULL && diag_bound_lock != NULL)
	{
		IdemKeyHash(VARDATA_ANY(scope->tenant), VARSIZE_ANY_EXHDR(scope->tenant),
					VARDATA_ANY(scope->endpoint), VARSIZE_ANY_EXHDR(scope->endpoint),
					VARDATA_ANY(scope->key), VARSIZE_ANY_EXHDR(scope->key),
					key_hash);

		LWLockAcquire(diag_bound_lock, LW_EXCLUSIVE);
		/* HASH_ENTER_NULL: NULL instead of an error when the table is full */
		e = hash_search(diag_bound_hash, key_hash, HASH_ENTER_NULL, &found);
		if (e == NULL && IdemDiagBoundEvict(now) > 0)
			e = hash_search(diag_bound_hash, key_hash, HASH_ENTER_NULL, &found);
		if (e == NULL)
			allow = false;		/* full of live keys: fail closed */
		else
		{
			if (!found || e->created_at != created_at)
			{
				/* a stored request not counted yet */
				e->created_at = created_at;
				e->diagnosed = 0;
				e->logged = false;
			}
			e->expires_at = expires_at;
			allow = e->diagnosed < idem_diagnostics_max_mismatches;
			if (allow)
				e->diagnosed++;
			else if (!e->logged)
			{
				e->logged = true;
				log_it = true;
				diagnosed = e->diagnosed;
			}
		}
		LWLockRelease(diag_bound_lock);
	}
	else
		allow = false;

	if (!allow)
		IdemStatsCount(scope->endpoint_str, IDEM_COUNT_DIAGNOSES_WITHHELD);
	if (log_it)
		ereport(LOG,
				(errmsg("idempotency mismatch diagnostics withheld: tenant \"%s\", endpoint \"%s\", key hash %s",
						text_to_cstring(scope->tenant), scope->endpoint_str, key_hash),
				 errdetail_plural("The stored request of the key was compared in %d diagnosed mismatch, the most idempotency.diagnostics_max_mismatches allows; its later mismatches are answered without member names.",
								  "The stored request of the key was compared in %d diagnosed mismatches, the most idempotency.diagnostics_max_mismatches allows; its later mismatches are answered without member names.",
								  diagnosed, diagnosed)));
	return allow;
}
