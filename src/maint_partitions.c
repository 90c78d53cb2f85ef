/*-------------------------------------------------------------------------
 *
 * maint_partitions.c
 *	  The partitions of idempotency.keys and idempotency.tombstones, as a
 *	  maintenance pass handles them: both tables are described alike
 *	  (MaintTable), listed from the catalog, and their partitions made
 *	  ahead (premake), dropped once their range has ended (retention, after
 *	  the tombstones of the rows of keys), and their default partitions
 *	  kept short: the rows of a partition being made are moved out of it,
 *	  and expired rows purged (leaving their tombstones).  The rows
 *	  themselves are changed by the key store (keystore.c) and the
 *	  tombstones (tombstone_write.c), except for the default partition's moves
 *	  and counts, which are the same SQL for both tables.
 *
 *	  DDL runs with a short lock_timeout in a subtransaction; a step that
 *	  cannot get its lock is skipped with a LOG line and the next pass
 *	  retries, so claims never wait on maintenance for more than that.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "partitioning/partbounds.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "ddl_guard.h"
#include "guc.h"
#include "keystore.h"
#include "maint_partitions.h"
#include "tombstone_filter.h"
#include "tombstone_probe.h"
#include "tombstone_write.h"
#include "util.h"

#define IDEM_SCHEMA		"idempotency"

/* One range [lo, hi) of expires_at; a partition's or one to make. */
typedef struct MaintRange
{
	TimestampTz lo;
	TimestampTz hi;
	bool		lo_inf;			/* MINVALUE */
	bool		hi_inf;			/* MAXVALUE */
	Oid			relid;			/* InvalidOid for a range to make */
} MaintRange;

/*
 * A table partitioned by RANGE (expires_at) whose partitions maintenance
 * makes and drops: idempotency.keys, idempotency.tombstones.
 */
typedef struct MaintTable
{
	const char *name;			/* in schema idempotency: "keys" */
	const char *dflt;			/* its default partition: "keys_default" */
	const char *prefix;			/* of its partitions' names: "keys_p" */
	const char *table_extra;	/* more of CREATE TABLE (%s: partition name) */
	const char *index_sql;		/* CREATE INDEX (%s: partition name, table) */
	/*
	 * The replica identity of its partitions (logical replication, Citus
	 * shard moves): USING INDEX on the index named partition name + this,
	 * or FULL when NULL.  Partitions do not inherit it from the parent.
	 */
	const char *identity_index;
	Oid			(*relid) (void);
	int64		(*width) (void);	/* partition width, microseconds */
	/*
	 * Where the rows written before the next pass land, as windows
	 * [from[i], to[i]) relative to as_of, microseconds, sorted by from:
	 * partitions are made for those (in p->cxt; returns how many)
	 */
	int			(*windows) (IdemMaintPass *p, int64 **from, int64 **to);
	/* tombstones of a partition about to be dropped, or NULL */
	int64		(*tombstones) (Oid relid, TimestampTz as_of, bool count_only,
							   Snapshot snapshot, List *tids);
} MaintTable;

static int64
IdemKeysWidth(void)
{
	return (int64) idem_partition_interval * USECS_PER_SEC;
}

/* a key expires up to max_ttl ahead */
static int
IdemKeysWindows(IdemMaintPass *p, int64 **from, int64 **to)
{
	*from = MemoryContextAlloc(p->cxt, sizeof(int64));
	*to = MemoryContextAlloc(p->cxt, sizeof(int64));
	(*from)[0] = 0;
	(*to)[0] = (int64) idem_max_ttl * USECS_PER_SEC + IdemKeysWidth();
	return 1;
}

static int64
IdemTombstonesWidth(void)
{
	return (int64) idem_tombstone_partition_interval * USECS_PER_SEC;
}

/*
 * A tombstone expires its ttl after its key: the keys expiring from now to
 * max_ttl ahead (those of a partition whose range has ended are still
 * there until its drop: one partition width earlier) leave tombstones
 * expiring one such window after each tombstone_ttl in use.  Only those
 * windows get partitions: with a ttl of years, the slots in between would
 * hold nothing before later passes (which make them as time comes), and
 * one endpoint's long ttl would otherwise make thousands of partitions,
 * every one of which a claim probes.  A tombstone that finds no partition
 * lands in the default partition and moves when its slot is made.
 */
