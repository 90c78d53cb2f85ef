/*-------------------------------------------------------------------------
 *
 * keystore.c
 *	  The key store (keystore.h): the SQL statements on rows of
 *	  idempotency.keys.  The key store is the only code that knows where
 *	  and how a key row is stored.  It is split by concern, as an index
 *	  access method is: where a scope's rows live, the relation, its
 *	  partitions, the Citus shard and their caches (keystore_rel.c); the
 *	  probes and direct inserts of the hot paths, and the row codec
 *	  (keystore_direct.c); the statements (this file); keystore_int.h holds
 *	  what they share.
 *
 *	  The statements run through SPI as the owner of the table: the
 *	  protocol's rarer changes of a row (the lock of a leased claim, its
 *	  finish, fail, release, heartbeat and resolve; the delete of a scope's
 *	  expired rows) and maintenance's (stale leases, the default
 *	  partition).  The one statement on key rows elsewhere is maintenance's
 *	  purge of the default partition that leaves tombstones in the same
 *	  statement (tombstone_write.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"

#include "keystore_int.h"
#include "util.h"

/* ----------------------------------------------------------------
 *		statements on a scope's rows
 * ----------------------------------------------------------------
 */

/* The statements on a scope's rows, prepared once per backend. */
typedef enum IdemStmt
{
	STMT_LOOKUP_FOR_UPDATE,
	STMT_DELETE_EXPIRED,
	STMT_DELETE_LIVE,
	STMT_COMPLETE,
	STMT_FAIL,
	STMT_HEARTBEAT,
	NUM_STMTS
} IdemStmt;

#define SCOPE_WHERE \
	" WHERE tenant OPERATOR(pg_catalog.=) $1 AND endpoint OPERATOR(pg_catalog.=) $2" \
	" AND key OPERATOR(pg_catalog.=) $3"
#define LIVE_WHERE	SCOPE_WHERE " AND expires_at OPERATOR(pg_catalog.>) $4"

typedef struct IdemStmtDef
{
	const char *sql;			/* on the relation (%s), by scope */
	const char *by_tid;			/* on one partition (%s), by ctid, which is
								 * the parameter after sql's; or NULL */
	int			nargs;			/* of sql */
	Oid			argtypes[17];
} IdemStmtDef;

#define SCOPE_TYPES TEXTOID, TEXTOID, TEXTOID
#define RESPONSE_TYPES INT4OID, JSONBOID, TEXTOID, BOOLOID, BYTEAOID, TEXTOID

#define COMPLETE_SET \
	" SET state = 'completed', completed_at = $4," \
	" locked_until = NULL, fail_reason = NULL, response_status = $5," \
	" response_headers = $6, body_kind = $7, body_encrypted = $8," \
	" response_body = $9, body_ref = $10"
#define FAIL_SET	" SET state = $5, fail_reason = $6, locked_until = NULL"
#define HEARTBEAT_SET " SET locked_until = $5"

static const IdemStmtDef stmt_defs[NUM_STMTS] = {
	[STMT_LOOKUP_FOR_UPDATE] = {
		"SELECT " IDEM_ROW_COLUMNS " FROM %s" LIVE_WHERE " FOR UPDATE",
		"SELECT 1 FROM ONLY %s WHERE ctid OPERATOR(pg_catalog.=) $5 FOR UPDATE",
		4, {SCOPE_TYPES, TIMESTAMPTZOID}
	},
	[STMT_DELETE_EXPIRED] = {
		"DELETE FROM %s" SCOPE_WHERE " AND expires_at OPERATOR(pg_catalog.<=) $4",
		NULL,
		4, {SCOPE_TYPES, TIMESTAMPTZOID}
	},
	[STMT_DELETE_LIVE] = {
		"DELETE FROM %s" LIVE_WHERE,
		"DELETE FROM ONLY %s WHERE ctid OPERATOR(pg_catalog.=) $5",
		4, {SCOPE_TYPES, TIMESTAMPTZOID}
	},
	[STMT_COMPLETE] = {
		"UPDATE %s" COMPLETE_SET LIVE_WHERE,
		"UPDATE ONLY %s" COMPLETE_SET " WHERE ctid OPERATOR(pg_catalog.=) $11",
		10, {SCOPE_TYPES, TIMESTAMPTZOID, RESPONSE_TYPES}
	},
	[STMT_FAIL] = {
		"UPDATE %s" FAIL_SET LIVE_WHERE,
		"UPDATE ONLY %s" FAIL_SET " WHERE ctid OPERATOR(pg_catalog.=) $7",
		6, {SCOPE_TYPES, TIMESTAMPTZOID, TEXTOID, TEXTOID}
	},
	[STMT_HEARTBEAT] = {
		"UPDATE %s" HEARTBEAT_SET LIVE_WHERE,
		"UPDATE ONLY %s" HEARTBEAT_SET " WHERE ctid OPERATOR(pg_catalog.=) $6",
		5, {SCOPE_TYPES, TIMESTAMPTZOID, TIMESTAMPTZOID}
	},
};

