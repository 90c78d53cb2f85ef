/*-------------------------------------------------------------------------
 *
 * maint.c
 *	  One maintenance pass over idempotency.keys (and the tombstones of its
 *	  expired keys, idempotency.tombstones), and the SQL function
 *	  idem_maintenance() that runs it: the pass's lock, its steps in order,
 *	  and the preview.  The steps are in maint_leases.c (1) and
 *	  maint_partitions.c (2 to 6); what they share in maint_pass.c.  The
 *	  rows they read and change are read and changed by the key store
 *	  (keystore.c) and the tombstones (tombstone_write.c).
 *
 *	  A pass, in this order:
 *	  1. stale leases: in_progress rows past locked_until (and not expired)
 *	     become 'unknown', or are settled by the endpoint's resolver (each
 *	     call cut off after idempotency.resolver_timeout);
 *	  2. premake of idempotency.tombstones (as in 3), so that the
 *	     tombstones written next land in dated partitions;
 *	  3. purge: expired rows leave the default partition, leaving their
 *	     tombstones (tombstone_write.c) in the same statement;
 *	  4. premake: dated partitions cover from as_of to as_of + max_ttl + one
 *	     partition_interval; rows of a new partition's range are first moved
 *	     out of the default partition;
 *	  5. retention: partitions whose range has ended are dropped whole,
 *	     after the tombstones of their rows are written;
 *	  6. retention of idempotency.tombstones, and expired tombstones leave
 *	     its default partition.
 *
 *	  Between 3 and 4, the outbox: operations that finished longer than
 *	  idempotency.outbox_retention before as_of leave it (maint_outbox.c; on
 *	  every node in the Citus mode, where it is a local table).
 *
 *	  Steps 2 to 6 serve both partitioned tables alike.
 *
 *	  A preview reports what a pass as of a given time would do, and does
 *	  nothing: it only reads.  idem_maintenance() previews a pass whose as_of
 *	  lies in the future unless told otherwise, since such a pass would drop
 *	  keys and mark leases unknown that are live now.
 *
 *	  DDL runs with a short lock_timeout in a subtransaction; a step that
 *	  cannot get its lock is skipped with a LOG line and the next pass
 *	  retries, so claims never wait on maintenance for more than that.  Two
 *	  passes of one database never overlap: each takes an advisory lock of
 *	  the extension's own lock space without waiting.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "horizon.h"
#include "keystore.h"
#include "maint.h"
#include "maint_leases.h"
#include "maint_outbox.h"
#include "maint_partitions.h"
#include "tombstone_filter_learn.h"
#include "tombstone_probe.h"
#include "util.h"

/* ---------------------------------------------------------------------
 * The pass
 * ---------------------------------------------------------------------
 */

/*
 * The lock that keeps two passes of this database apart: session-level for
 * the worker (which commits between steps), transaction-level otherwise.
 */
static void
IdemPassLockTag(LOCKTAG *tag)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, 0, 0, IDEM_LOCKTAG_MAINTENANCE);
}

static void
IdemPassInit(IdemMaintPass *p, TimestampTz as_of, bool own_xacts,
			 IdemMaintEmit emit, void *arg)
{
	memset(p, 0, sizeof(*p));
	p->as_of = as_of;
	p->own_xacts = own_xacts;
	p->emit = emit;
	p->arg = arg;
}

/*
 * The name of a subscription of this database that replicates a table of
 * the extension into it, or NULL.  Such a database is a logical replica
 * (the green side of a blue/green switch-over, doc/operations.md): its
 * keys are the publisher's, which its own maintenance must leave alone;
 * and a dated partition made here would take rows whose deletes the
 * subscription cannot find (they are routed by the replica identity, which
 * holds no expires_at, to the default partition).  Runs in a step.
 */
static char *
IdemSubscription(IdemMaintPass *p)
{
	char	   *result = NULL;

	if (SPI_execute("SELECT s.subname::pg_catalog.text"
					" FROM pg_catalog.pg_subscription_rel r"
					" JOIN pg_catalog.pg_subscription s ON s.oid OPERATOR(pg_catalog.=) r.srsubid"
					" JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) r.srrelid"
					" JOIN pg_catalog.pg_depend d"
					"  ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass"
					"  AND d.objid OPERATOR(pg_catalog.=) c.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'"
					" JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid"
					"  AND e.extname OPERATOR(pg_catalog.=) 'idempotency'"
					" ORDER BY 1 LIMIT 1", true, 1) != SPI_OK_SELECT)
		elog(ERROR, "reading pg_subscription_rel failed");
	if (SPI_processed == 1)
	{
		MemoryContext old = MemoryContextSwitchTo(p->cxt);

		result = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		MemoryContextSwitchTo(old);
	}
	return result;
}

