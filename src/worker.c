/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The maintenance background worker.
 *
 *	  A launcher, registered when the library is preloaded, connects to no
 *	  database (it reads the shared catalog pg_database) and, every
 *	  idempotency.maintenance_interval, starts one short-lived worker per
 *	  connectable database, one after the other.  Each worker connects,
 *	  leaves at once when the database has no idempotency extension, runs
 *	  one maintenance pass in short transactions, and exits.  Keeping the
 *	  per-database workers short-lived is what keeps DROP DATABASE (which
 *	  waits a few seconds for other sessions to leave) from failing.
 *
 *	  Nothing runs on a standby (the launcher starts once recovery has
 *	  finished) or in binary upgrade; idempotency.enable_worker = off stops
 *	  the passes.  SIGHUP reloads the settings, SIGTERM stops at once, and
 *	  the postmaster restarts the launcher after a crash.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "guc.h"
#include "maintenance.h"
#include "worker.h"

/* seconds before the postmaster restarts a launcher that died */
#define IDEM_LAUNCHER_RESTART_SECS	5

/* What the launcher and the per-database workers have in common. */
static void
IdemFillWorker(BackgroundWorker *worker, const char *function,
			   const char *type, int restart_time)
{
	memset(worker, 0, sizeof(*worker));
	worker->bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker->bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker->bgw_restart_time = restart_time;
	snprintf(worker->bgw_library_name, BGW_MAXLEN, "idempotency");
	snprintf(worker->bgw_function_name, BGW_MAXLEN, "%s", function);
	snprintf(worker->bgw_type, BGW_MAXLEN, "%s", type);
}

void
IdemWorkerInit(void)
{
	BackgroundWorker worker;

	if (!process_shared_preload_libraries_in_progress || IsBinaryUpgrade)
		return;

	IdemFillWorker(&worker, "IdemLauncherMain", "idempotency maintenance launcher",
				   IDEM_LAUNCHER_RESTART_SECS);
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency maintenance launcher");
	RegisterBackgroundWorker(&worker);
}

static void
ReloadIfAsked(void)
{
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
	}
}

/* The connectable databases that are not templates. */
static List *
ConnectableDatabases(MemoryContext cxt)
{
	List	   *result = NIL;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (HeapTupleIsValid(tup = heap_getnext(scan, ForwardScanDirection)))
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);
		MemoryContext old;

		/*
		 * Templates are left alone: a session in one would make CREATE
		 * DATABASE fail.  -2 in datconnlimit marks a database whose DROP
		 * was interrupted.
		 */
		if (!db->datallowconn || db->datistemplate || db->datconnlimit == -2)
			continue;
		old = MemoryContextSwitchTo(cxt);
		result = lappend_oid(result, db->oid);
		MemoryContextSwitchTo(old);
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return result;
}

/*
 * Start the worker of one database and wait until it has exited.  Returns
 * false when no worker could be started (no free slot).
 */
static bool
RunDatabaseWorker(Oid dboid)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	pid_t		pid;

	IdemFillWorker(&worker, "IdemDatabaseWorkerMain", "idempotency maintenance worker",
				   BGW_NEVER_RESTART);
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency maintenance worker %u", dboid);
	worker.bgw_main_arg = ObjectIdGetDatum(dboid);
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		return false;

	for (;;)
	{
		BgwHandleStatus status = GetBackgroundWorkerPid(handle, &pid);

		if (status == BGWH_STOPPED)
			break;
		if (status == BGWH_POSTMASTER_DIED)
			proc_exit(1);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 1000L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		ReloadIfAsked();
	}
	pfree(handle);
	return true;
}

static void
LaunchRound(void)
{
	MemoryContext cxt = AllocSetContextCreate(TopMemoryContext,
											  "idempotency launcher round",
											  ALLOCSET_DEFAULT_SIZES);
	List	   *dbs = ConnectableDatabases(cxt);
	ListCell   *lc;

	foreach(lc, dbs)
	{
		CHECK_FOR_INTERRUPTS();
		ReloadIfAsked();
		if (!idem_enable_worker)
			break;
		if (!RunDatabaseWorker(lfirst_oid(lc)))
		{
			ereport(LOG,
					(errmsg("idempotency maintenance could not start a worker: no free background worker slot"),
					 errhint("Raise max_worker_processes; the next round tries again.")));
			break;
		}
	}
	MemoryContextDelete(cxt);
}

void
IdemLauncherMain(Datum main_arg)
{
	TimestampTz last_round = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/* shared catalogs only */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	ereport(LOG, (errmsg("idempotency maintenance launcher started")));

	for (;;)
	{
		TimestampTz now;
		TimestampTz next;
		long		timeout;

		CHECK_FOR_INTERRUPTS();
		ReloadIfAsked();

		now = GetCurrentTimestamp();
		next = TimestampTzPlusMilliseconds(last_round,
										   (int64) idem_maintenance_interval * 1000);
		if (last_round == 0 || now >= next)
		{
			last_round = now;
			if (idem_enable_worker && !RecoveryInProgress())
				LaunchRound();
			continue;
		}

		timeout = (long) ((next - now) / 1000) + 1;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 timeout, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* Log each action of the worker's pass. */
static void
LogAction(void *arg, const char *kind, const char *object, int64 rows)
{
	if (strcmp(kind, "busy") == 0)
	{
		ereport(DEBUG1,
				(errmsg("idempotency maintenance: another pass is running in database \"%s\"",
						get_database_name(MyDatabaseId))));
		return;
	}
	if (rows >= 0)
		ereport(LOG,
				(errmsg("idempotency maintenance: %s %s (%lld rows)",
						kind, object ? object : "-", (long long) rows)));
	else
		ereport(LOG,
				(errmsg("idempotency maintenance: %s %s",
						kind, object ? object : "-")));
}

void
IdemDatabaseWorkerMain(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);
	Oid			extowner = InvalidOid;
	Oid			save_userid;
	int			save_sec_context;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/* fails (FATAL) when the database was dropped meanwhile */
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);

	if (!idem_enable_worker || RecoveryInProgress())
		proc_exit(0);

	/* a database without the extension has nothing to do */
	StartTransactionCommand();
	if (OidIsValid(get_extension_oid("idempotency", true)))
	{
		Relation	rel = table_open(ExtensionRelationId, AccessShareLock);
		TableScanDesc scan = table_beginscan_catalog(rel, 0, NULL);
		HeapTuple	tup;

		while (HeapTupleIsValid(tup = heap_getnext(scan, ForwardScanDirection)))
		{
			Form_pg_extension ext = (Form_pg_extension) GETSTRUCT(tup);

			if (strcmp(NameStr(ext->extname), "idempotency") == 0)
				extowner = ext->extowner;
		}
		table_endscan(scan);
		table_close(rel, AccessShareLock);
	}
	CommitTransactionCommand();
	if (!OidIsValid(extowner))
		proc_exit(0);

	pgstat_report_activity(STATE_RUNNING, "idempotency maintenance pass");

	/* act as the extension's owner, as idem_maintenance() does */
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(extowner, save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	(void) IdemMaintenancePass(GetCurrentTimestamp(), true, LogAction, NULL);
	SetUserIdAndSecContext(save_userid, save_sec_context);

	pgstat_report_activity(STATE_IDLE, NULL);
	proc_exit(0);
}
