/*-------------------------------------------------------------------------
 *
 * keystore_rel.c
 *	  The key store (keystore.h): where a scope's rows live.  This file is
 *	  the one place where the relation that holds a scope's rows is named
 *	  (IdemKeystoreRelation): the partitioned table idempotency.keys, its
 *	  description, checked for what claims cannot honour, the attribute
 *	  numbers of its columns, and per partition the index a probe reads and
 *	  the maps between the partition's columns and the parent's.  All of it
 *	  is cached per backend and forgotten at the relcache invalidation of
 *	  what it describes (one callback, below).
 *
 *	  In the Citus mode (doc/scaling.md, "Citus: set-up"), idempotency.keys is a distributed
 *	  table: the relation of a scope's rows is then the tenant's shard on
 *	  this node (itself partitioned like the table), found through SQL so
 *	  that nothing links to Citus, locked against shard moves as Citus's
 *	  executor locks it, and refused (IK421) when it is not on this node.
 *
 *	  The probes and inserts that use it are in keystore_direct.c, the
 *	  statements in keystore.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/tupconvert.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_index.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/partcache.h"
#include "utils/rel.h"

#include "compat.h"
#include "keys.h"
#include "keystore_int.h"
#include "schema.h"
#include "util.h"

/* ----------------------------------------------------------------
 *		the relation, its partitions and their caches
 * ----------------------------------------------------------------
 */

static HTAB *probe_cache = NULL;
uint64		idem_probe_generation = 0;	/* moves at every forgetting */
static bool probe_callback_registered = false;

/* the parent, in whose column numbers rows are read and written */
Oid			idem_keys_relid = InvalidOid;
TupleDesc	idem_keys_desc = NULL;

/* moves on each time the parent's description is forgotten */
uint64		idem_keys_generation = 1;

/*
 * Citus mode (doc/scaling.md): whether idempotency.keys is a
 * Citus distributed table, learnt once per description of the parent; and
 * per tenant, the shard that holds its rows, as resolved on this node.
 */
typedef enum IdemKeysMode
{
	KEYS_MODE_UNKNOWN,
	KEYS_MODE_LOCAL,			/* an ordinary partitioned table */
	KEYS_MODE_CITUS				/* a Citus distributed table */
} IdemKeysMode;

static IdemKeysMode keys_mode = KEYS_MODE_UNKNOWN;

typedef struct CitusShardEntry
{
	char		tenant[IDEM_SCOPE_MAX_LEN + 1]; /* hash key */
	int64		shardid;
	Oid			shard_relid;	/* the shard's relation here, or InvalidOid */
	bool		local;			/* a placement of the shard is on this node */
	Oid			tombstones_relid;	/* the colocated shard of tombstones here,
									 * or InvalidOid (none here, or the
									 * tombstones are not distributed) */
	LocalTransactionId locked_lxid; /* the shard lock is held by this */
	SubTransactionId locked_subxid; /* (sub)transaction */
} CitusShardEntry;

#define IDEM_CITUS_CACHE_MAX 4096

static HTAB *citus_cache = NULL;
static uint64 citus_generation = 0; /* moves at every forgetting */

static void
IdemFreeProbeMaps(PartitionProbe *probe)
{
	if (probe->map)
		free_attrmap(probe->map);
	if (probe->insert_map)
		free_attrmap(probe->insert_map);
}

static void
IdemCitusCacheForget(void)
{
	citus_generation++;
	if (citus_cache != NULL)
	{
		hash_destroy(citus_cache);
		citus_cache = NULL;
	}
}

static void
IdemProbeCacheInvalidate(Datum arg, Oid relid)
{
	idem_probe_generation++;
	if (OidIsValid(relid) && relid != idem_keys_relid)
	{
		/* one partition (or any other relation) */
		PartitionProbe *probe = probe_cache == NULL ? NULL :
			hash_search(probe_cache, &relid, HASH_FIND, NULL);

		if (probe != NULL)
		{
			IdemFreeProbeMaps(probe);
			(void) hash_search(probe_cache, &relid, HASH_REMOVE, NULL);
		}
		else if (citus_cache != NULL)
		{
			/* perhaps a shard, or one of Citus's catalogs */
			IdemCitusCacheForget();
		}
		return;
	}
	IdemCitusCacheForget();
	keys_mode = KEYS_MODE_UNKNOWN;
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
	if (idem_keys_desc)
		FreeTupleDesc(idem_keys_desc);
	idem_keys_desc = NULL;
	idem_keys_relid = InvalidOid;
	idem_keys_generation++;
}

