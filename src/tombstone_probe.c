/*-------------------------------------------------------------------------
 *
 * tombstone.c
 *	  Tombstones of expired keys: idempotency.tombstones, the one table of
 *	  this file.  A tombstone keeps of an expired key only a keyed hash of
 *	  its scope and its fingerprint, so that a claim of the key with another
 *	  payload still answers 422 after the key's row is gone.
 *
 *	  Tombstones are written off the request path, by maintenance, from the
 *	  rows of a partition of idempotency.keys about to be dropped and from
 *	  the expired rows purged from its default partition (in the same
 *	  statement as the purge).  They are partitioned by their own expiry and
 *	  leave by whole partitions too (maint_partitions.c).  A claim that finds
 *	  no live row probes the scope_hash index of every tombstone partition
 *	  whose range has not ended, whose filter may hold the scope
 *	  (tombfilter.c) and that holds a block.
 *
 *	  In the Citus mode (doc/scaling.md) the table is distributed by tenant,
 *	  colocated with idempotency.keys: a claim, on the worker of its
 *	  tenant's shard, probes the local shard of tombstones colocated with
 *	  it; the purge of the default partition writes, on each worker, into
 *	  the shard colocated with the purged one; and a partition of keys that
 *	  the coordinator's maintenance drops leaves its tombstones on each
 *	  worker from the DROP of its shard, under the lock of that drop
 *	  (IdemTombstonesBeforeShardDrop, called by the DDL guard's event
 *	  trigger), so that every row the drop removes leaves one.  All of it
 *	  reads and writes shards by name, never through Citus's executor.
 *
 *	  scope_hash is the first IDEM_TOMBSTONE_HASH_LEN bytes of a SHA-256
 *	  over a label, idempotency.encryption_key when it is set, and the
 *	  tenant, endpoint and key, each framed by its length.  With a key set,
 *	  a reader of the table cannot test guesses of low-entropy keys (an
 *	  order number) without it; without one, they can, as they could with
 *	  idem_key_hash.  A change of the key makes the tombstones written
 *	  before unreachable (they expire as usual).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heaptoast.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/partition.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "port/pg_bswap.h"
#include "fmgr.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/partcache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "guc.h"
#include "idempotency.h"
#include "keygen.h"
#include "keystore.h"
#include "schema.h"
#include "tombfilter.h"
#include "tombstone.h"

#define TOMBSTONE_LABEL "idempotency tombstone"

static Oid	tombstones_relid = InvalidOid;
static bool tombstone_callback_registered = false;

/*
 * What a probe needs of a tombstone partition, cached per backend and
 * forgotten at any relcache invalidation of the partition.
 */
typedef struct TombstoneProbe
{
	Oid			partoid;		/* hash key */
	Oid			indexoid;		/* its index on scope_hash */
	AttrNumber	a_fp;
	AttrNumber	a_expired;
	AttrNumber	a_expires;
} TombstoneProbe;

static HTAB *tombstone_probes = NULL;

/* Citus mode: whether idempotency.tombstones is distributed (unknown, no, yes). */
static int	tombstones_distributed = -1;

static void
IdemTombstoneInvalidate(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == tombstones_relid)
	{
		tombstones_relid = InvalidOid;
		tombstones_distributed = -1;
	}
	if (tombstone_probes != NULL)
	{
		if (OidIsValid(relid))
			(void) hash_search(tombstone_probes, &relid, HASH_REMOVE, NULL);
		else
		{
			hash_destroy(tombstone_probes);
			tombstone_probes = NULL;
		}
	}
}

/* idempotency.tombstones, or InvalidOid where it does not exist */
static Oid
IdemTombstoneRelidIfAny(void)
{
	if (!tombstone_callback_registered)
	{
		IdemRegisterRelcacheCallback(IdemTombstoneInvalidate);
		tombstone_callback_registered = true;
	}
	if (!OidIsValid(tombstones_relid))
		tombstones_relid = get_relname_relid("tombstones",
											 get_namespace_oid("idempotency", false));
	return tombstones_relid;
}

Oid
IdemTombstoneRelid(void)
{
	{
		Oid			relid = IdemTombstoneRelidIfAny();

		if (!OidIsValid(relid))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_TABLE),
					 errmsg("table idempotency.tombstones does not exist"),
					 errhint("Update the extension: ALTER EXTENSION idempotency UPDATE.")));
		return relid;
	}
}

/*
 * Citus mode: whether idempotency.tombstones is a Citus distributed table
 * (citus_distribute of 0.4.0 on makes it one); learnt once per backend and
 * description of the table.
 */
