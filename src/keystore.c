/*-------------------------------------------------------------------------
 *
 * keystore.c
 *	  Storage of key rows in idempotency.keys.  This file is the only code
 *	  that knows where and how a key row is stored: the relation and its
 *	  partitions, the columns and their attribute numbers, the row's codec,
 *	  the probes, the direct inserts, and every statement that changes or
 *	  deletes rows (the protocol's and maintenance's).  IdemKeystoreRelation
 *	  is the one place where the relation that holds a scope's rows is
 *	  named; every read and write of a scope's rows goes through it.
 *
 *	  The hot paths go straight to the partitions.  A read probes the
 *	  unique index of every partition whose range has not ended, and an
 *	  insert goes straight into the partition that covers the row's expiry
 *	  time: each costs a fraction of an executor run over the partitioned
 *	  table, since it skips the executor's start-up and tuple routing.  Rows
 *	  are only ever made by this code, which fills every column with valid
 *	  values: the table's CHECK constraints are a statement of what it
 *	  writes, and are not evaluated here; the unique index still is.  A
 *	  partition whose file has no block (the days ahead, usually) is locked
 *	  and its size read, nothing more: its index is not even locked, which
 *	  keeps a claim's relation locks within the lock manager's fast-path
 *	  slots.  Per partition, the index to probe and the maps between the
 *	  partition's columns and the parent's are cached per backend and
 *	  forgotten at any relcache invalidation of that partition.
 *
 *	  The rarer changes of a row (finish or fail of a leased claim, release,
 *	  heartbeat, resolve, maintenance's settling of stale leases) run as
 *	  SQL through SPI, as the owner of the table.
 *
 *	  In the Citus mode (README "Citus"), idempotency.keys is a distributed
 *	  table: the relation of a scope's rows is then the tenant's shard on
 *	  this node (itself partitioned like the table), found through SQL so
 *	  that nothing links to Citus, locked against shard moves as Citus's
 *	  executor locks it, and refused (IK421) when it is not on this node.
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
#include "catalog/pg_inherits.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/partcache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "compat.h"
#include "idempotency.h"
#include "keys.h"
#include "keystore.h"
#include "tombstone.h"

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

/* ----------------------------------------------------------------
 *		the relation, its partitions and their caches
 * ----------------------------------------------------------------
 */

typedef struct PartitionProbe
{
	Oid			partoid;		/* hash key */
	Oid			indexoid;		/* unique index on the scope's columns */
	int8		scope_col[3];	/* index column i+1 holds scope value
								 * scope_col[i]: 0 tenant, 1 endpoint, 2 key */
	AttrMap    *map;			/* partition to parent columns; NULL when the
								 * layouts are the same */
	AttrMap    *insert_map;		/* parent to partition columns, likewise */
	Oid			lease_indexoid; /* its index of leased claims in progress, or
								 * InvalidOid */
} PartitionProbe;

static HTAB *probe_cache = NULL;
static uint64 probe_cache_generation = 0;	/* moves at every forgetting */
static bool probe_callback_registered = false;

/* the parent, in whose column numbers rows are read and written here */
static Oid	keys_relid = InvalidOid;
static Oid	keys_owner = InvalidOid;
static TupleDesc keys_desc = NULL;

/* moves on each time the parent's description is forgotten */
static uint64 keys_generation = 1;

/*
 * Citus mode (README "Scaling out", "Citus"): whether idempotency.keys is a
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
 * method (see the banner): a column they do not fill that must not be NULL
 * or has a default, row triggers, rules, row security.  The DDL guard
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
	if (rel->trigdesc != NULL &&
		(rel->trigdesc->trig_insert_before_row || rel->trigdesc->trig_insert_after_row ||
		 rel->trigdesc->trig_insert_instead_row ||
		 rel->trigdesc->trig_update_before_row || rel->trigdesc->trig_update_after_row ||
		 rel->trigdesc->trig_delete_before_row || rel->trigdesc->trig_delete_after_row))
		IdemRefuseShape(rel, "row triggers");
	if (rel->rd_rules != NULL)
		IdemRefuseShape(rel, "rules");
	if (rel->rd_rel->relrowsecurity)
		IdemRefuseShape(rel, "row level security enabled");
}

/* idempotency.keys (the parent), with its description cached */
static Oid
IdemKeysRelid(void)
{
	if (!OidIsValid(keys_relid))
	{
		Oid			relid;
		Relation	rel;
		MemoryContext old;

		IdemRegisterInvalidation();
		relid = IdemKeystoreRelid();
		rel = table_open(relid, AccessShareLock);
		IdemCheckShape(rel);
		old = MemoryContextSwitchTo(CacheMemoryContext);
		keys_desc = CreateTupleDescCopy(RelationGetDescr(rel));
		MemoryContextSwitchTo(old);
		keys_owner = rel->rd_rel->relowner;
		table_close(rel, NoLock);
		keys_relid = relid;
	}
	return keys_relid;
}

/*
 * The relation that holds the rows of scope: the partitioned table
 * idempotency.keys.  Every read and write of a scope's rows (probes,
 * inserts, the statements below) opens or names the relation this returns.
 */
