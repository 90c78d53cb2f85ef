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
 *	  The launcher only ever sleeps on its latch: until the next round, or
 *	  until the postmaster reports that the worker of the current database
 *	  has exited (WaitForBackgroundWorkerShutdown).  When no worker slot is
 *	  free it warns once and waits for the next round.  A launcher that
 *	  cannot be registered at all (every slot taken at server start) is
 *	  warned about here, since PostgreSQL's own line does not say whose
 *	  worker it refused.
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
#include "postmaster/bgworker_internals.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "guc.h"
#include "maint.h"
#include "util.h"
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
	int			registered;

	if (!process_shared_preload_libraries_in_progress || IsBinaryUpgrade)
		return;

	IdemFillWorker(&worker, "IdemLauncherMain", "idempotency maintenance launcher",
				   IDEM_LAUNCHER_RESTART_SECS);
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency maintenance launcher");
	registered = IdemRegisteredBgWorkers();
	RegisterBackgroundWorker(&worker);
	/* refused, with a LOG line that does not name the extension */
	if (IdemRegisteredBgWorkers() == registered)
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("idempotency maintenance launcher could not be registered"),
				 errdetail("The background workers registered before it take every slot of max_worker_processes (%d), so no maintenance pass runs until the server is restarted with more.",
						   max_worker_processes),
				 errhint("Increase max_worker_processes: the launcher takes a slot, and each maintenance worker one more for the time of its pass.")));
}

static void
IdemReloadIfAsked(void)
{
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
	}
}

/* The connectable databases that are not templates. */
static List *
IdemConnectableDatabases(MemoryContext cxt)
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
		 * DATABASE fail.  -2 in datconnlimit marks a database whose DROP was
		 * interrupted.
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
IdemRunDatabaseWorker(Oid dboid)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	BgwHandleStatus status;

	IdemFillWorker(&worker, "IdemDatabaseWorkerMain", "idempotency maintenance worker",
				   BGW_NEVER_RESTART);
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency maintenance worker %u", dboid);
	worker.bgw_main_arg = ObjectIdGetDatum(dboid);
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		return false;

	/*
	 * The postmaster sets our latch when the worker stops (bgw_notify_pid);
	 * this sleeps on the latch alone and checks for interrupts after every
	 * wake-up, so SIGTERM still stops the launcher at once.  A reload asked
	 * for meanwhile is taken up by the caller, between two workers.
	 */
	status = WaitForBackgroundWorkerShutdown(handle);
	if (status == BGWH_POSTMASTER_DIED)
		proc_exit(1);
	Assert(status == BGWH_STOPPED);
	pfree(handle);
	return true;
}

/*
 * Whether the last attempt to start a worker found no free slot: the
 * warning is given once per streak of such rounds, not every round.
 */
static bool slots_exhausted = false;

static void
IdemLaunchRound(void)
{
	MemoryContext cxt = AllocSetContextCreate(TopMemoryContext,
											  "idempotency launcher round",
											  ALLOCSET_DEFAULT_SIZES);
	List	   *dbs = IdemConnectableDatabases(cxt);
	ListCell   *lc;

	foreach(lc, dbs)
	{
		CHECK_FOR_INTERRUPTS();
		IdemReloadIfAsked();
		if (!idem_enable_worker)
			break;
		if (!IdemRunDatabaseWorker(lfirst_oid(lc)))
		{
			if (!slots_exhausted)
				ereport(WARNING,
						(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
						 errmsg("idempotency maintenance launcher found no free background worker slot"),
						 errdetail("The databases not yet visited wait for a later round.  This warning is not repeated until a maintenance worker has started again."),
						 errhint("Increase max_worker_processes: each maintenance worker takes a slot for the time of its pass.")));
			slots_exhausted = true;
			break;
		}
		slots_exhausted = false;
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
		TimestampTz now = GetCurrentTimestamp();
		TimestampTz next = TimestampTzPlusMilliseconds(last_round,
													   (int64) idem_maintenance_interval * 1000);

		if (last_round == 0 || now >= next)
		{
			last_round = now;
			if (idem_enable_worker && !RecoveryInProgress())
				IdemLaunchRound();
			continue;			/* the round took time: read the clock again */
		}

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 (long) ((next - now) / 1000) + 1, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		IdemReloadIfAsked();
	}
}

/* The per-endpoint counts of stale leases, by outcome. */
static const struct
{
	const char *singular;
	const char *plural;
}			lease_messages[] =
{
	[IDEM_MAINT_LEASE_UNKNOWN] = {
		gettext_noop("idempotency maintenance marked %lld stale lease of endpoint \"%s\" unknown"),
		gettext_noop("idempotency maintenance marked %lld stale leases of endpoint \"%s\" unknown")
	},
	[IDEM_MAINT_LEASE_COMPLETED] = {
		gettext_noop("idempotency maintenance completed %lld stale lease of endpoint \"%s\" with its resolver's answer"),
		gettext_noop("idempotency maintenance completed %lld stale leases of endpoint \"%s\" with its resolver's answer")
	},
	[IDEM_MAINT_LEASE_FAILED] = {
		gettext_noop("idempotency maintenance marked %lld stale lease of endpoint \"%s\" failed because its resolver found no business record"),
		gettext_noop("idempotency maintenance marked %lld stale leases of endpoint \"%s\" failed because its resolver found no business record")
	},
	[IDEM_MAINT_RESOLVER_ERROR] = {
		gettext_noop("idempotency maintenance left %lld stale lease of endpoint \"%s\" in progress because its resolver failed or did not answer"),
		gettext_noop("idempotency maintenance left %lld stale leases of endpoint \"%s\" in progress because its resolver failed or did not answer")
	},
};