static bool
IdemTombstonesDistributed(void)
{
	Oid			relid = IdemTombstoneRelidIfAny();

	if (!OidIsValid(relid))
		return false;
	if (tombstones_distributed < 0)
	{
		int			result = 0;

		if (OidIsValid(get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE)))
		{
			if (SPI_connect() != SPI_OK_CONNECT)
				elog(ERROR, "SPI_connect failed");
			if (SPI_execute_with_args("SELECT 1 FROM pg_catalog.pg_dist_partition"
									  " WHERE logicalrelid OPERATOR(pg_catalog.=) $1",
									  1, (Oid[]) {OIDOID},
									  (Datum[]) {ObjectIdGetDatum(relid)},
									  NULL, true, 1) != SPI_OK_SELECT)
				elog(ERROR, "reading pg_dist_partition failed");
			result = SPI_processed > 0 ? 1 : 0;
			SPI_finish();
		}
		/* a description forgotten meanwhile learns it again */
		if (relid == tombstones_relid)
			tombstones_distributed = result;
		return result > 0;
	}
	return tombstones_distributed > 0;
}

/*
 * Whether tombstones are kept at all: the schema has them (0.3.0 on), and
 * where idempotency.keys is distributed by Citus, so are they (colocated
 * with the keys: citus_distribute of 0.4.0 on; a database distributed by
 * 0.3.0 keeps none until citus_distribute is called again).
 */
bool
IdemTombstonesActive(void)
{
	return IdemSchemaHas(IDEM_SCHEMA_TOMBSTONES) &&
		(!IdemKeystoreDistributed() || IdemTombstonesDistributed());
}

/* In the Citus mode, whether tombstones are distributed and so kept. */
static bool
IdemTombstonesCitus(void)
{
	return IdemKeystoreDistributed() && IdemTombstonesDistributed();
}

bool
IdemTombstonesOn(const IdemEndpointPolicy *policy)
{
	if (policy->has_tombstone_ttl ? !policy->tombstones_on : idem_tombstone_ttl <= 0)
		return false;
	return IdemTombstonesActive();
}

static void
IdemTombstoneHash(const text *tenant, const text *endpoint, const text *key,
				  uint8 out[IDEM_TOMBSTONE_HASH_LEN])
{
	const char *parts[4];
	int			lens[4];
	uint8		digest[PG_SHA256_DIGEST_LENGTH];

	parts[0] = idem_encryption_key ? idem_encryption_key : "";
	lens[0] = strlen(parts[0]);
	parts[1] = VARDATA_ANY(tenant);
	lens[1] = VARSIZE_ANY_EXHDR(tenant);
	parts[2] = VARDATA_ANY(endpoint);
	lens[2] = VARSIZE_ANY_EXHDR(endpoint);
	parts[3] = VARDATA_ANY(key);
	lens[3] = VARSIZE_ANY_EXHDR(key);
	IdemFramedSha256(TOMBSTONE_LABEL, 4, parts, lens, digest);
	memcpy(out, digest, IDEM_TOMBSTONE_HASH_LEN);
}

static bytea *
IdemTombstoneHashDatum(const text *tenant, const text *endpoint, const text *key)
{
	bytea	   *h = palloc(VARHDRSZ + IDEM_TOMBSTONE_HASH_LEN);

	SET_VARSIZE(h, VARHDRSZ + IDEM_TOMBSTONE_HASH_LEN);
	IdemTombstoneHash(tenant, endpoint, key, (uint8 *) VARDATA(h));
	return h;
}

/*
 * Entries per run (tombrow.h): as many as keep the row under the size at
 * which it would be compressed or moved out of line, so that a row is read
 * in place.
 */
#define RUN_MAX_ENTRIES ((TOAST_TUPLE_THRESHOLD - 64) / IDEM_TOMBSTONE_RUN_ENTRY)
#define RUN_NBUCKETKEYS	(IDEM_TOMBROW_MAX_BITS / IDEM_TOMBROW_MIN_BITS)

StaticAssertDecl(RUN_MAX_ENTRIES >= 8, "a run holds too few entries for this block size");

PG_FUNCTION_INFO_V1(idem_tombstone_hash);

/*
 * idem_tombstone_hash(tenant text, endpoint text, key text) RETURNS bytea
 */
