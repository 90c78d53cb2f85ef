/*-------------------------------------------------------------------------
 *
 * tombstone_direct.c
 *	  What maintenance's drop of a partition of keys reads and writes
 *	  (tombstone_direct.h), without the executor: the partition's rows, read
 *	  by a scan of the table, and the rows of tombstones made of them (some
 *	  2 kB runs of tombstones a row), written straight into their
 *	  partitions of idempotency.tombstones, without the cost of an INSERT
 *	  (its arrays of parameters, the function scan that unpacks them, tuple
 *	  routing through the executor, the trigger of each row).
 *
 *	  What the SELECT did, the reading does: the rows the snapshot sees,
 *	  those expired at the pass's time whose endpoint keeps tombstones
 *	  (its tombstone_ttl, else idempotency.tombstone_ttl, read once from
 *	  idempotency.endpoints with the same snapshot; endpoints compared
 *	  bytewise, as COLLATE "C" does) and whose tombstone would still live,
 *	  its expiry the key's plus that interval by the same function as the
 *	  SQL's +, the scope hashed by the caller's function (the one of
 *	  idem_tombstone_hash).
 *
 *	  What the INSERT did, this does: each row goes into the partition
 *	  whose range covers its expires_at (else into the default partition),
 *	  found from the partition bounds as the executor finds it; its hashes
 *	  go into that partition's filter before the row is written, as the
 *	  trigger tombstones_filter adds them (tombstone_filter.c); the rows
 *	  are written by the table access method, many at once
 *	  (table_multi_insert, WAL-logged as any insert, which logical
 *	  decoding reads), with their entries in every index of the partition;
 *	  and the command counter moves on at the end, so that the rest of the
 *	  transaction sees them.  Rows are only ever made by the extension,
 *	  with every column valid: the partition's constraint is met by the
 *	  routing, and NOT NULL by the values.  A table that is not as the
 *	  extension made it (another partitioning, a partition of partitions
 *	  or a foreign table, another trigger) is written by the INSERT still.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/partcache.h"
#include "utils/rel.h"
#include "utils/reltrigger.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "guc.h"
#include "tombstone_direct.h"
#include "tombstone_filter.h"
#include "tombstone_row.h"

/*
 * Rows written by one multi-insert into a partition: about 64 kB of runs,
 * as COPY buffers them.
 */
#define DIRECT_BATCH_ROWS 32

/* the columns written, in the order of IdemTombDirectAdd's values */
static const char *const direct_columns[] = {
	"scope_hash", "fingerprint", "expired_at", "expires_at"
};

#define DIRECT_NCOLUMNS lengthof(direct_columns)

/* One partition written into, opened on its first row. */
typedef struct DirectTarget
{
	Relation	rel;
	ResultRelInfo *rri;
	BulkInsertState bistate;
	int			col[DIRECT_NCOLUMNS];	/* each column's index in rel */
	Datum	   *values;
	bool	   *nulls;
	TupleTableSlot *slots[DIRECT_BATCH_ROWS];
	int			n;				/* rows held in slots */
} DirectTarget;

struct IdemTombDirect
{
	Relation	parent;
	Oid			root;			/* what the filters are kept under */
	PartitionDesc pd;
	PartitionKey key;
	EState	   *estate;
	CommandId	cid;
	DirectTarget **targets;		/* by index in pd */
	bytea	   *hash;			/* the row's two bytea, reused */
	bytea	   *fp;
	int			fp_cap;
};

/* Whether rel has exactly one trigger, tombstones_filter. */
static bool
IdemTombDirectTriggersKnown(Relation rel)
{
	TriggerDesc *td = rel->trigdesc;

	return td != NULL && td->numtriggers == 1 &&
		strcmp(td->triggers[0].tgname, "tombstones_filter") == 0;
}

/*
 * Whether parent is partitioned as the extension made it: by range of
 * expires_at alone, every partition a table, no trigger but the filters'.
 */
