/*-------------------------------------------------------------------------
 *
 * ddl_guard.c
 *	  The event trigger idempotency_ddl_guard (ddl_command_start), which
 *	  refuses DDL that would make claims wrong on the tables of keys and
 *	  tombstones: idempotency.keys, idempotency.tombstones and every
 *	  partition of them.
 *
 *	  Claims read and write those tables through the table access method,
 *	  not the executor (src/keystore_direct.c): a column added by hand would be
 *	  stored NULL whatever its default, and CHECK constraints, triggers,
 *	  rules and row security would be skipped for their rows; a partition
 *	  detached or dropped by hand takes live keys with it, so that their
 *	  retries execute again.  So the guard refuses, on those tables, every
 *	  ALTER TABLE but the subcommands listed in IdemAllowedSubcommand,
 *	  triggers, rules, row security policies, renames, moves to another
 *	  schema, partitioned indexes on the parents, dropping the extension's
 *	  indexes, and making, attaching, detaching or dropping partitions by
 *	  hand.  A partition that maintenance would have made (named
 *	  PARENT_p<digits>) may still be made or attached: that is how pg_dump
 *	  brings dated partitions back.  Such an attach, and ENABLE / DISABLE
 *	  TRIGGER ALL | USER, may bring rows that passed no trigger: the key
 *	  horizons and tombstone filters are made unknown (IdemAlterForget).
 *
 *	  The guard stands aside for the extension itself: its install and
 *	  update scripts (creating_extension), the DDL of maintenance passes
 *	  (IdemRunOwnDDL), binary upgrade (pg_upgrade), databases where Citus
 *	  is installed (Citus propagates and replays DDL on the tables and
 *	  their shards), and a superuser who sets idempotency.ddl_guard = off.
 *	  Event triggers do not fire in single-user mode either.
 *
 *	  Where Citus is installed, the trigger has one more task: a DROP TABLE
 *	  of a shard of a partition of idempotency.keys on a worker (the
 *	  coordinator's maintenance dropping the partition) first leaves the
 *	  tombstones of the shard's rows, under the drop's lock
 *	  (IdemTombstonesBeforeShardDrop in tombstone_write.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/partition.h"
#include "commands/event_trigger.h"
#include "commands/extension.h"
#include "commands/tablecmds.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/lmgr.h"
#include "tcop/cmdtag.h"
#include "utils/acl.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "compat.h"
#include "ddl_guard.h"
#include "guc.h"
#include "horizon.h"
#include "tombstone_filter.h"
#include "tombstone_write.h"
#include "util.h"

/* depth of the extension's own DDL (IdemRunOwnDDL) in this backend */
static int	own_ddl_depth = 0;

/*
 * Run sql (DDL of the extension's own, through SPI) with the guard standing
 * aside.
 */
int
IdemRunOwnDDL(const char *sql)
{
	int			rc;

	own_ddl_depth++;
	PG_TRY();
	{
		rc = SPI_execute(sql, false, 0);
	}
	PG_FINALLY();
	{
		own_ddl_depth--;
	}
	PG_END_TRY();
	return rc;
}

/* The guarded table a relation belongs to: "keys", "tombstones" or NULL. */
typedef struct GuardedRel
{
	Oid			relid;
	Oid			rootid;
	const char *root;			/* "keys" or "tombstones" */
	bool		is_root;
	char		relkind;
} GuardedRel;

static bool
IdemGuarded(Oid relid, GuardedRel *g)
{
	Oid			nsp = get_namespace_oid("idempotency", true);
	Oid			root = relid;
	char	   *name;

	if (!OidIsValid(relid) || !OidIsValid(nsp) || get_rel_namespace(relid) != nsp)
		return false;
	if (get_rel_relispartition(relid))
	{
		List	   *ancestors = get_partition_ancestors(relid);

		root = llast_oid(ancestors);
		list_free(ancestors);
	}
	name = get_rel_name(root);
	if (name == NULL || get_rel_namespace(root) != nsp ||
		(strcmp(name, "keys") != 0 && strcmp(name, "tombstones") != 0))
		return false;
	g->relid = relid;
	g->rootid = root;
	g->root = strcmp(name, "keys") == 0 ? "keys" : "tombstones";
	g->is_root = root == relid;
	g->relkind = get_rel_relkind(relid);
	return true;
}

static bool
IdemGuardedRangeVar(RangeVar *rv, GuardedRel *g)
{
	if (rv == NULL)
		return false;
	return IdemGuarded(RangeVarGetRelid(rv, NoLock, true), g);
}

