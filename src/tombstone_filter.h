/*-------------------------------------------------------------------------
 *
 * tombstone_filter.h
 *	  Membership filters of tombstone partitions, in shared memory: a claim
 *	  opens a partition of idempotency.tombstones only when its filter says
 *	  the scope may be there.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TOMBSTONE_FILTER_H
#define IDEM_TOMBSTONE_FILTER_H

#include "c.h"

#include "nodes/pg_list.h"

/* what the filters hash: a tombstone's scope_hash */
#define IDEM_TOMBFILTER_HASH_LEN	16

/*
 * With shared_preload_libraries: its shared memory, requested and set up by
 * the extension's one request hook and one startup hook (shmem.c).
 */
extern void IdemTombFilterShmemRequest(void);
extern void IdemTombFilterShmemStartup(void);

/*
 * Of the n partitions partoids of the tombstones table parent, set skip[i]
 * for each that holds no tombstone of hash: its filter says so.  Sets none
 * whenever the filters are not known (not preloaded, not learned since the
 * server started, in recovery), nor for a partition whose filter missed a
 * tombstone (no room for its entry or its bits) until it is learned again.
 */
extern void IdemTombFilterSkip(Oid parent, const Oid *partoids, int n,
							   const uint8 *hash, bool *skip);

/* Before a tombstone of hash is written into partition partoid of parent. */
extern void IdemTombFilterAdd(Oid parent, Oid partoid, const uint8 *hash);

/*
 * Before a row of tombstones (tombstone_row.h: one, or a run) is written
 * into partition partoid of parent, other than by an INSERT (whose trigger
 * tombstones_filter calls it): every hash it stands for.
 */
extern void IdemTombFilterAddRowHashes(Oid parent, Oid partoid,
									   bytea *scope_hash, bytea *fingerprint);

extern void IdemTombFilterDropped(Oid parent, Oid partoid);

/*
 * From the DDL guard, once a command that may bring tombstones no trigger
 * saw into the tombstones table parent holds its lock (ATTACH PARTITION, a
 * trigger disabled or enabled): the database counts a miss, so that its
 * partitions without an entry answer "maybe", and the entries of partoids
 * (NIL: of every partition) are no longer complete, until maintenance has
 * read them again (IdemTombFilterLearn).
 */
extern void IdemTombFilterForget(Oid parent, List *partoids);

#endif							/* IDEM_TOMBSTONE_FILTER_H */
