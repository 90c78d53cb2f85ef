/*-------------------------------------------------------------------------
 *
 * tombstone_write.c
 *	  Tombstones of expired keys (idempotency.tombstones), the writer's
 *	  side: the statements that make tombstones of expired key rows, its
 *	  default partition's purge, and the tombstone_ttl in use (the probe
 *	  and the scope hash are in tombstone_probe.c).
 *
 *	  Tombstones are written off the request path, by maintenance, from the
 *	  rows of a partition of idempotency.keys about to be dropped (as runs,
 *	  rows of many tombstones, when they are many: tombstone_row.h) and
 *	  from the expired rows purged from its default partition (in the same
 *	  statement as the purge).  They are partitioned by their own expiry
 *	  and leave by whole partitions too (maint_partitions.c).
 *
 *	  In the Citus mode (doc/scaling.md) the purge of the default partition
 *	  writes, on each worker, into the shard of tombstones colocated with
 *	  the purged one; and a partition of keys that the coordinator's
 *	  maintenance drops leaves its tombstones on each worker from the DROP
 *	  of its shard, under the lock of that drop
 *	  (IdemTombstonesBeforeShardDrop, called by the DDL guard's event
 *	  trigger), so that every row the drop removes leaves one.  All of it
 *	  writes shards by name, never through Citus's executor.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heaptoast.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/partition.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "port/pg_bswap.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "guc.h"
#include "schema.h"
#include "tombstone_direct.h"
#include "tombstone_probe.h"
#include "tombstone_write.h"
#include "util.h"

/*
 * Entries per run (tombstone_row.h): as many as keep the row under the size
 * at which it would be compressed or moved out of line, so that a row is
 * read in place.
 */
#define RUN_MAX_ENTRIES ((TOAST_TUPLE_THRESHOLD - 64) / IDEM_TOMBSTONE_RUN_ENTRY)

StaticAssertDecl(RUN_MAX_ENTRIES >= 8, "a run holds too few entries for this block size");

/*
 * The statements that make tombstones of key rows: a FROM and WHERE clause
 * over source (rows with columns tenant, endpoint, key, fingerprint and
 * expires_at, named s) that keeps the rows whose endpoint keeps tombstones
 * and whose tombstone would still live at $1 (a timestamptz), and the
 * INSERT that goes before it.
 */
static char *
IdemTombstoneSourceOnSql(const char *source, const char *endpoints)
{
	return psprintf(" FROM %s s"
					" LEFT JOIN %s e ON e.endpoint OPERATOR(pg_catalog.=)"
					" s.endpoint::pg_catalog.text COLLATE \"C\""
					" CROSS JOIN LATERAL (SELECT coalesce(e.tombstone_ttl,"
					" pg_catalog.make_interval(secs => %d)) AS ttl) t"
					" WHERE t.ttl OPERATOR(pg_catalog.>) '0'::pg_catalog.interval"
					" AND s.expires_at OPERATOR(pg_catalog.+) t.ttl OPERATOR(pg_catalog.>) $1",
					source, endpoints, idem_tombstone_ttl);
}

static char *
IdemTombstoneSourceSql(const char *source)
{
	return IdemTombstoneSourceOnSql(source, "idempotency.endpoints");
}

#define TOMBSTONE_INSERT_SQL \
	"INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)" \
	" SELECT idempotency.idem_tombstone_hash(s.tenant, s.endpoint, s.key)," \
	" s.fingerprint, s.expires_at, s.expires_at OPERATOR(pg_catalog.+) t.ttl"

/* The same into target, a shard of tombstones: with the tenant (Citus) */
#define TOMBSTONE_INSERT_SHARD_SQL \
	"INSERT INTO %s (scope_hash, fingerprint, expired_at, expires_at, tenant)" \
	" SELECT idempotency.idem_tombstone_hash(s.tenant, s.endpoint, s.key)," \
	" s.fingerprint, s.expires_at, s.expires_at OPERATOR(pg_catalog.+) t.ttl, s.tenant"

/*
 * Citus mode: the shard of idempotency.endpoints (a reference table) on this
 * node, by qualified name; the table itself where it is not distributed.
 */
static char *
IdemCitusEndpointsSql(void)
{
	char	   *result = "idempotency.endpoints";

	if (SPI_execute("SELECT pg_catalog.shard_name(s.logicalrelid, s.shardid)"
					" FROM pg_catalog.pg_dist_shard s"
					" JOIN pg_catalog.pg_dist_placement p USING (shardid)"
					" JOIN pg_catalog.pg_dist_local_group g USING (groupid)"
					" WHERE s.logicalrelid OPERATOR(pg_catalog.=) 'idempotency.endpoints'::pg_catalog.regclass"
					" LIMIT 1", true, 1) != SPI_OK_SELECT)
		elog(ERROR, "reading pg_dist_shard failed");
	if (SPI_processed == 1)
		result = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	return result;
}

