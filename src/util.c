/*-------------------------------------------------------------------------
 *
 * util.c
 *	  Helpers every module of the extension shares: the preload and trigger
 *	  checks, subtransactions that catch an error, and the one way the
 *	  extension acts as another role (IdemSwitchUser, and the owner
 *	  sections built on it, and the owner they act as), and the
 *	  extension's one relcache callback, and whether a database was
 *	  dropped.
 *	  Declared in util.h.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/partition.h"
#include "catalog/pg_class.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "commands/trigger.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "util.h"

bool		IdemPreloaded = false;

/* From _PG_init, first: whether the library is being preloaded. */
void
IdemUtilInit(void)
{
	IdemPreloaded = process_shared_preload_libraries_in_progress;
}

bool
IdemDatabaseDropped(Oid dbid)
{
	if (!OidIsValid(dbid) || dbid == MyDatabaseId || !IsTransactionState())
		return false;
	/* pg_database is shared: any database's backend sees every row */
	return !SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dbid));
}

/*
 * Raise an error naming shared_preload_libraries when a feature that needs
 * shared memory or the background worker is used in a server that did not
 * preload the library.
 */
void
IdemRequirePreload(const char *feature)
{
	if (!IdemPreloaded)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s requires idempotency to be loaded via shared_preload_libraries",
						feature),
				 errhint("Add idempotency to shared_preload_libraries in postgresql.conf and restart the server.")));
}

/*
 * Refuse, as PostgreSQL refuses any write (SQLSTATE 25006), a function that
 * writes key rows when the transaction is read-only (SET TRANSACTION READ
 * ONLY, default_transaction_read_only, a hot standby).  Claims write rows
 * through the table access method, not the executor, which is where
 * PostgreSQL checks this for a statement; so they check it here, before
 * anything else, and a replay is refused too: whether a claim writes is not
 * known before it has read the key (doc/operations.md).
 */
void
IdemRequireReadWrite(FunctionCallInfo fcinfo)
{
	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot execute %s() in a read-only transaction",
						get_func_name(fcinfo->flinfo->fn_oid)),
				 RecoveryInProgress() ?
				 errdetail("The server is a standby: keys are claimed and finished on the primary only.") :
				 errdetail("The function writes the extension's tables, as an INSERT or UPDATE would."),
				 errhint("Read a key without writing it with idem_lookup().")));
}

/*
 * Whether rel is a table of the extension: idempotency.table, a partition
 * of it, or in the Citus mode a shard of either (named table_N); any table
 * of the schema idempotency when table is NULL.  Only the extension's owner
 * (or a superuser) makes tables in that schema.
 */
static bool
IdemIsExtensionTable(Relation rel, const char *table)
{
	Oid			nsp = get_namespace_oid("idempotency", true);
	Oid			root;
	char	   *name;
	size_t		len;

	if (!OidIsValid(nsp) || RelationGetNamespace(rel) != nsp)
		return false;
	if (table == NULL)
		return true;
	root = IdemPartitionRoot(rel);
	if (get_rel_namespace(root) != nsp || (name = get_rel_name(root)) == NULL)
		return false;
	len = strlen(table);
	return strncmp(name, table, len) == 0 &&
		(name[len] == '\0' ||
		 (name[len] == '_' && name[len + 1] >= '0' && name[len + 1] <= '9'));
}

void
IdemRequireTriggerCall(FunctionCallInfo fcinfo, const char *funcname,
					   const char *table)
{
	Relation	rel;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function %s can only be called as a trigger", funcname)));
	rel = ((TriggerData *) fcinfo->context)->tg_relation;
	if (!IdemIsExtensionTable(rel, table))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 table != NULL ?
				 errmsg("function %s can only be a trigger of table idempotency.%s",
						funcname, table) :
				 errmsg("function %s can only be a trigger of a table of the extension idempotency",
						funcname),
				 errdetail("It was fired by trigger \"%s\" of table %s.",
						   ((TriggerData *) fcinfo->context)->tg_trigger->tgname,
						   quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
													  RelationGetRelationName(rel))),
				 errhint("Drop the trigger: the extension's trigger functions read its own tables only.")));
}

AttrNumber
IdemTriggerColumn(Relation rel, const char *name, Oid typid, bool required,
				  const char *funcname)
{
	TupleDesc	desc = RelationGetDescr(rel);

	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped || strcmp(NameStr(att->attname), name) != 0)
			continue;
		if (att->atttypid != typid)
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("column \"%s\" of table \"%s\" is of type %s, not %s",
							name, RelationGetRelationName(rel),
							format_type_be(att->atttypid), format_type_be(typid)),
					 errdetail("Function %s reads the column as %s.",
							   funcname, format_type_be(typid))));
		return att->attnum;
	}
	if (required)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("table \"%s\" has no column \"%s\"",
						RelationGetRelationName(rel), name),
				 errdetail("Function %s reads the column.", funcname)));
	return InvalidAttrNumber;
}

