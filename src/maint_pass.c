/*-------------------------------------------------------------------------
 *
 * maint_pass.c
 *	  What every step of a maintenance pass shares: the begin and end of a
 *	  step (a transaction of its own for the background worker, SPI, and the
 *	  settings every step runs with), and the report of an action to the
 *	  pass's receiver (idem_maintenance()'s rows, the worker's log lines).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/spi.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"

#include "maint_pass.h"

/* DDL waits at most this long for its lock, then the step is skipped */
#define IDEM_MAINT_LOCK_TIMEOUT_MS	"100"

/* The one place where a kind of action gets the name SQL and logs show. */
static const char *const maint_kind_names[] = {
	[IDEM_MAINT_BUSY] = "busy",
	[IDEM_MAINT_SKIPPED] = "skipped",
	[IDEM_MAINT_CREATE] = "create",
	[IDEM_MAINT_DROP] = "drop",
	[IDEM_MAINT_TOMBSTONE] = "tombstone",
	[IDEM_MAINT_PURGE] = "purge",
	[IDEM_MAINT_LEASE_RESOLVE] = "lease_resolve",
	[IDEM_MAINT_LEASE_UNKNOWN] = "lease_unknown",
	[IDEM_MAINT_LEASE_COMPLETED] = "lease_completed",
	[IDEM_MAINT_LEASE_FAILED] = "lease_failed",
	[IDEM_MAINT_RESOLVER_ERROR] = "resolver_error",
};

StaticAssertDecl(lengthof(maint_kind_names) == IDEM_MAINT_NUM_KINDS,
				 "every kind of maintenance action has a name");

const char *
IdemMaintKindName(IdemMaintKind kind)
{
	if ((int) kind < 0 || kind >= IDEM_MAINT_NUM_KINDS)
		elog(ERROR, "unknown kind of maintenance action: %d", (int) kind);
	return maint_kind_names[kind];
}

void
IdemMaintStepBegin(IdemMaintPass *p)
{
	if (p->own_xacts)
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
	}
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	p->guc_nest = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp",
							 PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("lock_timeout", IDEM_MAINT_LOCK_TIMEOUT_MS,
							 PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
}

void
IdemMaintStepEnd(IdemMaintPass *p)
{
	AtEOXact_GUC(true, p->guc_nest);
	SPI_finish();
	if (p->own_xacts)
	{
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
}

void
IdemMaintReport(IdemMaintPass *p, IdemMaintKind kind, const char *object,
				int64 rows)
{
	p->emit(p->arg, kind, object, rows);
}