static bool
IdemTombDirectLayoutKnown(Relation parent, PartitionDesc pd, PartitionKey key)
{
	if (key == NULL || key->strategy != PARTITION_STRATEGY_RANGE ||
		key->partnatts != 1 || key->partattrs[0] == 0 ||
		key->parttypid[0] != TIMESTAMPTZOID ||
		key->partattrs[0] != get_attnum(RelationGetRelid(parent), "expires_at") ||
		!IdemTombDirectTriggersKnown(parent))
		return false;
	for (int i = 0; i < pd->nparts; i++)
	{
		if (!pd->is_leaf[i] || get_rel_relkind(pd->oids[i]) != RELKIND_RELATION)
			return false;
	}
	return true;
}

IdemTombDirect *
IdemTombDirectBegin(Oid relid)
{
	Relation	parent = table_open(relid, RowExclusiveLock);
	IdemTombDirect *d;
	PartitionDesc pd;
	PartitionKey key;

	if (parent->rd_rel->relkind != RELKIND_PARTITIONED_TABLE)
	{
		table_close(parent, NoLock);
		return NULL;
	}
	pd = RelationGetPartitionDesc(parent, true);
	key = RelationGetPartitionKey(parent);
	if (!IdemTombDirectLayoutKnown(parent, pd, key))
	{
		table_close(parent, NoLock);
		return NULL;
	}
	d = palloc0(sizeof(IdemTombDirect));
	d->parent = parent;
	d->root = relid;
	d->pd = pd;
	d->key = key;
	d->estate = CreateExecutorState();
	d->cid = GetCurrentCommandId(true);
	d->targets = palloc0(sizeof(DirectTarget *) * Max(pd->nparts, 1));
	d->hash = palloc(VARHDRSZ + 64);
	d->fp_cap = 4096;
	d->fp = palloc(VARHDRSZ + d->fp_cap);
	return d;
}

/* The index in d->pd of the partition that covers ts; -1 for none. */
static int
IdemTombDirectPartition(IdemTombDirect *d, TimestampTz ts)
{
	PartitionBoundInfo bounds = d->pd->boundinfo;
	int			index = -1;

	if (bounds == NULL)
		return -1;
	if (bounds->ndatums > 0)
	{
		Datum		value = TimestampTzGetDatum(ts);
		bool		equal;
		int			offset;

		offset = partition_range_datum_bsearch(d->key->partsupfunc,
											   d->key->partcollation,
											   bounds, 1, &value, &equal);
		index = bounds->indexes[offset + 1];
	}
	return index >= 0 ? index : bounds->default_index;
}

/* The partition at index in d->pd, opened for its first row. */
static DirectTarget *
IdemTombDirectTarget(IdemTombDirect *d, int index)
{
	DirectTarget *t = d->targets[index];
	TupleDesc	desc;

	if (t != NULL)
		return t;
	t = palloc0(sizeof(DirectTarget));
	t->rel = table_open(d->pd->oids[index], RowExclusiveLock);
	if (!IdemTombDirectTriggersKnown(t->rel))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("partition %s of idempotency.tombstones has a trigger maintenance does not know",
						RelationGetRelationName(t->rel)),
				 errdetail("Maintenance writes tombstones without firing triggers; only the trigger tombstones_filter is expected."),
				 errhint("Drop the other triggers of the partition; only the extension writes tombstones.")));
	desc = RelationGetDescr(t->rel);
	for (int c = 0; c < (int) DIRECT_NCOLUMNS; c++)
	{
		t->col[c] = -1;
		for (int a = 0; a < desc->natts; a++)
		{
			Form_pg_attribute att = TupleDescAttr(desc, a);

			if (!att->attisdropped &&
				strcmp(NameStr(att->attname), direct_columns[c]) == 0)
				t->col[c] = a;
		}
		if (t->col[c] < 0)
			elog(ERROR, "partition %s of idempotency.tombstones has no column %s",
				 RelationGetRelationName(t->rel), direct_columns[c]);
	}
	t->values = palloc0(sizeof(Datum) * desc->natts);
	t->nulls = palloc(sizeof(bool) * desc->natts);
	memset(t->nulls, true, sizeof(bool) * desc->natts);
	t->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(t->rri, t->rel, 1, NULL, 0);
	ExecOpenIndices(t->rri, false);
	t->bistate = GetBulkInsertState();
	for (int i = 0; i < DIRECT_BATCH_ROWS; i++)
		t->slots[i] = MakeSingleTupleTableSlot(desc, &TTSOpsHeapTuple);
	d->targets[index] = t;
	return t;
}