/* the statements by scope, prepared for the relation stmt_relid */
static SPIPlanPtr stmt_plans[NUM_STMTS];
static Oid	stmt_relid = InvalidOid;

/* The qualified, quoted name of a relation. */
static char *
IdemRelationName(Oid relid)
{
	return quote_qualified_identifier(get_namespace_name(get_rel_namespace(relid)),
									  get_rel_name(relid));
}

/*
 * Run one of the statements with the latest snapshot, so that what
 * committed since the transaction's snapshot was taken is seen (the scope
 * lock orders the writers), as the owner of the table; returns the number
 * of rows processed.  With a row that a probe found (row->partoid valid;
 * see IdemLockProbedRow), on that version of the row only, by its ctid,
 * planned for this one call; otherwise on the scope's relation.  With
 * take, each row the statement returns is taken into it (as of now, in
 * cxt).
 */
static uint64
IdemExecOn(IdemStmt stmt, const IdemScope *scope, const IdemKeyRow *row,
		   Datum *values, const char *nulls, int expected,
		   IdemKeyRow *take, TimestampTz now, MemoryContext cxt)
{
	const IdemStmtDef *def = &stmt_defs[stmt];
	IdemOwnerSection section;
	SPIPlanPtr	plan;
	uint64		processed;
	int			rc;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	IdemBeginOwnerSection(&section, IdemExtensionOwner(), 0);
	if (row != NULL && OidIsValid(row->partoid))
	{
		Oid			argtypes[lengthof(def->argtypes) + 1];
		Datum		args[lengthof(def->argtypes) + 1];
		char		argnulls[lengthof(def->argtypes) + 1];

		Assert(def->by_tid != NULL);
		memcpy(argtypes, def->argtypes, sizeof(Oid) * def->nargs);
		memcpy(args, values, sizeof(Datum) * def->nargs);
		if (nulls)
			memcpy(argnulls, nulls, def->nargs);
		else
			memset(argnulls, ' ', def->nargs);
		argtypes[def->nargs] = TIDOID;
		args[def->nargs] = PointerGetDatum(&row->tid);
		argnulls[def->nargs] = ' ';
		plan = SPI_prepare(psprintf(def->by_tid, IdemRelationName(row->partoid)),
						   def->nargs + 1, argtypes);
		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s",
				 def->by_tid, SPI_result_code_string(SPI_result));
		rc = SPI_execute_snapshot(plan, args, argnulls, GetLatestSnapshot(),
								  InvalidSnapshot, false, true, 0);
		SPI_freeplan(plan);
	}
	else
	{
		Oid			relid = IdemKeystoreRelation(scope);

		if (relid != stmt_relid)
		{
			/* first use, or the relation was made anew */
			for (int i = 0; i < NUM_STMTS; i++)
			{
				if (stmt_plans[i] != NULL)
					SPI_freeplan(stmt_plans[i]);
				stmt_plans[i] = NULL;
			}
			stmt_relid = relid;
		}
		if (stmt_plans[stmt] == NULL)
		{
			char	   *sql = psprintf(def->sql, IdemRelationName(relid));

			plan = SPI_prepare(sql, def->nargs, (Oid *) def->argtypes);
			if (plan == NULL)
				elog(ERROR, "SPI_prepare failed for \"%s\": %s",
					 sql, SPI_result_code_string(SPI_result));
			SPI_keepplan(plan);
			stmt_plans[stmt] = plan;
		}
		rc = SPI_execute_snapshot(stmt_plans[stmt], values, nulls,
								  GetLatestSnapshot(), InvalidSnapshot,
								  false, true, 0);
	}
	if (rc != expected)
		elog(ERROR, "statement on idempotency.keys failed: %s",
			 SPI_result_code_string(rc));
	processed = SPI_processed;
	for (uint64 i = 0; take != NULL && i < processed; i++)
	{
		Datum		v[IDEM_NUM_ROW_COLUMNS];
		bool		n[IDEM_NUM_ROW_COLUMNS];

		for (int c = 0; c < IDEM_NUM_ROW_COLUMNS; c++)
			v[c] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
								 c + 1, &n[c]);
		IdemTakeRow(take, v, n, now, cxt);
	}
	IdemEndOwnerSection(&section);
	SPI_finish();
	return processed;
}