Datum
idem_tombstone_hash(PG_FUNCTION_ARGS)
{
	PG_RETURN_BYTEA_P(IdemTombstoneHashDatum(PG_GETARG_TEXT_PP(0),
											 PG_GETARG_TEXT_PP(1),
											 PG_GETARG_TEXT_PP(2)));
}

/* The index on scope_hash of a tombstone partition; InvalidOid if none. */
static Oid
IdemTombstoneIndex(Relation part, AttrNumber hash_attnum)
{
	List	   *indexes = RelationGetIndexList(part);
	ListCell   *lc;
	Oid			result = InvalidOid;

	foreach(lc, indexes)
	{
		Relation	idx = index_open(lfirst_oid(lc), AccessShareLock);
		Form_pg_index form = idx->rd_index;

		if (form->indisvalid && form->indisready &&
			form->indkey.values[0] == hash_attnum &&
			idx->rd_rel->relam == BTREE_AM_OID &&
			RelationGetIndexPredicate(idx) == NIL)
			result = RelationGetRelid(idx);
		index_close(idx, AccessShareLock);
		if (OidIsValid(result))
			break;
	}
	list_free(indexes);
	if (!OidIsValid(result))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("partition \"%s\" of idempotency.tombstones has no index on scope_hash",
						RelationGetRelationName(part)),
				 errhint("Every partition needs that index; partitions made by idem_maintenance() have it.")));
	return result;
}

/* The probe of a tombstone partition the caller has opened and locked. */
static TombstoneProbe *
IdemTombstoneGetProbe(Relation part)
{
	Oid			partoid = RelationGetRelid(part);
	TombstoneProbe *probe = NULL;
	TombstoneProbe built;
	bool		found;

	if (tombstone_probes != NULL)
		probe = hash_search(tombstone_probes, &partoid, HASH_FIND, NULL);
	if (probe != NULL)
		return probe;

	/* opening indexes may process invalidations: build first, then enter */
	built.partoid = partoid;
	built.a_fp = get_attnum(partoid, "fingerprint");
	built.a_expired = get_attnum(partoid, "expired_at");
	built.a_expires = get_attnum(partoid, "expires_at");
	built.indexoid = IdemTombstoneIndex(part, get_attnum(partoid, "scope_hash"));
	if (tombstone_probes == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(Oid);
		ctl.entrysize = sizeof(TombstoneProbe);
		ctl.hcxt = CacheMemoryContext;
		tombstone_probes = hash_create("idempotency tombstone probes", 16, &ctl,
									   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	probe = hash_search(tombstone_probes, &partoid, HASH_ENTER, &found);
	*probe = built;
	return probe;
}

/*
 * Citus mode: the shard of idempotency.tombstones on this node that holds
 * the tombstones of tenant, colocated with the tenant's shard of keys and
 * resolved with it (keystore_rel.c).
 */
static Oid
IdemTombstoneShard(const text *tenant)
{
	Oid			relid = IdemKeystoreTombstoneShard(tenant);

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_SHARD_NOT_LOCAL),
				 errmsg("the tombstones of tenant \"%s\" are not on this node",
						text_to_cstring(tenant)),
				 errdetail("idempotency.tombstones is a Citus distributed table colocated with idempotency.keys, and the shard that holds the tenant's tombstones has no placement on this node."),
				 errhint("Call the function on the coordinator as a statement of its own, so that Citus delegates it to the tenant's node; see doc/scaling.md, \"Citus: which calls are delegated\".")));
	return relid;
}

/* A tombstone found: kept when it lives at now and is the latest so far. */
static void
IdemTombstoneConsider(TimestampTz now, TimestampTz expired, TimestampTz expires,
					  const char *fp, int fplen, bool *found,
					  bytea **fingerprint, TimestampTz *expired_at,
					  MemoryContext cxt)
{
	bytea	   *copy;

	if (expires <= now || (*found && expired <= *expired_at))
		return;
	*found = true;
	*expired_at = expired;
	copy = MemoryContextAlloc(cxt, VARHDRSZ + fplen);
	SET_VARSIZE(copy, VARHDRSZ + fplen);
	memcpy(VARDATA(copy), fp, fplen);
	*fingerprint = copy;
}

/*
 * The entries for hash of a run (a row whose scope_hash is the bucket of
 * hash), by binary search: each is considered.
 */
