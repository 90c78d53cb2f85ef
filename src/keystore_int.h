/*-------------------------------------------------------------------------
 *
 * keystore_int.h
 *	  What the files of the key store share, and no other module includes:
 *	  the cached description of idempotency.keys and of its partitions
 *	  (keystore_rel.c), and the row codec (keystore_direct.c).  The key
 *	  store's interface is keystore.h.
 *
 *	  The files are one unit split by concern: their calls to each other
 *	  are hidden in the library, so that they cost what calls within one
 *	  file cost (PostgreSQL 15 builds modules without -fvisibility=hidden,
 *	  and every other call of a function of the library goes through its
 *	  procedure linkage table).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEYSTORE_INT_H
#define IDEM_KEYSTORE_INT_H

#include "access/attmap.h"
#include "partitioning/partdesc.h"
#include "utils/relcache.h"

#include "keystore.h"

#ifdef __GNUC__
#define IDEM_KEYSTORE_PRIVATE __attribute__((visibility("hidden")))
#else
#define IDEM_KEYSTORE_PRIVATE
#endif

/* ----------------------------------------------------------------
 *		keystore_rel.c: where a scope's rows live
 * ----------------------------------------------------------------
 */

/*
 * idempotency.keys (the parent), in whose column numbers rows are read and
 * written, as IdemKeysRelid caches it; idem_keys_generation moves on each
 * time the description is forgotten.
 */
extern IDEM_KEYSTORE_PRIVATE Oid idem_keys_relid;
extern IDEM_KEYSTORE_PRIVATE TupleDesc idem_keys_desc;
extern IDEM_KEYSTORE_PRIVATE uint64 idem_keys_generation;

extern IDEM_KEYSTORE_PRIVATE Oid IdemKeysRelid(void);

/*
 * The relation that holds the rows of scope: idempotency.keys, or in the
 * Citus mode the tenant's shard on this node (locked against shard moves,
 * refused with IK421 when it is elsewhere).  Every read and write of a
 * scope's rows opens or names the relation this returns.
 */
extern IDEM_KEYSTORE_PRIVATE Oid IdemKeystoreRelation(const IdemScope *scope);

/*
 * Column numbers in idempotency.keys: of a column by name, of
 * request_digest (InvalidAttrNumber under a schema of 0.2.0, which lacks
 * it), and of n columns at once, unless *generation says they are those of
 * the current description already.
 */
extern IDEM_KEYSTORE_PRIVATE AttrNumber IdemKeysAttnum(const char *column);
extern IDEM_KEYSTORE_PRIVATE AttrNumber IdemDigestAttnum(void);

static inline void
IdemKeysAttnums(const char *const *names, int n, AttrNumber *attnums,
				uint64 *generation)
{
	(void) IdemKeysRelid();
	if (*generation == idem_keys_generation)
		return;
	/* first: a description forgotten meanwhile makes the next call redo it */
	*generation = idem_keys_generation;
	for (int i = 0; i < n; i++)
		attnums[i] = IdemKeysAttnum(names[i]);
}

/*
 * What a probe or an insert needs of a partition, cached per backend and
 * forgotten at any relcache invalidation of the partition;
 * idem_probe_generation moves at every forgetting.
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

extern IDEM_KEYSTORE_PRIVATE uint64 idem_probe_generation;

/*
 * The probe of a partition the caller has locked; part is the partition
 * when the caller has it open, else NULL.
 */
extern IDEM_KEYSTORE_PRIVATE PartitionProbe *IdemGetProbe(Oid partoid,
														  Relation part);

/*
 * Index, in the partition descriptor, of the partition that covers ts (the
 * default partition where none does); -1 when there is none at all.
 */
extern IDEM_KEYSTORE_PRIVATE int IdemPartitionFor(Relation parent,
												  PartitionDesc pd,
												  TimestampTz ts);

/* ----------------------------------------------------------------
 *		keystore_direct.c: the row codec
 * ----------------------------------------------------------------
 */

/*
 * The columns a read takes, in this order (SQL's, and keystore_direct.c's
 * row_columns).
 */
#define IDEM_ROW_COLUMNS \
	"fingerprint, state, lease_token, locked_until, response_status," \
	" response_headers, body_kind, body_encrypted, response_body, body_ref," \
	" created_at, expires_at, completed_at"
#define IDEM_NUM_ROW_COLUMNS 13

/* Take one row of the scope (values in that order) into row. */
extern IDEM_KEYSTORE_PRIVATE void IdemTakeRow(IdemKeyRow *row, const Datum *v,
											  const bool *n, TimestampTz now,
											  MemoryContext cxt);

/* Fill the six response parameters of the statements that complete a row. */
extern IDEM_KEYSTORE_PRIVATE void IdemResponseValues(const IdemResponse *resp,
													 Datum *values,
													 char *nulls);

#endif							/* IDEM_KEYSTORE_INT_H */