/* The first parameters of every statement: the scope, and now. */
static void
IdemScopeValues(const IdemScope *scope, TimestampTz now, Datum *values)
{
	values[0] = PointerGetDatum(scope->tenant);
	values[1] = PointerGetDatum(scope->endpoint);
	values[2] = PointerGetDatum(scope->key);
	values[3] = TimestampTzGetDatum(now);
}

/*
 * The live row of a SERIALIZABLE transaction's lease-mode call, locked.  It
 * is found by a probe, which takes no predicate locks (see IdemProbeIndex
 * in keystore_direct.c), then locked by its ctid, and the statements that
 * change it go by its ctid too (IdemExecOn); the only predicate lock taken
 * is the one on the row itself.  A statement by scope would read the
 * partition's index with predicate locks on its pages, and calls on
 * different keys whose index entries share a page (time-ordered keys always
 * do) would make each other fail.  This is sound: the call decides on the
 * version it has locked, and whoever changes the row must lock it first, so
 * the row lock orders them, as it orders the statements at the other
 * levels.  A version that was replaced after the probe is not visible to
 * the lock's (later) snapshot: the probe then finds the new one.  The old
 * version's ctid cannot be reused meanwhile, since its deleter committed
 * after this transaction's snapshot was taken.
 */
static void
IdemLockProbedRow(const IdemScope *scope, TimestampTz now, IdemKeyRow *row,
				  MemoryContext cxt)
{
	Datum		values[4];

	IdemScopeValues(scope, now, values);
	for (;;)
	{
		IdemKeystoreRead(scope, now, now, row, cxt);
		if (!row->found)
			return;
		if (IdemExecOn(STMT_LOOKUP_FOR_UPDATE, scope, row, values, NULL,
					   SPI_OK_SELECT, NULL, now, cxt) == 1)
			return;
		/* a newer version of the row committed after the probe: find it */
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * Read the scope's live row and lock it, through SPI (or see
 * IdemLockProbedRow); note whether expired rows exist.
 */
void
IdemKeystoreLock(const IdemScope *scope, TimestampTz now, IdemKeyRow *row,
				 MemoryContext cxt)
{
	Datum		values[4];

	/*
	 * Lock the parent before the statement takes its snapshot.  A maintenance
	 * pass that moves rows out of the default partition holds ACCESS
	 * EXCLUSIVE on the parent until it commits.  Waiting for it inside the
	 * statement would leave the statement a snapshot taken before the move
	 * committed, in which the row is still in the default partition, and
	 * deleted by the time it is locked: "no live claim" (IK404) at READ
	 * COMMITTED, a serialization failure above.  Waiting here, the snapshot
	 * sees the row where it was moved to, and the invalidations taken in with
	 * the lock make the statement plan for the new partition.  A transaction
	 * that already holds the lock keeps any move out until it ends.
	 *
	 * The parent and its partitions are locked in ROW EXCLUSIVE, parent
	 * first, before the statement locks any index: the statement's FOR
	 * UPDATE would take them in ROW SHARE and its UPDATE raise that to ROW
	 * EXCLUSIVE, which deadlocks with REINDEX (see IdemReadScope in
	 * keystore_direct.c).
	 */
	{
		Oid			parent = IdemKeystoreRelation(scope);

		/* find_all_inheritors locks the partitions only: the parent first */
		LockRelationOid(parent, RowExclusiveLock);
		list_free(find_all_inheritors(parent, RowExclusiveLock, NULL));
	}
	if (IsolationIsSerializable())
	{
		IdemLockProbedRow(scope, now, row, cxt);
		return;
	}
	memset(row, 0, sizeof(*row));
	IdemScopeValues(scope, now, values);
	(void) IdemExecOn(STMT_LOOKUP_FOR_UPDATE, scope, NULL, values, NULL,
					  SPI_OK_SELECT, row, now, cxt);
}

void
IdemKeystoreDeleteExpired(const IdemScope *scope, TimestampTz now)
{
	Datum		values[4];

	IdemScopeValues(scope, now, values);
	(void) IdemExecOn(STMT_DELETE_EXPIRED, scope, NULL, values, NULL,
					  SPI_OK_DELETE, NULL, now, NULL);
}

void
IdemKeystoreDelete(const IdemScope *scope, const IdemKeyRow *row,
				   TimestampTz now)
{
	Datum		values[4];

	IdemScopeValues(scope, now, values);
	(void) IdemExecOn(STMT_DELETE_LIVE, scope, row, values, NULL,
					  SPI_OK_DELETE, NULL, now, NULL);
}

void
IdemKeystoreComplete(const IdemScope *scope, const IdemKeyRow *row,
					 TimestampTz now, const IdemResponse *resp)
{
	Datum		values[10];
	char		nulls[10];

	memset(nulls, ' ', sizeof(nulls));
	IdemScopeValues(scope, now, values);
	IdemResponseValues(resp, values + 4, nulls + 4);
	(void) IdemExecOn(STMT_COMPLETE, scope, row, values, nulls,
					  SPI_OK_UPDATE, NULL, now, NULL);
}

void
IdemKeystoreFail(const IdemScope *scope, const IdemKeyRow *row,
				 TimestampTz now, IdemState outcome, const char *reason)
{
	Datum		values[6];
	char		nulls[6];

	memset(nulls, ' ', sizeof(nulls));
	IdemScopeValues(scope, now, values);
	values[4] = CStringGetTextDatum(IdemStateName(outcome));
	values[5] = reason ? CStringGetTextDatum(reason) : (Datum) 0;
	nulls[5] = reason ? ' ' : 'n';
	(void) IdemExecOn(STMT_FAIL, scope, row, values, nulls,
					  SPI_OK_UPDATE, NULL, now, NULL);
}

void
IdemKeystoreExtendLease(const IdemScope *scope, const IdemKeyRow *row,
						TimestampTz now, TimestampTz until)
{
	Datum		values[5];

	IdemScopeValues(scope, now, values);
	values[4] = TimestampTzGetDatum(until);
	(void) IdemExecOn(STMT_HEARTBEAT, scope, row, values, NULL,
					  SPI_OK_UPDATE, NULL, now, NULL);
}

/* ----------------------------------------------------------------
 *		maintenance: stale leases, the default partition
 * ----------------------------------------------------------------
 *
 * These run as whoever runs the pass (the extension's owner), in the
 * caller's SPI-less context: each connects to SPI itself and returns what
 * it read in the caller's memory context.
 */

/* The WHERE clause of the stale leases as of $1. */
#define STALE_LEASES_QUAL \
	" WHERE state OPERATOR(pg_catalog.=) 'in_progress' AND locked_until OPERATOR(pg_catalog.<) $1" \
	" AND expires_at OPERATOR(pg_catalog.>) $1"

/* The WHERE clause that identifies a still-stale lease ($1..$4). */
#define STALE_ROW_QUAL \
	STALE_LEASES_QUAL " AND tenant OPERATOR(pg_catalog.=) $2" \
	" AND endpoint OPERATOR(pg_catalog.=) $3 AND key OPERATOR(pg_catalog.=) $4"

/*
 * The tables maintenance reads and changes rows of, by qualified name: the
 * table (or, with dflt, its default partition), or in the Citus mode their
 * shards placed on this node (none on a coordinator without shards).
 */
static List *
IdemMaintRelations(bool dflt)
{
	const char *table = dflt ? "idempotency.keys_default" : "idempotency.keys";
	MemoryContext cxt = CurrentMemoryContext;
	List	   *result = NIL;

	if (IdemKeystoreNode() == IDEM_KEYS_LOCAL)
		return list_make1(pstrdup(table));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute(psprintf("SELECT pg_catalog.shard_name('%s', p.shardid)"
							 " FROM pg_catalog.pg_dist_placement p"
							 " JOIN pg_catalog.pg_dist_local_group USING (groupid)"
							 " JOIN pg_catalog.pg_dist_shard s USING (shardid)"
							 " WHERE s.logicalrelid OPERATOR(pg_catalog.=) '%s'::pg_catalog.regclass"
							 " ORDER BY p.shardid", table, table),
					true, 0) != SPI_OK_SELECT)
		elog(ERROR, "listing the local shards of %s failed", table);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		char	   *name = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		MemoryContext old = MemoryContextSwitchTo(cxt);

		result = lappend(result, pstrdup(name));
		MemoryContextSwitchTo(old);
	}
	SPI_finish();
	return result;
}

