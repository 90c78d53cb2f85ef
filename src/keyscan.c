/*-------------------------------------------------------------------------
 *
 * keyscan.c
 *	  Direct access to idempotency.keys on the hot paths: reading the rows
 *	  of one (tenant, endpoint, key) scope straight from the unique index of
 *	  every partition, and inserting a row straight into the partition that
 *	  covers its expiry time.
 *
 *	  A probe of each partition's unique index costs a fraction of an
 *	  executor run over the partitioned table, and so does an insert that
 *	  skips the executor's start-up and tuple routing.  Rows are only ever
 *	  made by the extension's own code, which fills every column with valid
 *	  values: the table's CHECK constraints are a statement of what the code
 *	  writes, and are not evaluated here; the unique index still is.
 *	  A partition whose file has no block (the days ahead, usually) is
 *	  locked and its size read, nothing more: its index is not even locked,
 *	  which keeps a claim's relation locks within the lock manager's
 *	  fast-path slots.  Per partition, the index to probe and the maps
 *	  between the partition's columns and the parent's are cached per
 *	  backend and forgotten at any relcache invalidation of that partition.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/tupconvert.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_index.h"
#include "executor/executor.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/partcache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "compat.h"
#include "keyscan.h"

typedef struct PartitionProbe
{
	Oid			partoid;		/* hash key */
	Oid			indexoid;		/* unique index on the scope's columns */
	int8		scope_col[3];	/* index column i+1 holds scope value
								 * scope_col[i]: 0 tenant, 1 endpoint, 2 key */
	AttrMap    *map;			/* partition to parent columns; NULL when the
								 * layouts are the same */
	AttrMap    *insert_map;		/* parent to partition columns, likewise */
	Oid			lease_indexoid; /* its index of leased claims in progress,
								 * or InvalidOid */
} PartitionProbe;

static HTAB *probe_cache = NULL;
static uint64 probe_cache_generation = 0;	/* moves at every forgetting */
static bool probe_callback_registered = false;

/* the parent, whose column numbers the callers use */
static Oid	keys_relid = InvalidOid;
static Oid	keys_owner = InvalidOid;
static TupleDesc keys_desc = NULL;

/* moves on each time the parent's description is forgotten */
static uint64 keys_generation = 1;

static void
IdemFreeProbeMaps(PartitionProbe *probe)
{
	if (probe->map)
		free_attrmap(probe->map);
	if (probe->insert_map)
		free_attrmap(probe->insert_map);
}

static void
IdemProbeCacheInvalidate(Datum arg, Oid relid)
{
	probe_cache_generation++;
	if (OidIsValid(relid) && relid != keys_relid)
	{
		/* one partition (or any other relation) */
		PartitionProbe *probe = probe_cache == NULL ? NULL :
			hash_search(probe_cache, &relid, HASH_FIND, NULL);

		if (probe != NULL)
		{
			IdemFreeProbeMaps(probe);
			(void) hash_search(probe_cache, &relid, HASH_REMOVE, NULL);
		}
		return;
	}
	/* everything, or the parent itself */
	if (probe_cache != NULL)
	{
		HASH_SEQ_STATUS status;
		PartitionProbe *probe;

		hash_seq_init(&status, probe_cache);
		while ((probe = hash_seq_search(&status)) != NULL)
			IdemFreeProbeMaps(probe);
		hash_destroy(probe_cache);
		probe_cache = NULL;
	}
	if (keys_desc)
		FreeTupleDesc(keys_desc);
	keys_desc = NULL;
	keys_relid = InvalidOid;
	keys_generation++;
}

/* Forget what is cached here whenever the relations it describes change. */
static void
IdemRegisterInvalidation(void)
{
	if (!probe_callback_registered)
	{
		CacheRegisterRelcacheCallback(IdemProbeCacheInvalidate, (Datum) 0);
		probe_callback_registered = true;
	}
}