/*
 * The expired rows of the default partition of idempotency.keys leave it,
 * and those whose endpoint keeps tombstones leave one, in one statement: a
 * claim that reads with a later snapshot sees the row or its tombstone.
 */
static int64
IdemTombstonePurgeOne(const char *keys_default, const char *insert,
					  TimestampTz as_of, int64 *tombstoned)
{
	Oid			argtypes[1] = {TIMESTAMPTZOID};
	Datum		args[1] = {TimestampTzGetDatum(as_of)};
	bool		isnull;
	int64		purged;
	int			rc;

	rc = SPI_execute_with_args(psprintf("WITH gone AS (DELETE FROM ONLY %s"
										" WHERE expires_at OPERATOR(pg_catalog.<=) $1"
										" RETURNING tenant, endpoint, key, fingerprint, expires_at),"
										" made AS (%s RETURNING 1)"
										" SELECT (SELECT pg_catalog.count(*) FROM gone),"
										" (SELECT pg_catalog.count(*) FROM made)",
										keys_default, insert),
							   1, argtypes, args, NULL, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "purging %s failed: %s",
			 keys_default, SPI_result_code_string(rc));
	purged = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
										 SPI_tuptable->tupdesc, 1, &isnull));
	*tombstoned += DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc, 2, &isnull));
	return purged;
}

int64
IdemTombstonePurgeKeysDefault(TimestampTz as_of, int64 *tombstoned)
{
	int64		purged = 0;

	*tombstoned = 0;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (!IdemTombstonesCitus())
		purged = IdemTombstonePurgeOne("idempotency.keys_default",
									   psprintf(TOMBSTONE_INSERT_SQL "%s",
												IdemTombstoneSourceSql("gone")),
									   as_of, tombstoned);
	else
	{
		/*
		 * Citus mode: each shard of the default partition placed on this
		 * node (none on the coordinator), into the shard of tombstones
		 * colocated with it
		 */
		char	   *endpoints = IdemCitusEndpointsSql();
		SPITupleTable *shards;
		uint64		nshards;

		if (SPI_execute("SELECT pg_catalog.shard_name(k.logicalrelid, k.shardid),"
						" pg_catalog.shard_name(t.logicalrelid, t.shardid)"
						" FROM pg_catalog.pg_dist_shard k"
						" JOIN pg_catalog.pg_dist_placement p USING (shardid)"
						" JOIN pg_catalog.pg_dist_local_group g USING (groupid)"
						" JOIN pg_catalog.pg_dist_shard t"
						"   ON t.logicalrelid OPERATOR(pg_catalog.=) 'idempotency.tombstones'::pg_catalog.regclass"
						"  AND t.shardminvalue OPERATOR(pg_catalog.=) k.shardminvalue"
						" WHERE k.logicalrelid OPERATOR(pg_catalog.=) 'idempotency.keys_default'::pg_catalog.regclass"
						" ORDER BY k.shardid", true, 0) != SPI_OK_SELECT)
			elog(ERROR, "listing the local shards of idempotency.keys_default failed");
		shards = SPI_tuptable;
		nshards = SPI_processed;
		for (uint64 i = 0; i < nshards; i++)
		{
			char	   *keys_default = SPI_getvalue(shards->vals[i], shards->tupdesc, 1);
			char	   *target = SPI_getvalue(shards->vals[i], shards->tupdesc, 2);

			purged += IdemTombstonePurgeOne(keys_default,
											psprintf(TOMBSTONE_INSERT_SHARD_SQL "%s", target,
													 IdemTombstoneSourceOnSql("gone", endpoints)),
											as_of, tombstoned);
		}
	}
	SPI_finish();
	return purged;
}

/*
 * Citus mode, on a worker: before relid, a shard of a partition of
 * idempotency.keys placed on this node, is dropped (the coordinator's
 * maintenance dropping the partition, which Citus carries to each shard),
 * take the lock the drop takes, ACCESS EXCLUSIVE on the shard's parent
 * (the tenant's shard of keys, which every claim of its tenants holds in
 * ROW EXCLUSIVE until it ends), then write the tombstones of all its rows
 * as the latest snapshot sees them into the shard of tombstones colocated
 * with it: no writer is left, so every committed row the drop removes
 * leaves one.  Anything else (not a shard of keys, a placement moved away,
 * tombstones not distributed) is left alone.
 */
