/*-------------------------------------------------------------------------
 *
 * maintenance.c
 *	  One maintenance pass over idempotency.keys (and the tombstones of its
 *	  expired keys, idempotency.tombstones), and the SQL function
 *	  idem_maintenance() that runs it.  The pass decides; the rows it reads
 *	  and changes are read and changed by the key store (keystore.c), and
 *	  only the partitions themselves (made, attached, dropped by DDL) are
 *	  handled here.
 *
 *	  A pass, in this order:
 *	  1. stale leases: in_progress rows past locked_until (and not expired)
 *	     become 'unknown', or are settled by the endpoint's resolver (each
 *	     call cut off after idempotency.resolver_timeout);
 *	  2. premake of idempotency.tombstones (as in 3), so that the
 *	     tombstones written next land in dated partitions;
 *	  3. purge: expired rows leave the default partition, leaving their
 *	     tombstones (tombstone.c) in the same statement;
 *	  4. premake: dated partitions cover from as_of to as_of + max_ttl + one
 *	     partition_interval; rows of a new partition's range are first moved
 *	     out of the default partition;
 *	  5. retention: partitions whose range has ended are dropped whole,
 *	     after the tombstones of their rows are written;
 *	  6. retention of idempotency.tombstones, and expired tombstones leave
 *	     its default partition.
 *
 *	  Steps 2 to 6 serve both partitioned tables through one description of
 *	  each (MaintTable).
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

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "partitioning/partbounds.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"

#include "ddl_guard.h"
#include "idempotency.h"
#include "audit.h"
#include "endpoint.h"
#include "guc.h"
#include "keygen.h"
#include "keystore.h"
#include "maintenance.h"
#include "resolver.h"
#include "response.h"
#include "stats.h"
#include "tombstone.h"

/* DDL waits at most this long for its lock, then the step is skipped */
#define IDEM_MAINT_LOCK_TIMEOUT_MS	"100"

#define IDEM_SCHEMA		"idempotency"

typedef struct MaintPass
{
	TimestampTz as_of;
	bool		own_xacts;
	bool		preview;		/* report what would be done, do nothing */
	IdemMaintEmit emit;
	void	   *arg;
	int			guc_nest;
	MemoryContext cxt;			/* lives as long as the pass */
} MaintPass;

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
	/* how far beyond as_of + width partitions are made, microseconds */
	int64		(*ahead) (void);
	/* tombstones of a partition about to be dropped, or NULL */
	int64		(*tombstones) (Oid relid, TimestampTz as_of, bool count_only);
} MaintTable;

static int64
IdemKeysWidth(void)
{
	return (int64) idem_partition_interval * USECS_PER_SEC;
}

static int64
IdemKeysAhead(void)
{
	return (int64) idem_max_ttl * USECS_PER_SEC;
}

static int64
IdemTombstonesWidth(void)
{
	return (int64) idem_tombstone_partition_interval * USECS_PER_SEC;
}

/* a key expires up to max_ttl ahead, its tombstone up to the longest ttl later */
static int64
IdemTombstonesAhead(void)
{
	return ((int64) idem_max_ttl + IdemTombstoneMaxTtl()) * USECS_PER_SEC;
}

static const MaintTable keys_table = {
	"keys", "keys_default", "keys_p",
	", UNIQUE (key, endpoint, tenant)",
	"CREATE INDEX %s_lease_idx ON %s (locked_until) WHERE state = 'in_progress'",
	"_key_endpoint_tenant_key",	/* the UNIQUE constraint's index */
	IdemKeystoreRelid, IdemKeysWidth, IdemKeysAhead, IdemKeystoreTombstones
};

static const MaintTable tombstones_table = {
	"tombstones", "tombstones_default", "tombstones_p",
	"",
	"CREATE INDEX %s_scope_idx ON %s (scope_hash)",
	NULL,						/* no unique index: FULL (four short columns) */
	IdemTombstoneRelid, IdemTombstonesWidth, IdemTombstonesAhead, NULL
};