static Oid
IdemKeysRelid(void)
{
	if (!OidIsValid(keys_relid))
	{
		Oid			nsp;
		Oid			relid;
		Relation	rel;
		MemoryContext old;

		IdemRegisterInvalidation();
		nsp = get_namespace_oid("idempotency", false);
		relid = get_relname_relid("keys", nsp);
		if (!OidIsValid(relid))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_TABLE),
					 errmsg("table idempotency.keys does not exist"),
					 errhint("Run CREATE EXTENSION idempotency.")));
		rel = table_open(relid, AccessShareLock);
		old = MemoryContextSwitchTo(CacheMemoryContext);
		keys_desc = CreateTupleDescCopy(RelationGetDescr(rel));
		MemoryContextSwitchTo(old);
		keys_owner = rel->rd_rel->relowner;
		table_close(rel, NoLock);
		keys_relid = relid;
	}
	return keys_relid;
}

/* Lock idempotency.keys (the parent) for reading, as a query of it would. */
void
IdemLockKeys(void)
{
	LockRelationOid(IdemKeysRelid(), AccessShareLock);
}

/* the owner of idempotency.keys: the role the extension's own SQL runs as */
Oid
IdemKeysOwner(void)
{
	(void) IdemKeysRelid();
	return keys_owner;
}

int
IdemKeysNatts(void)
{
	(void) IdemKeysRelid();
	return keys_desc->natts;
}

AttrNumber
IdemKeysAttnum(const char *column)
{
	int			i;

	(void) IdemKeysRelid();
	for (i = 0; i < keys_desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(keys_desc, i);

		if (!att->attisdropped && strcmp(NameStr(att->attname), column) == 0)
			return att->attnum;
	}
	elog(ERROR, "column \"%s\" of idempotency.keys does not exist", column);
	return InvalidAttrNumber;	/* keep compiler quiet */
}

/*
 * Fill attnums with the column numbers of the n names, unless *generation
 * says they are those of the table's current description already.
 */
void
IdemKeysAttnums(const char *const *names, int n, AttrNumber *attnums,
				uint64 *generation)
{
	(void) IdemKeysRelid();
	if (*generation == keys_generation)
		return;
	/* first: a description forgotten meanwhile makes the next call redo it */
	*generation = keys_generation;
	for (int i = 0; i < n; i++)
		attnums[i] = IdemKeysAttnum(names[i]);
}

/*
 * Find the partition's unique index on the scope's three columns, in any
 * order (the extension makes them key first, so that a descent decides on
 * the first column), and note which scope value each index column holds.
 */
static Oid
IdemScopeIndex(Relation part, int8 *scope_col)
{
	AttrNumber	want[3];
	List	   *indexes = RelationGetIndexList(part);
	ListCell   *lc;
	Oid			result = InvalidOid;

	want[0] = get_attnum(RelationGetRelid(part), "tenant");
	want[1] = get_attnum(RelationGetRelid(part), "endpoint");
	want[2] = get_attnum(RelationGetRelid(part), "key");

	foreach(lc, indexes)
	{
		Relation	idx = index_open(lfirst_oid(lc), AccessShareLock);
		Form_pg_index form = idx->rd_index;
		int			seen = 0;

		if (form->indisunique && form->indisvalid && form->indisready &&
			form->indnkeyatts == 3 && idx->rd_rel->relam == BTREE_AM_OID &&
			RelationGetIndexPredicate(idx) == NIL &&
			RelationGetIndexExpressions(idx) == NIL)
		{
			for (int k = 0; k < 3; k++)
			{
				for (int c = 0; c < 3; c++)
				{
					if (form->indkey.values[k] == want[c] && !(seen & (1 << c)))
					{
						scope_col[k] = c;
						seen |= 1 << c;
					}
				}
			}
		}
		if (seen == 7)
			result = RelationGetRelid(idx);
		index_close(idx, AccessShareLock);
		if (OidIsValid(result))
			break;
	}
	list_free(indexes);
	if (!OidIsValid(result))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("partition \"%s\" of idempotency.keys has no unique index on (key, endpoint, tenant)",
						RelationGetRelationName(part)),
				 errhint("Every partition needs that index; partitions made by idem_maintenance() have it.")));
	return result;
}

/*
 * The partition's lease index (leased claims in progress), which the
 * extension names after the partition: PARTITION_lease_idx, partial.
 * InvalidOid when it has none.
 */
