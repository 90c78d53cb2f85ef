/*-------------------------------------------------------------------------
 *
 * util.h
 *	  Declarations shared by every module of the idempotency extension:
 *	  the extension's own SQLSTATEs, and the helpers of util.c (the preload
 *	  check, subtransactions, acting as another role).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_UTIL_H
#define IDEM_UTIL_H

/* the longest tenant and endpoint */
#define IDEM_SCOPE_MAX_LEN		255

#include "postgres.h"

#include "access/htup.h"
#include "datatype/timestamp.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "nodes/pg_list.h"
#include "storage/lockdefs.h"
#include "utils/inval.h"
#include "utils/relcache.h"

/*
 * SQLSTATEs of the extension's own, in class "IK" (idempotency key).  The
 * last three characters are the HTTP status an application should answer
 * with, so that the mapping is mechanical.  doc/reference.md lists them.
 */
#define ERRCODE_IDEM_INVALID_KEY			MAKE_SQLSTATE('I','K','4','0','0')
#define ERRCODE_IDEM_WRONG_TENANT			MAKE_SQLSTATE('I','K','4','0','1')
#define ERRCODE_IDEM_LEASE_MISMATCH			MAKE_SQLSTATE('I','K','4','0','3')
#define ERRCODE_IDEM_KEY_NOT_FOUND			MAKE_SQLSTATE('I','K','4','0','4')
#define ERRCODE_IDEM_INVALID_STATE			MAKE_SQLSTATE('I','K','4','0','9')
#define ERRCODE_IDEM_RESPONSE_TOO_LARGE		MAKE_SQLSTATE('I','K','4','1','3')
#define ERRCODE_IDEM_SHARD_NOT_LOCAL		MAKE_SQLSTATE('I','K','4','2','1')
#define ERRCODE_IDEM_TOO_MANY_CLAIMS		MAKE_SQLSTATE('I','K','4','2','9')
#define ERRCODE_IDEM_UNFINISHED_CLAIM		MAKE_SQLSTATE('I','K','5','0','0')
#define ERRCODE_IDEM_DECRYPTION_FAILED		MAKE_SQLSTATE('I','K','5','0','1')

/*
 * true when the library was loaded through shared_preload_libraries (util.c,
 * set by IdemUtilInit from _PG_init)
 */
extern bool IdemPreloaded;
extern void IdemUtilInit(void);

/* one statement through SPI, checked (util.c) */
extern uint64 IdemSpiExec(const char *sql, int nargs, Oid *argtypes, Datum *args,
						  const char *nulls, bool read_only, int expected);
/* one relcache callback of the extension, calling each module's (util.c) */
extern void IdemRegisterRelcacheCallback(RelcacheCallbackFunction fn);
extern void IdemRequirePreload(const char *feature);

/*
 * Is the database dbid certainly gone (dropped, its drop committed)?  False
 * when it exists, and whenever that cannot be known here (outside a
 * transaction).  For the shared structures that free the entries of
 * dropped databases.  Reads the syscache, so call it without holding an
 * LWLock.
 */
extern bool IdemDatabaseDropped(Oid dbid);

/*
 * Run fn(arg) in a subtransaction.  Returns NULL when it succeeded; when it
 * raised an error, rolls the subtransaction back and returns a copy of the
 * error (the caller logs it, or raises it again with ReThrowError).
 */
extern ErrorData *IdemRunInSubtransaction(void (*fn) (void *arg), void *arg);

/* A character of an HTTP token (RFC 9110): method and header names. */
static inline bool
IdemIsTokenChar(unsigned char c)
{
	if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		(c >= '0' && c <= '9'))
		return true;
	return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/*
 * Raise 25006 (read_only_sql_transaction) when the transaction is
 * read-only: every function that writes key rows calls it first.
 */
extern void IdemRequireReadWrite(FunctionCallInfo fcinfo);

/*
 * Raise unless the function was called by the trigger manager (a trigger
 * function called in SQL), for a table of the extension: idempotency.table,
 * a partition of it, or in the Citus mode a shard of either (table_N); any
 * table of the schema idempotency when table is NULL.  Firing a trigger
 * checks no privilege: a trigger function attached to another table, whose
 * columns have the names it reads and other types, would read them as what
 * they are not.
 */