int
IdemKeystoreStaleLeases(TimestampTz as_of, IdemStaleLease **leases)
{
	MemoryContext cxt = CurrentMemoryContext;
	Oid			argtypes[1] = {TIMESTAMPTZOID};
	Datum		args[1] = {TimestampTzGetDatum(as_of)};
	List	   *relations = IdemMaintRelations(false);
	IdemStaleLease *result = palloc0(sizeof(IdemStaleLease));
	uint64		total = 0;
	ListCell   *lc;

	foreach(lc, relations)
	{
		char	   *relation = lfirst(lc);
		uint64		nrows;
		int			rc;

		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");

		/*
		 * Lock the stale rows; one whose holder is busy with it right now
		 * (finishing, heartbeating) is left for the next pass.  In the Citus
		 * mode, one local shard at a time: Citus refuses FOR UPDATE on the
		 * distributed table.
		 */
		rc = SPI_execute_with_args(psprintf("SELECT tenant, endpoint, key, fingerprint, created_at"
											" FROM %s"
											STALE_LEASES_QUAL
											" ORDER BY endpoint, tenant, key"
											" FOR UPDATE SKIP LOCKED", relation),
								   1, argtypes, args, NULL, false, 0);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "looking for stale leases failed: %s", SPI_result_code_string(rc));

		nrows = SPI_processed;
		MemoryContextSwitchTo(cxt);
		result = repalloc(result, sizeof(IdemStaleLease) * (total + nrows + 1));
		memset(result + total, 0, sizeof(IdemStaleLease) * (nrows + 1));
		for (uint64 i = 0; i < nrows; i++)
		{
			HeapTuple	tup = SPI_tuptable->vals[i];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			IdemStaleLease *l = &result[total + i];
			bool		isnull;
			Datum		d;

			l->tenant = SPI_getvalue(tup, desc, 1);
			l->endpoint = SPI_getvalue(tup, desc, 2);
			l->key = SPI_getvalue(tup, desc, 3);
			d = SPI_getbinval(tup, desc, 4, &isnull);
			l->fingerprint = isnull ? NULL : DatumGetByteaPCopy(d);
			d = SPI_getbinval(tup, desc, 5, &isnull);
			l->created_at = isnull ? 0 : DatumGetTimestampTz(d);
			l->relation = relation;
		}
		total += nrows;
		SPI_finish();
	}
	*leases = result;
	return (int) total;
}