void
IdemTombstonesBeforeShardDrop(Oid relid)
{
	Oid			nsp;
	Oid			parent;
	char	   *parent_name;
	char	   *target;
	char	   *endpoints;
	char	   *source;
	IdemOwnerSection section;
	SPIPlanPtr	plan;
	Snapshot	latest;
	int			rc;

	if (!OidIsValid(relid) || !get_rel_relispartition(relid))
		return;
	nsp = get_namespace_oid("idempotency", true);
	if (!OidIsValid(nsp) || get_rel_namespace(relid) != nsp ||
		get_rel_relkind(relid) != RELKIND_RELATION)
		return;
	parent = get_partition_parent(relid, true);
	parent_name = get_rel_name(parent);
	/* shards are named TABLE_SHARDID */
	if (parent_name == NULL || get_rel_namespace(parent) != nsp ||
		strncmp(parent_name, "keys_", 5) != 0 ||
		strspn(parent_name + 5, "0123456789") != strlen(parent_name + 5) ||
		!IdemSchemaHas(IDEM_SCHEMA_CITUS_TOMBSTONES))
		return;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	IdemBeginOwnerSection(&section, IdemExtensionOwner(), 0);
	if (SPI_execute_with_args("SELECT pg_catalog.shard_name(t.logicalrelid, t.shardid)"
							  " FROM pg_catalog.pg_dist_shard k"
							  " JOIN pg_catalog.pg_dist_placement p USING (shardid)"
							  " JOIN pg_catalog.pg_dist_local_group g USING (groupid)"
							  " JOIN pg_catalog.pg_dist_shard t"
							  "   ON t.logicalrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('idempotency.tombstones')"
							  "  AND t.shardminvalue OPERATOR(pg_catalog.=) k.shardminvalue"
							  " JOIN pg_catalog.pg_dist_placement tp"
							  "   ON tp.shardid OPERATOR(pg_catalog.=) t.shardid"
							  "  AND tp.groupid OPERATOR(pg_catalog.=) g.groupid"
							  " WHERE k.logicalrelid OPERATOR(pg_catalog.=) 'idempotency.keys'::pg_catalog.regclass"
							  "  AND k.shardid OPERATOR(pg_catalog.=) $1::pg_catalog.int8"
							  "  AND pg_catalog.to_regclass(pg_catalog.shard_name(t.logicalrelid,"
							  " t.shardid)) IS NOT NULL",
							  1, (Oid[]) {TEXTOID},
							  (Datum[]) {CStringGetTextDatum(parent_name + 5)},
							  NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "reading pg_dist_shard failed");
	if (SPI_processed != 1)
	{
		IdemEndOwnerSection(&section);
		SPI_finish();
		return;
	}
	target = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	endpoints = IdemCitusEndpointsSql();

	/* the drop's own lock, taken first, in the order the drop takes it */
	LockRelationOid(parent, AccessExclusiveLock);

	source = psprintf("(SELECT * FROM ONLY %s)",
					  quote_qualified_identifier("idempotency", get_rel_name(relid)));
	plan = SPI_prepare(psprintf(TOMBSTONE_INSERT_SHARD_SQL "%s", target,
								IdemTombstoneSourceOnSql(source, endpoints)),
					   1, (Oid[]) {TIMESTAMPTZOID});
	if (plan == NULL)
		elog(ERROR, "preparing the tombstones of %s failed: %s",
			 source, SPI_result_code_string(SPI_result));
	latest = RegisterSnapshot(GetLatestSnapshot());
	rc = SPI_execute_snapshot(plan,
							  (Datum[]) {TimestampTzGetDatum(GetCurrentTimestamp())},
							  NULL, latest, InvalidSnapshot, false, true, 0);
	UnregisterSnapshot(latest);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "writing the tombstones of %s failed: %s",
			 source, SPI_result_code_string(rc));
	IdemEndOwnerSection(&section);
	SPI_finish();
}

/* One tombstone of a run being built. */
typedef struct RunEntry
{
	uint8		hash[IDEM_TOMBSTONE_HASH_LEN];
	uint8		fp[IDEM_TOMBSTONE_FP_LEN];
	TimestampTz expired;
	TimestampTz expires;
} RunEntry;

/*
 * Rows of tombstones written by one INSERT: enough that the statement's
 * set-up is a small share of its cost, few enough (about 1 MB of runs) to
 * hold in memory.
 */
#define RUN_INSERT_BATCH 512

typedef struct RunWriter
{
	bool		begun;			/* direct or insert set (at the first row) */
	IdemTombDirect *direct;		/* writes rows straight into partitions */
	SPIPlanPtr	insert;			/* else: INSERT of up to RUN_INSERT_BATCH rows */
	/* the rows waiting for it, as its four arrays' elements */
	Datum		row_hash[RUN_INSERT_BATCH];
	Datum		row_fp[RUN_INSERT_BATCH];
	Datum		row_expired[RUN_INSERT_BATCH];
	Datum		row_expires[RUN_INSERT_BATCH];
	int			nrows;
	int			bits;			/* width of the buckets */
	uint8		bucket[IDEM_TOMBROW_BUCKET_MAX];		/* the bucket of the entries held */
	int			bucket_len;
	RunEntry	entries[RUN_MAX_ENTRIES];
	int			n;
} RunWriter;

