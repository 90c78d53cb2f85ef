/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Shared-memory counters of the idempotency extension, allocated when
 *	  the library is preloaded, and the SQL functions that read and reset
 *	  them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"

#include "idempotency.h"
#include "stats.h"

#define IDEM_STATS_TRANCHE	"idempotency_stats"

typedef struct IdemStatsShared
{
	LWLock	   *lock;			/* protects reset_time */
	TimestampTz reset_time;		/* when the counters were last reset */
} IdemStatsShared;

static IdemStatsShared *idem_stats = NULL;

#if PG_VERSION_NUM >= 150000
static shmem_request_hook_type prev_shmem_request_hook = NULL;
#endif
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static Size
IdemStatsShmemSize(void)
{
	return MAXALIGN(sizeof(IdemStatsShared));
}

static void
IdemStatsShmemRequest(void)
{
#if PG_VERSION_NUM >= 150000
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
#endif
	RequestAddinShmemSpace(IdemStatsShmemSize());
	RequestNamedLWLockTranche(IDEM_STATS_TRANCHE, 1);
}

static void
IdemStatsShmemStartup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	idem_stats = ShmemInitStruct("idempotency stats", IdemStatsShmemSize(), &found);
	if (!found)
	{
		idem_stats->lock = &(GetNamedLWLockTranche(IDEM_STATS_TRANCHE))->lock;
		idem_stats->reset_time = GetCurrentTimestamp();
	}
	LWLockRelease(AddinShmemInitLock);
}

void
IdemStatsInit(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;

#if PG_VERSION_NUM >= 150000
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = IdemStatsShmemRequest;
#else
	IdemStatsShmemRequest();
#endif
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = IdemStatsShmemStartup;
}

/* Fail clearly where the counters do not exist. */
static void
IdemStatsRequire(void)
{
	IdemRequirePreload("idem_stats_reset()");
	if (idem_stats == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency statistics are not available in this process")));
}

/*
 * Count one event.  Per-endpoint counters are not kept yet: this is the
 * interface that claim.c and maintenance call.
 */
void
IdemStatsCount(const char *endpoint, IdemCounter counter)
{
	(void) endpoint;
	(void) counter;
}

PG_FUNCTION_INFO_V1(idem_stats_reset);

/*
 * idem_stats_reset() RETURNS timestamptz
 *		Zero every counter; returns the new reset time.
 */
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	TimestampTz now = GetCurrentTimestamp();

	IdemStatsRequire();

	LWLockAcquire(idem_stats->lock, LW_EXCLUSIVE);
	idem_stats->reset_time = now;
	LWLockRelease(idem_stats->lock);

	PG_RETURN_TIMESTAMPTZ(now);
}
