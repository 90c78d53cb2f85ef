/*-------------------------------------------------------------------------
 *
 * tombstone_probe.c
 *	  Tombstones of expired keys (idempotency.tombstones), the claim's side:
 *	  where the table is, whether tombstones are kept, the keyed scope hash
 *	  (idem_tombstone_hash), and the probe.  A tombstone keeps of an
 *	  expired key only a keyed hash of its scope and its fingerprint, so
 *	  that a claim of the key with another payload still answers 422 after
 *	  the key's row is gone.  tombstone_write.c writes them.
 *
 *	  A claim that finds no live row probes the scope_hash index of every
 *	  tombstone partition whose range has not ended, whose filter may hold
 *	  the scope (tombstone_filter.c) and that holds a block, for the scope's
 *	  hash and, outside the Citus mode, for the buckets of the runs that may
 *	  hold it (tombstone_row.h).  When no partition can hold the scope (its
 *	  range ended or its filter says so), the claim learns it from a copy of
 *	  the partitions kept per backend (TombstoneParts) without opening the
 *	  table, or taking a snapshot.
 *
 *	  In the Citus mode (doc/scaling.md) the table is distributed by tenant,
 *	  colocated with idempotency.keys: a claim, on the worker of its
 *	  tenant's shard, probes the local shard of tombstones colocated with
 *	  it.  All of it reads shards by name, never through Citus's executor.
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
#include "keygen.h"
#include "keystore.h"
#include "schema.h"
#include "sha256.h"
#include "tombstone_filter.h"
#include "tombstone_probe.h"
#include "util.h"

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

/*
 * The partitions of idempotency.tombstones, as the parent's partition
 * descriptor in the relcache gives them, cached per backend so that a claim
 * whose scope no filter can hold learns it without opening the parent (see
 * IdemTombstoneNoneFiltered).  Made from the descriptor of an open parent
 * that lists no partition being detached, and forgotten at every relcache
 * invalidation of the parent (an ATTACH, DETACH, CREATE ... PARTITION OF or
 * DROP of a partition sends one), or of every relation, by the same
 * callback and at the same moment as the relcache's own entry: the cache is
 * valid exactly while the descriptor a table_open would give is the one it
 * was made from.  generation counts those invalidations, so that one
 * processed while the cache is made keeps it from being used.
 */
typedef struct TombstoneParts
{
	bool		valid;
	Oid			parent;
	int			nparts;
	int			cap;
	Oid		   *oids;
	TimestampTz *ends;			/* each one's upper bound; DT_NOEND: none */
	bool	   *skip;			/* the answers of one claim */
} TombstoneParts;