/*
 * The rows waiting, written by one INSERT of four arrays, in their order
 * (tuple routing puts each into the partition of its expires_at).
 */
static void
IdemTombstoneInsertRows(RunWriter *w)
{
	Datum		values[4];
	int			rc;

	if (w->nrows == 0)
		return;
	values[0] = PointerGetDatum(construct_array(w->row_hash, w->nrows, BYTEAOID,
												-1, false, TYPALIGN_INT));
	values[1] = PointerGetDatum(construct_array(w->row_fp, w->nrows, BYTEAOID,
												-1, false, TYPALIGN_INT));
	values[2] = PointerGetDatum(construct_array(w->row_expired, w->nrows,
												TIMESTAMPTZOID, sizeof(TimestampTz),
												FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	values[3] = PointerGetDatum(construct_array(w->row_expires, w->nrows,
												TIMESTAMPTZOID, sizeof(TimestampTz),
												FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	rc = SPI_execute_plan(w->insert, values, NULL, false, 0);
	if (rc != SPI_OK_INSERT || SPI_processed != (uint64) w->nrows)
		elog(ERROR, "writing rows of tombstones failed: %s",
			 SPI_result_code_string(rc));
	for (int i = 0; i < 4; i++)
		pfree(DatumGetPointer(values[i]));
	for (int i = 0; i < w->nrows; i++)
	{
		pfree(DatumGetPointer(w->row_hash[i]));
		pfree(DatumGetPointer(w->row_fp[i]));
	}
	w->nrows = 0;
}

static void IdemTombstoneWriterBegin(RunWriter *w);

/*
 * One row of tombstones: straight into its partition (tombstone_direct.h),
 * or written by the INSERT with the next RUN_INSERT_BATCH - 1.
 */
static void
IdemTombstoneInsertRow(RunWriter *w, const uint8 *scope_hash, int hlen,
					   const uint8 *fp, int fplen, TimestampTz expired,
					   TimestampTz expires)
{
	bytea	   *h;
	bytea	   *f;

	if (!w->begun)
		IdemTombstoneWriterBegin(w);
	if (w->direct != NULL)
	{
		IdemTombDirectAdd(w->direct, scope_hash, hlen, fp, fplen, expired, expires);
		return;
	}
	h = palloc(VARHDRSZ + hlen);
	f = palloc(VARHDRSZ + fplen);

	SET_VARSIZE(h, VARHDRSZ + hlen);
	memcpy(VARDATA(h), scope_hash, hlen);
	SET_VARSIZE(f, VARHDRSZ + fplen);
	memcpy(VARDATA(f), fp, fplen);
	w->row_hash[w->nrows] = PointerGetDatum(h);
	w->row_fp[w->nrows] = PointerGetDatum(f);
	w->row_expired[w->nrows] = TimestampTzGetDatum(expired);
	w->row_expires[w->nrows] = TimestampTzGetDatum(expires);
	if (++w->nrows == RUN_INSERT_BATCH)
		IdemTombstoneInsertRows(w);
}

/*
 * The entries held, as one row: its expired_at and expires_at are the
 * latest of theirs, and each entry keeps how many whole seconds lie
 * between, so that an entry read back expires no earlier than its key's
 * tombstone would have (up to a second later).  An entry too far back for
 * its offsets (never within one partition's drop) is written alone.
 */
static void
IdemTombstoneFlushRun(RunWriter *w)
{
	TimestampTz row_expired = DT_NOBEGIN;
	TimestampTz row_expires = DT_NOBEGIN;
	uint8	   *packed;
	int			n = 0;

	if (w->n == 0)
		return;
	for (int i = 0; i < w->n; i++)
	{
		row_expired = Max(row_expired, w->entries[i].expired);
		row_expires = Max(row_expires, w->entries[i].expires);
	}
	packed = palloc((Size) w->n * IDEM_TOMBSTONE_RUN_ENTRY);
	for (int i = 0; i < w->n; i++)
	{
		RunEntry   *e = &w->entries[i];
		int64		back_expired = (row_expired - e->expired) / USECS_PER_SEC;
		int64		back_expires = (row_expires - e->expires) / USECS_PER_SEC;
		uint8	   *out = packed + (Size) n * IDEM_TOMBSTONE_RUN_ENTRY;
		uint32		v;

		if (back_expired > PG_UINT32_MAX || back_expires > PG_UINT32_MAX)
		{
			IdemTombstoneInsertRow(w, e->hash, IDEM_TOMBSTONE_HASH_LEN,
								   e->fp, IDEM_TOMBSTONE_FP_LEN,
								   e->expired, e->expires);
			continue;
		}
		memcpy(out, e->hash, IDEM_TOMBSTONE_HASH_LEN);
		memcpy(out + IDEM_TOMBSTONE_HASH_LEN, e->fp, IDEM_TOMBSTONE_FP_LEN);
		v = pg_hton32((uint32) back_expired);
		memcpy(out + IDEM_TOMBSTONE_HASH_LEN + IDEM_TOMBSTONE_FP_LEN, &v, 4);
		v = pg_hton32((uint32) back_expires);
		memcpy(out + IDEM_TOMBSTONE_HASH_LEN + IDEM_TOMBSTONE_FP_LEN + 4, &v, 4);
		n++;
	}
	if (n > 0)
		IdemTombstoneInsertRow(w, w->bucket, w->bucket_len, packed,
							   n * IDEM_TOMBSTONE_RUN_ENTRY, row_expired, row_expires);
	pfree(packed);
	w->n = 0;
}

/*
 * The bucket width for n tombstones of one drop: the widest (up to 24
 * bits) whose buckets hold a full row or more on average.
 */
static int
IdemTombstoneRunBits(int64 n)
{
	int			bits = IDEM_TOMBROW_MIN_BITS;

	while (bits + IDEM_TOMBROW_MIN_BITS <= IDEM_TOMBROW_MAX_BITS &&
		   n / (int64) RUN_MAX_ENTRIES >= ((int64) 1 << (bits + IDEM_TOMBROW_MIN_BITS)))
		bits += IDEM_TOMBROW_MIN_BITS;
	return bits;
}

/*
 * One more tombstone with a SHA-256 fingerprint, in the order of the
 * hashes: into the run being built, which is written first when it is
 * full or the tombstone's bucket is another.
 */
static void
IdemTombstoneRunAdd(RunWriter *w, const RunEntry *entry)
{
	uint8		bucket[IDEM_TOMBROW_BUCKET_MAX];
	int			blen = IdemTombRowBucket(entry->hash, w->bits, bucket);

	if (w->n > 0 &&
		(w->n == RUN_MAX_ENTRIES || blen != w->bucket_len ||
		 memcmp(bucket, w->bucket, blen) != 0))
		IdemTombstoneFlushRun(w);
	if (w->n == 0)
	{
		memcpy(w->bucket, bucket, blen);
		w->bucket_len = blen;
	}
	w->entries[w->n++] = *entry;
}

/* the entries being ordered, for IdemRunOrderCmp */
static const RunEntry *run_order_entries;

static int
IdemRunOrderCmp(const void *a, const void *b)
{
	return memcmp(run_order_entries[*(const uint32 *) a].hash,
				  run_order_entries[*(const uint32 *) b].hash,
				  IDEM_TOMBSTONE_HASH_LEN);
}

/* Buckets that hold more entries than this are sorted by qsort. */
#define RUN_ORDER_INSERTION_MAX 16

/*
 * The order of the n entries e by hash, as n indexes into order: a
 * counting sort by their first bits (as many bits as make about one
 * entry a bucket, at most 16; the hashes are uniform), then each bucket
 * sorted in place, by insertion when small, by qsort otherwise (so that
 * hashes made to share their first bits cost no more than a sort).  Much
 * cheaper than sorting the 64-byte entries themselves.
 */
static void
IdemRunEntriesOrder(const RunEntry *e, Size n, uint32 *order)
{
	int			bits = 1;
	Size		nbuckets;
	Size	   *end;

	while (bits < 16 && ((Size) 1 << bits) < n)
		bits++;
	nbuckets = (Size) 1 << bits;
	end = palloc0(sizeof(Size) * (nbuckets + 1));
#define RUN_BUCKET(i) ((((Size) e[i].hash[0] << 8) | e[i].hash[1]) >> (16 - bits))
	for (Size i = 0; i < n; i++)
		end[RUN_BUCKET(i) + 1]++;
	for (Size b = 1; b <= nbuckets; b++)
		end[b] += end[b - 1];
	/* end[b] is the start of bucket b; filling it moves it to its end */
	for (Size i = 0; i < n; i++)
		order[end[RUN_BUCKET(i)]++] = (uint32) i;
#undef RUN_BUCKET
	run_order_entries = e;
	for (Size b = 0; b < nbuckets; b++)
	{
		Size		first = b == 0 ? 0 : end[b - 1];
		Size		count = end[b] - first;

		if (count > RUN_ORDER_INSERTION_MAX)
		{
			qsort(order + first, count, sizeof(uint32), IdemRunOrderCmp);
			continue;
		}
		for (Size i = first + 1; i < end[b]; i++)
		{
			uint32		v = order[i];
			Size		j = i;

			while (j > first && memcmp(e[order[j - 1]].hash, e[v].hash,
									   IDEM_TOMBSTONE_HASH_LEN) > 0)
			{
				order[j] = order[j - 1];
				j--;
			}
			order[j] = v;
		}
	}
	pfree(end);
}

/*
 * The tombstones held (n of them, SHA-256 fingerprints only), written: as
 * runs, in the order of their hashes, with buckets as wide as n calls for,
 * when as_runs, each as a row of its own otherwise.
 */
static void
IdemTombstonesWriteHeld(RunWriter *w, RunEntry *held, Size n, bool as_runs)
{
	uint32	   *order;

	if (n == 0)
		return;
	if (!as_runs)
	{
		for (Size i = 0; i < n; i++)
			IdemTombstoneInsertRow(w, held[i].hash, IDEM_TOMBSTONE_HASH_LEN,
								   held[i].fp, IDEM_TOMBSTONE_FP_LEN,
								   held[i].expired, held[i].expires);
		return;
	}
	w->bits = IdemTombstoneRunBits((int64) n);
	order = palloc_extended(n * sizeof(uint32), MCXT_ALLOC_HUGE);
	IdemRunEntriesOrder(held, n, order);
	for (Size i = 0; i < n; i++)
	{
		if ((i & 1023) == 0)
			CHECK_FOR_INTERRUPTS();
		IdemTombstoneRunAdd(w, &held[order[i]]);
	}
	IdemTombstoneFlushRun(w);
	pfree(order);
}

/*
 * The writer of w's rows, at the first (after the partition of keys is
 * locked, as the INSERT locked the tombstones): straight into the
 * partitions of idempotency.tombstones when it is as the extension made
 * it, by an INSERT otherwise.
 */
static void
IdemTombstoneWriterBegin(RunWriter *w)
{
	w->begun = true;
	w->direct = IdemTombDirectBegin(IdemTombstoneRelid());
	if (w->direct != NULL)
		return;
	w->insert = SPI_prepare("INSERT INTO idempotency.tombstones"
							" (scope_hash, fingerprint, expired_at, expires_at)"
							" SELECT * FROM ROWS FROM (pg_catalog.unnest($1),"
							" pg_catalog.unnest($2), pg_catalog.unnest($3),"
							" pg_catalog.unnest($4))",
							4, (Oid[]) {BYTEAARRAYOID, BYTEAARRAYOID,
							TIMESTAMPTZARRAYOID, TIMESTAMPTZARRAYOID});
	if (w->insert == NULL)
		elog(ERROR, "preparing the insert of tombstones failed: %s",
			 SPI_result_code_string(SPI_result));
}

/*
 * The tombstones of one drop as they are read: those with a SHA-256
 * fingerprint held in memory (up to limit at a time), the others written
 * at once, each a row of its own.
 */
typedef struct DropHeld
{
	RunWriter  *w;
	RunEntry   *held;
	Size		nheld;
	Size		capacity;
	Size		limit;
	bool		spilled;		/* some were written as runs already */
	int64		written;
} DropHeld;

/* One tombstone read (IdemTombDirectEmit). */
static void
IdemTombstoneHold(void *arg, const uint8 *hash, int hlen, const uint8 *fp,
				  int fplen, TimestampTz expired, TimestampTz expires)
{
	DropHeld   *d = arg;
	RunEntry   *e;

	d->written++;
	if (fplen != IDEM_TOMBSTONE_FP_LEN || hlen != IDEM_TOMBSTONE_HASH_LEN)
	{
		IdemTombstoneInsertRow(d->w, hash, hlen, fp, fplen, expired, expires);
		return;
	}
	if (d->nheld == d->limit)
	{
		IdemTombstonesWriteHeld(d->w, d->held, d->nheld, true);
		d->nheld = 0;
		d->spilled = true;
	}
	if (d->nheld == d->capacity)
	{
		d->capacity = Min(d->capacity * 2, d->limit);
		d->held = repalloc_huge(d->held, d->capacity * sizeof(RunEntry));
	}
	e = &d->held[d->nheld++];
	memcpy(e->hash, hash, IDEM_TOMBSTONE_HASH_LEN);
	memcpy(e->fp, fp, IDEM_TOMBSTONE_FP_LEN);
	e->expired = expired;
	e->expires = expires;
}

/*
 * The tombstones of source read by its SQL (IdemTombstoneSourceSql), with
 * snapshot, into d: where the partition cannot be read directly.
 */
static void
IdemTombstonesReadSql(DropHeld *d, const char *source, int nargs,
					  Oid *argtypes, Datum *args, Snapshot snapshot)
{
	SPIPlanPtr	read;
	Portal		portal;

	read = SPI_prepare(psprintf("SELECT idempotency.idem_tombstone_hash(s.tenant, s.endpoint, s.key),"
								" s.fingerprint, s.expires_at, s.expires_at OPERATOR(pg_catalog.+) t.ttl%s",
								IdemTombstoneSourceSql(source)),
					   nargs, argtypes);
	if (read == NULL)
		elog(ERROR, "preparing the tombstones of %s failed: %s",
			 source, SPI_result_code_string(SPI_result));

	/* a read-only cursor reads with the active snapshot: the caller's */
	PushActiveSnapshot(snapshot);
	portal = SPI_cursor_open(NULL, read, args, NULL, true);
	PopActiveSnapshot();

	for (;;)
	{
		SPITupleTable *batch;
		uint64		nbatch;

		SPI_cursor_fetch(portal, true, 1024);
		batch = SPI_tuptable;
		nbatch = SPI_processed;
		if (nbatch == 0)
			break;
		for (uint64 i = 0; i < nbatch; i++)
		{
			HeapTuple	tup = batch->vals[i];
			TupleDesc	desc = batch->tupdesc;
			bool		isnull[4];
			bytea	   *h = DatumGetByteaPP(SPI_getbinval(tup, desc, 1, &isnull[0]));
			bytea	   *fp = DatumGetByteaPP(SPI_getbinval(tup, desc, 2, &isnull[1]));
			TimestampTz expired = DatumGetTimestampTz(SPI_getbinval(tup, desc, 3, &isnull[2]));
			TimestampTz expires = DatumGetTimestampTz(SPI_getbinval(tup, desc, 4, &isnull[3]));

			if (isnull[0] || isnull[1] || isnull[2] || isnull[3])
				elog(ERROR, "a tombstone of %s lacks a value", source);
			IdemTombstoneHold(d, (const uint8 *) VARDATA_ANY(h), VARSIZE_ANY_EXHDR(h),
							  (const uint8 *) VARDATA_ANY(fp), VARSIZE_ANY_EXHDR(fp),
							  expired, expires);
		}
		SPI_freetuptable(batch);
	}
	SPI_cursor_close(portal);
}

/*
 * The tombstones of the partition relid of keys expired at as_of (source:
 * the same in SQL, see IdemTombstonesOfPartition), read with snapshot in
 * one pass (straight from the partition, tombstone_direct.h, else by
 * source's SQL) and held in memory: as runs when they are
 * IDEM_TOMBSTONE_RUN_MIN or more, each a row of its own otherwise, the
 * rows written straight into their partitions (tombstone_direct.h; by
 * INSERTs of many rows where it cannot).  A run's entries are put in the
 * order of their hashes here (IdemRunEntriesOrder: much cheaper than the
 * executor's sort of bytea); when more than maintenance_work_mem holds
 * come, those held are written as runs and the reading goes on (runs of
 * the same bucket in two rows, as when a bucket holds more than a row).  A
 * key whose fingerprint is not a SHA-256 gets a row of its own.  Returns
 * how many tombstones were written.  Called within SPI.
 */
static int64
IdemTombstonesWriteDrop(Oid relid, TimestampTz as_of, const char *source,
						int nargs, Oid *argtypes, Datum *args,
						Snapshot snapshot)
{
	DropHeld	d;

	d.w = palloc0(sizeof(RunWriter));
	/* (and 4 bytes each for their order, IdemRunEntriesOrder) */
	d.limit = Max(Min((Size) maintenance_work_mem * 1024 / sizeof(RunEntry),
					  (Size) PG_UINT32_MAX),
				  (Size) IDEM_TOMBSTONE_RUN_MIN);
	d.capacity = IDEM_TOMBSTONE_RUN_MIN;
	d.held = palloc(d.capacity * sizeof(RunEntry));
	d.nheld = 0;
	d.spilled = false;
	d.written = 0;

	if (!IdemTombDirectRead(relid, as_of, snapshot, IdemTombstoneHash,
							IdemTombstoneHold, &d))
		IdemTombstonesReadSql(&d, source, nargs, argtypes, args, snapshot);
	IdemTombstonesWriteHeld(d.w, d.held, d.nheld,
							d.spilled || d.written >= IDEM_TOMBSTONE_RUN_MIN);
	IdemTombstoneInsertRows(d.w);
	if (d.w->direct != NULL)
		IdemTombDirectEnd(d.w->direct);
	pfree(d.held);
	pfree(d.w);
	return d.written;
}

/*
 * How many tombstones source (see IdemTombstonesOfPartition) would make,
 * read with snapshot (InvalidSnapshot: the statement's own).  Called within
 * SPI.
 */
static int64
IdemTombstonesCount(const char *source, int nargs, Oid *argtypes, Datum *args,
					Snapshot snapshot)
{
	SPIPlanPtr	plan = SPI_prepare(psprintf("SELECT pg_catalog.count(*)%s",
											IdemTombstoneSourceSql(source)),
								   nargs, argtypes);
	bool		isnull;
	int			rc;

	if (plan == NULL)
		elog(ERROR, "preparing the count of the tombstones of %s failed: %s",
			 source, SPI_result_code_string(SPI_result));
	rc = SPI_execute_snapshot(plan, args, NULL, snapshot, InvalidSnapshot,
							  true, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "counting the tombstones of %s failed: %s",
			 source, SPI_result_code_string(rc));
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * The tombstones of the expired rows of a partition of keys
 * (tombstone_write.h): written, or with count_only counted.  The rows are
 * written as snapshot sees them (the count reads with the statement's own);
 * tids, when not NIL, limits them to the rows at those ItemPointers.
 */
int64
IdemTombstonesOfPartition(Oid relid, TimestampTz as_of, bool count_only,
						  Snapshot snapshot, List *tids)
{
	Oid			argtypes[2] = {TIMESTAMPTZOID, TIDARRAYOID};
	Datum		args[2];
	/* expired at as_of: every row of a partition whose range has ended */
	char	   *source = psprintf("(SELECT * FROM ONLY %s WHERE expires_at OPERATOR(pg_catalog.<=) $1%s)",
								  quote_qualified_identifier(get_namespace_name(get_rel_namespace(relid)),
															 get_rel_name(relid)),
								  tids != NIL ? " AND ctid OPERATOR(pg_catalog.=) ANY ($2)" : "");
	int			nargs = tids != NIL ? 2 : 1;
	int64		n;

	args[0] = TimestampTzGetDatum(as_of);
	if (tids != NIL)
	{
		Datum	   *elems = palloc(sizeof(Datum) * list_length(tids));
		ListCell   *lc;
		int			i = 0;

		foreach(lc, tids)
			elems[i++] = PointerGetDatum(lfirst(lc));
		args[1] = PointerGetDatum(construct_array(elems, i, TIDOID,
												  sizeof(ItemPointerData),
												  false, TYPALIGN_SHORT));
	}
	if (!count_only)
	{
		SPIPlanPtr	plan;
		int			rc;

		/* read with the caller's snapshot, whatever the isolation level */
		Assert(snapshot != NULL);
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");

		/*
		 * A whole partition's drop (the Citus mode writes on its workers,
		 * see IdemTombstonesBeforeShardDrop) leaves runs when it leaves
		 * many tombstones, read once and sorted in memory.
		 */
		if (tids == NIL && !IdemTombstonesCitus())
		{
			n = IdemTombstonesWriteDrop(relid, as_of, source, nargs, argtypes,
										args, snapshot);
			SPI_finish();
			return n;
		}
		plan = SPI_prepare(psprintf(TOMBSTONE_INSERT_SQL "%s",
									IdemTombstoneSourceSql(source)),
						   nargs, argtypes);
		if (plan == NULL)
			elog(ERROR, "preparing the tombstones of %s failed: %s",
				 source, SPI_result_code_string(SPI_result));
		rc = SPI_execute_snapshot(plan, args, NULL, snapshot, InvalidSnapshot,
								  false, true, 0);
		if (rc != SPI_OK_INSERT)
			elog(ERROR, "writing the tombstones of %s failed: %s",
				 source, SPI_result_code_string(rc));
		n = (int64) SPI_processed;
		SPI_finish();
		return n;
	}
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	n = IdemTombstonesCount(source, nargs, argtypes, args, InvalidSnapshot);
	SPI_finish();
	return n;
}

/*
 * The distinct tombstone_ttl in use, in seconds, in ascending order (in the
 * current memory context): the setting's, and every endpoint's, those above
 * 0 only.  Returns how many; 0 when no tombstone is kept anywhere.
 */
int
IdemTombstoneTtls(int64 **ttls)
{
	MemoryContext caller = CurrentMemoryContext;
	int			n = 0;
	uint64		i;

	*ttls = NULL;
	if (!IdemTombstonesActive())
		return 0;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute_with_args("SELECT DISTINCT t FROM (SELECT $1::pg_catalog.int8 AS t UNION ALL"
							  " SELECT pg_catalog.ceil(pg_catalog.date_part('epoch',"
							  " tombstone_ttl))::pg_catalog.int8 FROM idempotency.endpoints) s"
							  " WHERE t OPERATOR(pg_catalog.>) 0 ORDER BY t",
							  1, (Oid[]) {INT8OID},
							  (Datum[]) {Int64GetDatum(idem_tombstone_ttl)},
							  NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "reading idempotency.endpoints failed");
	if (SPI_processed > 0)
		*ttls = MemoryContextAlloc(caller, sizeof(int64) * SPI_processed);
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;

		(*ttls)[n++] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
													SPI_tuptable->tupdesc, 1,
													&isnull));
	}
	SPI_finish();
	return n;
}

int64
IdemTombstonePurgeDefault(TimestampTz as_of)
{
	Oid			argtypes[1] = {TIMESTAMPTZOID};
	Datum		args[1] = {TimestampTzGetDatum(as_of)};

	return (int64) IdemSpiExec("DELETE FROM ONLY idempotency.tombstones_default"
							   " WHERE expires_at OPERATOR(pg_catalog.<=) $1",
							   1, argtypes, args, NULL, false, SPI_OK_DELETE);
}