static int
IdemTombstonesWindows(IdemMaintPass *p, int64 **from, int64 **to)
{
	int64	   *ttls;
	int			n = IdemTombstoneTtls(&ttls);
	int			i;

	*from = MemoryContextAlloc(p->cxt, sizeof(int64) * Max(n, 1));
	*to = MemoryContextAlloc(p->cxt, sizeof(int64) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		int64		ttl = ttls[i] * USECS_PER_SEC;

		(*from)[i] = ttl - IdemKeysWidth();
		(*to)[i] = ttl + (int64) idem_max_ttl * USECS_PER_SEC +
			IdemKeysWidth() + IdemTombstonesWidth();
	}
	return n;
}

static const MaintTable keys_table = {
	"keys", "keys_default", "keys_p",
	", UNIQUE (key, endpoint, tenant)",
	"CREATE INDEX %s_lease_idx ON %s (locked_until) WHERE state = 'in_progress'",
	"_key_endpoint_tenant_key",	/* the UNIQUE constraint's index */
	IdemKeystoreRelid, IdemKeysWidth, IdemKeysWindows, IdemTombstonesOfPartition
};

static const MaintTable tombstones_table = {
	"tombstones", "tombstones_default", "tombstones_p",
	"",
	"CREATE INDEX %s_scope_idx ON %s (scope_hash)",
	NULL,						/* no unique index: FULL (four short columns) */
	IdemTombstoneRelid, IdemTombstonesWidth, IdemTombstonesWindows, NULL
};

static const MaintTable *const partitioned_tables[] = {
	[IDEM_PARTITIONED_KEYS] = &keys_table,
	[IDEM_PARTITIONED_TOMBSTONES] = &tombstones_table,
};

/* ---------------------------------------------------------------------
 * DDL under a short lock_timeout
 * ---------------------------------------------------------------------
 */

typedef struct LockTimeoutCall
{
	IdemMaintPass *p;
	void		(*fn) (IdemMaintPass *p, void *arg);
	void	   *arg;
} LockTimeoutCall;

static void
IdemCallWithPass(void *arg)
{
	LockTimeoutCall *c = (LockTimeoutCall *) arg;

	c->fn(c->p, c->arg);
}

/*
 * Run fn (which creates the partition object, or drops the expired
 * partitions of object, as dropping says) in a subtransaction.  When it
 * fails for want of a lock (lock_timeout), roll it back, log, report a
 * "skipped" action and return false; any other error is raised again.
 */
static bool
IdemRunWithLockTimeout(IdemMaintPass *p, bool dropping, const char *object,
					   void (*fn) (IdemMaintPass *p, void *arg), void *arg)
{
	LockTimeoutCall c = {p, fn, arg};
	ErrorData  *edata = IdemRunInSubtransaction(IdemCallWithPass, &c);

	if (edata == NULL)
		return true;
	if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
		ReThrowError(edata);

	ereport(LOG,
			(dropping ?
			 errmsg("idempotency maintenance skipped dropping the expired partitions of \"%s\": %s",
					object, edata->message) :
			 errmsg("idempotency maintenance skipped creating partition \"%s\": %s",
					object, edata->message),
			 errdetail("The next maintenance pass tries again.")));
	FreeErrorData(edata);
	IdemMaintReport(p, IDEM_MAINT_SKIPPED, object, -1);
	return false;
}

static void
IdemExecDDL(const char *sql)
{
	int			rc = IdemRunOwnDDL(sql);

	if (rc < 0)
		elog(ERROR, "idempotency maintenance: \"%s\" failed: %s",
			 sql, SPI_result_code_string(rc));
}

/* ---------------------------------------------------------------------
 * Names and times
 * ---------------------------------------------------------------------
 */

/* Microseconds from the Unix epoch to PostgreSQL's (2000-01-01). */
#define UNIX_TO_PG_USECS \
	((int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY)

/* Start of the partition_interval slot that holds ts (UTC, from the epoch). */
static TimestampTz
IdemSlotStart(TimestampTz ts, int64 width)
{
	int64		unix_us = ts + UNIX_TO_PG_USECS;
	int64		q = unix_us / width;

	if (unix_us % width < 0)
		q--;
	return q * width - UNIX_TO_PG_USECS;
}

static void
IdemTimestampToUtcTm(TimestampTz ts, struct pg_tm *tm)
{
	fsec_t		fsec;

	if (timestamp2tm(ts, NULL, tm, &fsec, NULL, NULL) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));
}