typedef enum LeaseOutcome
{
	LEASE_UNKNOWN,
	LEASE_COMPLETED,
	LEASE_FAILED,
	LEASE_RESOLVER_ERROR,
	LEASE_GONE					/* changed meanwhile: nothing done */
} LeaseOutcome;

static const char *const lease_outcome_kinds[] = {
	[LEASE_UNKNOWN] = "lease_unknown",
	[LEASE_COMPLETED] = "lease_completed",
	[LEASE_FAILED] = "lease_failed",
	[LEASE_RESOLVER_ERROR] = "resolver_error",
	[LEASE_GONE] = NULL,
};

/* ---------------------------------------------------------------------
 * Transactions, settings and locks
 * ---------------------------------------------------------------------
 */

/*
 * Begin one step: a transaction of its own for the worker, SPI, and the
 * settings every step runs with.
 */
static void
IdemStepBegin(MaintPass *p)
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

static void
IdemStepEnd(MaintPass *p)
{
	AtEOXact_GUC(true, p->guc_nest);
	SPI_finish();
	if (p->own_xacts)
	{
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
}

static void
IdemEmit(MaintPass *p, const char *kind, const char *object, int64 rows)
{
	p->emit(p->arg, kind, object, rows);
}

typedef struct LockTimeoutCall
{
	MaintPass  *p;
	void		(*fn) (MaintPass *p, void *arg);
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
IdemRunWithLockTimeout(MaintPass *p, bool dropping, const char *object,
					   void (*fn) (MaintPass *p, void *arg), void *arg)
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
	IdemEmit(p, "skipped", object, -1);
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

/*
 * The lock that keeps two passes of this database apart: session-level for
 * the worker (which commits between steps), transaction-level otherwise.
 */
static void
IdemPassLockTag(LOCKTAG *tag)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, 0, 0, IDEM_LOCKTAG_MAINTENANCE);
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

/* What logs show of a key: idem_key_hash(tenant, endpoint, key). */
static char *
IdemLeaseKeyHash(const IdemStaleLease *l)
{
	char	   *out = palloc(IDEM_KEY_HASH_LEN + 1);

	IdemKeyHash(l->tenant, strlen(l->tenant), l->endpoint, strlen(l->endpoint),
				l->key, strlen(l->key), out);
	return out;
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
IdemListPartitions(MaintPass *p, const MaintTable *t)
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
 * The ranges to make so that [as_of, as_of + max_ttl + one interval) is
 * covered: every partition_interval slot, less what existing partitions
 * already cover (they may have another width when the setting changed).
 */
static List *
IdemPlanPremake(MaintPass *p, const MaintTable *t, List *existing)
{
	int64		width = t->width();
	TimestampTz horizon = p->as_of + t->ahead() + width;
	TimestampTz slot;
	List	   *plan = NIL;
	MemoryContext old = MemoryContextSwitchTo(p->cxt);

	for (slot = IdemSlotStart(p->as_of, width); slot < horizon; slot += width)
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
				continue;		/* wholly before */
			if (!r->lo_inf && r->lo >= end)
				break;			/* wholly after, as are the rest */
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
										"SELECT count(*) FROM ONLY %s"
										" WHERE expires_at >= $2 AND expires_at < $1" :
										"SELECT count(*) FROM ONLY %s"
										" WHERE expires_at <= $1", qname),
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
								" WHERE expires_at >= $1 AND expires_at < $2 LIMIT 1",
								IdemDefaultName(t)),
					   2, argtypes, args, NULL, false, SPI_OK_SELECT) > 0;
}

/*
 * Move the rows of the default partition of t whose expires_at is in
 * [lo, hi) into the table target (a partition about to be attached);
 * returns how many.
 */