extern void IdemRequireTriggerCall(FunctionCallInfo fcinfo, const char *funcname,
								   const char *table);

/*
 * The number of column name of rel, the table a trigger of funcname fired
 * on, which must be of type typid (raises otherwise); 0 when rel has no such
 * column, unless required, which raises.
 */
extern AttrNumber IdemTriggerColumn(Relation rel, const char *name, Oid typid,
									bool required, const char *funcname);

/*
 * The new row of a BEFORE INSERT OR UPDATE ... FOR EACH ROW trigger on
 * idempotency.table (as IdemRequireTriggerCall), and in *rel the relation
 * it is written into; raise when funcname was called otherwise.
 */
extern HeapTuple IdemBeforeRowTriggerTuple(FunctionCallInfo fcinfo,
										   const char *funcname,
										   const char *table,
										   Relation *rel);

/*
 * The root of the partition tree rel belongs to (rel itself when it is no
 * partition).  For row triggers: remembers the last relation asked about,
 * since a statement writes many rows into few partitions.
 */
extern Oid	IdemPartitionRoot(Relation rel);

/*
 * Whether partoid is a dated partition of the partitioned table root: a
 * partition of root itself, other than its default one.  Anything else (the
 * default partition, a partition of a partition) may hold rows of any date.
 */
extern bool IdemDatedPartition(Oid root, Oid partoid);

/*
 * Call fn on every row version of the table relid (committed, in progress,
 * prepared or dead: SnapshotAny), which it locks in ACCESS SHARE; returns
 * how many.  For the learning of what shared memory keeps of a table, where
 * a row too many is harmless and a row missed is not.
 */
extern int64 IdemScanRowVersions(Oid relid,
								 void (*fn) (TupleTableSlot *slot, void *arg),
								 void *arg);

/*
 * Whether a transaction other than this one holds (or awaits) a lock of
 * relid that conflicts with mode.
 */
extern bool IdemLockConflicts(Oid relid, LOCKMODE mode);

/*
 * Whether what shared memory learned of the partition tree relids (its
 * root first, then every member: find_all_inheritors) may be taken as
 * complete: no other transaction is attaching a partition to the root (a
 * lock conflicting with SHARE UPDATE EXCLUSIVE) nor changing a member's
 * triggers (a lock conflicting with ROW EXCLUSIVE), and the row trigger
 * tgname, which keeps that memory, fires always on every table of the tree
 * (present and enabled ALWAYS, as the extension makes it): rows written
 * while it is disabled pass no trigger, nor rows a replication apply
 * writes while it fires for ordinary sessions only (ENABLE TRIGGER ALL).
 */
extern bool IdemLearnedTreeComplete(List *relids, const char *tgname);

/*
 * Act as role (with SECURITY_LOCAL_USERID_CHANGE and extra_sec_context
 * added to the security context) until IdemRestoreUser; an error in
 * between is undone by the (sub)transaction's abort.  Every change of the
 * current user in the extension goes through these two.
 */
typedef struct IdemUserSwitch
{
	Oid			save_userid;
	int			save_sec_context;
} IdemUserSwitch;

extern void IdemSwitchUser(IdemUserSwitch *sw, Oid role, int extra_sec_context);
extern void IdemRestoreUser(const IdemUserSwitch *sw);

/*
 * The extension's own SQL (SPI) runs as the owner of its tables, with the
 * search_path pinned to pg_catalog, pg_temp, whoever called: clients need
 * no rights on the tables, and no object of theirs can stand in for a
 * built-in one.  The functions themselves are not SECURITY DEFINER (that
 * cost every call a user and GUC switch); only these sections are.  An
 * error inside one is undone by the (sub)transaction's abort.
 */
typedef struct IdemOwnerSection
{
	IdemUserSwitch user;
	int			guc_nestlevel;
} IdemOwnerSection;

extern void IdemBeginOwnerSection(IdemOwnerSection *section, Oid owner,
								  int extra_sec_context);
extern void IdemEndOwnerSection(IdemOwnerSection *section);

/* the owner of the extension's tables (of idempotency.keys): whom they run as */
extern Oid	IdemExtensionOwner(void);

#endif							/* IDEM_UTIL_H */
