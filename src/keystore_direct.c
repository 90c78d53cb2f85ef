/*-------------------------------------------------------------------------
 *
 * keystore_direct.c
 *	  The key store (keystore.h): the hot paths, which go straight to the
 *	  partitions of idempotency.keys, and the row codec.  A read probes the
 *	  unique index of every partition whose range has not ended
 *	  (IdemKeystoreRead, IdemKeystoreReadWithExpired, IdemKeystorePeek),
 *	  and an insert goes straight into the partition that covers the row's
 *	  expiry time (IdemKeystoreInsert): each costs a fraction of an
 *	  executor run over the partitioned table, since it skips the
 *	  executor's start-up and tuple routing.
 *
 *	  Rows are only ever made by this code, which fills every column with
 *	  valid values: the table's CHECK constraints are a statement of what
 *	  it writes, and are not evaluated here; the unique index still is.  A
 *	  partition whose file has no block (the days ahead, usually) is locked
 *	  and its size read, nothing more: its index is not even locked, which
 *	  keeps a claim's relation locks within the lock manager's fast-path
 *	  slots.  Which relation and partitions hold a scope's rows, and what
 *	  is cached of them, is keystore_rel.c's.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/tupconvert.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "executor/executor.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "storage/bufmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "compat.h"
#include "horizon.h"
#include "keystore_int.h"

/* ----------------------------------------------------------------
 *		the row codec
 * ----------------------------------------------------------------
 */

static const char *const state_names[] = {
	"in_progress", "completed", "failed", "unknown"
};

const char *
IdemStateName(IdemState state)
{
	return state_names[state];
}

static IdemState
IdemStateFromName(const char *name)
{
	int			i;

	for (i = 0; i < (int) lengthof(state_names); i++)
		if (strcmp(name, state_names[i]) == 0)
			return (IdemState) i;
	elog(ERROR, "unrecognized key state \"%s\"", name);
	return IDEM_STATE_UNKNOWN;	/* keep compiler quiet */
}

/* the columns a read takes, in the order of IDEM_ROW_COLUMNS */
static const char *const row_columns[] = {
	"fingerprint", "state", "lease_token", "locked_until", "response_status",
	"response_headers", "body_kind", "body_encrypted", "response_body",
	"body_ref", "created_at", "expires_at", "completed_at"
};

#define NUM_ROW_COLUMNS IDEM_NUM_ROW_COLUMNS
StaticAssertDecl(lengthof(row_columns) == NUM_ROW_COLUMNS,
				 "row_columns and IDEM_NUM_ROW_COLUMNS disagree");

static AttrNumber row_attnums[NUM_ROW_COLUMNS];
static uint64 row_attnums_generation = 0;

/* Take one row of the scope (values in row_columns order) into row. */
void
IdemTakeRow(IdemKeyRow *row, const Datum *v, const bool *n, TimestampTz now,
			MemoryContext cxt)
{
	MemoryContext old;
	TimestampTz expires_at = DatumGetTimestampTz(v[11]);

	if (expires_at <= now)
	{
		row->has_expired = true;
		if (row->expired_fingerprint == NULL || expires_at > row->expired_at)
		{
			old = MemoryContextSwitchTo(cxt);
			row->expired_fingerprint = DatumGetByteaPCopy(v[0]);
			row->expired_at = expires_at;
			MemoryContextSwitchTo(old);
		}
		return;
	}
	old = MemoryContextSwitchTo(cxt);
	row->found = true;
	row->expires_at = expires_at;
	row->fingerprint = DatumGetByteaPCopy(v[0]);
	row->state = IdemStateFromName(TextDatumGetCString(v[1]));
	row->has_token = !n[2];
	row->lease_token = n[2] ? 0 : DatumGetInt64(v[2]);
	row->has_locked_until = !n[3];
	row->locked_until = n[3] ? 0 : DatumGetTimestampTz(v[3]);
	row->resp.status = n[4] ? -1 : DatumGetInt32(v[4]);
	row->resp.headers = n[5] ? NULL : DatumGetJsonbPCopy(v[5]);
	row->resp.body_kind = IdemBodyKindFromName(n[6] ? NULL : TextDatumGetCString(v[6]));
	row->resp.encrypted = !n[7] && DatumGetBool(v[7]);
	row->resp.body = n[8] ? NULL : DatumGetByteaPCopy(v[8]);
	row->resp.body_ref = n[9] ? NULL : DatumGetTextPCopy(v[9]);
	row->created_at = DatumGetTimestampTz(v[10]);
	row->has_completed_at = !n[12];
	row->completed_at = n[12] ? 0 : DatumGetTimestampTz(v[12]);
	MemoryContextSwitchTo(old);
}