/* A timestamptz literal in UTC, whatever the session's TimeZone. */
static char *
IdemUtcLiteral(TimestampTz ts)
{
	struct pg_tm tm;
	int64		usec = ts % USECS_PER_SEC;

	if (usec < 0)
		usec += USECS_PER_SEC;
	IdemTimestampToUtcTm(ts, &tm);
	return psprintf("'%04d-%02d-%02d %02d:%02d:%02d.%06d+00'",
					tm.tm_year, tm.tm_mon, tm.tm_mday,
					tm.tm_hour, tm.tm_min, tm.tm_sec, (int) usec);
}

/* keys_pYYYYMMDDtHHMM (prefix keys_p), with seconds when the start has any. */
static char *
IdemPartitionName(const char *prefix, TimestampTz lo)
{
	struct pg_tm tm;

	IdemTimestampToUtcTm(lo, &tm);
	if (tm.tm_sec != 0 || lo % USECS_PER_SEC != 0)
		return psprintf("%s%04d%02d%02dt%02d%02d%02d", prefix,
						tm.tm_year, tm.tm_mon, tm.tm_mday,
						tm.tm_hour, tm.tm_min, tm.tm_sec);
	return psprintf("%s%04d%02d%02dt%02d%02d", prefix,
					tm.tm_year, tm.tm_mon, tm.tm_mday, tm.tm_hour, tm.tm_min);
}

/* ---------------------------------------------------------------------
 * Partitions
 * ---------------------------------------------------------------------
 */

static int
IdemRangeCmp(const ListCell *a, const ListCell *b)
{
	MaintRange *ra = lfirst(a);
	MaintRange *rb = lfirst(b);

	if (ra->lo_inf != rb->lo_inf)
		return ra->lo_inf ? -1 : 1;
	if (ra->lo < rb->lo)
		return -1;
	return ra->lo > rb->lo ? 1 : 0;
}

/* The dated partitions of table t, by lower bound (in p->cxt). */
static List *
IdemListPartitions(IdemMaintPass *p, const MaintTable *t)
{
	List	   *children = find_inheritance_children(t->relid(), NoLock);
	List	   *result = NIL;
	ListCell   *lc;

	foreach(lc, children)
	{
		Oid			relid = lfirst_oid(lc);
		HeapTuple	tup;
		Datum		d;
		bool		isnull;
		PartitionBoundSpec *spec;
		PartitionRangeDatum *lo;
		PartitionRangeDatum *hi;
		MaintRange *r;
		MemoryContext old;

		tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
		if (!HeapTupleIsValid(tup))
			continue;			/* dropped meanwhile */
		d = SysCacheGetAttr(RELOID, tup, Anum_pg_class_relpartbound, &isnull);
		if (isnull)
		{
			ReleaseSysCache(tup);
			continue;
		}
		spec = castNode(PartitionBoundSpec, stringToNode(TextDatumGetCString(d)));
		ReleaseSysCache(tup);
		if (spec->is_default || spec->strategy != PARTITION_STRATEGY_RANGE)
			continue;
		lo = linitial_node(PartitionRangeDatum, spec->lowerdatums);
		hi = linitial_node(PartitionRangeDatum, spec->upperdatums);

		old = MemoryContextSwitchTo(p->cxt);
		r = palloc0(sizeof(MaintRange));
		r->relid = relid;
		r->lo_inf = lo->kind != PARTITION_RANGE_DATUM_VALUE;
		r->hi_inf = hi->kind != PARTITION_RANGE_DATUM_VALUE;
		if (!r->lo_inf)
			r->lo = DatumGetTimestampTz(castNode(Const, lo->value)->constvalue);
		if (!r->hi_inf)
			r->hi = DatumGetTimestampTz(castNode(Const, hi->value)->constvalue);
		result = lappend(result, r);
		MemoryContextSwitchTo(old);
	}
	list_sort(result, IdemRangeCmp);
	return result;
}

/*
 * The ranges to make so that the windows of t (see MaintTable) are covered:
 * every partition_interval slot that meets one, less what existing
 * partitions already cover (they may have another width when the setting
 * changed).
 */
/* the most partitions of one table a pass in one transaction makes */
#define IDEM_PREMAKE_PER_TRANSACTION 64