/* A table or index by its name; for an index, the table it is on. */
static bool
IdemGuardedTableOf(RangeVar *rv, GuardedRel *g, bool *is_index)
{
	Oid			relid = RangeVarGetRelid(rv, NoLock, true);
	char		kind = OidIsValid(relid) ? get_rel_relkind(relid) : '\0';

	*is_index = kind == RELKIND_INDEX || kind == RELKIND_PARTITIONED_INDEX;
	if (*is_index)
		relid = IndexGetRelation(relid, true);
	return IdemGuarded(relid, g);
}

/* A partition named as maintenance names them: PARENT_p<digit>... */
static bool
IdemMaintenanceName(const char *relname, const char *root)
{
	size_t		len = strlen(root);

	return strncmp(relname, root, len) == 0 &&
		strncmp(relname + len, "_p", 2) == 0 &&
		relname[len + 2] >= '0' && relname[len + 2] <= '9';
}

/* The index names the extension gives: PARTITION_scope_idx, _lease_idx. */
static bool
IdemExtensionIndexName(const char *name)
{
	size_t		len = strlen(name);

	return (len > 10 && strcmp(name + len - 10, "_scope_idx") == 0) ||
		(len > 10 && strcmp(name + len - 10, "_lease_idx") == 0);
}

/*
 * What ALTER TABLE may still do on the guarded tables: nothing a claim
 * reads or writes differently after.
 */
static bool
IdemAllowedSubcommand(AlterTableType t)
{
	switch (t)
	{
		case AT_SetRelOptions:
		case AT_ResetRelOptions:
		case AT_ReplaceRelOptions:
		case AT_SetStatistics:
		case AT_SetOptions:
		case AT_ResetOptions:
		case AT_SetStorage:
		case AT_SetCompression:
		case AT_ClusterOn:
		case AT_DropCluster:
		case AT_SetTableSpace:
		case AT_ReplicaIdentity:
		case AT_ChangeOwner:
			/* pg_dump --disable-triggers; the tables have no trigger */
		case AT_EnableTrigAll:
		case AT_DisableTrigAll:
		case AT_EnableTrigUser:
		case AT_DisableTrigUser:
			/* putting keys_horizon or tombstones_filter back ALWAYS after */
		case AT_EnableAlwaysTrig:
			return true;
		default:
			return false;
	}
}

static void
IdemRefuse(EventTriggerData *trigdata, const GuardedRel *g, const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("%s is not allowed on table %s.%s of extension idempotency",
					what ? what : GetCommandTagName(trigdata->tag),
					"idempotency", get_rel_name(g->relid)),
			 errdetail("Claims read and write the tables of keys and tombstones directly, not through the executor: columns, constraints, triggers, rules, row security and partitions that the extension did not make would be ignored by claims or make them fail, and a partition detached or dropped by hand takes live keys with it."),
			 errhint("REINDEX, VACUUM, CLUSTER, ANALYZE, statistics, storage parameters, tablespaces and replica identity remain allowed (doc/operations.md).  For a repair by hand, a superuser may SET idempotency.ddl_guard = off.")));
}

static void
IdemCheckAlterTable(EventTriggerData *trigdata, AlterTableStmt *stmt)
{
	GuardedRel	g;
	ListCell   *lc;

	if (stmt->objtype != OBJECT_TABLE || !IdemGuardedRangeVar(stmt->relation, &g))
		return;
	foreach(lc, stmt->cmds)
	{
		AlterTableCmd *cmd = lfirst_node(AlterTableCmd, lc);

		if (IdemAllowedSubcommand(cmd->subtype))
			continue;
		/* a unique index by another name: maintenance makes partitions so */
		if (cmd->subtype == AT_AddConstraint && !g.is_root &&
			IsA(cmd->def, Constraint) &&
			(((Constraint *) cmd->def)->contype == CONSTR_UNIQUE ||
			 ((Constraint *) cmd->def)->contype == CONSTR_PRIMARY))
			continue;
		if (cmd->subtype == AT_AttachPartition && g.is_root)
		{
			PartitionCmd *pc = (PartitionCmd *) cmd->def;

			if (pc != NULL && pc->name != NULL &&
				IdemMaintenanceName(pc->name->relname, g.root))
				continue;
			IdemRefuse(trigdata, &g, "ATTACH PARTITION of a table not named as maintenance names partitions");
		}
		if (cmd->subtype == AT_DetachPartition
			|| cmd->subtype == AT_DetachPartitionFinalize)
			IdemRefuse(trigdata, &g, "DETACH PARTITION");
		IdemRefuse(trigdata, &g, NULL);
	}
}

/*
 * ENABLE TRIGGER (ALL, USER or by name) and ENABLE REPLICA TRIGGER on a table
 * of keys or tombstones leave the extension's trigger there firing for
 * ordinary sessions only, or for a replication apply only: the extension
 * makes it ALWAYS, so that rows applied by logical replication pass it too,
 * and maintenance learns the horizons or filters of the tree only while it
 * fires always (util.h, IdemLearnedTreeComplete).  Say so, and how to put it
 * back.
 */