/*
 * Learn the key horizons (horizon.c) and the tombstone filters
 * (tombstone_filter.c) of this database when the server has not yet: once per
 * server start, a read of every row, in a step of its own.  Not in a
 * preview, not in the Citus mode (neither is used there).
 */
static void
IdemMaintLearnHorizons(IdemMaintPass *p)
{
	int64		n;

	if (p->preview)
		return;
	IdemMaintStepBegin(p);
	n = IdemKeystoreDistributed() ? -1 : IdemHorizonLearn(IdemKeystoreRelid());
	if (n >= 0)
		elog(DEBUG1, "idempotency: key horizons learned from " INT64_FORMAT " rows", n);
	n = IdemKeystoreDistributed() || !IdemTombstonesActive() ? -1 :
		IdemTombFilterLearn(IdemTombstoneRelid());
	if (n >= 0)
		elog(DEBUG1, "idempotency: tombstone filters learned from " INT64_FORMAT " rows", n);
	IdemMaintStepEnd(p);
}

/*
 * Compact the tombstone filters that grew by several generations
 * (tombstone_filter.c), in a step of its own at the end of a pass, once this
 * pass's tombstones are written.  Not in a preview, not in the Citus mode.
 * What it asks of the catalog (the schema's version, the mode) is asked
 * inside the step: between two steps the worker is in no transaction, and
 * the cached answers may have been forgotten by an invalidation meanwhile.
 */
static void
IdemMaintCompactFilters(IdemMaintPass *p)
{
	int			n;

	if (p->preview)
		return;
	IdemMaintStepBegin(p);
	if (!IdemKeystoreDistributed() && IdemTombstonesActive())
	{
		n = IdemTombFilterCompact(IdemTombstoneRelid());
		if (n > 0)
			elog(DEBUG1, "idempotency: %d tombstone filters compacted", n);
	}
	IdemMaintStepEnd(p);
}

/*
 * The steps.  In the Citus mode (doc/scaling.md, "Citus: maintenance, stats and health") stale leases and the
 * default partition's purge (with its tombstones) run on every node, on its
 * own shards; only the coordinator makes and drops partitions (of keys and
 * of tombstones), which Citus carries to the shards.
 */
static void
IdemRunSteps(IdemMaintPass *p)
{
	IdemKeysNode node;
	char	   *subscription;

	IdemMaintStepBegin(p);
	node = IdemKeystoreNode();
	subscription = IdemSubscription(p);
	IdemMaintStepEnd(p);
	if (subscription)
	{
		ereport(p->own_xacts ? LOG : NOTICE,
				(errmsg("idempotency maintenance skipped: subscription \"%s\" replicates the extension's tables into this database",
						subscription),
				 errdetail("A logical replica keeps the publisher's keys as they come; maintenance runs here once the subscription is dropped."),
				 errhint("At the switch-over, drop the subscription (doc/operations.md, \"Logical replication and blue/green switch-over\").")));
		IdemMaintReport(p, IDEM_MAINT_SKIPPED, "subscription", -1);
		return;
	}
	IdemMaintStaleLeases(p);
	IdemMaintLearnHorizons(p);
	/* tombstones land in dated partitions, made first (by the coordinator) */
	if (node != IDEM_KEYS_CITUS_WORKER)
		IdemMaintPremake(p, IDEM_PARTITIONED_TOMBSTONES);
	IdemMaintPurgeKeysDefault(p);
	/* every node's own outbox */
	IdemMaintOutbox(p);
	/* a Citus worker: the coordinator makes and drops the partitions */
	if (node == IDEM_KEYS_CITUS_WORKER)
		return;
	IdemMaintPremake(p, IDEM_PARTITIONED_KEYS);
	IdemMaintRetention(p, IDEM_PARTITIONED_KEYS);
	IdemMaintRetention(p, IDEM_PARTITIONED_TOMBSTONES);
	IdemMaintPurgeTombstonesDefault(p);
	IdemMaintCompactFilters(p);
}

/*
 * What a pass as of as_of would do, in the caller's transaction, doing
 * nothing: it takes no lock but those of its reads, calls no resolver and
 * counts, logs and audits nothing.
 */
void
IdemMaintenancePreview(TimestampTz as_of, IdemMaintEmit emit, void *arg)
{
	IdemMaintPass p;

	IdemPassInit(&p, as_of, false, emit, arg);
	p.preview = true;
	p.cxt = CurrentMemoryContext;
	IdemRunSteps(&p);
}