static void
IdemTombstoneConsiderRun(const uint8 *hash, bytea *packed,
						 TimestampTz row_expired, TimestampTz row_expires,
						 TimestampTz now, bool *found, bytea **fingerprint,
						 TimestampTz *expired_at, MemoryContext cxt)
{
	const uint8 *entries = (const uint8 *) VARDATA_ANY(packed);
	int			n = VARSIZE_ANY_EXHDR(packed) / IDEM_TOMBSTONE_RUN_ENTRY;
	int			lo = 0;
	int			hi = n;

	/* the first entry not below hash */
	while (lo < hi)
	{
		int			mid = lo + (hi - lo) / 2;

		if (memcmp(entries + (Size) mid * IDEM_TOMBSTONE_RUN_ENTRY, hash,
				   IDEM_TOMBSTONE_HASH_LEN) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < n; lo++)
	{
		const uint8 *e = entries + (Size) lo * IDEM_TOMBSTONE_RUN_ENTRY;
		uint32		back_expired;
		uint32		back_expires;

		if (memcmp(e, hash, IDEM_TOMBSTONE_HASH_LEN) != 0)
			break;
		memcpy(&back_expired, e + IDEM_TOMBSTONE_HASH_LEN + IDEM_TOMBSTONE_FP_LEN, 4);
		memcpy(&back_expires, e + IDEM_TOMBSTONE_HASH_LEN + IDEM_TOMBSTONE_FP_LEN + 4, 4);
		IdemTombstoneConsider(now,
							  row_expired - (TimestampTz) pg_ntoh32(back_expired) * USECS_PER_SEC,
							  row_expires - (TimestampTz) pg_ntoh32(back_expires) * USECS_PER_SEC,
							  (const char *) e + IDEM_TOMBSTONE_HASH_LEN,
							  IDEM_TOMBSTONE_FP_LEN, found, fingerprint, expired_at, cxt);
	}
}

/*
 * After lookups[0] (the hash), with runs its bucket at every width a run
 * may have (tombrow.h); returns how many lookups there are.
 */
static int
IdemTombstoneLookups(const uint8 *hash, bool runs, Datum *lookups)
{
	int			n = 1;

	for (int bits = IDEM_TOMBROW_MIN_BITS; runs && bits <= IDEM_TOMBROW_MAX_BITS;
		 bits += IDEM_TOMBROW_MIN_BITS)
	{
		bytea	   *b = palloc(VARHDRSZ + IDEM_TOMBROW_BUCKET_MAX);

		SET_VARSIZE(b, VARHDRSZ + IdemTombRowBucket(hash, bits, (uint8 *) VARDATA(b)));
		lookups[n++] = PointerGetDatum(b);
	}
	return n;
}

bool
IdemTombstoneFind(const IdemScope *scope, TimestampTz now,
				  bytea **fingerprint, TimestampTz *expired_at,
				  MemoryContext cxt)
{
	bytea	   *hash = IdemTombstoneHashDatum(scope->tenant, scope->endpoint, scope->key);
	Relation	parent;
	PartitionDesc pd;
	PartitionBoundInfo bounds;
	Snapshot	snapshot;
	bool		unlocked = IsolationIsSerializable();
	/* no filter in the Citus mode: shards also receive rows by shard moves */
	bool		filtered = !IdemKeystoreDistributed();
	bool	   *skip;
	bool		found = false;

	/*
	 * What to look up: the hash, and (outside the Citus mode, where only
	 * maintenance's drops of whole partitions write runs) its bucket at
	 * every width a run may have, made when a partition is first probed.
	 */
	Datum		lookups[1 + RUN_NBUCKETKEYS];
	int			nlookups = 0;

	lookups[0] = PointerGetDatum(hash);

	/* in the Citus mode, the tenant's shard here (itself partitioned alike) */
	parent = table_open(IdemTombstonesCitus() ? IdemTombstoneShard(scope->tenant) :
						IdemTombstoneRelid(), AccessShareLock);
	/* before the filters are read: a tombstone it sees had its bits set */
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	pd = RelationGetPartitionDesc(parent, true);
	bounds = pd->boundinfo;

	/*
	 * The partitions to skip, in one pass over the bounds: those whose range
	 * ended hold only expired tombstones, those whose filter does not know
	 * the scope hold none of it.
	 */
	skip = palloc0(sizeof(bool) * Max(pd->nparts, 1));
	for (int j = 0; bounds != NULL && j < bounds->ndatums; j++)
	{
		if (bounds->indexes[j] >= 0 &&
			bounds->kind[j][0] == PARTITION_RANGE_DATUM_VALUE &&
			DatumGetTimestampTz(bounds->datums[j][0]) <= now)
			skip[bounds->indexes[j]] = true;
	}
	if (filtered)
		IdemTombFilterSkip(RelationGetRelid(parent), pd->oids, pd->nparts,
						   (const uint8 *) VARDATA(hash), skip);

	for (int p = 0; p < pd->nparts; p++)
	{
		Relation	part;
		Relation	idx;
		TombstoneProbe probe;
		ScanKeyData skey;
		IndexScanDesc scan;
		TupleTableSlot *slot;

		if (skip[p])
			continue;

		/*
		 * As for the keys, a partition without a block holds no row.  Unlike
		 * theirs, the locks of a tombstone partition and its index are given
		 * back as soon as it has been read: nothing the claim does later
		 * depends on them (only maintenance writes or drops the partition,
		 * and a tombstone found is copied out), so a claim holds at most two
		 * of them at once, whatever the filters answer, and none once it has
		 * returned.  A lock the transaction held before is kept: each
		 * release undoes only this open's own.
		 */
		part = table_open(pd->oids[p], AccessShareLock);
		if (part->rd_rel->relkind != RELKIND_RELATION ||
			RelationGetNumberOfBlocks(part) == 0)
		{
			table_close(part, AccessShareLock);
			continue;
		}
		if (nlookups == 0)
			nlookups = IdemTombstoneLookups((const uint8 *) VARDATA(hash), filtered,
											lookups);
		/* copied: opening the index may process invalidations */
		probe = *IdemTombstoneGetProbe(part);
		idx = index_open(probe.indexoid, AccessShareLock);

		/* no predicate locks: see IdemProbeIndex in keystore_direct.c */
		slot = table_slot_create(part, NULL);
		scan = IdemIndexBeginscan(part, idx, unlocked ? SnapshotAny : snapshot, 1, 0);
		for (int k = 0; k < nlookups; k++)
		{
			ScanKeyEntryInitialize(&skey, 0, 1, BTEqualStrategyNumber, InvalidOid,
								   InvalidOid, F_BYTEAEQ, lookups[k]);
			index_rescan(scan, &skey, 1, NULL, 0);
			while (index_getnext_slot(scan, ForwardScanDirection, slot))
			{
				bool		isnull;
				bool		isnull2;
				TimestampTz expires;
				TimestampTz expired;
				bytea	   *fp;

				if (unlocked && !table_tuple_satisfies_snapshot(part, slot, snapshot))
					continue;
				expires = DatumGetTimestampTz(slot_getattr(slot, probe.a_expires, &isnull));
				expired = DatumGetTimestampTz(slot_getattr(slot, probe.a_expired, &isnull2));
				if (isnull || isnull2 || expires <= now)
					continue;
				fp = DatumGetByteaPP(slot_getattr(slot, probe.a_fp, &isnull));
				if (isnull)
					continue;
				if (k == 0)
					IdemTombstoneConsider(now, expired, expires, VARDATA_ANY(fp),
										  VARSIZE_ANY_EXHDR(fp), &found,
										  fingerprint, expired_at, cxt);
				else if (VARSIZE_ANY_EXHDR(fp) % IDEM_TOMBSTONE_RUN_ENTRY == 0)
					IdemTombstoneConsiderRun((const uint8 *) VARDATA(hash), fp,
											 expired, expires, now, &found,
											 fingerprint, expired_at, cxt);
			}
		}
		index_endscan(scan);
		ExecDropSingleTupleTableSlot(slot);
		index_close(idx, AccessShareLock);
		table_close(part, AccessShareLock);
	}
	UnregisterSnapshot(snapshot);
	table_close(parent, NoLock);
	for (int k = 1; k < nlookups; k++)
		pfree(DatumGetPointer(lookups[k]));
	pfree(hash);
	pfree(skip);
	return found;
}

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

typedef struct RunWriter
{
	SPIPlanPtr	insert;			/* INSERT of one row of tombstones */
	int			bits;			/* width of the buckets */
	uint8		bucket[IDEM_TOMBROW_BUCKET_MAX];		/* the bucket of the entries held */
	int			bucket_len;
	RunEntry	entries[RUN_MAX_ENTRIES];
	int			n;
} RunWriter;

static void
IdemTombstoneInsertRow(RunWriter *w, const uint8 *scope_hash, int hlen,
					   const uint8 *fp, int fplen, TimestampTz expired,
					   TimestampTz expires)
{
	bytea	   *h = palloc(VARHDRSZ + hlen);
	bytea	   *f = palloc(VARHDRSZ + fplen);
	Datum		values[4];
	int			rc;

	SET_VARSIZE(h, VARHDRSZ + hlen);
	memcpy(VARDATA(h), scope_hash, hlen);
	SET_VARSIZE(f, VARHDRSZ + fplen);
	memcpy(VARDATA(f), fp, fplen);
	values[0] = PointerGetDatum(h);
	values[1] = PointerGetDatum(f);
	values[2] = TimestampTzGetDatum(expired);
	values[3] = TimestampTzGetDatum(expires);
	rc = SPI_execute_plan(w->insert, values, NULL, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "writing a row of tombstones failed: %s",
			 SPI_result_code_string(rc));
	pfree(h);
	pfree(f);
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
 * The tombstones of source (see IdemTombstonesOfPartition), n of them, as
 * runs: read in the order of their hashes with snapshot, and written a
 * bucket at a time; a key whose fingerprint is not a SHA-256 gets a row of
 * its own.  Returns how many tombstones were written.  Called within SPI.
 */
static int64
IdemTombstonesWriteRuns(const char *source, int nargs, Oid *argtypes,
						Datum *args, Snapshot snapshot, int64 n)
{
	RunWriter  *w = palloc0(sizeof(RunWriter));
	SPIPlanPtr	read;
	Portal		portal;
	int64		written = 0;

	w->bits = IdemTombstoneRunBits(n);
	w->insert = SPI_prepare("INSERT INTO idempotency.tombstones"
							" (scope_hash, fingerprint, expired_at, expires_at)"
							" VALUES ($1, $2, $3, $4)",
							4, (Oid[]) {BYTEAOID, BYTEAOID, TIMESTAMPTZOID, TIMESTAMPTZOID});
	if (w->insert == NULL)
		elog(ERROR, "preparing the insert of tombstones failed: %s",
			 SPI_result_code_string(SPI_result));
	read = SPI_prepare(psprintf("SELECT idempotency.idem_tombstone_hash(s.tenant, s.endpoint, s.key),"
								" s.fingerprint, s.expires_at, s.expires_at OPERATOR(pg_catalog.+) t.ttl%s"
								" ORDER BY 1",
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
			uint8		bucket[IDEM_TOMBROW_BUCKET_MAX];
			int			blen;
			RunEntry   *e;

			if (isnull[0] || isnull[1] || isnull[2] || isnull[3])
				elog(ERROR, "a tombstone of %s lacks a value", source);
			if (VARSIZE_ANY_EXHDR(fp) != IDEM_TOMBSTONE_FP_LEN ||
				VARSIZE_ANY_EXHDR(h) != IDEM_TOMBSTONE_HASH_LEN)
			{
				IdemTombstoneInsertRow(w, (const uint8 *) VARDATA_ANY(h),
									   VARSIZE_ANY_EXHDR(h),
									   (const uint8 *) VARDATA_ANY(fp),
									   VARSIZE_ANY_EXHDR(fp), expired, expires);
				written++;
				continue;
			}
			blen = IdemTombRowBucket((const uint8 *) VARDATA_ANY(h), w->bits, bucket);
			if (w->n > 0 &&
				(w->n == RUN_MAX_ENTRIES || blen != w->bucket_len ||
				 memcmp(bucket, w->bucket, blen) != 0))
				IdemTombstoneFlushRun(w);
			if (w->n == 0)
			{
				memcpy(w->bucket, bucket, blen);
				w->bucket_len = blen;
			}
			e = &w->entries[w->n++];
			memcpy(e->hash, VARDATA_ANY(h), IDEM_TOMBSTONE_HASH_LEN);
			memcpy(e->fp, VARDATA_ANY(fp), IDEM_TOMBSTONE_FP_LEN);
			e->expired = expired;
			e->expires = expires;
			written++;
		}
		SPI_freetuptable(batch);
	}
	IdemTombstoneFlushRun(w);
	SPI_cursor_close(portal);
	pfree(w);
	return written;
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
 * The tombstones of the expired rows of a partition of keys (tombstone.h):
 * written, or with count_only counted.  The rows are written as snapshot
 * sees them (the count reads with the statement's own); tids, when not NIL,
 * limits them to the rows at those ItemPointers.
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
		 * many tombstones: counted first with the same snapshot.
		 */
		if (tids == NIL && !IdemTombstonesCitus())
		{
			n = IdemTombstonesCount(source, nargs, argtypes, args, snapshot);
			if (n >= IDEM_TOMBSTONE_RUN_MIN)
			{
				n = IdemTombstonesWriteRuns(source, nargs, argtypes, args, snapshot, n);
				SPI_finish();
				return n;
			}
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