static void
IdemWarnNotAlways(const GuardedRel *g)
{
	const char *tgname = strcmp(g->root, "keys") == 0 ? "keys_horizon" : "tombstones_filter";

	ereport(WARNING,
			(errcode(ERRCODE_WARNING),
			 errmsg("trigger %s of table %s.%s no longer fires always", tgname,
					"idempotency", get_rel_name(g->relid)),
			 errdetail("The extension enables %s ALWAYS, so that rows applied by logical replication pass it too.  Until it fires always again, maintenance does not learn the key horizons and tombstone filters of this database, and claims probe every partition.",
					   tgname),
			 errhint("After the load, run ALTER TABLE idempotency.%s ENABLE ALWAYS TRIGGER %s.",
					 g->root, tgname)));
}

/*
 * What the guard lets through and yet may bring rows that passed no trigger
 * into the tables of keys and tombstones: a partition attached holding rows,
 * rows written while a trigger is disabled.  The horizons and tombstone
 * filters in shared memory, which those triggers keep, are made unknown
 * (claims probe the partitions again) until maintenance has read the rows
 * (IdemHorizonForget, IdemTombFilterForget), and learning completes nothing
 * while the command's transaction runs or a trigger stays disabled.
 *
 * This trigger fires before the command takes its lock, so it takes that
 * lock itself first (the same, on the same table, as the command takes it
 * next): a learning that read the rows before it sees the counts of its
 * forgets move, and one that reads after sees the lock, or the command
 * done.  Only for the table's owner (or a superuser): the command fails for
 * anyone else, and nobody queues a lock by running it.
 */
static void
IdemAlterForget(AlterTableStmt *stmt)
{
	GuardedRel	g;
	ListCell   *lc;
	bool		forget = false;
	bool		enable_origin = false;
	bool		all = false;
	List	   *partoids = NIL;

	if (stmt->objtype != OBJECT_TABLE || !IdemGuardedRangeVar(stmt->relation, &g))
		return;
	foreach(lc, stmt->cmds)
	{
		AlterTableCmd *cmd = lfirst_node(AlterTableCmd, lc);
		PartitionCmd *pc;
		Oid			part;

		switch (cmd->subtype)
		{
			case AT_AttachPartition:
				if (!g.is_root)
					break;
				forget = true;
				pc = (PartitionCmd *) cmd->def;
				part = pc != NULL && pc->name != NULL ?
					RangeVarGetRelid(pc->name, NoLock, true) : InvalidOid;
				/* a partitioned table attached: every partition's entry */
				if (OidIsValid(part) && get_rel_relkind(part) == RELKIND_RELATION)
					partoids = lappend_oid(partoids, part);
				else
					all = true;
				break;
			case AT_EnableTrig:
			case AT_EnableTrigAll:
			case AT_EnableTrigUser:
			case AT_EnableReplicaTrig:
				enable_origin = true;
				/* FALLTHROUGH */
			case AT_EnableAlwaysTrig:
			case AT_DisableTrig:
			case AT_DisableTrigAll:
			case AT_DisableTrigUser:
				forget = true;
				if (g.relkind == RELKIND_RELATION && !g.is_root)
					partoids = lappend_oid(partoids, g.relid);
				else
					all = true;
				break;
			default:
				break;
		}
	}
	if (all)
	{
		list_free(partoids);
		partoids = NIL;			/* every partition's entry */
	}
	if (!forget || !IdemRelationOwnerCheck(g.relid, GetUserId()))
	{
		list_free(partoids);
		return;
	}
	LockRelationOid(g.relid, AlterTableGetLockLevel(stmt->cmds));
	if (strcmp(g.root, "keys") == 0)
		IdemHorizonForget(g.rootid);
	else
		IdemTombFilterForget(g.rootid, partoids);
	list_free(partoids);
	if (enable_origin)
		IdemWarnNotAlways(&g);
}

static void
IdemCheckDrop(EventTriggerData *trigdata, DropStmt *stmt)
{
	ListCell   *lc;

	if (stmt->removeType != OBJECT_TABLE && stmt->removeType != OBJECT_INDEX)
		return;
	foreach(lc, stmt->objects)
	{
		RangeVar   *rv = makeRangeVarFromNameList((List *) lfirst(lc));
		GuardedRel	g;
		bool		is_index;

		if (!IdemGuardedTableOf(rv, &g, &is_index))
			continue;
		if (stmt->removeType == OBJECT_TABLE && !is_index)
			IdemRefuse(trigdata, &g, "DROP TABLE");
		if (stmt->removeType == OBJECT_INDEX && is_index &&
			IdemExtensionIndexName(rv->relname))
			IdemRefuse(trigdata, &g, "DROP INDEX of an index the extension made");
	}
}