static List *
IdemPlanPremake(IdemMaintPass *p, const MaintTable *t, List *existing)
{
	int64		width = t->width();
	int64	   *from;
	int64	   *to;
	int			nwindows = t->windows(p, &from, &to);
	TimestampTz next = DT_NOBEGIN;	/* slots before it are planned */
	List	   *plan = NIL;
	int			w;
	MemoryContext old = MemoryContextSwitchTo(p->cxt);

	for (w = 0; w < nwindows; w++)
	{
		/* a slot that has ended by as_of would be dropped at once */
		TimestampTz slot = Max(IdemSlotStart(p->as_of + Max(from[w], 0), width),
							   next);
		TimestampTz horizon = p->as_of + to[w];

		for (; slot < horizon; slot += width)
		{
			TimestampTz cur = slot;
			TimestampTz end = slot + width;
			ListCell   *lc;

			foreach(lc, existing)
			{
				MaintRange *r = lfirst(lc);

				if (cur >= end)
					break;
				if (!r->hi_inf && r->hi <= cur)
					continue;	/* wholly before */
				if (!r->lo_inf && r->lo >= end)
					break;		/* wholly after, as are the rest */
				if (!r->lo_inf && r->lo > cur)
				{
					MaintRange *m = palloc0(sizeof(MaintRange));

					m->lo = cur;
					m->hi = r->lo;
					plan = lappend(plan, m);
				}
				cur = r->hi_inf ? end : Max(cur, r->hi);
			}
			if (cur < end)
			{
				MaintRange *m = palloc0(sizeof(MaintRange));

				m->lo = cur;
				m->hi = end;
				plan = lappend(plan, m);
			}
			next = end;
		}
	}
	MemoryContextSwitchTo(old);
	return plan;
}

/* A partition's rows as pg_class.reltuples estimates them; -1 if never counted. */
static int64
IdemPartitionEstimate(Oid relid)
{
	int64		estimate = -1;
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));

	if (HeapTupleIsValid(tup))
	{
		float4		reltuples = ((Form_pg_class) GETSTRUCT(tup))->reltuples;

		if (reltuples >= 0)
			estimate = (int64) reltuples;
		ReleaseSysCache(tup);
	}
	return estimate;
}

/* ---------------------------------------------------------------------
 * The default partition
 * ---------------------------------------------------------------------
 */

/* The default partition of table t, schema-qualified: idempotency.keys_default */
static char *
IdemDefaultName(const MaintTable *t)
{
	return psprintf(IDEM_SCHEMA ".%s", t->dflt);
}

/*
 * Rows of the default partition of t (counted ONLY) whose expires_at is in
 * [*lo, hi), or, with lo NULL, at most hi: what a pass would move or purge.
 */