static int64
IdemDefaultMoveRows(const MaintTable *t, TimestampTz lo, TimestampTz hi,
					const char *target)
{
	Oid			argtypes[2] = {TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		args[2] = {TimestampTzGetDatum(lo), TimestampTzGetDatum(hi)};

	return (int64) IdemSpiExec(psprintf("WITH moved AS (DELETE FROM ONLY %s"
										" WHERE expires_at >= $1 AND expires_at < $2 RETURNING *)"
										" INSERT INTO %s SELECT * FROM moved",
										IdemDefaultName(t), target),
							   2, argtypes, args, NULL, false, SPI_OK_INSERT);
}

typedef struct CreateArgs
{
	const MaintTable *table;
	MaintRange *range;
	char	   *name;
	int64		moved;
} CreateArgs;

/*
 * Make one partition: a standalone table with a CHECK constraint matching
 * its range (so that ATTACH need not scan it), the rows of its range moved
 * out of the default partition, then ATTACH.  Claims keep running against
 * the parent (ATTACH takes SHARE UPDATE EXCLUSIVE on it); only the default
 * partition is locked exclusively, and only for as long as the step lasts.
 */
static void
IdemCreatePartition(MaintPass *p, void *arg)
{
	CreateArgs *a = arg;
	const MaintTable *t = a->table;
	char	   *qname = quote_qualified_identifier(IDEM_SCHEMA, a->name);
	char	   *lo = IdemUtcLiteral(a->range->lo);
	char	   *hi = IdemUtcLiteral(a->range->hi);
	char	   *lock_parent_exclusive = psprintf("LOCK TABLE ONLY idempotency.%s IN ACCESS EXCLUSIVE MODE",
												 t->name);
	StringInfoData sql;

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

	/* rows that arrived meanwhile */
	if (IdemDefaultHasRows(t, a->range->lo, a->range->hi))
		IdemExecDDL(lock_parent_exclusive);

	a->moved = IdemDefaultMoveRows(t, a->range->lo, a->range->hi, qname);

	resetStringInfo(&sql);
	appendStringInfo(&sql,
					 "ALTER TABLE idempotency.%s ATTACH PARTITION %s FOR VALUES FROM (%s) TO (%s)",
					 t->name, qname, lo, hi);
	IdemExecDDL(sql.data);
}

static void
IdemPremake(MaintPass *p, const MaintTable *t)
{
	List	   *plan;
	ListCell   *lc;

	IdemStepBegin(p);
	/* no tombstone is kept anywhere: none of their partitions either */
	if (t == &tombstones_table && IdemTombstoneMaxTtl() <= 0)
		plan = NIL;
	else
		plan = IdemPlanPremake(p, t, IdemListPartitions(p, t));
	IdemStepEnd(p);

	foreach(lc, plan)
	{
		CreateArgs	a;
		MemoryContext old;

		IdemStepBegin(p);
		a.table = t;
		a.range = lfirst(lc);
		old = MemoryContextSwitchTo(p->cxt);
		a.name = IdemPartitionName(t->prefix, a.range->lo);
		MemoryContextSwitchTo(old);
		a.moved = 0;
		if (p->preview)
			IdemEmit(p, "create", a.name, IdemDefaultCount(t, &a.range->lo, a.range->hi));
		else if (IdemRunWithLockTimeout(p, false, a.name, IdemCreatePartition, &a))
			IdemEmit(p, "create", a.name, a.moved);
		IdemStepEnd(p);
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
 * Drop partitions whose range has ended.  Dropping a partition takes ACCESS
 * EXCLUSIVE on the parent: it is taken once, with the short lock_timeout,
 * for all of them, in the last step of the pass.  The tombstones of a
 * partition of keys are written first, before that lock, in the same
 * subtransaction, so that they are written once: claims keep running while
 * they are written (the partition's rows are all expired, and a claim that
 * has no live row reads them or their tombstones), and when the lock is
 * not granted, they go with the partition's drop.
 */
static void
IdemDropPartitions(MaintPass *p, void *arg)
{
	DropArgs   *a = arg;
	const MaintTable *t = a->table;
	ListCell   *lc;
	StringInfoData sql;
	MemoryContext old;

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
		if (t->tombstones != NULL && IdemTombstonesActive())
			tombstoned = t->tombstones(r->relid, p->as_of, false);
		if (a->names != NIL)
			appendStringInfoString(&sql, ", ");
		appendStringInfoString(&sql, quote_qualified_identifier(nspname, relname));

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

	/* one statement: one dependency walk for all of them */
	if (a->names != NIL)
		IdemExecDDL(sql.data);
}

static void
IdemRetention(MaintPass *p, const MaintTable *t)
{
	DropArgs	a = {t, NIL, NIL, NIL, NIL};
	ListCell   *lc;

	IdemStepBegin(p);
	/* a schema older than 0.3.0 has no tombstones */
	if (t == &tombstones_table && !IdemTombstonesActive())
	{
		IdemStepEnd(p);
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
				int64		n = t->tombstones(r->relid, p->as_of, true);

				if (n > 0)
					IdemEmit(p, "tombstone", relname, n);
			}
			IdemEmit(p, "drop", relname, IdemPartitionEstimate(r->relid));
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
				IdemEmit(p, "tombstone", lfirst(lc), *(int64 *) lfirst(lc3));
			IdemEmit(p, "drop", lfirst(lc), *(int64 *) lfirst(lc2));
		}
	}
	IdemStepEnd(p);
}

/*
 * Expired rows leave the default partition (it should hold few rows),
 * leaving their tombstones.
 */
static void
IdemPurgeDefault(MaintPass *p)
{
	int64		n;
	int64		tombstoned = 0;

	IdemStepBegin(p);
	if (!IdemTombstonesActive())
		n = p->preview ? IdemDefaultCount(&keys_table, NULL, p->as_of) :
			IdemKeystorePurgeDefault(p->as_of);
	else if (p->preview)
	{
		n = IdemDefaultCount(&keys_table, NULL, p->as_of);
		if (n > 0)
			tombstoned = IdemKeystoreTombstones(get_relname_relid("keys_default",
																  get_namespace_oid(IDEM_SCHEMA, false)),
												p->as_of, true);
	}
	else
		n = IdemKeystorePurgeDefaultToTombstones(p->as_of, &tombstoned);
	if (tombstoned > 0)
		IdemEmit(p, "tombstone", "keys_default", tombstoned);
	if (n > 0)
		IdemEmit(p, "purge", "keys_default", n);
	IdemStepEnd(p);
}

/* Expired tombstones leave the default partition of tombstones. */
static void
IdemPurgeTombstonesDefault(MaintPass *p)
{
	int64		n;

	IdemStepBegin(p);
	if (!IdemTombstonesActive())
		n = 0;					/* a schema older than 0.3.0 */
	else if (p->preview)
		n = IdemDefaultCount(&tombstones_table, NULL, p->as_of);
	else
		n = IdemTombstonePurgeDefault(p->as_of);
	if (n > 0)
		IdemEmit(p, "purge", "tombstones_default", n);
	IdemStepEnd(p);
}

/* ---------------------------------------------------------------------
 * Stale leases
 * ---------------------------------------------------------------------
 */

static void
IdemReportLease(const IdemStaleLease *l, const char *to_state, int status)
{
	IdemTransition t;

	memset(&t, 0, sizeof(t));
	t.tenant = l->tenant;
	t.endpoint = l->endpoint;
	t.key = l->key;
	t.fingerprint = l->fingerprint;
	t.from_state = "in_progress";
	t.to_state = to_state;
	t.replayed = false;
	t.response_status = status;
	t.started = l->created_at;
	IdemReportTransition(&t);
}

typedef struct ResolveArgs
{
	const IdemStaleLease *lease;
	const IdemEndpointPolicy *policy;
	LeaseOutcome outcome;
	int			status;
} ResolveArgs;

/* Call the resolver and apply its answer; runs in a subtransaction. */
static void
IdemResolveLease(MaintPass *p, ResolveArgs *a)
{
	const IdemStaleLease *l = a->lease;
	Oid			resolver;
	FmgrInfo	flinfo;

	LOCAL_FCINFO(fcinfo, 3);
	Datum		answer;
	Oid			types[2] = {JSONBOID, TEXTOID};
	Datum		values[2];
	int			rc;
	bool		isnull;
	char	   *status_type;
	char	   *status_text;
	IdemResponse resp;
	Oid			role;
	IdemUserSwitch user;

	/*
	 * The function is found again by its name at each call; it, and the
	 * role, may have changed since the row was written.
	 */
	role = IdemResolverRole(l->endpoint, a->policy->resolver_name, &resolver);
	IdemResolverCheckSignature(resolver, l->endpoint);
	IdemResolverCheckRole(resolver, role, l->endpoint);

	fmgr_info(resolver, &flinfo);
	InitFunctionCallInfoData(*fcinfo, &flinfo, 3, DEFAULT_COLLATION_OID, NULL, NULL);
	fcinfo->args[0].value = CStringGetTextDatum(l->tenant);
	fcinfo->args[0].isnull = false;
	fcinfo->args[1].value = CStringGetTextDatum(l->endpoint);
	fcinfo->args[1].isnull = false;
	fcinfo->args[2].value = CStringGetTextDatum(l->key);
	fcinfo->args[2].isnull = false;

	/*
	 * The resolver runs as the endpoint's resolver_role (the role that set
	 * it), not as the pass (the extension's owner), and may not change
	 * session state: whoever may edit idempotency.endpoints can name a
	 * resolver, but not run code with rights they do not have.  A SECURITY
	 * DEFINER resolver runs as its owner, who lent those rights by granting
	 * EXECUTE.  An error restores the user with the subtransaction.
	 */
	IdemSwitchUser(&user, role, SECURITY_RESTRICTED_OPERATION);
	answer = FunctionCallInvoke(fcinfo);
	IdemRestoreUser(&user);

	if (fcinfo->isnull)
	{
		/* no business record: the operation did not happen */
		if (IdemKeystoreSettleLease(l, p->as_of, IDEM_STATE_FAILED,
									"resolver found no business record", NULL))
			a->outcome = LEASE_FAILED;
		else
			a->outcome = LEASE_GONE;
		return;
	}

	/* pick the answer apart */
	values[0] = answer;
	values[1] = CStringGetTextDatum("UTF8");
	rc = SPI_execute_with_args("SELECT jsonb_typeof($1),"
							   " jsonb_typeof($1 -> 'status'), $1 ->> 'status',"
							   " jsonb_typeof($1 -> 'headers'), $1 -> 'headers',"
							   " convert_to(($1 -> 'body')::text, $2)",
							   2, types, values, NULL, true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "reading a resolver's answer failed: %s", SPI_result_code_string(rc));

	status_type = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
	status_text = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3);
	{
		char	   *top = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		char	   *headers_type = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 4);
		char	   *end = NULL;
		long		status = 0;
		Datum		body;

		if (status_text != NULL)
		{
			errno = 0;
			status = strtol(status_text, &end, 10);
		}
		if (top == NULL || strcmp(top, "object") != 0 ||
			status_type == NULL || strcmp(status_type, "number") != 0 ||
			end == NULL || *end != '\0' || errno != 0 || status < 100 || status > 599 ||
			(headers_type != NULL && strcmp(headers_type, "null") != 0 &&
			 strcmp(headers_type, "object") != 0))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("resolver %s of endpoint \"%s\" returned an invalid answer",
							format_procedure(resolver), l->endpoint),
					 errdetail("A resolver returns NULL or a JSON object with an integer \"status\" from 100 to 599, an optional \"body\" and an optional object \"headers\".")));

		memset(&resp, 0, sizeof(resp));
		resp.status = (int32) status;
		if (headers_type != NULL && strcmp(headers_type, "object") == 0)
			resp.headers = DatumGetJsonbP(SPI_getbinval(SPI_tuptable->vals[0],
														SPI_tuptable->tupdesc, 5, &isnull));
		/* no "body": NULL, which must not be detoasted */
		body = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 6, &isnull);
		if (isnull)
		{
			resp.body = NULL;
			resp.body_kind = IDEM_BODY_NONE;
		}
		else
		{
			resp.body = DatumGetByteaP(body);
			resp.body_kind = IDEM_BODY_JSON;
		}
	}

	/* what the endpoint keeps of it (headers, size cap, encryption) */
	IdemResponseForStorage(a->policy, &resp);

	if (!IdemKeystoreSettleLease(l, p->as_of, IDEM_STATE_COMPLETED, NULL, &resp))
		a->outcome = LEASE_GONE;
	else
	{
		a->outcome = LEASE_COMPLETED;
		a->status = resp.status;
	}
}

