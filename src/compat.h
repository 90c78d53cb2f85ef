/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  The differences between the PostgreSQL major versions the extension
 *	  supports (15 to 18), in one place.  The code calls the wrappers below
 *	  wherever a server API changed; each maps to the call of the version it
 *	  is compiled against.
 *
 *	  16: varlena access macros moved to varatt.h; pg_class_ownercheck and
 *	      pg_proc_aclcheck gave way to object_ownercheck and
 *	      object_aclcheck; JSON semantic action callbacks return a
 *	      JsonParseErrorType; build_attrmap_by_name_if_req gained missing_ok;
 *	      ExecInsertIndexTuples gained onlySummarizing; GUC check hooks
 *	      allocate with guc_malloc and free with guc_free (malloc and free
 *	      before).
 *	  17: makeJsonLexContext takes the context to initialize (NULL: a new
 *	      one is allocated) as its first argument.
 *	  18: index_beginscan takes an IndexScanInstrumentation (NULL: none);
 *	      the postmaster's list of registered background workers is a
 *	      dlist (an slist before).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_COMPAT_H
#define IDEM_COMPAT_H

#include "postgres.h"

#if PG_VERSION_NUM < 150000
#error "idempotency requires PostgreSQL 15 or later"
#endif

#if PG_VERSION_NUM >= 160000
#include "varatt.h"
#endif

/* callers include utils/acl.h and catalog/pg_class.h */
#if PG_VERSION_NUM >= 160000
#define IdemRelationOwnerCheck(relid, roleid) \
	object_ownercheck(RelationRelationId, (relid), (roleid))
#else
#define IdemRelationOwnerCheck(relid, roleid) \
	pg_class_ownercheck((relid), (roleid))
#endif

/* whether roleid may execute function funcid (callers include utils/acl.h) */
#if PG_VERSION_NUM >= 160000
#define IdemProcExecuteAllowed(funcid, roleid) \
	(object_aclcheck(ProcedureRelationId, (funcid), (roleid), ACL_EXECUTE) == ACLCHECK_OK)
#else
#define IdemProcExecuteAllowed(funcid, roleid) \
	(pg_proc_aclcheck((funcid), (roleid), ACL_EXECUTE) == ACLCHECK_OK)
#endif

/*
 * The memory of a string GUC's value or extra, as the GUC machinery frees
 * it (check hooks must allocate with this); callers include utils/guc.h.
 */
#if PG_VERSION_NUM >= 160000
#define IdemGucAlloc(size)	guc_malloc(LOG, (size))
#define IdemGucFree(ptr)	guc_free(ptr)
#else
#define IdemGucAlloc(size)	malloc(size)
#define IdemGucFree(ptr)	free(ptr)
#endif

/*
 * The result type of a JsonSemAction callback, and what one returns when it
 * has nothing to report (errors are raised with ereport).
 */
#if PG_VERSION_NUM >= 160000
#define IdemJsonSemResult JsonParseErrorType
#define IDEM_JSON_SEM_OK JSON_SUCCESS
#else
#define IdemJsonSemResult void
#define IDEM_JSON_SEM_OK
#endif

#if PG_VERSION_NUM >= 170000
#define IdemMakeJsonLexContext(json, need_escapes) \
	makeJsonLexContext(NULL, (json), (need_escapes))
#else
#define IdemMakeJsonLexContext(json, need_escapes) \
	makeJsonLexContext((json), (need_escapes))
#endif

/* a map between two descriptors; NULL when they match */
#if PG_VERSION_NUM >= 160000
#define IdemAttrMapIfReq(indesc, outdesc) \
	build_attrmap_by_name_if_req((indesc), (outdesc), false)
#else
#define IdemAttrMapIfReq(indesc, outdesc) \
	build_attrmap_by_name_if_req((indesc), (outdesc))
#endif

/* entries for a new tuple in every index of a result relation */
#if PG_VERSION_NUM >= 160000
#define IdemInsertIndexTuples(rri, slot, estate) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, false, NULL, NIL, false)
#else
#define IdemInsertIndexTuples(rri, slot, estate) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, false, NULL, NIL)
#endif

#if PG_VERSION_NUM >= 180000
#define IdemIndexBeginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys))
#else
#define IdemIndexBeginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), (norderbys))
#endif

/* the local transaction id of this backend's transaction */
#if PG_VERSION_NUM >= 170000
#define IDEM_MY_LXID (MyProc->vxid.lxid)
#else
#define IDEM_MY_LXID (MyProc->lxid)
#endif

/*
 * The number of background workers registered so far (the postmaster's
 * list; callers include postmaster/bgworker_internals.h), which a
 * registration refused for want of max_worker_processes leaves unchanged.
 */
#include "lib/ilist.h"

#if PG_VERSION_NUM >= 180000
static inline int
IdemBgWorkerListCount(dlist_head *head)
{
	dlist_iter	iter;
	int			n = 0;

	dlist_foreach(iter, head)
		n++;
	return n;
}
#else
static inline int
IdemBgWorkerListCount(slist_head *head)
{
	slist_iter	iter;
	int			n = 0;

	slist_foreach(iter, head)
		n++;
	return n;
}
#endif

#define IdemRegisteredBgWorkers() IdemBgWorkerListCount(&BackgroundWorkerList)

#endif							/* IDEM_COMPAT_H */