static void
IdemCheckCreate(EventTriggerData *trigdata, CreateStmt *stmt)
{
	ListCell   *lc;

	foreach(lc, stmt->inhRelations)
	{
		GuardedRel	g;

		if (!IdemGuardedRangeVar(lfirst_node(RangeVar, lc), &g))
			continue;
		if (stmt->partbound != NULL && g.is_root &&
			IdemMaintenanceName(stmt->relation->relname, g.root))
			continue;
		IdemRefuse(trigdata, &g, "CREATE TABLE ... PARTITION OF");
	}
}

/* The Citus mode: the tables a DROP TABLE names, to tombstone_write.c */
static void
IdemCitusDrop(DropStmt *stmt)
{
	ListCell   *lc;

	if (stmt->removeType != OBJECT_TABLE)
		return;
	foreach(lc, stmt->objects)
	{
		RangeVar   *rv = makeRangeVarFromNameList((List *) lfirst(lc));

		IdemTombstonesBeforeShardDrop(RangeVarGetRelid(rv, NoLock, true));
	}
}

PG_FUNCTION_INFO_V1(idem_ddl_guard);

/*
 * idem_ddl_guard() RETURNS event_trigger, fired at ddl_command_start.
 */
Datum
idem_ddl_guard(PG_FUNCTION_ARGS)
{
	EventTriggerData *trigdata;
	Node	   *parsetree;
	GuardedRel	g;
	bool		is_index;

	if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function %s can only be called as an event trigger",
						"idem_ddl_guard")));
	trigdata = (EventTriggerData *) fcinfo->context;
	parsetree = trigdata->parsetree;

	if (creating_extension || IsBinaryUpgrade)
		PG_RETURN_VOID();
	if (OidIsValid(get_extension_oid("citus", true)))
	{
		/*
		 * The Citus mode: a shard of a partition of keys dropped on a worker
		 * leaves the tombstones of its rows first (tombstone_write.c), whoever
		 * drops it and whatever idempotency.ddl_guard says
		 */
		if (IsA(parsetree, DropStmt))
			IdemCitusDrop((DropStmt *) parsetree);
		PG_RETURN_VOID();
	}
	if (own_ddl_depth > 0)
		PG_RETURN_VOID();
	if (!idem_ddl_guard_on)
	{
		/* a repair by hand: nothing refused, what it may bring counted */
		if (IsA(parsetree, AlterTableStmt))
			IdemAlterForget((AlterTableStmt *) parsetree);
		PG_RETURN_VOID();
	}

	switch (nodeTag(parsetree))
	{
		case T_AlterTableStmt:
			IdemCheckAlterTable(trigdata, (AlterTableStmt *) parsetree);
			IdemAlterForget((AlterTableStmt *) parsetree);
			break;
		case T_CreateTrigStmt:
			if (IdemGuardedRangeVar(((CreateTrigStmt *) parsetree)->relation, &g))
				IdemRefuse(trigdata, &g, NULL);
			break;
		case T_RuleStmt:
			if (IdemGuardedRangeVar(((RuleStmt *) parsetree)->relation, &g))
				IdemRefuse(trigdata, &g, NULL);
			break;
		case T_CreatePolicyStmt:
			if (IdemGuardedRangeVar(((CreatePolicyStmt *) parsetree)->table, &g))
				IdemRefuse(trigdata, &g, NULL);
			break;
		case T_AlterPolicyStmt:
			if (IdemGuardedRangeVar(((AlterPolicyStmt *) parsetree)->table, &g))
				IdemRefuse(trigdata, &g, NULL);
			break;
		case T_RenameStmt:
			{
				RenameStmt *stmt = (RenameStmt *) parsetree;

				if (stmt->relation != NULL &&
					IdemGuardedTableOf(stmt->relation, &g, &is_index))
					IdemRefuse(trigdata, &g, "a rename");
				break;
			}
		case T_AlterObjectSchemaStmt:
			{
				AlterObjectSchemaStmt *stmt = (AlterObjectSchemaStmt *) parsetree;

				if (stmt->relation != NULL &&
					IdemGuardedRangeVar(stmt->relation, &g))
					IdemRefuse(trigdata, &g, "SET SCHEMA");
				break;
			}
		case T_DropStmt:
			IdemCheckDrop(trigdata, (DropStmt *) parsetree);
			break;
		case T_CreateStmt:
			IdemCheckCreate(trigdata, (CreateStmt *) parsetree);
			break;
		case T_IndexStmt:
			/* a partitioned index: pg_restore would meet each part twice */
			if (IdemGuardedRangeVar(((IndexStmt *) parsetree)->relation, &g) &&
				g.is_root)
				IdemRefuse(trigdata, &g, "CREATE INDEX on the partitioned table");
			break;
		default:
			break;
	}
	PG_RETURN_VOID();
}