typedef struct ResolveCall
{
	MaintPass  *p;
	ResolveArgs *a;
} ResolveCall;

static void
IdemCallResolveLease(void *arg)
{
	ResolveCall *c = (ResolveCall *) arg;

	IdemResolveLease(c->p, c->a);
}

/*
 * idempotency.resolver_timeout: a timeout of this process's own, which
 * cancels the resolver's call the way a statement timeout cancels a query
 * (the resolver sees a query cancel at its next interrupt check).
 */
static volatile sig_atomic_t resolver_timed_out = false;
static TimeoutId resolver_timeout_id;
static bool resolver_timeout_registered = false;

static void
IdemResolverTimeoutHandler(void)
{
	resolver_timed_out = true;
	InterruptPending = true;
	QueryCancelPending = true;
	SetLatch(MyLatch);
}

/*
 * Settle one stale lease through the endpoint's resolver.  A resolver that
 * raises, or does not answer within idempotency.resolver_timeout, leaves the
 * row as it was: the error is logged and the pass goes on.
 */
static LeaseOutcome
IdemResolveLeaseGuarded(MaintPass *p, const IdemStaleLease *l,
						const IdemEndpointPolicy *policy, int *status)
{
	ResolveArgs a;
	ResolveCall c = {p, &a};
	ErrorData  *edata;
	int			timeout_ms = idem_resolver_timeout;
	bool		timed_out;

	a.lease = l;
	a.policy = policy;
	a.outcome = LEASE_RESOLVER_ERROR;
	a.status = -1;

	if (timeout_ms > 0 && !resolver_timeout_registered)
	{
		resolver_timeout_id = RegisterTimeout(USER_TIMEOUT, IdemResolverTimeoutHandler);
		resolver_timeout_registered = true;
	}
	resolver_timed_out = false;
	if (timeout_ms > 0)
		enable_timeout_after(resolver_timeout_id, timeout_ms);
	edata = IdemRunInSubtransaction(IdemCallResolveLease, &c);
	if (timeout_ms > 0)
		disable_timeout(resolver_timeout_id, false);
	timed_out = resolver_timed_out;
	if (timed_out)
	{
		/* the cancel was this timeout's: none is left for the pass */
		QueryCancelPending = false;
		resolver_timed_out = false;
	}

	if (edata != NULL)
	{
		/* a cancel (not the timeout's) or shutdown stops the pass */
		if ((edata->sqlerrcode == ERRCODE_QUERY_CANCELED && !timed_out) ||
			edata->sqlerrcode == ERRCODE_ADMIN_SHUTDOWN)
			ReThrowError(edata);

		if (timed_out)
			ereport(WARNING,
					(errmsg("idempotency resolver of endpoint \"%s\" did not answer within %d ms for tenant \"%s\", key hash %s",
							l->endpoint, timeout_ms, l->tenant, IdemLeaseKeyHash(l)),
					 errdetail("The key stays in_progress; the next maintenance pass calls the resolver again."),
					 errhint("A resolver should only look the operation up; raise idempotency.resolver_timeout if it needs longer.")));
		else
			ereport(WARNING,
					(errmsg("idempotency resolver of endpoint \"%s\" failed for tenant \"%s\", key hash %s: %s",
							l->endpoint, l->tenant, IdemLeaseKeyHash(l), edata->message),
					 errdetail("The key stays in_progress; the next maintenance pass calls the resolver again.")));
		FreeErrorData(edata);
		a.outcome = LEASE_RESOLVER_ERROR;
	}

	*status = a.status;
	return a.outcome;
}