/* What a probe fills, and with what. */
typedef struct ProbeState
{
	IdemKeyRow *row;
	TimestampTz now;
	MemoryContext cxt;
	bool		ended_too;		/* probe partitions whose range ended too */
	LOCKMODE	lockmode;		/* on the parent and the partitions */
} ProbeState;

/*
 * Take a row a probe found (in the parent's layout; tts_tableOid and
 * tts_tid say where it is).  Returns true when it is the live row: there
 * is at most one, so once it is found nothing else matters.
 */
static bool
IdemTakeSlot(TupleTableSlot *slot, ProbeState *st)
{
	Datum		v[NUM_ROW_COLUMNS];
	bool		n[NUM_ROW_COLUMNS];
	int			i;

	/* one deforming pass, then the columns by number */
	slot_getallattrs(slot);
	for (i = 0; i < (int) NUM_ROW_COLUMNS; i++)
	{
		v[i] = slot->tts_values[row_attnums[i] - 1];
		n[i] = slot->tts_isnull[row_attnums[i] - 1];
	}
	IdemTakeRow(st->row, v, n, st->now, st->cxt);
	if (st->row->found)
	{
		AttrNumber	d = IdemDigestAttnum();

		st->row->request_digest = NULL;
		if (d != InvalidAttrNumber && !slot->tts_isnull[d - 1])
		{
			MemoryContext old = MemoryContextSwitchTo(st->cxt);

			st->row->request_digest = DatumGetByteaPCopy(slot->tts_values[d - 1]);
			MemoryContextSwitchTo(old);
		}
		st->row->partoid = slot->tts_tableOid;
		st->row->tid = slot->tts_tid;
	}
	return st->row->found;
}

/* Fill the six response parameters of the completing statements. */
void
IdemResponseValues(const IdemResponse *resp, Datum *values, char *nulls)
{
	const char *kind = IdemBodyKindName(resp->body_kind);

	values[0] = Int32GetDatum(resp->status);
	nulls[0] = resp->status < 0 ? 'n' : ' ';
	values[1] = PointerGetDatum(resp->headers);
	nulls[1] = resp->headers ? ' ' : 'n';
	values[2] = kind ? CStringGetTextDatum(kind) : (Datum) 0;
	nulls[2] = kind ? ' ' : 'n';
	values[3] = BoolGetDatum(resp->encrypted);
	nulls[3] = ' ';
	values[4] = PointerGetDatum(resp->body);
	nulls[4] = resp->body ? ' ' : 'n';
	values[5] = PointerGetDatum(resp->body_ref);
	nulls[5] = resp->body_ref ? ' ' : 'n';
}

/* ----------------------------------------------------------------
 *		probes
 * ----------------------------------------------------------------
 */