static TombstoneParts tombstone_parts;
static uint64 tombstone_parts_generation = 0;

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
	if (!OidIsValid(relid) || relid == tombstone_parts.parent)
	{
		tombstone_parts.valid = false;
		tombstone_parts_generation++;
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
bool
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

/*
 * The SHA-256 state after the label and the framed encryption key, the
 * same for every scope until the key is assigned again: a claim absorbs
 * only its scope and finishes (one or two compressions for a scope of
 * usual lengths).  Same output as hashing the whole framed input at once.
 */
static IdemSha256 tombstone_prefix;
static uint64 tombstone_prefix_generation = 0;	/* 0: none yet */

/* t framed at p (its length, 4 bytes big-endian, then its bytes): past it */
static inline uint8 *
IdemTombstoneFrame(uint8 *p, const text *t)
{
	uint32		len = VARSIZE_ANY_EXHDR(t);
	uint32		be = pg_hton32(len);

	memcpy(p, &be, 4);
	memcpy(p + 4, VARDATA_ANY(t), len);
	return p + 4 + len;
}

void
IdemTombstoneHash(const text *tenant, const text *endpoint, const text *key,
				  uint8 out[IDEM_TOMBSTONE_HASH_LEN])
{
	IdemSha256	s;
	uint8		digest[IDEM_SHA256_LEN];
	uint8		framed[128];

	if (tombstone_prefix_generation != idem_encryption_key_generation)
	{
		const char *ekey = idem_encryption_key ? idem_encryption_key : "";

		IdemSha256Init(&tombstone_prefix);
		IdemSha256Update(&tombstone_prefix, TOMBSTONE_LABEL,
						 strlen(TOMBSTONE_LABEL));
		IdemSha256UpdateFramed(&tombstone_prefix, ekey, strlen(ekey));
		tombstone_prefix_generation = idem_encryption_key_generation;
	}
	s = tombstone_prefix;
	if (3 * 4 + VARSIZE_ANY_EXHDR(tenant) + VARSIZE_ANY_EXHDR(endpoint) +
		VARSIZE_ANY_EXHDR(key) <= sizeof(framed))
	{
		/* a scope of usual lengths: framed in one buffer, absorbed at once */
		uint8	   *p = framed;

		p = IdemTombstoneFrame(p, tenant);
		p = IdemTombstoneFrame(p, endpoint);
		p = IdemTombstoneFrame(p, key);
		IdemSha256Update(&s, framed, p - framed);
	}
	else
	{
		IdemSha256UpdateFramed(&s, VARDATA_ANY(tenant), VARSIZE_ANY_EXHDR(tenant));
		IdemSha256UpdateFramed(&s, VARDATA_ANY(endpoint), VARSIZE_ANY_EXHDR(endpoint));
		IdemSha256UpdateFramed(&s, VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key));
	}
	IdemSha256Final(&s, digest);
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

/* the buckets a run may have: one per width (tombstone_row.h) */
#define RUN_NBUCKETKEYS	(IDEM_TOMBROW_MAX_BITS / IDEM_TOMBROW_MIN_BITS)

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
 * may have (tombstone_row.h); returns how many lookups there are.
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

/*
 * One probe for the tombstones of a scope: what it looks up, how it reads,
 * and the latest tombstone found so far (IdemTombstoneConsider).
 */
typedef struct TombstoneSearch
{
	bytea	   *hash;			/* the scope's hash: lookups[0] */
	/* no filter in the Citus mode: shards also receive rows by shard moves */
	bool		filtered;

	/*
	 * What to look up: the hash, and (outside the Citus mode, where only
	 * maintenance's drops of whole partitions write runs) its bucket at
	 * every width a run may have, made when a partition is first probed.
	 */
	Datum		lookups[1 + RUN_NBUCKETKEYS];
	int			nlookups;
	Snapshot	snapshot;
	bool		unlocked;		/* serializable: SnapshotAny, then snapshot */
	TimestampTz now;
	/* the answer */
	bool		found;
	bytea	  **fingerprint;
	TimestampTz *expired_at;
	MemoryContext cxt;
} TombstoneSearch;

/*
 * The partitions to skip, in one pass over the bounds: those whose range
 * ended hold only expired tombstones, those whose filter does not know the
 * scope hold none of it.
 */
static bool *
IdemTombstoneSkips(const TombstoneSearch *s, Relation parent, PartitionDesc pd)
{
	PartitionBoundInfo bounds = pd->boundinfo;
	bool	   *skip = palloc0(sizeof(bool) * Max(pd->nparts, 1));

	for (int j = 0; bounds != NULL && j < bounds->ndatums; j++)
	{
		if (bounds->indexes[j] >= 0 &&
			bounds->kind[j][0] == PARTITION_RANGE_DATUM_VALUE &&
			DatumGetTimestampTz(bounds->datums[j][0]) <= s->now)
			skip[bounds->indexes[j]] = true;
	}
	if (s->filtered)
		IdemTombFilterSkip(RelationGetRelid(parent), pd->oids, pd->nparts,
						   (const uint8 *) VARDATA(s->hash), skip);
	return skip;
}

/*
 * Each lookup in the index on scope_hash of a tombstone partition: a row of
 * the hash is a tombstone of its own, a row of a bucket a run that may hold
 * it; each one living at now is considered.
 */
static void
IdemTombstoneScan(TombstoneSearch *s, Relation part, Relation idx,
				  const TombstoneProbe *probe)
{
	ScanKeyData skey;
	IndexScanDesc scan;
	TupleTableSlot *slot;

	/* no predicate locks: see IdemProbeIndex in keystore_direct.c */
	slot = table_slot_create(part, NULL);
	scan = IdemIndexBeginscan(part, idx, s->unlocked ? SnapshotAny : s->snapshot, 1, 0);
	for (int k = 0; k < s->nlookups; k++)
	{
		ScanKeyEntryInitialize(&skey, 0, 1, BTEqualStrategyNumber, InvalidOid,
							   InvalidOid, F_BYTEAEQ, s->lookups[k]);
		index_rescan(scan, &skey, 1, NULL, 0);
		while (index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;
			bool		isnull2;
			TimestampTz expires;
			TimestampTz expired;
			bytea	   *fp;

			if (s->unlocked && !table_tuple_satisfies_snapshot(part, slot, s->snapshot))
				continue;
			expires = DatumGetTimestampTz(slot_getattr(slot, probe->a_expires, &isnull));
			expired = DatumGetTimestampTz(slot_getattr(slot, probe->a_expired, &isnull2));
			if (isnull || isnull2 || expires <= s->now)
				continue;
			fp = DatumGetByteaPP(slot_getattr(slot, probe->a_fp, &isnull));
			if (isnull)
				continue;
			if (k == 0)
				IdemTombstoneConsider(s->now, expired, expires, VARDATA_ANY(fp),
									  VARSIZE_ANY_EXHDR(fp), &s->found,
									  s->fingerprint, s->expired_at, s->cxt);
			else if (VARSIZE_ANY_EXHDR(fp) % IDEM_TOMBSTONE_RUN_ENTRY == 0)
				IdemTombstoneConsiderRun((const uint8 *) VARDATA(s->hash), fp,
										 expired, expires, s->now, &s->found,
										 s->fingerprint, s->expired_at, s->cxt);
		}
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
}

/*
 * One tombstone partition not skipped: opened, probed when it holds a
 * block, and closed.
 *
 * As for the keys, a partition without a block holds no row.  Unlike theirs,
 * the locks of a tombstone partition and its index are given back as soon
 * as it has been read: nothing the claim does later depends on them (only
 * maintenance writes or drops the partition, and a tombstone found is
 * copied out), so a claim holds at most two of them at once, whatever the
 * filters answer, and none once it has returned.  A lock the transaction
 * held before is kept: each release undoes only this open's own.
 */
static void
IdemTombstoneProbePartition(TombstoneSearch *s, Oid partoid)
{
	Relation	part;
	Relation	idx;
	TombstoneProbe probe;

	part = table_open(partoid, AccessShareLock);
	if (part->rd_rel->relkind != RELKIND_RELATION ||
		RelationGetNumberOfBlocks(part) == 0)
	{
		table_close(part, AccessShareLock);
		return;
	}
	if (s->nlookups == 0)
		s->nlookups = IdemTombstoneLookups((const uint8 *) VARDATA(s->hash),
										   s->filtered, s->lookups);
	/* copied: opening the index may process invalidations */
	probe = *IdemTombstoneGetProbe(part);
	idx = index_open(probe.indexoid, AccessShareLock);
	IdemTombstoneScan(s, part, idx, &probe);
	index_close(idx, AccessShareLock);
	table_close(part, AccessShareLock);
}

/*
 * Remember the partitions of the tombstones table parent, open and locked
 * since the cache's generation was generation, from its descriptor pd (see
 * TombstoneParts): only a descriptor of the relcache that lists no
 * partition being detached, of a table partitioned by a range of
 * timestamptz, as the bounds are read here.
 */
static void
IdemTombstonePartsRemember(Relation parent, PartitionDesc pd, uint64 generation)
{
	PartitionKey key = RelationGetPartitionKey(parent);
	PartitionBoundInfo bounds = pd->boundinfo;
	TombstoneParts *tp = &tombstone_parts;

	tp->valid = false;
	if (pd != parent->rd_partdesc || pd->detached_exist ||
		key->strategy != PARTITION_STRATEGY_RANGE || key->partnatts != 1 ||
		key->parttypid[0] != TIMESTAMPTZOID)
		return;
	if (pd->nparts > tp->cap)
	{
		int			cap = Max(pd->nparts, 2 * tp->cap);

		if (tp->oids != NULL)
		{
			pfree(tp->oids);
			pfree(tp->ends);
			pfree(tp->skip);
		}
		tp->cap = 0;
		tp->oids = MemoryContextAlloc(TopMemoryContext, sizeof(Oid) * cap);
		tp->ends = MemoryContextAlloc(TopMemoryContext, sizeof(TimestampTz) * cap);
		tp->skip = MemoryContextAlloc(TopMemoryContext, sizeof(bool) * cap);
		tp->cap = cap;
	}
	for (int p = 0; p < pd->nparts; p++)
	{
		tp->oids[p] = pd->oids[p];
		tp->ends[p] = DT_NOEND;
	}
	/* as IdemTombstoneSkips reads them */
	for (int j = 0; bounds != NULL && j < bounds->ndatums; j++)
	{
		if (bounds->indexes[j] >= 0 &&
			bounds->kind[j][0] == PARTITION_RANGE_DATUM_VALUE)
		{
			TimestampTz end = DatumGetTimestampTz(bounds->datums[j][0]);
			int			p = bounds->indexes[j];

			tp->ends[p] = Min(tp->ends[p], end);
		}
	}
	tp->parent = RelationGetRelid(parent);
	tp->nparts = pd->nparts;
	/* unless an invalidation was processed meanwhile */
	tp->valid = generation == tombstone_parts_generation;
}

/*
 * Whether every partition of the tombstones table relid, locked by the
 * caller, holds no tombstone of the search's scope by the cache of its
 * partitions and their filters alone: its range ended, or its filter says
 * so.  False whenever the cache is not valid (then the parent is opened).
 *
 * No snapshot is needed for a "none": a tombstone had its bits set before
 * it committed, so one committed before the filters are read is a "maybe"
 * here, as it is for a claim that takes its snapshot before reading them.
 * The parent is locked first, as table_open locks it: a new lock processes
 * the invalidations that reached the backend, the cache's among them, so
 * that a partition attached or made meanwhile is seen as a table_open of the
 * parent would see it.
 */
static bool
IdemTombstoneNoneFiltered(const TombstoneSearch *s, Oid relid)
{
	TombstoneParts *tp = &tombstone_parts;

	if (!tp->valid || tp->parent != relid)
		return false;
	for (int p = 0; p < tp->nparts; p++)
		tp->skip[p] = tp->ends[p] <= s->now;
	IdemTombFilterSkip(relid, tp->oids, tp->nparts,
					   (const uint8 *) VARDATA(s->hash), tp->skip);
	/* the filters' checks may have processed invalidations: look again */
	if (!tp->valid)
		return false;
	for (int p = 0; p < tp->nparts; p++)
	{
		if (!tp->skip[p])
			return false;
	}
	return true;
}

bool
IdemTombstoneFind(const IdemScope *scope, TimestampTz now,
				  bytea **fingerprint, TimestampTz *expired_at,
				  MemoryContext cxt)
{
	TombstoneSearch s;
	Relation	parent;
	PartitionDesc pd;
	bool	   *skip;
	uint64		generation;

	s.hash = IdemTombstoneHashDatum(scope->tenant, scope->endpoint, scope->key);
	s.filtered = !IdemKeystoreDistributed();
	s.lookups[0] = PointerGetDatum(s.hash);
	s.nlookups = 0;
	s.unlocked = IsolationIsSerializable();
	s.now = now;
	s.found = false;
	s.fingerprint = fingerprint;
	s.expired_at = expired_at;
	s.cxt = cxt;

	if (s.filtered)
	{
		Oid			relid = IdemTombstoneRelid();

		/* usually the whole answer: no partition can hold the scope */
		LockRelationOid(relid, AccessShareLock);
		if (IdemTombstoneNoneFiltered(&s, relid))
		{
			pfree(s.hash);
			return false;
		}
	}

	/* in the Citus mode, the tenant's shard here (itself partitioned alike) */
	parent = table_open(IdemTombstonesCitus() ? IdemTombstoneShard(scope->tenant) :
						IdemTombstoneRelid(), AccessShareLock);
	generation = tombstone_parts_generation;
	/* before the filters are read: a tombstone it sees had its bits set */
	s.snapshot = RegisterSnapshot(GetLatestSnapshot());
	pd = RelationGetPartitionDesc(parent, true);
	if (s.filtered)
		IdemTombstonePartsRemember(parent, pd, generation);
	skip = IdemTombstoneSkips(&s, parent, pd);
	for (int p = 0; p < pd->nparts; p++)
	{
		if (!skip[p])
			IdemTombstoneProbePartition(&s, pd->oids[p]);
	}
	UnregisterSnapshot(s.snapshot);
	table_close(parent, NoLock);
	for (int k = 1; k < s.nlookups; k++)
		pfree(DatumGetPointer(s.lookups[k]));
	pfree(s.hash);
	pfree(skip);
	return s.found;
}