typedef struct LeaseCount
{
	char	   *endpoint;
	int64		n[LEASE_GONE];
} LeaseCount;

/*
 * Preview of step 1: per endpoint, the stale leases that a pass would give
 * to the endpoint's resolver ("lease_resolve") or mark unknown.
 */
static void
IdemStaleLeasesPreview(MaintPass *p)
{
	int			nrows;
	char	  **endpoints;
	int64	   *counts;

	nrows = IdemKeystoreCountStaleLeases(p->as_of, &endpoints, &counts);
	for (int i = 0; i < nrows; i++)
	{
		const IdemEndpointPolicy *policy = IdemGetEndpointPolicy(endpoints[i]);

		IdemEmit(p, policy->resolve_on_expiry && policy->has_resolver ?
				 "lease_resolve" : "lease_unknown", endpoints[i], counts[i]);
	}
}

static void
IdemStaleLeases(MaintPass *p)
{
	int			nrows;
	IdemStaleLease *leases;
	List	   *counts = NIL;
	ListCell   *lc;

	IdemStepBegin(p);
	if (p->preview)
	{
		IdemStaleLeasesPreview(p);
		IdemStepEnd(p);
		return;
	}
	nrows = IdemKeystoreStaleLeases(p->as_of, &leases);

	for (int i = 0; i < nrows; i++)
	{
		IdemStaleLease *l = &leases[i];
		IdemEndpointPolicy policy = *IdemGetEndpointPolicy(l->endpoint);
		LeaseOutcome outcome;
		int			status = -1;
		LeaseCount *count = NULL;

		CHECK_FOR_INTERRUPTS();

		if (policy.resolve_on_expiry && policy.has_resolver)
			outcome = IdemResolveLeaseGuarded(p, l, &policy, &status);
		else
			outcome = IdemKeystoreSettleLease(l, p->as_of, IDEM_STATE_UNKNOWN,
											  NULL, NULL) ?
				LEASE_UNKNOWN : LEASE_GONE;

		/* counted once per key: when its state changed */
		if (outcome == LEASE_UNKNOWN || outcome == LEASE_COMPLETED ||
			outcome == LEASE_FAILED)
			IdemStatsCount(l->endpoint, IDEM_COUNT_LEASES_EXPIRED);

		switch (outcome)
		{
			case LEASE_UNKNOWN:
				ereport(WARNING,
						(errmsg("idempotency lease expired: tenant \"%s\", endpoint \"%s\", key hash %s is now unknown",
								l->tenant, l->endpoint, IdemLeaseKeyHash(l)),
						 errdetail("Its holder neither finished nor renewed the lease in time; duplicates get outcome_pending until an operator resolves the key."),
						 errhint("Record the real outcome with idempotency.idem_resolve().")));
				IdemReportLease(l, "unknown", -1);
				break;
			case LEASE_COMPLETED:
				IdemStatsCount(l->endpoint, IDEM_COUNT_RESOLVED);
				IdemReportLease(l, "completed", status);
				break;
			case LEASE_FAILED:
				IdemStatsCount(l->endpoint, IDEM_COUNT_RESOLVED);
				IdemReportLease(l, "failed", -1);
				break;
			case LEASE_RESOLVER_ERROR:
			case LEASE_GONE:
				break;
		}
		if (outcome == LEASE_GONE)
			continue;

		/* one result row per endpoint and outcome; rows come by endpoint */
		if (counts != NIL)
		{
			count = llast(counts);
			if (strcmp(count->endpoint, l->endpoint) != 0)
				count = NULL;
		}
		if (count == NULL)
		{
			count = palloc0(sizeof(LeaseCount));
			count->endpoint = l->endpoint;
			counts = lappend(counts, count);
		}
		count->n[outcome]++;
	}

	foreach(lc, counts)
	{
		LeaseCount *count = lfirst(lc);
		int			o;

		for (o = 0; o < LEASE_GONE; o++)
			if (count->n[o] > 0)
				IdemEmit(p, lease_outcome_kinds[o], count->endpoint, count->n[o]);
	}
	IdemStepEnd(p);
}