HeapTuple
IdemBeforeRowTriggerTuple(FunctionCallInfo fcinfo, const char *funcname,
						  const char *table, Relation *rel)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	IdemRequireTriggerCall(fcinfo, funcname, table);
	if (!TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!(TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) ||
		  TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event)))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function %s must be fired before insert or update, for each row",
						funcname)));
	*rel = trigdata->tg_relation;
	return TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ?
		trigdata->tg_newtuple : trigdata->tg_trigtuple;
}

Oid
IdemPartitionRoot(Relation rel)
{
	static Oid	last_relid = InvalidOid;
	static Oid	last_root = InvalidOid;

	if (!rel->rd_rel->relispartition)
		return RelationGetRelid(rel);
	/*
	 * A relation's OID names it until it is dropped, and the extension's
	 * partitions are never attached elsewhere (the DDL guard refuses it).
	 */
	if (RelationGetRelid(rel) != last_relid)
	{
		last_relid = InvalidOid;
		last_root = llast_oid(get_partition_ancestors(RelationGetRelid(rel)));
		last_relid = RelationGetRelid(rel);
	}
	return last_root;
}

bool
IdemDatedPartition(Oid root, Oid partoid)
{
	return partoid != root && get_rel_relispartition(partoid) &&
		get_partition_parent(partoid, true) == root &&
		get_default_partition_oid(root) != partoid;
}

int64
IdemScanRowVersions(Oid relid, void (*fn) (TupleTableSlot *slot, void *arg),
					void *arg)
{
	Relation	rel = table_open(relid, AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	TableScanDesc scan = table_beginscan(rel, SnapshotAny, 0, NULL);
	int64		n = 0;

	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		CHECK_FOR_INTERRUPTS();
		fn(slot, arg);
		n++;
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, NoLock);
	return n;
}

ErrorData *
IdemRunInSubtransaction(void (*fn) (void *arg), void *arg)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	ErrorData  *volatile edata = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcxt);
	PG_TRY();
	{
		fn(arg);
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(oldcxt);
	CurrentResourceOwner = oldowner;
	return edata;
}

void
IdemSwitchUser(IdemUserSwitch *sw, Oid role, int extra_sec_context)
{
	GetUserIdAndSecContext(&sw->save_userid, &sw->save_sec_context);
	SetUserIdAndSecContext(role, sw->save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE | extra_sec_context);
}

void
IdemRestoreUser(const IdemUserSwitch *sw)
{
	SetUserIdAndSecContext(sw->save_userid, sw->save_sec_context);
}

void
IdemBeginOwnerSection(IdemOwnerSection *section, Oid owner,
					  int extra_sec_context)
{
	IdemSwitchUser(&section->user, owner, extra_sec_context);
	section->guc_nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);
}

void
IdemEndOwnerSection(IdemOwnerSection *section)
{
	AtEOXact_GUC(true, section->guc_nestlevel);
	IdemRestoreUser(&section->user);
}

/*
 * The owner of idempotency.keys, as the owner sections act: the role the
 * extension's own SQL runs as.  Cached per backend, and forgotten at any
 * relcache invalidation of the table (ALTER TABLE OWNER sends one).
 */
static Oid	owner_relid = InvalidOid;
static Oid	extension_owner = InvalidOid;
static bool owner_callback_registered = false;

static void
IdemOwnerInvalidate(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == owner_relid)
	{
		owner_relid = InvalidOid;
		extension_owner = InvalidOid;
	}
}

Oid
IdemExtensionOwner(void)
{
	if (unlikely(!OidIsValid(extension_owner)))
	{
		Oid			relid;
		HeapTuple	tuple;

		if (!owner_callback_registered)
		{
			IdemRegisterRelcacheCallback(IdemOwnerInvalidate);
			owner_callback_registered = true;
		}
		relid = get_relname_relid("keys", get_namespace_oid("idempotency", false));
		if (!OidIsValid(relid))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_TABLE),
					 errmsg("table idempotency.keys does not exist"),
					 errhint("Run CREATE EXTENSION idempotency.")));
		tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
		if (!HeapTupleIsValid(tuple))
			elog(ERROR, "cache lookup failed for relation %u", relid);
		owner_relid = relid;
		extension_owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
		ReleaseSysCache(tuple);
	}
	return extension_owner;
}