/*
 * The name of the worker's database, read in its first transaction: the
 * log lines of a pass are written between transactions, where the catalog
 * cannot be read.
 */
static const char *worker_dbname = "";

/*
 * Log each action of the worker's pass (the kinds of idem_maintenance()'s
 * rows), each in a message of its own.
 */
static void
IdemLogAction(void *arg, IdemMaintKind kind, const char *object, int64 rows)
{
	long long	n = (long long) rows;
	unsigned long un = (unsigned long) Max(rows, 0);

	switch (kind)
	{
		case IDEM_MAINT_BUSY:
			ereport(DEBUG1,
					(errmsg("idempotency maintenance found another pass running in database \"%s\"",
							worker_dbname)));
			break;
		case IDEM_MAINT_SKIPPED:
			/* the pass has logged the step and why it was skipped */
			break;
		case IDEM_MAINT_CREATE:
			if (rows > 0)
				ereport(LOG,
						(errmsg_plural("idempotency maintenance created partition \"%s\" and moved %lld row into it from the default partition",
									   "idempotency maintenance created partition \"%s\" and moved %lld rows into it from the default partition",
									   un, object, n)));
			else
				ereport(LOG,
						(errmsg("idempotency maintenance created partition \"%s\"", object)));
			break;
		case IDEM_MAINT_DROP:
			if (rows >= 0)
				ereport(LOG,
						(errmsg_plural("idempotency maintenance dropped partition \"%s\", whose range has ended, with about %lld row",
									   "idempotency maintenance dropped partition \"%s\", whose range has ended, with about %lld rows",
									   un, object, n)));
			else
				ereport(LOG,
						(errmsg("idempotency maintenance dropped partition \"%s\", whose range has ended", object)));
			break;
		case IDEM_MAINT_PURGE:
			if (object != NULL && strcmp(object, IDEM_MAINT_OUTBOX_OBJECT) == 0)
				ereport(LOG,
						(errmsg_plural("idempotency maintenance deleted %lld operation of the outbox finished longer than idempotency.outbox_retention ago",
									   "idempotency maintenance deleted %lld operations of the outbox finished longer than idempotency.outbox_retention ago",
									   un, n)));
			else
				ereport(LOG,
						(errmsg_plural("idempotency maintenance deleted %lld expired row from the default partition",
									   "idempotency maintenance deleted %lld expired rows from the default partition",
									   un, n)));
			break;
		case IDEM_MAINT_LEASE_UNKNOWN:
		case IDEM_MAINT_LEASE_COMPLETED:
		case IDEM_MAINT_LEASE_FAILED:
		case IDEM_MAINT_RESOLVER_ERROR:
			ereport(LOG,
					(errmsg_plural(lease_messages[kind].singular,
								   lease_messages[kind].plural,
								   un, n, object)));
			break;
		case IDEM_MAINT_TOMBSTONE:
		case IDEM_MAINT_LEASE_RESOLVE:
			/* no message of their own: say it as idem_maintenance() does */
			ereport(LOG,
					(errmsg_internal("idempotency maintenance action \"%s\" on \"%s\", rows %lld",
									 IdemMaintKindName(kind), object ? object : "", n)));
			break;
	}
}

void
IdemDatabaseWorkerMain(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);
	Oid			extowner = InvalidOid;
	IdemUserSwitch user;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/* fails (FATAL) when the database was dropped meanwhile */
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);

	if (!idem_enable_worker || RecoveryInProgress())
		proc_exit(0);

	/* a database without the extension has nothing to do */
	StartTransactionCommand();
	{
		char	   *name = get_database_name(MyDatabaseId);

		if (name != NULL)
			worker_dbname = MemoryContextStrdup(TopMemoryContext, name);
	}
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

	/*
	 * Every pass writes: a server or database whose new transactions are
	 * read only (as a switch-over stops the writes of the old primary) gets
	 * none, rather than a pass failing every interval.
	 */
	if (OidIsValid(extowner) && DefaultXactReadOnly)
	{
		ereport(LOG,
				(errmsg("idempotency maintenance skipped database \"%s\": its transactions are read only",
						get_database_name(MyDatabaseId)),
				 errdetail("default_transaction_read_only is on for the server or the database."),
				 errhint("Maintenance resumes at the first pass after default_transaction_read_only is turned off.")));
		extowner = InvalidOid;
	}
	CommitTransactionCommand();
	if (!OidIsValid(extowner))
		proc_exit(0);

	pgstat_report_activity(STATE_RUNNING, "idempotency maintenance pass");

	/* act as the extension's owner, as idem_maintenance() does */
	IdemSwitchUser(&user, extowner, 0);
	(void) IdemMaintenancePass(GetCurrentTimestamp(), true, IdemLogAction, NULL);
	IdemRestoreUser(&user);

	pgstat_report_activity(STATE_IDLE, NULL);
	proc_exit(0);
}