/* Forget what is cached here whenever the relations it describes change. */
static void
IdemRegisterInvalidation(void)
{
	if (!probe_callback_registered)
	{
		IdemRegisterRelcacheCallback(IdemProbeCacheInvalidate);
		probe_callback_registered = true;
	}
}

/*
 * idempotency.keys, looked up by name without a lock; the cached entry
 * below is built on it.
 */
Oid
IdemKeystoreRelid(void)
{
	Oid			relid = get_relname_relid("keys",
										  get_namespace_oid("idempotency", false));

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table idempotency.keys does not exist"),
				 errhint("Run CREATE EXTENSION idempotency.")));
	return relid;
}

/*
 * What claims cannot honour, since they write rows through the table access
 * method (see keystore_direct.c): a column they do not fill that must not
 * be NULL or has a default, row triggers, rules, row security.  The DDL guard
 * (ddl_guard.c) refuses the DDL that makes them; this catches what was made
 * while it was off or before it existed, when the description is cached
 * (at every change of the relation): claims are refused with a clear error
 * rather than writing rows the table would not accept.
 */
static const char *const known_columns[] = {
	"tenant", "endpoint", "key", "created_at", "fingerprint", "state",
	"lease_token", "locked_until", "response_status", "response_headers",
	"body_kind", "body_encrypted", "response_body", "body_ref", "fail_reason",
	"completed_at", "expires_at", "request_digest"
};

static void
IdemRefuseShape(Relation rel, const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("claims cannot write table %s: it has %s",
					quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
											   RelationGetRelationName(rel)),
					what),
			 errdetail("Claims write key rows directly, not through the executor, so they would not honour it."),
			 errhint("Remove it (as a superuser, with SET idempotency.ddl_guard = off); see doc/operations.md.")));
}

static void
IdemCheckShape(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);

	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		bool		known = false;

		if (att->attisdropped)
			continue;
		for (int k = 0; k < (int) lengthof(known_columns); k++)
			if (strcmp(NameStr(att->attname), known_columns[k]) == 0)
				known = true;
		if (!known && (att->attnotnull || att->atthasdef || att->attgenerated ||
					   att->attidentity))
			IdemRefuseShape(rel, psprintf("a column \"%s\" that claims do not fill",
										  NameStr(att->attname)));
	}
	for (int i = 0; rel->trigdesc != NULL && i < rel->trigdesc->numtriggers; i++)
	{
		Trigger    *trig = &rel->trigdesc->triggers[i];

		if (!TRIGGER_FOR_ROW(trig->tgtype) ||
			!(TRIGGER_FOR_INSERT(trig->tgtype) || TRIGGER_FOR_UPDATE(trig->tgtype) ||
			  TRIGGER_FOR_DELETE(trig->tgtype)))
			continue;
		/*
		 * the extension's own, keys_horizon (horizon.c; Citus names its copy
		 * on a shard after the shard): claims do its work themselves
		 */
		if (get_func_namespace(trig->tgfoid) == get_namespace_oid("idempotency", false) &&
			strcmp(get_func_name(trig->tgfoid), "idem_keys_horizon_trigger") == 0)
			continue;
		IdemRefuseShape(rel, "row triggers");
	}
	if (rel->rd_rules != NULL)
		IdemRefuseShape(rel, "rules");
	if (rel->rd_rel->relrowsecurity)
		IdemRefuseShape(rel, "row level security enabled");
}

/* idempotency.keys (the parent), with its description cached */
Oid
IdemKeysRelid(void)
{
	if (!OidIsValid(idem_keys_relid))
	{
		Oid			relid;
		Relation	rel;
		MemoryContext old;

		IdemRegisterInvalidation();
		relid = IdemKeystoreRelid();
		rel = table_open(relid, AccessShareLock);
		IdemCheckShape(rel);
		old = MemoryContextSwitchTo(CacheMemoryContext);
		idem_keys_desc = CreateTupleDescCopy(RelationGetDescr(rel));
		MemoryContextSwitchTo(old);
		table_close(rel, NoLock);
		idem_keys_relid = relid;
	}
	return idem_keys_relid;
}