int
IdemKeystoreCountStaleLeases(TimestampTz as_of, char ***endpoints,
							 int64 **counts)
{
	MemoryContext cxt = CurrentMemoryContext;
	Oid			argtypes[1] = {TIMESTAMPTZOID};
	Datum		args[1] = {TimestampTzGetDatum(as_of)};
	uint64		nrows;
	int			rc;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	/* in the Citus mode, through the distributed table: no lock is taken */
	rc = SPI_execute_with_args("SELECT endpoint, pg_catalog.count(*) FROM idempotency.keys"
							   STALE_LEASES_QUAL
							   " GROUP BY endpoint ORDER BY endpoint",
							   1, argtypes, args, NULL, true, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "looking for stale leases failed: %s", SPI_result_code_string(rc));
	nrows = SPI_processed;
	MemoryContextSwitchTo(cxt);
	*endpoints = palloc0(sizeof(char *) * (nrows + 1));
	*counts = palloc0(sizeof(int64) * (nrows + 1));
	for (uint64 i = 0; i < nrows; i++)
	{
		bool		isnull;

		(*endpoints)[i] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		(*counts)[i] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
												   SPI_tuptable->tupdesc, 2, &isnull));
	}
	SPI_finish();
	return (int) nrows;
}

bool
IdemKeystoreSettleLease(const IdemStaleLease *lease, TimestampTz as_of,
						IdemState to, const char *reason,
						const IdemResponse *resp)
{
	Oid			types[11] = {TIMESTAMPTZOID, TEXTOID, TEXTOID, TEXTOID};
	Datum		values[11];
	char		nulls[11];
	const char *set_clause;
	int			nargs = 4;

	memset(nulls, ' ', sizeof(nulls));
	values[0] = TimestampTzGetDatum(as_of);
	values[1] = CStringGetTextDatum(lease->tenant);
	values[2] = CStringGetTextDatum(lease->endpoint);
	values[3] = CStringGetTextDatum(lease->key);
	switch (to)
	{
		case IDEM_STATE_UNKNOWN:
			set_clause = "state = 'unknown'";
			break;
		case IDEM_STATE_FAILED:
			set_clause = "state = 'failed', fail_reason = $5, locked_until = NULL";
			types[4] = TEXTOID;
			values[4] = CStringGetTextDatum(reason);
			nargs = 5;
			break;
		case IDEM_STATE_COMPLETED:
			set_clause = "state = 'completed', locked_until = NULL, fail_reason = NULL,"
				" response_status = $5, response_headers = $6,"
				" body_kind = $7, body_encrypted = $8, response_body = $9,"
				" body_ref = $10, completed_at = $1";
			types[4] = INT4OID;
			types[5] = JSONBOID;
			types[6] = TEXTOID;
			types[7] = BOOLOID;
			types[8] = BYTEAOID;
			types[9] = TEXTOID;
			IdemResponseValues(resp, values + 4, nulls + 4);
			nargs = 10;
			break;
		default:
			elog(ERROR, "a stale lease cannot become %s", IdemStateName(to));
	}

	return IdemSpiExec(psprintf("UPDATE %s SET %s" STALE_ROW_QUAL,
								lease->relation ? lease->relation : "idempotency.keys",
								set_clause),
					   nargs, types, values, nulls, false, SPI_OK_UPDATE) > 0;
}

int64
IdemKeystorePurgeDefault(TimestampTz as_of)
{
	Oid			argtypes[1] = {TIMESTAMPTZOID};
	Datum		args[1] = {TimestampTzGetDatum(as_of)};

	int64		n = 0;
	ListCell   *lc;

	/* in the Citus mode, each local shard of the default partition */
	foreach(lc, IdemMaintRelations(true))
		n += (int64) IdemSpiExec(psprintf("DELETE FROM ONLY %s WHERE expires_at OPERATOR(pg_catalog.<=) $1",
										  (char *) lfirst(lc)),
								 1, argtypes, args, NULL, false, SPI_OK_DELETE);
	return n;
}