static Oid IdemCitusShard(const text *tenant);

static Oid
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
										   " WHERE logicalrelid = $1",
										   1, argtypes, args, NULL, true, 1);
				if (rc != SPI_OK_SELECT)
					elog(ERROR, "reading pg_dist_partition failed: %s",
						 SPI_result_code_string(rc));
				if (SPI_processed > 0)
					mode = KEYS_MODE_CITUS;
				SPI_finish();
			}
			/* a description forgotten meanwhile learns it again */
			if (relid == keys_relid)
				keys_mode = mode;
			if (mode == KEYS_MODE_LOCAL)
				return relid;
		}
		return IdemCitusShard(scope->tenant);
	}
	return relid;
}

/* the owner of idempotency.keys: the role the extension's own SQL runs as */
Oid
IdemKeystoreOwner(void)
{
	(void) IdemKeysRelid();
	return keys_owner;
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
	IdemBeginOwnerSection(&section, IdemKeystoreOwner(), 0);
	rc = SPI_execute_with_args("SELECT s.id,"
							   " pg_catalog.to_regclass(pg_catalog.shard_name($1, s.id))::oid,"
							   " EXISTS (SELECT FROM pg_catalog.pg_dist_placement p"
							   "   JOIN pg_catalog.pg_dist_local_group g USING (groupid)"
							   "   WHERE p.shardid = s.id)"
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
	entry->locked_lxid = InvalidLocalTransactionId;
	entry->locked_subxid = InvalidSubTransactionId;
	pfree(name);
	return entry;
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
			IdemBeginOwnerSection(&section, IdemKeystoreOwner(), 0);
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

static AttrNumber
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
 * The column request_digest (mismatch diagnostics), or InvalidAttrNumber
 * under a schema of 0.2.0, which lacks it until the extension is updated.
 */
static AttrNumber digest_attnum = InvalidAttrNumber;
static uint64 digest_attnum_generation = 0;

static AttrNumber
IdemDigestAttnum(void)
{
	(void) IdemKeysRelid();
	if (digest_attnum_generation != keys_generation)
	{
		digest_attnum = InvalidAttrNumber;
		for (int i = 0; i < keys_desc->natts; i++)
		{
			Form_pg_attribute att = TupleDescAttr(keys_desc, i);

			if (!att->attisdropped &&
				strcmp(NameStr(att->attname), "request_digest") == 0)
				digest_attnum = att->attnum;
		}
		digest_attnum_generation = keys_generation;
	}
	return digest_attnum;
}

/*
 * Fill attnums with the column numbers of the n names, unless *generation
 * says they are those of the table's current description already.
 */
static void
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
		IdemCheckShape(rel);
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

/* ----------------------------------------------------------------
 *		the row codec
 * ----------------------------------------------------------------
 */

/* the columns a read takes, in the order of ROW_COLUMNS below */
static const char *const row_columns[] = {
	"fingerprint", "state", "lease_token", "locked_until", "response_status",
	"response_headers", "body_kind", "body_encrypted", "response_body",
	"body_ref", "created_at", "expires_at", "completed_at"
};

#define NUM_ROW_COLUMNS lengthof(row_columns)

static AttrNumber row_attnums[NUM_ROW_COLUMNS];
static uint64 row_attnums_generation = 0;

/* Take one row of the scope (values in row_columns order) into row. */
static void
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
static void
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
 * Take the rows of the scope until the live row is found, reading with the
 * latest snapshot, which is taken after the parent is locked (and
 * so after the invalidations of a partition attached meanwhile are
 * processed).  Partitions whose range ended at or before now hold only
 * expired rows and are skipped.  The partition that covers hint is probed
 * first, since a live row is most likely there.
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
	int			nparts;
	int			first;
	int			n;
	bool		stop = false;

	relid = IdemKeystoreRelation(scope);
	is_shard = relid != keys_relid;
	parent = table_open(relid, st->lockmode);
	/* rows are taken in the layout of idempotency.keys, which a shard need not share */
	layout = is_shard ? table_open(IdemKeystoreRelid(), AccessShareLock) : parent;
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
		if (!ended || st->ended_too)
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
		generation = probe_cache_generation;
		idx = index_open(probe->indexoid, AccessShareLock);
		/* opening the index may have processed invalidations: look again */
		if (generation != probe_cache_generation)
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
	if (is_shard)
		table_close(layout, NoLock);
	table_close(parent, NoLock);
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
	natts = keys_desc->natts;
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
	IdemInsertKeyRow(relid, relid != keys_relid, values, nulls,
					 newrow->state == IDEM_STATE_IN_PROGRESS);
}

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
	" WHERE tenant = $1 AND endpoint = $2 AND key = $3"
#define LIVE_WHERE	SCOPE_WHERE " AND expires_at > $4"
#define ROW_COLUMNS \
	"fingerprint, state, lease_token, locked_until, response_status," \
	" response_headers, body_kind, body_encrypted, response_body, body_ref," \
	" created_at, expires_at, completed_at"

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
		"SELECT " ROW_COLUMNS " FROM %s" LIVE_WHERE " FOR UPDATE",
		"SELECT 1 FROM ONLY %s WHERE ctid = $5 FOR UPDATE",
		4, {SCOPE_TYPES, TIMESTAMPTZOID}
	},
	[STMT_DELETE_EXPIRED] = {
		"DELETE FROM %s" SCOPE_WHERE " AND expires_at <= $4",
		NULL,
		4, {SCOPE_TYPES, TIMESTAMPTZOID}
	},
	[STMT_DELETE_LIVE] = {
		"DELETE FROM %s" LIVE_WHERE,
		"DELETE FROM ONLY %s WHERE ctid = $5",
		4, {SCOPE_TYPES, TIMESTAMPTZOID}
	},
	[STMT_COMPLETE] = {
		"UPDATE %s" COMPLETE_SET LIVE_WHERE,
		"UPDATE ONLY %s" COMPLETE_SET " WHERE ctid = $11",
		10, {SCOPE_TYPES, TIMESTAMPTZOID, RESPONSE_TYPES}
	},
	[STMT_FAIL] = {
		"UPDATE %s" FAIL_SET LIVE_WHERE,
		"UPDATE ONLY %s" FAIL_SET " WHERE ctid = $7",
		6, {SCOPE_TYPES, TIMESTAMPTZOID, TEXTOID, TEXTOID}
	},
	[STMT_HEARTBEAT] = {
		"UPDATE %s" HEARTBEAT_SET LIVE_WHERE,
		"UPDATE ONLY %s" HEARTBEAT_SET " WHERE ctid = $6",
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
	IdemBeginOwnerSection(&section, IdemKeystoreOwner(), 0);
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
		Datum		v[NUM_ROW_COLUMNS];
		bool		n[NUM_ROW_COLUMNS];

		for (int c = 0; c < (int) NUM_ROW_COLUMNS; c++)
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

/*
 * The live row of a SERIALIZABLE transaction's lease-mode call, locked.  It
 * is found by a probe, which takes no predicate locks (see IdemProbeIndex),
 * then locked by its ctid, and the statements that change it go by its
 * ctid too (IdemExecOn); the only predicate lock taken is the one on the
 * row itself.  A statement by scope would read the partition's index with
 * predicate locks on its pages, and calls on different keys whose index
 * entries share a page (time-ordered keys always do) would make each other
 * fail.  This is sound: the call decides on the version it has locked, and
 * whoever changes the row must lock it first, so the row lock orders them,
 * as it orders the statements at the other levels.  A version that was
 * replaced after the probe is not visible to the lock's (later) snapshot:
 * the probe then finds the new one.  The old version's ctid cannot be
 * reused meanwhile, since its deleter committed after this transaction's
 * snapshot was taken.
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
	 * EXCLUSIVE, which deadlocks with REINDEX (see IdemReadScope).
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
	" WHERE state = 'in_progress' AND locked_until < $1 AND expires_at > $1"

/* The WHERE clause that identifies a still-stale lease ($1..$4). */
#define STALE_ROW_QUAL \
	STALE_LEASES_QUAL " AND tenant = $2 AND endpoint = $3 AND key = $4"

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
						" WHERE logicalrelid = 'idempotency.keys'::pg_catalog.regclass",
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
							 " WHERE s.logicalrelid = '%s'::pg_catalog.regclass"
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
	rc = SPI_execute_with_args("SELECT endpoint, count(*) FROM idempotency.keys"
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
		n += (int64) IdemSpiExec(psprintf("DELETE FROM ONLY %s WHERE expires_at <= $1",
										  (char *) lfirst(lc)),
								 1, argtypes, args, NULL, false, SPI_OK_DELETE);
	return n;
}

/*
 * The expired rows of the default partition leave it, and those whose
 * endpoint keeps tombstones leave one, in one statement: a claim that reads
 * with a later snapshot sees the row or its tombstone.
 */
int64
IdemKeystorePurgeDefaultToTombstones(TimestampTz as_of, int64 *tombstoned)
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
										" made AS (" IDEM_TOMBSTONE_INSERT_SQL "%s RETURNING 1)"
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

int64
IdemKeystoreTombstones(Oid relid, TimestampTz as_of, bool count_only)
{
	Oid			argtypes[1] = {TIMESTAMPTZOID};
	Datum		args[1] = {TimestampTzGetDatum(as_of)};
	/* expired at as_of: every row of a partition whose range has ended */
	char	   *source = psprintf("(SELECT * FROM ONLY %s WHERE expires_at <= $1)",
								  IdemRelationName(relid));
	bool		isnull;
	int64		n;

	if (!count_only)
		return (int64) IdemSpiExec(psprintf(IDEM_TOMBSTONE_INSERT_SQL "%s",
											IdemTombstoneSourceSql(source)),
								   1, argtypes, args, NULL, false, SPI_OK_INSERT);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute_with_args(psprintf("SELECT count(*)%s", IdemTombstoneSourceSql(source)),
							  1, argtypes, args, NULL, true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "counting the tombstones of %s failed", source);
	n = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	return n;
}