bool
IdemMaintenancePass(TimestampTz as_of, bool own_xacts,
					IdemMaintEmit emit, void *arg)
{
	IdemMaintPass p;
	LOCKTAG		tag;

	IdemPassInit(&p, as_of, own_xacts, emit, arg);

	IdemPassLockTag(&tag);
	if (own_xacts)
	{
		/* a session lock, taken in a transaction, kept across the steps */
		StartTransactionCommand();
		if (LockAcquire(&tag, ExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
		{
			CommitTransactionCommand();
			IdemMaintReport(&p, IDEM_MAINT_BUSY, NULL, -1);
			return false;
		}
		CommitTransactionCommand();
		p.cxt = AllocSetContextCreate(TopMemoryContext,
									  "idempotency maintenance",
									  ALLOCSET_DEFAULT_SIZES);
	}
	else
	{
		if (LockAcquire(&tag, ExclusiveLock, false, true) == LOCKACQUIRE_NOT_AVAIL)
		{
			IdemMaintReport(&p, IDEM_MAINT_BUSY, NULL, -1);
			return false;
		}
		p.cxt = CurrentMemoryContext;
	}

	PG_TRY();
	{
		IdemRunSteps(&p);
	}
	PG_FINALLY();
	{
		if (own_xacts)
		{
			LockRelease(&tag, ExclusiveLock, true);
			MemoryContextDelete(p.cxt);
		}
	}
	PG_END_TRY();
	return true;
}

/* ---------------------------------------------------------------------
 * SQL interface
 * ---------------------------------------------------------------------
 */

static void
IdemEmitTuple(void *arg, IdemMaintKind kind, const char *object, int64 rows)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) arg;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	values[0] = CStringGetTextDatum(IdemMaintKindName(kind));
	if (object)
		values[1] = CStringGetTextDatum(object);
	else
		nulls[1] = true;
	if (rows >= 0)
		values[2] = Int64GetDatum(rows);
	else
		nulls[2] = true;
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * Times a pass accepts: from the Unix epoch, from which partitions are
 * aligned, to the year 9000, so that the partitions a pass makes (at most
 * max_ttl plus one partition_interval, some 136 years, ahead) keep
 * four-digit years in their names.
 */
#define IDEM_AS_OF_MIN	"1970-01-01 00:00:00+00"
#define IDEM_AS_OF_MAX	"9000-01-01 00:00:00+00"

static TimestampTz
IdemAsOfBound(const char *literal)
{
	return DatumGetTimestampTz(DirectFunctionCall3(timestamptz_in,
												   CStringGetDatum(literal),
												   ObjectIdGetDatum(InvalidOid),
												   Int32GetDatum(-1)));
}

PG_FUNCTION_INFO_V1(idem_maintenance);

/*
 * idem_maintenance(as_of timestamptz DEFAULT now(), preview boolean DEFAULT NULL)
 *		RETURNS TABLE (kind text, object text, rows bigint)
 *
 * One maintenance pass in the caller's transaction, as if the clock read
 * as_of; one row per action.  With preview, or when preview is NULL and
 * as_of lies in the future, only what the pass would do is reported.  (The
 * 0.2.0 definition has no preview argument: it previews a future as_of.)
 */
Datum
idem_maintenance(PG_FUNCTION_ARGS)
{
	TimestampTz as_of;
	bool		preview;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("as_of must not be NULL"),
				 errhint("Leave as_of out for a pass as of now().")));
	as_of = PG_GETARG_TIMESTAMPTZ(0);
	if (TIMESTAMP_NOT_FINITE(as_of) ||
		as_of < IdemAsOfBound(IDEM_AS_OF_MIN) || as_of >= IdemAsOfBound(IDEM_AS_OF_MAX))
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("as_of is out of range for a maintenance pass"),
				 errdetail("A pass accepts times from %s up to, but not including, %s.",
						   "1970-01-01 00:00 UTC", "9000-01-01 00:00 UTC")));

	if (PG_NARGS() > 1 && !PG_ARGISNULL(1))
		preview = PG_GETARG_BOOL(1);
	else
	{
		preview = as_of > GetCurrentTimestamp();
		if (preview)
			ereport(NOTICE,
					(errmsg("maintenance pass previewed: as_of lies in the future"),
					 errdetail("The rows show what a pass at that time would do; nothing was changed."),
					 errhint("Pass preview => false to run the pass as if the clock read as_of, which drops keys and marks leases unknown that are live now.")));
	}

	if (!preview)
		IdemRequireReadWrite(fcinfo);
	InitMaterializedSRF(fcinfo, 0);
	if (preview)
		IdemMaintenancePreview(as_of, IdemEmitTuple, rsinfo);
	else
		(void) IdemMaintenancePass(as_of, false, IdemEmitTuple, rsinfo);
	return (Datum) 0;
}