/* The rows held for t, written, with their index entries. */
static void
IdemTombDirectFlush(IdemTombDirect *d, DirectTarget *t)
{
	if (t->n == 0)
		return;
	table_multi_insert(t->rel, t->slots, t->n, d->cid, 0, t->bistate);
	for (int i = 0; i < t->n; i++)
	{
		if (t->rri->ri_NumIndices > 0)
		{
			(void) IdemInsertIndexTuples(t->rri, t->slots[i], d->estate);
			ResetPerTupleExprContext(d->estate);
		}
		ExecClearTuple(t->slots[i]);
	}
	t->n = 0;
}

void
IdemTombDirectAdd(IdemTombDirect *d, const uint8 *scope_hash, int hlen,
				  const uint8 *fp, int fplen, TimestampTz expired,
				  TimestampTz expires)
{
	int			index = IdemTombDirectPartition(d, expires);
	DirectTarget *t;
	HeapTuple	tuple;

	if (index < 0)
		ereport(ERROR,
				(errcode(ERRCODE_CHECK_VIOLATION),
				 errmsg("no partition of idempotency.tombstones covers a tombstone's expiry time"),
				 errhint("The default partition idempotency.tombstones_default must exist; reinstall the extension.")));
	t = IdemTombDirectTarget(d, index);

	if (hlen > 64)
		elog(ERROR, "a tombstone's scope_hash of %d bytes is too long", hlen);
	SET_VARSIZE(d->hash, VARHDRSZ + hlen);
	memcpy(VARDATA(d->hash), scope_hash, hlen);
	if (fplen > d->fp_cap)
	{
		d->fp_cap = fplen;
		d->fp = repalloc(d->fp, VARHDRSZ + d->fp_cap);
	}
	SET_VARSIZE(d->fp, VARHDRSZ + fplen);
	memcpy(VARDATA(d->fp), fp, fplen);

	/* before the row is written, as the trigger tombstones_filter does */
	IdemTombFilterAddRowHashes(d->root, d->pd->oids[index], d->hash, d->fp);

	t->values[t->col[0]] = PointerGetDatum(d->hash);
	t->values[t->col[1]] = PointerGetDatum(d->fp);
	t->values[t->col[2]] = TimestampTzGetDatum(expired);
	t->values[t->col[3]] = TimestampTzGetDatum(expires);
	for (int c = 0; c < (int) DIRECT_NCOLUMNS; c++)
		t->nulls[t->col[c]] = false;
	tuple = heap_form_tuple(RelationGetDescr(t->rel), t->values, t->nulls);
	ExecStoreHeapTuple(tuple, t->slots[t->n], true);
	if (++t->n == DIRECT_BATCH_ROWS)
		IdemTombDirectFlush(d, t);
}

void
IdemTombDirectEnd(IdemTombDirect *d)
{
	for (int i = 0; i < d->pd->nparts; i++)
	{
		DirectTarget *t = d->targets[i];

		if (t == NULL)
			continue;
		IdemTombDirectFlush(d, t);
		for (int s = 0; s < DIRECT_BATCH_ROWS; s++)
			ExecDropSingleTupleTableSlot(t->slots[s]);
		FreeBulkInsertState(t->bistate);
		ExecCloseIndices(t->rri);
		table_close(t->rel, NoLock);
	}
	FreeExecutorState(d->estate);
	table_close(d->parent, NoLock);
	/* later reads of this transaction see the rows */
	CommandCounterIncrement();
}

/* ----------------------------------------------------------------
 *		reading a partition of keys
 * ----------------------------------------------------------------
 */

/* The tombstone_ttl of an endpoint, as the SQL reads it. */
typedef struct EndpointTtl
{
	const char *name;
	int			len;
	Interval	ttl;			/* coalesce(tombstone_ttl, the setting) */
	bool		keeps;			/* ttl > 0 */
} EndpointTtl;

typedef struct EndpointTtls
{
	EndpointTtl *e;				/* by name, bytewise */
	int			n;
	EndpointTtl deflt;			/* of an endpoint without a row */
	const EndpointTtl *last;	/* the last one found */
} EndpointTtls;