/* ---------------------------------------------------------------------
 * The pass
 * ---------------------------------------------------------------------
 */

static void
IdemPassInit(MaintPass *p, TimestampTz as_of, bool own_xacts,
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
IdemSubscription(MaintPass *p)
{
	char	   *result = NULL;

	if (SPI_execute("SELECT s.subname::text"
					" FROM pg_catalog.pg_subscription_rel r"
					" JOIN pg_catalog.pg_subscription s ON s.oid = r.srsubid"
					" JOIN pg_catalog.pg_class c ON c.oid = r.srrelid"
					" JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass"
					"  AND d.objid = c.oid AND d.deptype = 'e'"
					" JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid"
					"  AND e.extname = 'idempotency'"
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
 * The steps.  In the Citus mode (README "Citus") stale leases and the
 * default partition's purge run on every node, on its own shards; only the
 * coordinator makes and drops partitions, which Citus carries to the shards.
 */
static void
IdemRunSteps(MaintPass *p)
{
	IdemKeysNode node;
	char	   *subscription;

	IdemStepBegin(p);
	node = IdemKeystoreNode();
	subscription = IdemSubscription(p);
	IdemStepEnd(p);
	if (subscription)
	{
		ereport(p->own_xacts ? LOG : NOTICE,
				(errmsg("idempotency maintenance skipped: subscription \"%s\" replicates the extension's tables into this database",
						subscription),
				 errdetail("A logical replica keeps the publisher's keys as they come; maintenance runs here once the subscription is dropped."),
				 errhint("At the switch-over, drop the subscription (doc/operations.md, \"Logical replication and blue/green switch-over\").")));
		IdemEmit(p, "skipped", "subscription", -1);
		return;
	}
	IdemStaleLeases(p);
	/* tombstones land in dated partitions, made first */
	IdemPremake(p, &tombstones_table);
	IdemPurgeDefault(p);
	/* a Citus worker: the coordinator makes and drops the partitions */
	if (node == IDEM_KEYS_CITUS_WORKER)
		return;
	IdemPremake(p, &keys_table);
	IdemRetention(p, &keys_table);
	IdemRetention(p, &tombstones_table);
	IdemPurgeTombstonesDefault(p);
}

/*
 * What a pass as of as_of would do, in the caller's transaction, doing
 * nothing: it takes no lock but those of its reads, calls no resolver and
 * counts, logs and audits nothing.
 */
void
IdemMaintenancePreview(TimestampTz as_of, IdemMaintEmit emit, void *arg)
{
	MaintPass	p;

	IdemPassInit(&p, as_of, false, emit, arg);
	p.preview = true;
	p.cxt = CurrentMemoryContext;
	IdemRunSteps(&p);
}

bool
IdemMaintenancePass(TimestampTz as_of, bool own_xacts,
					IdemMaintEmit emit, void *arg)
{
	MaintPass	p;
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
			IdemEmit(&p, "busy", NULL, -1);
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
			IdemEmit(&p, "busy", NULL, -1);
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
IdemEmitTuple(void *arg, const char *kind, const char *object, int64 rows)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) arg;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	values[0] = CStringGetTextDatum(kind);
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