/*
 * Take each row of the scope in one partition that snapshot sees, until
 * the live row is found (then true).
 *
 * In a SERIALIZABLE transaction, a scan with an MVCC snapshot takes
 * predicate locks (SIREAD) on the index pages and heap tuples it reads (see
 * SerializationNeededForRead in predicate.c).  A probe takes none: the
 * index is scanned with SnapshotAny, which is not an MVCC snapshot, and
 * each version it returns is tested against snapshot here.  The rows read
 * are the same; only the locks are left out.  This is sound because those
 * locks could not protect anything the protocol relies on: the probe reads
 * with the latest snapshot, not the transaction's, so what it sees is
 * outside what serializable snapshot isolation reasons about in any case,
 * and the read is ordered instead by the scope lock, which the caller holds
 * and which every transaction that makes a row of the scope holds until it
 * ends.  What the locks did do was make transactions that claimed
 * different keys conflict whenever their keys shared an index page (always,
 * for time-ordered keys) and fill the predicate lock table, which is shared
 * by the whole server.  The transaction's own reads of other tables keep
 * their predicate locks.
 */
static bool
IdemProbeIndex(Relation parent, Relation part, Relation idx,
			   const PartitionProbe *probe, Snapshot snapshot,
			   const text *tenant, const text *endpoint, const text *key,
			   TupleTableSlot **parent_slot, ProbeState *st)
{
	const text *vals[3] = {tenant, endpoint, key};
	ScanKeyData skey[3];
	IndexScanDesc scan;
	TupleTableSlot *slot = table_slot_create(part, NULL);
	bool		unlocked = IsolationIsSerializable();
	bool		stop = false;

	for (int k = 0; k < 3; k++)
		ScanKeyEntryInitialize(&skey[k], 0, k + 1, BTEqualStrategyNumber,
							   InvalidOid, idx->rd_indcollation[k],
							   F_TEXTEQ,
							   PointerGetDatum(vals[probe->scope_col[k]]));
	scan = IdemIndexBeginscan(part, idx, unlocked ? SnapshotAny : snapshot, 3, 0);
	index_rescan(scan, skey, 3, NULL, 0);
	while (!stop && index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		if (unlocked && !table_tuple_satisfies_snapshot(part, slot, snapshot))
			continue;
		if (probe->map == NULL)
			stop = IdemTakeSlot(slot, st);
		else
		{
			TupleTableSlot *mapped;

			if (*parent_slot == NULL)
				*parent_slot = MakeSingleTupleTableSlot(RelationGetDescr(parent),
														&TTSOpsVirtual);
			mapped = execute_attr_map_slot(probe->map, slot, *parent_slot);
			/* where the row is, as the slot of the partition says */
			mapped->tts_tableOid = slot->tts_tableOid;
			mapped->tts_tid = slot->tts_tid;
			stop = IdemTakeSlot(mapped, st);
		}
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	return stop;
}

/*
 * Which partitions may hold a row of the scope expiring in [from, horizon),
 * into may_hold (nparts entries), in one pass over the bounds: a dated
 * partition when its range meets that span, the default partition when a
 * part of the span is covered by no dated partition (PostgreSQL keeps a row
 * out of the default partition when a dated one covers it).  Bounds other
 * than values are taken to meet any span.
 */
static void
IdemPartitionsMayHold(PartitionBoundInfo bounds, int nparts, TimestampTz from,
					  TimestampTz horizon, bool *may_hold)
{
	memset(may_hold, bounds == NULL, sizeof(bool) * nparts);
	for (int j = 0; bounds != NULL && j <= bounds->ndatums; j++)
	{
		TimestampTz lower = DT_NOBEGIN;
		TimestampTz upper = DT_NOEND;
		int			p = bounds->indexes[j] >= 0 ? bounds->indexes[j] : bounds->default_index;

		if ((j > 0 && bounds->kind[j - 1][0] != PARTITION_RANGE_DATUM_VALUE) ||
			(j < bounds->ndatums && bounds->kind[j][0] != PARTITION_RANGE_DATUM_VALUE))
		{
			memset(may_hold, true, sizeof(bool) * nparts);
			return;
		}
		if (j > 0)
			lower = DatumGetTimestampTz(bounds->datums[j - 1][0]);
		if (j < bounds->ndatums)
			upper = DatumGetTimestampTz(bounds->datums[j][0]);
		/* [lower, upper) is partition indexes[j]'s range, or a gap at -1 */
		if (p >= 0 && lower < horizon && upper > from)
			may_hold[p] = true;
	}
}

/*
 * Take the rows of the scope until the live row is found, reading with the
 * latest snapshot, which is taken after the parent is locked (and
 * so after the invalidations of a partition attached meanwhile are
 * processed).  Partitions whose range ended at or before now hold only
 * expired rows and are skipped, and so are those that begin at or after
 * the endpoint's horizon (horizon.c), which no row of the endpoint reaches.
 * The partition that covers hint is probed first, since a live row is most
 * likely there.
 */
static void
IdemScanScope(const IdemScope *scope, TimestampTz now, TimestampTz hint,
			  ProbeState *st)
{
	Relation	parent;
	Relation	layout;
	Oid			relid;
	bool		is_shard;
	PartitionDesc pd;
	PartitionBoundInfo bounds;
	TupleTableSlot *parent_slot = NULL;
	Snapshot	snapshot;
	Oid		   *oids;
	bool	   *may_hold;
	TimestampTz horizon;
	TimestampTz dflt;
	int			nparts;
	int			first;
	int			n;
	bool		stop = false;

	relid = IdemKeystoreRelation(scope);
	is_shard = relid != idem_keys_relid;
	parent = table_open(relid, st->lockmode);
	/* rows are taken in the layout of idempotency.keys, which a shard need not share */
	layout = is_shard ? table_open(IdemKeystoreRelid(), AccessShareLock) : parent;
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	pd = RelationGetPartitionDesc(parent, true);
	bounds = pd->boundinfo;
	nparts = pd->nparts;

	/*
	 * every row of the endpoint expires before its horizon, and every row of
	 * it in the default partition before dflt
	 */
	if (is_shard)
		horizon = dflt = DT_NOEND;
	else
		horizon = IdemHorizonOf(relid, scope->endpoint, &dflt);

	/* the partitions to probe, the one that covers hint first */
	oids = palloc(sizeof(Oid) * Max(nparts, 1));
	may_hold = palloc(sizeof(bool) * Max(nparts, 1));
	IdemPartitionsMayHold(bounds, nparts, st->ended_too ? DT_NOBEGIN : now,
						  horizon, may_hold);
	/* no row of the endpoint in the default partition: it is not opened */
	if (bounds != NULL && bounds->default_index >= 0 &&
		dflt <= (st->ended_too ? DT_NOBEGIN : now))
		may_hold[bounds->default_index] = false;
	first = IdemPartitionFor(parent, pd, hint);
	n = 0;
	if (first >= 0 && may_hold[first])
		oids[n++] = pd->oids[first];
	for (int p = 0; p < nparts; p++)
	{
		if (p != first && may_hold[p])
			oids[n++] = pd->oids[p];
	}

	for (int i = 0; i < n && !stop; i++)
	{
		PartitionProbe *probe;
		uint64		generation;
		Relation	part;
		Relation	idx;

		/*
		 * A partition without a block holds no row: its index is not even
		 * locked.  A row committed before the snapshot was taken extended the
		 * file before it committed, and the lock held on the partition keeps
		 * VACUUM from truncating the file.
		 */
		part = table_open(oids[i], st->lockmode);
		if (part->rd_rel->relkind == RELKIND_RELATION &&
			RelationGetNumberOfBlocks(part) == 0)
		{
			table_close(part, NoLock);
			continue;
		}
		probe = IdemGetProbe(oids[i], part);
		generation = idem_probe_generation;
		idx = index_open(probe->indexoid, AccessShareLock);
		/* opening the index may have processed invalidations: look again */
		if (generation != idem_probe_generation)
			probe = IdemGetProbe(oids[i], part);
		stop = IdemProbeIndex(layout, part, idx, probe, snapshot,
							  scope->tenant, scope->endpoint, scope->key,
							  &parent_slot, st);
		index_close(idx, NoLock);
		table_close(part, NoLock);
	}
	if (parent_slot)
		ExecDropSingleTupleTableSlot(parent_slot);
	UnregisterSnapshot(snapshot);
	pfree(oids);
	pfree(may_hold);
	if (is_shard)
		table_close(layout, NoLock);
	table_close(parent, NoLock);
}

/*
 * Probe each partition's unique index for the scope's rows, the partition
 * covering hint (where the live row is most likely) first, until the live
 * row is found: fill row with it, note whether expired ones exist.
 *
 * The reads of a call that may write (a claim, a lease-mode change) take
 * the parent and each partition in ROW EXCLUSIVE before reading any index,
 * as an INSERT or UPDATE would: a lock taken in ACCESS SHARE and raised to
 * ROW EXCLUSIVE at the write deadlocks with DDL that takes SHARE on the
 * partition and then ACCESS EXCLUSIVE on its index (REINDEX), since the
 * DDL would hold what the write waits for, and wait for the index lock the
 * read holds.  Taken in one mode from the start, the two queue on the
 * partition instead (doc/operations.md).
 */
static void
IdemReadScope(const IdemScope *scope, TimestampTz now, TimestampTz hint,
			  IdemKeyRow *row, MemoryContext cxt, bool ended_too,
			  LOCKMODE lockmode)
{
	ProbeState	st;

	memset(row, 0, sizeof(*row));
	st.row = row;
	st.now = now;
	st.cxt = cxt;
	st.ended_too = ended_too;
	st.lockmode = lockmode;
	IdemKeysAttnums(row_columns, NUM_ROW_COLUMNS, row_attnums,
					&row_attnums_generation);
	IdemScanScope(scope, now, hint, &st);
}

void
IdemKeystoreRead(const IdemScope *scope, TimestampTz now, TimestampTz hint,
				 IdemKeyRow *row, MemoryContext cxt)
{
	IdemReadScope(scope, now, hint, row, cxt, false, RowExclusiveLock);
}

void
IdemKeystoreReadWithExpired(const IdemScope *scope, TimestampTz now,
							TimestampTz hint, IdemKeyRow *row,
							MemoryContext cxt)
{
	IdemReadScope(scope, now, hint, row, cxt, true, RowExclusiveLock);
}

void
IdemKeystorePeek(const IdemScope *scope, TimestampTz now, TimestampTz hint,
				 IdemKeyRow *row, MemoryContext cxt)
{
	IdemReadScope(scope, now, hint, row, cxt, false, AccessShareLock);
}

/* ----------------------------------------------------------------
 *		direct inserts
 * ----------------------------------------------------------------
 */

/*
 * ExecOpenIndices, leaving out the partition's lease index when the row is
 * not a leased claim in progress: its predicate would be false, and
 * evaluating it costs an atomic-mode insert more than the rest of its index
 * work.
 */
static void
IdemOpenIndices(ResultRelInfo *rri, Oid lease_indexoid, bool leased)
{
	List	   *indexes = RelationGetIndexList(rri->ri_RelationDesc);
	int			n = 0;
	ListCell   *lc;

	rri->ri_NumIndices = 0;
	if (indexes == NIL)
		return;
	rri->ri_IndexRelationDescs = palloc(sizeof(Relation) * list_length(indexes));
	rri->ri_IndexRelationInfo = palloc(sizeof(IndexInfo *) * list_length(indexes));
	foreach(lc, indexes)
	{
		Oid			indexoid = lfirst_oid(lc);
		Relation	idx;

		if (!leased && indexoid == lease_indexoid)
			continue;
		idx = index_open(indexoid, RowExclusiveLock);
		rri->ri_IndexRelationDescs[n] = idx;
		rri->ri_IndexRelationInfo[n] = BuildIndexInfo(idx);
		n++;
	}
	rri->ri_NumIndices = n;
	list_free(indexes);
}

/*
 * Before a row is written into partition index of parent: its endpoint's
 * horizon (horizon.c) is raised to the partition's upper bound (just past
 * the row's expiry in the default partition), so that it is raised once
 * per partition and endpoint, not for every row.
 */
static void
IdemRaiseHorizon(Relation parent, PartitionDesc pd, int index, Datum *values)
{
	PartitionBoundInfo bounds = pd->boundinfo;
	TimestampTz expires = DatumGetTimestampTz(values[IdemKeysAttnum("expires_at") - 1]);
	TimestampTz bound = IdemHorizonJustAfter(expires);

	for (int j = 0; bounds != NULL && j < bounds->ndatums; j++)
	{
		if (bounds->indexes[j] == index &&
			bounds->kind[j][0] == PARTITION_RANGE_DATUM_VALUE &&
			DatumGetTimestampTz(bounds->datums[j][0]) > expires)
			bound = DatumGetTimestampTz(bounds->datums[j][0]);
	}
	IdemHorizonRaise(RelationGetRelid(parent),
					 DatumGetTextPP(values[IdemKeysAttnum("endpoint") - 1]),
					 expires, bound,
					 bounds == NULL || bounds->default_index == index);
}

/*
 * Insert one row into relid (the parent), given in its layout (values and
 * nulls indexed by attribute number - 1): into the partition that covers
 * its expires_at, or into the default partition.  Uniqueness of (tenant,
 * endpoint, key) within the partition is checked by its unique index, as
 * an INSERT would.
 */
static void
IdemInsertKeyRow(Oid relid, bool is_shard, Datum *values, bool *nulls,
				 bool leased)
{
	Relation	parent;
	Relation	layout;
	Relation	part;
	PartitionDesc pd;
	AttrNumber	expires_attnum;
	int			index;
	Oid			partoid;
	EState	   *estate;
	ResultRelInfo *rri;
	TupleTableSlot *slot;
	TupleTableSlot *parent_slot;
	AttrMap    *map;

	parent = table_open(relid, RowExclusiveLock);
	/* values come in the layout of idempotency.keys, which a shard need not share */
	layout = is_shard ? table_open(IdemKeystoreRelid(), AccessShareLock) : parent;
	pd = RelationGetPartitionDesc(parent, true);
	expires_attnum = IdemKeysAttnum("expires_at");
	Assert(!nulls[expires_attnum - 1]);
	index = IdemPartitionFor(parent, pd,
							 DatumGetTimestampTz(values[expires_attnum - 1]));
	if (index < 0)
		ereport(ERROR,
				(errcode(ERRCODE_CHECK_VIOLATION),
				 errmsg("no partition of idempotency.keys covers the key's expiry time"),
				 errhint("The default partition idempotency.keys_default must exist; reinstall the extension.")));
	partoid = pd->oids[index];
	if (!is_shard)
		IdemRaiseHorizon(parent, pd, index, values);
	part = table_open(partoid, RowExclusiveLock);

	estate = CreateExecutorState();
	rri = makeNode(ResultRelInfo);
	InitResultRelInfo(rri, part, 1, NULL, 0);
	/* by value: opening the indexes may process invalidations */
	IdemOpenIndices(rri, IdemGetProbe(partoid, part)->lease_indexoid, leased);

	parent_slot = MakeSingleTupleTableSlot(RelationGetDescr(layout), &TTSOpsVirtual);
	ExecClearTuple(parent_slot);
	memcpy(parent_slot->tts_values, values, sizeof(Datum) * parent_slot->tts_tupleDescriptor->natts);
	memcpy(parent_slot->tts_isnull, nulls, sizeof(bool) * parent_slot->tts_tupleDescriptor->natts);
	ExecStoreVirtualTuple(parent_slot);

	slot = table_slot_create(part, NULL);
	map = IdemGetProbe(partoid, part)->insert_map;
	if (map != NULL)
		execute_attr_map_slot(map, parent_slot, slot);
	else
		ExecCopySlot(slot, parent_slot);

	table_tuple_insert(part, slot, GetCurrentCommandId(true), 0, NULL);
	if (rri->ri_NumIndices > 0)
		(void) IdemInsertIndexTuples(rri, slot, estate);

	ExecDropSingleTupleTableSlot(slot);
	ExecDropSingleTupleTableSlot(parent_slot);
	ExecCloseIndices(rri);
	FreeExecutorState(estate);
	table_close(part, NoLock);
	if (is_shard)
		table_close(layout, NoLock);
	table_close(parent, NoLock);

	/* later reads of this transaction see the row */
	CommandCounterIncrement();
}

/* the columns of a row, in the order IdemKeystoreInsert fills them */
static const char *const insert_columns[] = {
	"tenant", "endpoint", "key", "created_at", "fingerprint", "state",
	"lease_token", "locked_until", "response_status", "response_headers",
	"body_kind", "body_encrypted", "response_body", "body_ref", "fail_reason",
	"completed_at", "expires_at"
};

#define NUM_INSERT_COLUMNS lengthof(insert_columns)

static AttrNumber insert_attnums[NUM_INSERT_COLUMNS];
static uint64 insert_attnums_generation = 0;

void
IdemKeystoreInsert(const IdemScope *scope, const IdemNewKeyRow *newrow)
{
	Datum		v[NUM_INSERT_COLUMNS];
	char		cn[NUM_INSERT_COLUMNS];
	IdemResponse none = {-1, NULL, IDEM_BODY_NONE, NULL, NULL, false};
	Oid			relid = IdemKeystoreRelation(scope);
	int			natts;
	Datum	   *values;
	bool	   *nulls;
	int			i;

	memset(cn, ' ', sizeof(cn));
	v[0] = PointerGetDatum(scope->tenant);
	v[1] = PointerGetDatum(scope->endpoint);
	v[2] = PointerGetDatum(scope->key);
	v[3] = TimestampTzGetDatum(newrow->created_at);
	v[4] = PointerGetDatum(newrow->fingerprint);
	v[5] = CStringGetTextDatum(IdemStateName(newrow->state));
	v[6] = newrow->lease_token ? Int64GetDatum(*newrow->lease_token) : (Datum) 0;
	cn[6] = newrow->lease_token ? ' ' : 'n';
	v[7] = newrow->locked_until ? TimestampTzGetDatum(*newrow->locked_until) : (Datum) 0;
	cn[7] = newrow->locked_until ? ' ' : 'n';
	IdemResponseValues(newrow->resp ? newrow->resp : &none, v + 8, cn + 8);
	v[14] = newrow->fail_reason ? CStringGetTextDatum(newrow->fail_reason) : (Datum) 0;
	cn[14] = newrow->fail_reason ? ' ' : 'n';
	v[15] = newrow->completed_at ? TimestampTzGetDatum(*newrow->completed_at) : (Datum) 0;
	cn[15] = newrow->completed_at ? ' ' : 'n';
	v[16] = TimestampTzGetDatum(newrow->expires_at);

	/* lay the values out by the table's attribute numbers */
	IdemKeysAttnums(insert_columns, NUM_INSERT_COLUMNS, insert_attnums,
					&insert_attnums_generation);
	natts = idem_keys_desc->natts;
	values = palloc0(sizeof(Datum) * natts);
	nulls = palloc(sizeof(bool) * natts);
	memset(nulls, true, sizeof(bool) * natts);
	for (i = 0; i < (int) NUM_INSERT_COLUMNS; i++)
	{
		values[insert_attnums[i] - 1] = v[i];
		nulls[insert_attnums[i] - 1] = cn[i] == 'n';
	}
	if (newrow->request_digest != NULL && IdemDigestAttnum() != InvalidAttrNumber)
	{
		values[IdemDigestAttnum() - 1] = PointerGetDatum(newrow->request_digest);
		nulls[IdemDigestAttnum() - 1] = false;
	}
	IdemInsertKeyRow(relid, relid != idem_keys_relid, values, nulls,
					 newrow->state == IDEM_STATE_IN_PROGRESS);
}