/*
 * The relation that holds the rows of scope: the partitioned table
 * idempotency.keys, or its shard (below).  Every read and write of a
 * scope's rows (probes, inserts, statements) opens or names the relation
 * this returns.
 */
static Oid IdemCitusShard(const text *tenant);

Oid
IdemKeystoreRelation(const IdemScope *scope)
{
	Oid			relid = IdemKeysRelid();

	if (unlikely(keys_mode != KEYS_MODE_LOCAL))
	{
		if (keys_mode == KEYS_MODE_UNKNOWN)
		{
			IdemKeysMode mode = KEYS_MODE_LOCAL;
			Oid			dist = get_relname_relid("pg_dist_partition",
												 PG_CATALOG_NAMESPACE);

			/* Citus's catalog, where Citus is installed: read it by SQL */
			if (OidIsValid(dist))
			{
				Oid			argtypes[1] = {OIDOID};
				Datum		args[1] = {ObjectIdGetDatum(relid)};
				int			rc;

				if (SPI_connect() != SPI_OK_CONNECT)
					elog(ERROR, "SPI_connect failed");
				rc = SPI_execute_with_args("SELECT 1 FROM pg_catalog.pg_dist_partition"
										   " WHERE logicalrelid OPERATOR(pg_catalog.=) $1",
										   1, argtypes, args, NULL, true, 1);
				if (rc != SPI_OK_SELECT)
					elog(ERROR, "reading pg_dist_partition failed: %s",
						 SPI_result_code_string(rc));
				if (SPI_processed > 0)
					mode = KEYS_MODE_CITUS;
				SPI_finish();
			}
			/* a description forgotten meanwhile learns it again */
			if (relid == idem_keys_relid)
				keys_mode = mode;
			if (mode == KEYS_MODE_LOCAL)
				return relid;
		}
		return IdemCitusShard(scope->tenant);
	}
	return relid;
}

/*
 * Citus mode: the shard of idempotency.keys that holds tenant's rows, as
 * Citus places it (get_shard_id_for_distribution_column, shard_name), and
 * whether a placement of it is on this node; read through SPI, so that
 * nothing here links to Citus.  Cached per backend, and forgotten at any
 * relcache invalidation but a partition's: Citus invalidates the
 * distributed table's relcache whenever its shards or placements change.
 */
