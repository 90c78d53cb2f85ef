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
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "storage/bufmgr.h"
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

static void
IdemTombstoneInvalidate(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == tombstones_relid)
		tombstones_relid = InvalidOid;
	if (tombstone_probes == NULL)
		return;
	if (OidIsValid(relid))
		(void) hash_search(tombstone_probes, &relid, HASH_REMOVE, NULL);
	else
	{
		hash_destroy(tombstone_probes);
		tombstone_probes = NULL;
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
 * Whether tombstones are kept at all: the schema has them (0.3.0 on), and
 * idempotency.keys is not distributed by Citus (tombstones are not
 * distributed: in the Citus mode none is written or read).
 */
bool
IdemTombstonesActive(void)
{
	return IdemSchemaHas(IDEM_SCHEMA_TOMBSTONES) && !IdemKeystoreDistributed();
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
	bool		filtered = !IdemKeystoreDistributed();
	bool		found = false;

	parent = table_open(IdemTombstoneRelid(), AccessShareLock);
	/* before the filters are read: a tombstone it sees had its bits set */
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	pd = RelationGetPartitionDesc(parent, true);
	bounds = pd->boundinfo;

	for (int p = 0; p < pd->nparts; p++)
	{
		bool		ended = false;
		Relation	part;
		Relation	idx;
		TombstoneProbe probe;
		ScanKeyData skey;
		IndexScanDesc scan;
		TupleTableSlot *slot;

		/* a partition whose range ended holds only expired tombstones */
		for (int j = 0; bounds != NULL && j < bounds->ndatums; j++)
		{
			if (bounds->indexes[j] == p &&
				bounds->kind[j][0] == PARTITION_RANGE_DATUM_VALUE &&
				DatumGetTimestampTz(bounds->datums[j][0]) <= now)
				ended = true;
		}
		if (ended)
			continue;
		/* a partition whose filter does not know the scope holds none of it */
		if (filtered &&
			!IdemTombFilterMaybe(RelationGetRelid(parent), pd->oids[p],
								 (const uint8 *) VARDATA(hash)))
			continue;

		/* as for the keys: a partition without a block holds no row */
		part = table_open(pd->oids[p], AccessShareLock);
		if (part->rd_rel->relkind != RELKIND_RELATION ||
			RelationGetNumberOfBlocks(part) == 0)
		{
			table_close(part, NoLock);
			continue;
		}
		/* copied: opening the index may process invalidations */
		probe = *IdemTombstoneGetProbe(part);
		idx = index_open(probe.indexoid, AccessShareLock);

		/* no predicate locks: see IdemProbeIndex in keystore_direct.c */
		ScanKeyEntryInitialize(&skey, 0, 1, BTEqualStrategyNumber, InvalidOid,
							   InvalidOid, F_BYTEAEQ, PointerGetDatum(hash));
		slot = table_slot_create(part, NULL);
		scan = IdemIndexBeginscan(part, idx, unlocked ? SnapshotAny : snapshot, 1, 0);
		index_rescan(scan, &skey, 1, NULL, 0);
		while (index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;
			TimestampTz expires;
			TimestampTz expired;

			if (unlocked && !table_tuple_satisfies_snapshot(part, slot, snapshot))
				continue;
			expires = DatumGetTimestampTz(slot_getattr(slot, probe.a_expires, &isnull));
			if (isnull || expires <= now)
				continue;
			expired = DatumGetTimestampTz(slot_getattr(slot, probe.a_expired, &isnull));
			if (isnull || (found && expired <= *expired_at))
				continue;
			found = true;
			*expired_at = expired;
			{
				MemoryContext old = MemoryContextSwitchTo(cxt);

				*fingerprint = DatumGetByteaPCopy(slot_getattr(slot, probe.a_fp, &isnull));
				MemoryContextSwitchTo(old);
			}
		}
		index_endscan(scan);
		ExecDropSingleTupleTableSlot(slot);
		index_close(idx, NoLock);
		table_close(part, NoLock);
	}
	UnregisterSnapshot(snapshot);
	table_close(parent, NoLock);
	pfree(hash);
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
IdemTombstoneSourceSql(const char *source)
{
	return psprintf(" FROM %s s"
					" LEFT JOIN idempotency.endpoints e ON e.endpoint = s.endpoint::text COLLATE \"C\""
					" CROSS JOIN LATERAL (SELECT coalesce(e.tombstone_ttl,"
					" pg_catalog.make_interval(secs => %d)) AS ttl) t"
					" WHERE t.ttl > interval '0' AND s.expires_at + t.ttl > $1",
					source, idem_tombstone_ttl);
}

#define TOMBSTONE_INSERT_SQL \
	"INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)" \
	" SELECT idempotency.idem_tombstone_hash(s.tenant, s.endpoint, s.key)," \
	" s.fingerprint, s.expires_at, s.expires_at + t.ttl"

/*
 * The expired rows of the default partition of idempotency.keys leave it,
 * and those whose endpoint keeps tombstones leave one, in one statement: a
 * claim that reads with a later snapshot sees the row or its tombstone.
 */
int64
IdemTombstonePurgeKeysDefault(TimestampTz as_of, int64 *tombstoned)
{
	Oid			argtypes[1] = {TIMESTAMPTZOID};
	Datum		args[1] = {TimestampTzGetDatum(as_of)};
	bool		isnull;
	int64		purged;
	int			rc;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	rc = SPI_execute_with_args(psprintf("WITH gone AS (DELETE FROM ONLY idempotency.keys_default"
										" WHERE expires_at <= $1"
										" RETURNING tenant, endpoint, key, fingerprint, expires_at),"
										" made AS (" TOMBSTONE_INSERT_SQL "%s RETURNING 1)"
										" SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM made)",
										IdemTombstoneSourceSql("gone")),
							   1, argtypes, args, NULL, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "purging idempotency.keys_default failed: %s",
			 SPI_result_code_string(rc));
	purged = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
										 SPI_tuptable->tupdesc, 1, &isnull));
	*tombstoned = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											  SPI_tuptable->tupdesc, 2, &isnull));
	SPI_finish();
	return purged;
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
	char	   *source = psprintf("(SELECT * FROM ONLY %s WHERE expires_at <= $1%s)",
								  quote_qualified_identifier(get_namespace_name(get_rel_namespace(relid)),
															 get_rel_name(relid)),
								  tids != NIL ? " AND ctid = ANY ($2)" : "");
	int			nargs = tids != NIL ? 2 : 1;
	bool		isnull;
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
	if (SPI_execute_with_args(psprintf("SELECT count(*)%s", IdemTombstoneSourceSql(source)),
							  nargs, argtypes, args, NULL, true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "counting the tombstones of %s failed", source);
	n = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									SPI_tuptable->tupdesc, 1, &isnull));
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
	if (SPI_execute_with_args("SELECT DISTINCT t FROM (SELECT $1::bigint AS t UNION ALL"
							  " SELECT pg_catalog.ceil(pg_catalog.date_part('epoch',"
							  " tombstone_ttl))::bigint FROM idempotency.endpoints) s"
							  " WHERE t > 0 ORDER BY t",
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
							   " WHERE expires_at <= $1",
							   1, argtypes, args, NULL, false, SPI_OK_DELETE);
}