static Oid
IdemLeaseIndex(Relation part)
{
	char	   *name = psprintf("%s_lease_idx", RelationGetRelationName(part));
	Oid			indexoid = get_relname_relid(name, RelationGetNamespace(part));
	Oid			result = InvalidOid;

	if (OidIsValid(indexoid))
	{
		Relation	idx = index_open(indexoid, AccessShareLock);

		if (idx->rd_index->indrelid == RelationGetRelid(part) &&
			RelationGetIndexPredicate(idx) != NIL)
			result = indexoid;
		index_close(idx, AccessShareLock);
	}
	pfree(name);
	return result;
}

/*
 * The probe of a partition the caller has locked; part is the partition
 * when the caller has it open, else NULL.
 */
static PartitionProbe *
IdemGetProbe(Oid partoid, Relation part)
{
	PartitionProbe *probe = NULL;

	IdemRegisterInvalidation();
	if (probe_cache != NULL)
		probe = hash_search(probe_cache, &partoid, HASH_FIND, NULL);
	if (probe == NULL)
	{
		/* opening indexes may process invalidations: build first, then enter */
		Relation	rel = part ? part : table_open(partoid, NoLock);
		int8		scope_col[3];
		Oid			indexoid;
		Oid			lease_indexoid;
		MemoryContext old;
		AttrMap    *map;
		AttrMap    *insert_map;
		bool		found;

		if (rel->rd_rel->relkind != RELKIND_RELATION)
			ereport(ERROR,
					(errcode(ERRCODE_WRONG_OBJECT_TYPE),
					 errmsg("partition \"%s\" of idempotency.keys is not an ordinary table",
							RelationGetRelationName(rel)),
					 errdetail("Claims read and write the partitions of idempotency.keys directly, which only ordinary tables allow."),
					 errhint("Detach it; partitions made by idem_maintenance() are ordinary tables.")));
		indexoid = IdemScopeIndex(rel, scope_col);
		lease_indexoid = IdemLeaseIndex(rel);
		(void) IdemKeysRelid();
		old = MemoryContextSwitchTo(CacheMemoryContext);
		map = IdemAttrMapIfReq(RelationGetDescr(rel), keys_desc);
		insert_map = IdemAttrMapIfReq(keys_desc, RelationGetDescr(rel));
		MemoryContextSwitchTo(old);
		if (part == NULL)
			table_close(rel, NoLock);
		if (probe_cache == NULL)
		{
			HASHCTL		ctl;

			ctl.keysize = sizeof(Oid);
			ctl.entrysize = sizeof(PartitionProbe);
			ctl.hcxt = CacheMemoryContext;
			probe_cache = hash_create("idempotency partition probes", 64, &ctl,
									  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
		}
		probe = hash_search(probe_cache, &partoid, HASH_ENTER, &found);
		probe->indexoid = indexoid;
		memcpy(probe->scope_col, scope_col, sizeof(scope_col));
		probe->map = map;
		probe->insert_map = insert_map;
		probe->lease_indexoid = lease_indexoid;
	}
	return probe;
}

/*
 * Index, in the partition descriptor, of the partition that covers ts (the
 * default partition where none does); -1 when there is none at all.
 */
static int
IdemPartitionFor(Relation parent, PartitionDesc pd, TimestampTz ts)
{
	PartitionBoundInfo bounds = pd->boundinfo;
	int			index = -1;

	if (bounds == NULL)
		return -1;
	if (bounds->ndatums > 0)
	{
		PartitionKey key = RelationGetPartitionKey(parent);
		Datum		value = TimestampTzGetDatum(ts);
		bool		equal;
		int			offset;

		offset = partition_range_datum_bsearch(key->partsupfunc,
											   key->partcollation,
											   bounds, 1, &value, &equal);
		index = bounds->indexes[offset + 1];
	}
	return index >= 0 ? index : bounds->default_index;
}

/*
 * Call callback for each row of the scope in one partition that snapshot
 * sees, with the slot's tts_tableOid and tts_tid saying where the row is;
 * true: stop.
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
			   TupleTableSlot **parent_slot,
			   IdemScopeRowCallback callback, void *arg)
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
			stop = callback(slot, arg);
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
			stop = callback(mapped, arg);
		}
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	return stop;
}

/*
 * Call callback for every row of the scope until it returns true, reading
 * with the latest snapshot, which is taken after the parent is locked (and
 * so after the invalidations of a partition attached meanwhile are
 * processed).  Partitions whose range ended at or before now hold only
 * expired rows and are skipped.  The partition that covers hint is probed
 * first, since a live row is most likely there.
 */
void
IdemScanScope(const text *tenant, const text *endpoint, const text *key,
			  TimestampTz now, TimestampTz hint,
			  IdemScopeRowCallback callback, void *arg)
{
	Relation	parent;
	PartitionDesc pd;
	PartitionBoundInfo bounds;
	TupleTableSlot *parent_slot = NULL;
	Snapshot	snapshot;
	Oid		   *oids;
	int			nparts;
	int			first;
	int			n;
	bool		stop = false;

	parent = table_open(IdemKeysRelid(), AccessShareLock);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	pd = RelationGetPartitionDesc(parent, true);
	bounds = pd->boundinfo;
	nparts = pd->nparts;

	/* the partitions to probe, the one that covers hint first */
	oids = palloc(sizeof(Oid) * Max(nparts, 1));
	first = IdemPartitionFor(parent, pd, hint);
	n = 0;
	if (first >= 0)
		oids[n++] = pd->oids[first];
	for (int p = 0; p < nparts; p++)
	{
		bool		ended = false;

		if (p == first)
			continue;
		for (int j = 0; bounds != NULL && j < bounds->ndatums; j++)
		{
			if (bounds->indexes[j] == p &&
				bounds->kind[j][0] == PARTITION_RANGE_DATUM_VALUE &&
				DatumGetTimestampTz(bounds->datums[j][0]) <= now)
				ended = true;
		}
		if (!ended)
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
		 * locked.  A row committed before the snapshot was taken extended
		 * the file before it committed, and the lock held on the partition
		 * keeps VACUUM from truncating the file.
		 */
		part = table_open(oids[i], AccessShareLock);
		if (part->rd_rel->relkind == RELKIND_RELATION &&
			RelationGetNumberOfBlocks(part) == 0)
		{
			table_close(part, NoLock);
			continue;
		}
		probe = IdemGetProbe(oids[i], part);
		generation = probe_cache_generation;
		idx = index_open(probe->indexoid, AccessShareLock);
		/* opening the index may have processed invalidations: look again */
		if (generation != probe_cache_generation)
			probe = IdemGetProbe(oids[i], part);
		stop = IdemProbeIndex(parent, part, idx, probe, snapshot,
							  tenant, endpoint, key, &parent_slot,
							  callback, arg);
		index_close(idx, NoLock);
		table_close(part, NoLock);
	}
	if (parent_slot)
		ExecDropSingleTupleTableSlot(parent_slot);
	UnregisterSnapshot(snapshot);
	pfree(oids);
	table_close(parent, NoLock);
}

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
 * Insert one row, given in the parent's layout (values and nulls indexed by
 * attribute number - 1), into the partition that covers its expires_at, or
 * into the default partition.  Uniqueness of (tenant, endpoint, key) within
 * the partition is checked by its unique index, as an INSERT would.
 */
void
IdemInsertKeyRow(Datum *values, bool *nulls, bool leased)
{
	Relation	parent;
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

	parent = table_open(IdemKeysRelid(), RowExclusiveLock);
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
	part = table_open(partoid, RowExclusiveLock);

	estate = CreateExecutorState();
	rri = makeNode(ResultRelInfo);
	InitResultRelInfo(rri, part, 1, NULL, 0);
	/* by value: opening the indexes may process invalidations */
	IdemOpenIndices(rri, IdemGetProbe(partoid, part)->lease_indexoid, leased);

	parent_slot = MakeSingleTupleTableSlot(RelationGetDescr(parent), &TTSOpsVirtual);
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
	table_close(parent, NoLock);

	/* later reads of this transaction see the row */
	CommandCounterIncrement();
}