static int64
IdemDefaultCount(const MaintTable *t, const TimestampTz *lo, TimestampTz hi)
{
	char	   *qname = IdemDefaultName(t);
	Oid			argtypes[2] = {TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		args[2] = {TimestampTzGetDatum(hi), TimestampTzGetDatum(lo ? *lo : 0)};
	bool		isnull;
	int64		count;
	int			rc;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	rc = SPI_execute_with_args(psprintf(lo ?
										"SELECT pg_catalog.count(*) FROM ONLY %s"
										" WHERE expires_at OPERATOR(pg_catalog.>=) $2"
										" AND expires_at OPERATOR(pg_catalog.<) $1" :
										"SELECT pg_catalog.count(*) FROM ONLY %s"
										" WHERE expires_at OPERATOR(pg_catalog.<=) $1", qname),
							   lo ? 2 : 1, argtypes, args, NULL, true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "counting rows of %s failed: %s",
			 qname, SPI_result_code_string(rc));
	count = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
										SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	return count;
}

/* Whether the default partition of t holds rows whose expires_at is in [lo, hi). */
static bool
IdemDefaultHasRows(const MaintTable *t, TimestampTz lo, TimestampTz hi)
{
	Oid			argtypes[2] = {TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		args[2] = {TimestampTzGetDatum(lo), TimestampTzGetDatum(hi)};

	return IdemSpiExec(psprintf("SELECT 1 FROM ONLY %s"
								" WHERE expires_at OPERATOR(pg_catalog.>=) $1"
								" AND expires_at OPERATOR(pg_catalog.<) $2 LIMIT 1",
								IdemDefaultName(t)),
					   2, argtypes, args, NULL, false, SPI_OK_SELECT) > 0;
}

/*
 * Take the rows of the default partition of t whose expires_at is in
 * [lo, hi) out of it, into the temporary table idem_moving (made here, and
 * dropped by IdemDefaultMoveBack); returns how many.
 */
static int64
IdemDefaultMoveOut(const MaintTable *t, TimestampTz lo, TimestampTz hi)
{
	Oid			argtypes[2] = {TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		args[2] = {TimestampTzGetDatum(lo), TimestampTzGetDatum(hi)};

	IdemExecDDL(psprintf("CREATE TEMPORARY TABLE idem_moving (LIKE idempotency.%s)",
						 t->name));
	return (int64) IdemSpiExec(psprintf("WITH moved AS (DELETE FROM ONLY %s"
										" WHERE expires_at OPERATOR(pg_catalog.>=) $1"
										" AND expires_at OPERATOR(pg_catalog.<) $2 RETURNING *)"
										" INSERT INTO pg_temp.idem_moving SELECT * FROM moved",
										IdemDefaultName(t)),
							   2, argtypes, args, NULL, false, SPI_OK_INSERT);
}

/*
 * Write the rows IdemDefaultMoveOut took back through the parent, which
 * routes them to the partition just attached: as an INSERT into the
 * partitioned table (a publication with publish_via_partition_root
 * publishes it as such, where a write into the table before ATTACH went
 * out under the table's own name, which no subscriber has), and through
 * the triggers of the partition (horizons, tombstone filters).
 */
static void
IdemDefaultMoveBack(const MaintTable *t)
{
	(void) IdemSpiExec(psprintf("INSERT INTO idempotency.%s SELECT * FROM pg_temp.idem_moving",
								t->name),
					   0, NULL, NULL, NULL, false, SPI_OK_INSERT);
	IdemExecDDL("DROP TABLE pg_temp.idem_moving");
}

/* ---------------------------------------------------------------------
 * Premake, retention and purge
 * ---------------------------------------------------------------------
 */

typedef struct CreateArgs
{
	const MaintTable *table;
	MaintRange *range;
	char	   *name;
	int64		moved;
} CreateArgs;

/*
 * Make one partition: a standalone table with a CHECK constraint matching
 * its range (so that ATTACH need not scan it); the rows of its range taken
 * out of the default partition into a temporary table, ATTACH, and those
 * rows written back through the parent.  Claims keep running against
 * the parent (ATTACH takes SHARE UPDATE EXCLUSIVE on it); only the default
 * partition is locked exclusively, and only for as long as the step lasts.
 */
static void
IdemCreatePartition(IdemMaintPass *p, void *arg)
{
	CreateArgs *a = arg;
	const MaintTable *t = a->table;
	char	   *qname = quote_qualified_identifier(IDEM_SCHEMA, a->name);
	char	   *lo = IdemUtcLiteral(a->range->lo);
	char	   *hi = IdemUtcLiteral(a->range->hi);
	char	   *lock_parent_exclusive = psprintf("LOCK TABLE ONLY idempotency.%s IN ACCESS EXCLUSIVE MODE",
												 t->name);
	StringInfoData sql;
	bool		move;

	initStringInfo(&sql);
	appendStringInfo(&sql,
					 "CREATE TABLE %s (LIKE idempotency.%s INCLUDING DEFAULTS"
					 " INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION,"
					 " CONSTRAINT %s CHECK (expires_at >= %s AND expires_at < %s)%s)",
					 qname, t->name, quote_identifier(psprintf("%s_range", a->name)),
					 lo, hi, t->table_extra);
	IdemExecDDL(sql.data);
	resetStringInfo(&sql);
	appendStringInfo(&sql, t->index_sql, a->name, qname);
	IdemExecDDL(sql.data);
	if (t->identity_index)
		IdemExecDDL(psprintf("ALTER TABLE %s REPLICA IDENTITY USING INDEX %s", qname,
							 quote_identifier(psprintf("%s%s", a->name, t->identity_index))));
	else
		IdemExecDDL(psprintf("ALTER TABLE %s REPLICA IDENTITY FULL", qname));

	/*
	 * Rows to move out of the default partition: a claim that had read the
	 * list of partitions before the move could look for its key in the
	 * default partition only.  As a precaution the move happens under ACCESS
	 * EXCLUSIVE on the parent, so that every claim reads the list afresh
	 * after it; moves are rare (maintenance fell behind).  Otherwise ATTACH's
	 * own locks do, taken in the order it takes them.
	 */
	if (IdemDefaultHasRows(t, a->range->lo, a->range->hi))
		IdemExecDDL(lock_parent_exclusive);
	else
		IdemExecDDL(psprintf("LOCK TABLE ONLY idempotency.%s IN SHARE UPDATE EXCLUSIVE MODE",
							 t->name));
	IdemExecDDL(psprintf("LOCK TABLE ONLY idempotency.%s IN ACCESS EXCLUSIVE MODE",
						 t->dflt));

	/* rows that arrived meanwhile; with the default locked, none comes now */
	move = IdemDefaultHasRows(t, a->range->lo, a->range->hi);
	if (move)
	{
		IdemExecDDL(lock_parent_exclusive);
		a->moved = IdemDefaultMoveOut(t, a->range->lo, a->range->hi);
	}

	resetStringInfo(&sql);
	appendStringInfo(&sql,
					 "ALTER TABLE idempotency.%s ATTACH PARTITION %s FOR VALUES FROM (%s) TO (%s)",
					 t->name, qname, lo, hi);
	IdemExecDDL(sql.data);
	if (move)
		IdemDefaultMoveBack(t);
}

void
IdemMaintPremake(IdemMaintPass *p, IdemPartitionedTable table)
{
	const MaintTable *t = partitioned_tables[table];
	List	   *plan;
	ListCell   *lc;

	IdemMaintStepBegin(p);
	/* a schema older than 0.3.0 has no tombstones */
	if (t == &tombstones_table && !IdemTombstonesActive())
		plan = NIL;
	else
		plan = IdemPlanPremake(p, t, IdemListPartitions(p, t));
	IdemMaintStepEnd(p);

	foreach(lc, plan)
	{
		CreateArgs	a;
		MemoryContext old;

		/*
		 * One transaction holds the locks of every partition it makes until
		 * it ends: a pass in one transaction (idem_maintenance()) makes a
		 * bounded number, and the next pass makes the rest.
		 */
		if (!p->own_xacts && !p->preview &&
			foreach_current_index(lc) >= IDEM_PREMAKE_PER_TRANSACTION)
		{
			ereport(NOTICE,
					(errmsg("maintenance made %d partitions of idempotency.%s, the most one transaction makes",
							IDEM_PREMAKE_PER_TRANSACTION, t->name),
					 errdetail("%d more are planned; the next pass makes them.",
							   list_length(plan) - IDEM_PREMAKE_PER_TRANSACTION),
					 errhint("Rows whose partition is not made yet go to the default partition and move when it is made.")));
			break;
		}
		IdemMaintStepBegin(p);
		a.table = t;
		a.range = lfirst(lc);
		old = MemoryContextSwitchTo(p->cxt);
		a.name = IdemPartitionName(t->prefix, a.range->lo);
		MemoryContextSwitchTo(old);
		a.moved = 0;
		if (p->preview)
			IdemMaintReport(p, IDEM_MAINT_CREATE, a.name,
							IdemDefaultCount(t, &a.range->lo, a.range->hi));
		else if (IdemRunWithLockTimeout(p, false, a.name, IdemCreatePartition, &a))
			IdemMaintReport(p, IDEM_MAINT_CREATE, a.name, a.moved);
		IdemMaintStepEnd(p);
	}
}

typedef struct DropArgs
{
	const MaintTable *table;
	List	   *ranges;			/* MaintRange of the partitions to drop */
	List	   *names;			/* their names, then their row estimates */
	List	   *estimates;
	List	   *tombstoned;		/* tombstones written of each */
} DropArgs;

/*
 * The rows of relation relid that the snapshot seen did not see: those of
 * transactions that committed after it was taken (a new version of a row
 * that seen saw, too).  Read with the latest snapshot, under a lock that
 * keeps every writer out.
 */
static List *
IdemRowsNotSeen(Oid relid, Snapshot seen)
{
	Relation	rel = table_open(relid, AccessShareLock);
	Snapshot	latest = RegisterSnapshot(GetLatestSnapshot());
	TableScanDesc scan = table_beginscan(rel, latest, 0, NULL);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	TupleTableSlot *check = table_slot_create(rel, NULL);
	List	   *tids = NIL;

	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		ItemPointerData tid = slot->tts_tid;

		CHECK_FOR_INTERRUPTS();
		if (!table_tuple_fetch_row_version(rel, &tid, seen, check))
		{
			ItemPointer copy = palloc(sizeof(ItemPointerData));

			ItemPointerCopy(&tid, copy);
			tids = lappend(tids, copy);
		}
	}
	ExecDropSingleTupleTableSlot(check);
	ExecDropSingleTupleTableSlot(slot);
	table_endscan(scan);
	UnregisterSnapshot(latest);
	table_close(rel, NoLock);
	return tids;
}

/*
 * Drop partitions whose range has ended.  Dropping a partition takes ACCESS
 * EXCLUSIVE on the parent: it is taken once, with the short lock_timeout,
 * for all of them, in the last step of the pass.  The tombstones of a
 * partition of keys are written first, before that lock, in the same
 * subtransaction, so that they are written once: claims keep running while
 * they are written (the partition's rows are all expired, and a claim that
 * has no live row reads them or their tombstones), and when the lock is
 * not granted, they go with the partition's drop.
 *
 * A transaction that wrote into the partition may commit between that
 * reading and the lock (one still open past its key's expiry, or any with
 * a pass as of a later time): once the lock is held, no writer is left
 * (every write of keys holds ROW EXCLUSIVE on the parent until its
 * transaction ends), and the rows the first reading did not see are read
 * again with the latest snapshot and get their tombstones too, so that no
 * committed key is dropped without one.
 */
static void
IdemDropPartitions(IdemMaintPass *p, void *arg)
{
	DropArgs   *a = arg;
	const MaintTable *t = a->table;
	ListCell   *lc;
	ListCell   *lc2;
	StringInfoData sql;
	MemoryContext old;
	Snapshot	seen = NULL;
	List	   *relids = NIL;
	bool		citus = false;

	/*
	 * In the Citus mode the partition here is a shell: each worker writes
	 * the tombstones of its shards' rows as Citus drops them, under the
	 * lock of that drop (IdemTombstonesBeforeShardDrop); here they are only
	 * counted, through Citus, for the pass's report.
	 */
	if (t->tombstones != NULL && IdemTombstonesActive())
	{
		citus = IdemKeystoreDistributed();
		if (!citus)
			seen = RegisterSnapshot(GetLatestSnapshot());
	}

	initStringInfo(&sql);
	appendStringInfoString(&sql, "DROP TABLE ");
	foreach(lc, a->ranges)
	{
		MaintRange *r = lfirst(lc);
		char	   *relname = get_rel_name(r->relid);
		char	   *nspname = get_namespace_name(get_rel_namespace(r->relid));
		int64		estimate = IdemPartitionEstimate(r->relid);
		int64		tombstoned = -1;

		if (relname == NULL || nspname == NULL)
			continue;			/* dropped meanwhile */
		if (seen != NULL)
			tombstoned = t->tombstones(r->relid, p->as_of, false, seen, NIL);
		else if (citus)
			tombstoned = t->tombstones(r->relid, p->as_of, true, NULL, NIL);
		if (a->names != NIL)
			appendStringInfoString(&sql, ", ");
		appendStringInfoString(&sql, quote_qualified_identifier(nspname, relname));
		relids = lappend_oid(relids, r->relid);

		old = MemoryContextSwitchTo(p->cxt);
		a->names = lappend(a->names, pstrdup(relname));
		a->estimates = lappend(a->estimates, palloc(sizeof(int64)));
		*(int64 *) llast(a->estimates) = estimate;
		a->tombstoned = lappend(a->tombstoned, palloc(sizeof(int64)));
		*(int64 *) llast(a->tombstoned) = tombstoned;
		MemoryContextSwitchTo(old);
	}

	IdemExecDDL(psprintf("LOCK TABLE ONLY idempotency.%s IN ACCESS EXCLUSIVE MODE",
						 t->name));

	if (seen != NULL)
	{
		forboth(lc, relids, lc2, a->tombstoned)
		{
			List	   *tids = IdemRowsNotSeen(lfirst_oid(lc), seen);

			if (tids != NIL)
			{
				Snapshot	latest = RegisterSnapshot(GetLatestSnapshot());

				*(int64 *) lfirst(lc2) +=
					t->tombstones(lfirst_oid(lc), p->as_of, false, latest, tids);
				UnregisterSnapshot(latest);
			}
			list_free_deep(tids);
		}
		UnregisterSnapshot(seen);
	}

	/* one statement: one dependency walk for all of them */
	if (a->names != NIL)
		IdemExecDDL(sql.data);
	/* their filters go when the drop commits */
	if (t == &tombstones_table)
	{
		foreach(lc, relids)
			IdemTombFilterDropped(IdemTombstoneRelid(), lfirst_oid(lc));
	}
}

void
IdemMaintRetention(IdemMaintPass *p, IdemPartitionedTable table)
{
	const MaintTable *t = partitioned_tables[table];
	DropArgs	a = {t, NIL, NIL, NIL, NIL};
	ListCell   *lc;

	IdemMaintStepBegin(p);
	/* a schema older than 0.3.0 has no tombstones */
	if (t == &tombstones_table && !IdemTombstonesActive())
	{
		IdemMaintStepEnd(p);
		return;
	}
	foreach(lc, IdemListPartitions(p, t))
	{
		MaintRange *r = lfirst(lc);

		if (r->hi_inf || r->hi > p->as_of)
			continue;
		if (p->preview)
		{
			char	   *relname = get_rel_name(r->relid);

			if (relname == NULL)
				continue;
			if (t->tombstones != NULL && IdemTombstonesActive())
			{
				int64		n = t->tombstones(r->relid, p->as_of, true, NULL, NIL);

				if (n > 0)
					IdemMaintReport(p, IDEM_MAINT_TOMBSTONE, relname, n);
			}
			IdemMaintReport(p, IDEM_MAINT_DROP, relname,
							IdemPartitionEstimate(r->relid));
		}
		else
			a.ranges = lappend(a.ranges, r);
	}
	if (a.ranges != NIL &&
		IdemRunWithLockTimeout(p, true, t->name, IdemDropPartitions, &a))
	{
		ListCell   *lc2;
		ListCell   *lc3;

		forthree(lc, a.names, lc2, a.estimates, lc3, a.tombstoned)
		{
			if (*(int64 *) lfirst(lc3) > 0)
				IdemMaintReport(p, IDEM_MAINT_TOMBSTONE, lfirst(lc),
								*(int64 *) lfirst(lc3));
			IdemMaintReport(p, IDEM_MAINT_DROP, lfirst(lc), *(int64 *) lfirst(lc2));
		}
	}
	IdemMaintStepEnd(p);
}

/*
 * Expired rows leave the default partition (it should hold few rows),
 * leaving their tombstones.
 */
void
IdemMaintPurgeKeysDefault(IdemMaintPass *p)
{
	int64		n;
	int64		tombstoned = 0;

	IdemMaintStepBegin(p);
	if (!IdemTombstonesActive())
		n = p->preview ? IdemDefaultCount(&keys_table, NULL, p->as_of) :
			IdemKeystorePurgeDefault(p->as_of);
	else if (p->preview)
	{
		n = IdemDefaultCount(&keys_table, NULL, p->as_of);
		if (n > 0)
			tombstoned = IdemTombstonesOfPartition(get_relname_relid("keys_default",
																	 get_namespace_oid(IDEM_SCHEMA, false)),
												   p->as_of, true, NULL, NIL);
	}
	else
		n = IdemTombstonePurgeKeysDefault(p->as_of, &tombstoned);
	if (tombstoned > 0)
		IdemMaintReport(p, IDEM_MAINT_TOMBSTONE, "keys_default", tombstoned);
	if (n > 0)
		IdemMaintReport(p, IDEM_MAINT_PURGE, "keys_default", n);
	IdemMaintStepEnd(p);
}

/* Expired tombstones leave the default partition of tombstones. */
void
IdemMaintPurgeTombstonesDefault(IdemMaintPass *p)
{
	int64		n;

	IdemMaintStepBegin(p);
	if (!IdemTombstonesActive())
		n = 0;					/* a schema older than 0.3.0 */
	else if (p->preview)
		n = IdemDefaultCount(&tombstones_table, NULL, p->as_of);
	else
		n = IdemTombstonePurgeDefault(p->as_of);
	if (n > 0)
		IdemMaintReport(p, IDEM_MAINT_PURGE, "tombstones_default", n);
	IdemMaintStepEnd(p);
}