static int
IdemEndpointTtlCmp(const void *a, const void *b)
{
	const EndpointTtl *x = a;
	const EndpointTtl *y = b;
	int			c = memcmp(x->name, y->name, Min(x->len, y->len));

	return c != 0 ? c : (x->len > y->len) - (x->len < y->len);
}

/* Whether ttl is above 0, as interval '0' < ttl. */
static bool
IdemIntervalPositive(Interval *ttl)
{
	Interval	zero = {0};

	return DatumGetBool(DirectFunctionCall2(interval_gt, IntervalPGetDatum(ttl),
											IntervalPGetDatum(&zero)));
}

/* Every endpoint's tombstone_ttl as snapshot sees it. */
static void
IdemEndpointTtlsLoad(EndpointTtls *t, Snapshot snapshot)
{
	SPIPlanPtr	plan = SPI_prepare("SELECT endpoint::pg_catalog.text, tombstone_ttl"
								   " FROM idempotency.endpoints", 0, NULL);
	int			rc;

	if (plan == NULL)
		elog(ERROR, "preparing the read of idempotency.endpoints failed: %s",
			 SPI_result_code_string(SPI_result));
	rc = SPI_execute_snapshot(plan, NULL, NULL, snapshot, InvalidSnapshot,
							  true, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "reading idempotency.endpoints failed: %s",
			 SPI_result_code_string(rc));
	memset(&t->deflt, 0, sizeof(t->deflt));
	t->deflt.len = -1;			/* never found by name */
	t->deflt.ttl.time = (int64) idem_tombstone_ttl * USECS_PER_SEC;
	t->deflt.keeps = IdemIntervalPositive(&t->deflt.ttl);
	t->n = (int) SPI_processed;
	t->e = palloc(sizeof(EndpointTtl) * Max(t->n, 1));
	t->last = NULL;
	for (int i = 0; i < t->n; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		bool		isnull;
		text	   *name = DatumGetTextPP(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull));
		Datum		ttl = SPI_getbinval(tup, SPI_tuptable->tupdesc, 2, &isnull);
		EndpointTtl *e = &t->e[i];

		e->len = VARSIZE_ANY_EXHDR(name);
		e->name = pnstrdup(VARDATA_ANY(name), e->len);
		e->ttl = isnull ? t->deflt.ttl : *DatumGetIntervalP(ttl);
		e->keeps = IdemIntervalPositive(&e->ttl);
	}
	qsort(t->e, t->n, sizeof(EndpointTtl), IdemEndpointTtlCmp);
}

/* The tombstone_ttl of the endpoint name (len bytes). */
static const EndpointTtl *
IdemEndpointTtlOf(EndpointTtls *t, const char *name, int len)
{
	EndpointTtl key;
	const EndpointTtl *found;

	if (t->last != NULL && t->last->len == len &&
		memcmp(t->last->name, name, len) == 0)
		return t->last;
	key.name = name;
	key.len = len;
	found = bsearch(&key, t->e, t->n, sizeof(EndpointTtl), IdemEndpointTtlCmp);
	if (found == NULL)
		return &t->deflt;
	t->last = found;
	return found;
}

/* the columns read, in the order of their use below, and their types */
static const char *const read_columns[] = {
	"tenant", "endpoint", "key", "fingerprint", "expires_at"
};
static const Oid read_types[] = {
	TEXTOID, TEXTOID, TEXTOID, BYTEAOID, TIMESTAMPTZOID
};

#define READ_NCOLUMNS lengthof(read_columns)

/*
 * The attribute numbers of the columns read in rel, into att; false when
 * one is missing or of another type.
 */
static bool
IdemTombDirectReadColumns(Relation rel, AttrNumber *att)
{
	TupleDesc	desc = RelationGetDescr(rel);

	for (int c = 0; c < (int) READ_NCOLUMNS; c++)
	{
		att[c] = InvalidAttrNumber;
		for (int a = 0; a < desc->natts; a++)
		{
			Form_pg_attribute attr = TupleDescAttr(desc, a);

			if (!attr->attisdropped &&
				strcmp(NameStr(attr->attname), read_columns[c]) == 0 &&
				attr->atttypid == read_types[c])
				att[c] = attr->attnum;
		}
		if (att[c] == InvalidAttrNumber)
			return false;
	}
	return true;
}