/*
 * Relcache invalidation for every module that caches something about a
 * relation.  A backend has room for only a few relcache callbacks (ten in
 * PostgreSQL 15 to 18), shared with every other library it loads (Citus
 * takes several): the extension registers one, which calls the modules'.
 */
#define IDEM_MAX_RELCACHE_CALLBACKS 8

static RelcacheCallbackFunction idem_relcache_callbacks[IDEM_MAX_RELCACHE_CALLBACKS];
static int	idem_relcache_ncallbacks = 0;

static void
IdemRelcacheCallback(Datum arg, Oid relid)
{
	for (int i = 0; i < idem_relcache_ncallbacks; i++)
		idem_relcache_callbacks[i] ((Datum) 0, relid);
}

void
IdemRegisterRelcacheCallback(RelcacheCallbackFunction fn)
{
	if (idem_relcache_ncallbacks >= IDEM_MAX_RELCACHE_CALLBACKS)
		elog(ERROR, "too many relcache callbacks of idempotency");
	if (idem_relcache_ncallbacks == 0)
		CacheRegisterRelcacheCallback(IdemRelcacheCallback, (Datum) 0);
	idem_relcache_callbacks[idem_relcache_ncallbacks++] = fn;
}

/*
 * Run one statement through SPI, connected for it alone (maintenance's
 * statements, the rarer changes of a row); raises unless SPI answers
 * expected, and returns the rows processed.
 */
uint64
IdemSpiExec(const char *sql, int nargs, Oid *argtypes, Datum *args,
			const char *nulls, bool read_only, int expected)
{
	uint64		processed;
	int			rc;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	rc = SPI_execute_with_args(sql, nargs, argtypes, args, nulls, read_only, 0);
	if (rc != expected)
		elog(ERROR, "statement failed: %s: %s", SPI_result_code_string(rc), sql);
	processed = SPI_processed;
	SPI_finish();
	return processed;
}

bool
IdemLockConflicts(Oid relid, LOCKMODE mode)
{
	LOCKTAG		tag;
	VirtualTransactionId *vxids;
	bool		any;

	SET_LOCKTAG_RELATION(tag, MyDatabaseId, relid);
	vxids = GetLockConflicts(&tag, mode, NULL);
	any = VirtualTransactionIdIsValid(vxids[0]);
	/* in hot standby the array is static; never asked there */
	pfree(vxids);
	return any;
}

/*
 * Whether the row trigger tgname of relid exists and fires always: for
 * ordinary writes and for a replication apply alike, as the extension
 * enables it (ENABLE TRIGGER ALL leaves it firing for ordinary writes only).
 */
static bool
IdemTriggerFires(Relation tgrel, Oid relid, const char *tgname)
{
	ScanKeyData skey[2];
	SysScanDesc scan;
	HeapTuple	tup;
	bool		fires = false;

	ScanKeyInit(&skey[0], Anum_pg_trigger_tgrelid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(relid));
	ScanKeyInit(&skey[1], Anum_pg_trigger_tgname, BTEqualStrategyNumber,
				F_NAMEEQ, CStringGetDatum(tgname));
	scan = systable_beginscan(tgrel, TriggerRelidNameIndexId, true, NULL, 2, skey);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		char		e = ((Form_pg_trigger) GETSTRUCT(tup))->tgenabled;

		fires = e == TRIGGER_FIRES_ALWAYS;
	}
	systable_endscan(scan);
	return fires;
}

bool
IdemLearnedTreeComplete(List *relids, const char *tgname)
{
	Relation	tgrel;
	ListCell   *lc;
	bool		complete = true;

	if (relids == NIL)
		return false;
	if (IdemLockConflicts(linitial_oid(relids), ShareUpdateExclusiveLock))
		return false;
	foreach(lc, relids)
	{
		if (IdemLockConflicts(lfirst_oid(lc), RowExclusiveLock))
			return false;
	}

	/* the catalog as committed now, not as this transaction first read it */
	InvalidateCatalogSnapshot();
	tgrel = table_open(TriggerRelationId, AccessShareLock);
	foreach(lc, relids)
	{
		Oid			relid = lfirst_oid(lc);
		char		kind = get_rel_relkind(relid);

		if ((kind == RELKIND_RELATION || kind == RELKIND_PARTITIONED_TABLE) &&
			!IdemTriggerFires(tgrel, relid, tgname))
		{
			complete = false;
			break;
		}
	}
	table_close(tgrel, AccessShareLock);
	return complete;
}