static CitusShardEntry *
IdemCitusResolve(const text *tenant)
{
	CitusShardEntry *entry;
	char	   *name = text_to_cstring(tenant);
	IdemOwnerSection section;
	Oid			argtypes[2] = {OIDOID, TEXTOID};
	Datum		args[2];
	int64		shardid;
	Oid			shard_relid;
	bool		local;
	Oid			tombstones_relid;
	bool		isnull;
	bool		found;
	int			rc;

	if (strlen(name) > IDEM_SCOPE_MAX_LEN)
		elog(ERROR, "tenant longer than %d bytes", IDEM_SCOPE_MAX_LEN);
	if (citus_cache != NULL &&
		(entry = hash_search(citus_cache, name, HASH_FIND, NULL)) != NULL)
		return entry;

	args[0] = ObjectIdGetDatum(IdemKeysRelid());
	args[1] = PointerGetDatum(tenant);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	IdemBeginOwnerSection(&section, IdemExtensionOwner(), 0);
	/*
	 * With the colocated shard of idempotency.tombstones (tombstone_probe.c),
	 * where it is distributed: after an update from 0.3.0 the keys may be
	 * distributed while the tombstones are not yet.
	 */
	rc = SPI_execute_with_args("SELECT s.id,"
							   " pg_catalog.to_regclass(pg_catalog.shard_name($1, s.id))::pg_catalog.oid,"
							   " EXISTS (SELECT FROM pg_catalog.pg_dist_placement p"
							   "   JOIN pg_catalog.pg_dist_local_group g USING (groupid)"
							   "   WHERE p.shardid OPERATOR(pg_catalog.=) s.id),"
							   " (SELECT pg_catalog.to_regclass(pg_catalog.shard_name(d.logicalrelid,"
							   "     pg_catalog.get_shard_id_for_distribution_column(d.logicalrelid, $2)))::pg_catalog.oid"
							   "   FROM pg_catalog.pg_dist_partition d"
							   "   WHERE d.logicalrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('idempotency.tombstones'))"
							   " FROM (SELECT pg_catalog.get_shard_id_for_distribution_column($1, $2) AS id) s",
							   2, argtypes, args, NULL, true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "resolving the shard of idempotency.keys failed: %s",
			 SPI_result_code_string(rc));
	shardid = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
										  SPI_tuptable->tupdesc, 1, &isnull));
	shard_relid = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
												 SPI_tuptable->tupdesc, 2, &isnull));
	if (isnull)
		shard_relid = InvalidOid;
	local = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 3, &isnull));
	tombstones_relid = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
													  SPI_tuptable->tupdesc, 4, &isnull));
	if (isnull)
		tombstones_relid = InvalidOid;
	IdemEndOwnerSection(&section);
	SPI_finish();

	/* bounded: emptied when full */
	if (citus_cache != NULL && hash_get_num_entries(citus_cache) >= IDEM_CITUS_CACHE_MAX)
		IdemCitusCacheForget();
	if (citus_cache == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = IDEM_SCOPE_MAX_LEN + 1;
		ctl.entrysize = sizeof(CitusShardEntry);
		ctl.hcxt = CacheMemoryContext;
		citus_cache = hash_create("idempotency tenant shards", 64, &ctl,
								  HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	entry = hash_search(citus_cache, name, HASH_ENTER, &found);
	entry->shardid = shardid;
	entry->shard_relid = shard_relid;
	entry->local = local && OidIsValid(shard_relid);
	entry->tombstones_relid = tombstones_relid;
	entry->locked_lxid = InvalidLocalTransactionId;
	entry->locked_subxid = InvalidSubTransactionId;
	pfree(name);
	return entry;
}

/*
 * Citus mode: the shard of idempotency.tombstones on this node colocated
 * with the tenant's shard of keys, or InvalidOid; resolved in the same
 * query as the keys' shard and cached with it.  The claim has resolved and
 * locked the keys' shard against moves before: a move of one is a move of
 * both.
 */
Oid
IdemKeystoreTombstoneShard(const text *tenant)
{
	return IdemCitusResolve(tenant)->tombstones_relid;
}

/*
 * Citus mode: the relation holding tenant's rows on this node, the local
 * shard of idempotency.keys (itself partitioned like the table), with
 * Citus's lock on the metadata of the shard's colocation group taken in
 * ShareLock, as Citus's executor takes it for a write: a shard move or
 * split (block_writes) takes it in ExclusiveLock, so it waits for this
 * transaction, and this transaction waits for the move, then resolves the
 * shard again.  A tenant whose shard is not on this node is refused: the
 * shell table of the coordinator or of another worker holds no rows.
 */
static Oid
IdemCitusShard(const text *tenant)
{
	CitusShardEntry *entry;
	int64		shardid;
	Oid			shard_relid;
	bool		local;

	for (;;)
	{
		uint64		generation;
		LocalTransactionId lxid = IDEM_MY_LXID;
		SubTransactionId subxid = GetCurrentSubTransactionId();

		entry = IdemCitusResolve(tenant);
		shardid = entry->shardid;
		shard_relid = entry->shard_relid;
		local = entry->local;
		if (entry->locked_lxid == lxid && entry->locked_subxid == subxid)
			break;
		generation = citus_generation;
		if (local)
		{
			IdemOwnerSection section;
			Oid			argtypes[1] = {INT8OID};
			Datum		args[1] = {Int64GetDatum(shardid)};
			int			rc;

			if (SPI_connect() != SPI_OK_CONNECT)
				elog(ERROR, "SPI_connect failed");
			IdemBeginOwnerSection(&section, IdemExtensionOwner(), 0);
			rc = SPI_execute_with_args(psprintf("SELECT pg_catalog.lock_shard_metadata(%d, ARRAY[$1])",
												ShareLock),
									   1, argtypes, args, NULL, false, 1);
			if (rc != SPI_OK_SELECT)
				elog(ERROR, "locking the shard of idempotency.keys failed: %s",
						 SPI_result_code_string(rc));
			IdemEndOwnerSection(&section);
			SPI_finish();
		}
		/* a move that ended while this waited has changed the placements */
		AcceptInvalidationMessages();
		if (generation == citus_generation)
		{
			if (local)
			{
				entry->locked_lxid = lxid;
				entry->locked_subxid = subxid;
			}
			break;
		}
	}
	if (!local)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_SHARD_NOT_LOCAL),
				 errmsg("the keys of tenant \"%s\" are not on this node",
						text_to_cstring(tenant)),
				 errdetail("idempotency.keys is a Citus distributed table, and the shard %lld that holds the tenant's keys has no placement on this node.",
						   (long long) shardid),
				 errhint("Call the function on the coordinator as a statement of its own (SELECT * FROM idempotency.idem_claim(...)), so that Citus delegates it to the tenant's node; see doc/scaling.md, \"Citus: which calls are delegated\".")));
	return shard_relid;
}