/* The tombstone of a row of a partition of keys (IdemTombDirectReadRow). */
typedef struct ReadTombstone
{
	uint8		hash[IDEM_TOMBSTONE_HASH_LEN];
	bytea	   *fp;
	TimestampTz expired;
	TimestampTz expires;
} ReadTombstone;

/*
 * One row of the partition: whether it leaves a tombstone (the conditions
 * of tombstone_write.c's SQL), and the tombstone into out, computed in the
 * current memory context.
 */
static bool
IdemTombDirectReadRow(TupleTableSlot *slot, const AttrNumber *att,
					  EndpointTtls *ttls, TimestampTz as_of,
					  IdemTombDirectHash hash, ReadTombstone *out)
{
	Datum	   *v = slot->tts_values;
	text	   *endpoint;
	const EndpointTtl *e;

	for (int c = 0; c < (int) READ_NCOLUMNS; c++)
	{
		if (slot->tts_isnull[att[c] - 1])
			elog(ERROR, "a row of %s lacks its %s",
				 get_rel_name(slot->tts_tableOid), read_columns[c]);
	}
	out->expired = DatumGetTimestampTz(v[att[4] - 1]);
	if (out->expired > as_of)
		return false;
	endpoint = DatumGetTextPP(v[att[1] - 1]);
	e = IdemEndpointTtlOf(ttls, VARDATA_ANY(endpoint), VARSIZE_ANY_EXHDR(endpoint));
	if (!e->keeps)
		return false;
	out->expires = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														   TimestampTzGetDatum(out->expired),
														   IntervalPGetDatum(&e->ttl)));
	if (!(out->expires > as_of))
		return false;
	hash(DatumGetTextPP(v[att[0] - 1]), endpoint,
		 DatumGetTextPP(v[att[2] - 1]), out->hash);
	out->fp = DatumGetByteaPP(v[att[3] - 1]);
	return true;
}

bool
IdemTombDirectRead(Oid relid, TimestampTz as_of, Snapshot snapshot,
				   IdemTombDirectHash hash, IdemTombDirectEmit emit, void *arg)
{
	Relation	rel = table_open(relid, AccessShareLock);
	AttrNumber	att[READ_NCOLUMNS];
	AttrNumber	maxatt = 0;
	EndpointTtls ttls;
	TupleTableSlot *slot;
	TableScanDesc scan;
	MemoryContext row_cxt;
	MemoryContext caller = CurrentMemoryContext;
	uint64		n = 0;

	if (rel->rd_rel->relkind != RELKIND_RELATION ||
		!IdemTombDirectReadColumns(rel, att))
	{
		table_close(rel, NoLock);
		return false;
	}
	for (int c = 0; c < (int) READ_NCOLUMNS; c++)
		maxatt = Max(maxatt, att[c]);
	IdemEndpointTtlsLoad(&ttls, snapshot);
	row_cxt = AllocSetContextCreate(caller, "tombstones of a partition",
									ALLOCSET_DEFAULT_SIZES);
	slot = table_slot_create(rel, NULL);
	scan = table_beginscan(rel, snapshot, 0, NULL);
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		ReadTombstone t;
		bool		keep;

		if ((++n & 1023) == 0)
			CHECK_FOR_INTERRUPTS();
		slot_getsomeattrs(slot, maxatt);
		/* what a row needs leaves with it; emit copies what it keeps */
		MemoryContextSwitchTo(row_cxt);
		keep = IdemTombDirectReadRow(slot, att, &ttls, as_of, hash, &t);
		MemoryContextSwitchTo(caller);
		if (keep)
			emit(arg, t.hash, IDEM_TOMBSTONE_HASH_LEN,
				 (const uint8 *) VARDATA_ANY(t.fp), VARSIZE_ANY_EXHDR(t.fp),
				 t.expired, t.expires);
		MemoryContextReset(row_cxt);
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	MemoryContextDelete(row_cxt);
	table_close(rel, NoLock);
	return true;
}