AttrNumber
IdemKeysAttnum(const char *column)
{
	int			i;

	(void) IdemKeysRelid();
	for (i = 0; i < idem_keys_desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(idem_keys_desc, i);

		if (!att->attisdropped && strcmp(NameStr(att->attname), column) == 0)
			return att->attnum;
	}
	elog(ERROR, "column \"%s\" of idempotency.keys does not exist", column);
	return InvalidAttrNumber;	/* keep compiler quiet */
}

/*
 * The column request_digest (mismatch diagnostics), or InvalidAttrNumber
 * under a schema of 0.2.0, which lacks it until the extension is updated.
 */
static AttrNumber digest_attnum = InvalidAttrNumber;
static uint64 digest_attnum_generation = 0;

AttrNumber
IdemDigestAttnum(void)
{
	(void) IdemKeysRelid();
	if (digest_attnum_generation != idem_keys_generation)
	{
		digest_attnum = IdemSchemaHas(IDEM_SCHEMA_DIAGNOSTICS) ?
			IdemKeysAttnum("request_digest") : InvalidAttrNumber;
		digest_attnum_generation = idem_keys_generation;
	}
	return digest_attnum;
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

/* The probe of a partition (keystore_int.h). */
PartitionProbe *
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
		IdemCheckShape(rel);
		indexoid = IdemScopeIndex(rel, scope_col);
		lease_indexoid = IdemLeaseIndex(rel);
		(void) IdemKeysRelid();
		old = MemoryContextSwitchTo(CacheMemoryContext);
		map = IdemAttrMapIfReq(RelationGetDescr(rel), idem_keys_desc);
		insert_map = IdemAttrMapIfReq(idem_keys_desc, RelationGetDescr(rel));
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

/* The partition that covers ts (keystore_int.h). */
int
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

/* ----------------------------------------------------------------
 *		the Citus mode, as maintenance sees it
 * ----------------------------------------------------------------
 */

/*
 * Whether idempotency.keys is a Citus distributed table (the Citus mode);
 * learned once per backend and table.
 */
bool
IdemKeystoreDistributed(void)
{
	(void) IdemKeysRelid();
	if (keys_mode == KEYS_MODE_UNKNOWN)
	{
		/* learn it as a claim would, without naming a tenant */
		if (!OidIsValid(get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE)))
			return false;
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		if (SPI_execute("SELECT 1 FROM pg_catalog.pg_dist_partition"
						" WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.keys'::pg_catalog.regclass",
						true, 1) != SPI_OK_SELECT)
			elog(ERROR, "reading pg_dist_partition failed");
		keys_mode = SPI_processed > 0 ? KEYS_MODE_CITUS : KEYS_MODE_LOCAL;
		SPI_finish();
	}
	return keys_mode == KEYS_MODE_CITUS;
}

/*
 * In the Citus mode, whether this node is the coordinator (which partitions
 * the table: Citus carries the partitions' DDL to the shards) or a worker.
 */
IdemKeysNode
IdemKeystoreNode(void)
{
	bool		coordinator = false;
	bool		isnull;

	if (!IdemKeystoreDistributed())
		return IDEM_KEYS_LOCAL;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute("SELECT pg_catalog.citus_is_coordinator()", true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "citus_is_coordinator() failed");
	coordinator = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
											 SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	return coordinator ? IDEM_KEYS_CITUS_COORDINATOR : IDEM_KEYS_CITUS_WORKER;
}
