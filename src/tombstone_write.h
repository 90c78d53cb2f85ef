/*-------------------------------------------------------------------------
 *
 * tombstone_write.h
 *	  Tombstones of expired keys (idempotency.tombstones), the writer's
 *	  side: maintenance's statements that make them, and the purge of
 *	  their default partition.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TOMBSTONE_WRITE_H
#define IDEM_TOMBSTONE_WRITE_H

#include "datatype/timestamp.h"
#include "nodes/pg_list.h"
#include "utils/snapshot.h"

/*
 * For maintenance, the tombstones of expired key rows whose endpoint keeps
 * tombstones: of the rows of the partition relid of idempotency.keys
 * expired at as_of (every row of one about to be dropped; returns how many
 * tombstones were written, or with count_only would be), or of the rows of
 * its default partition expired at as_of, deleted in the same statement
 * (returns how many were deleted, *tombstoned how many tombstones were
 * written).
 */
extern int64 IdemTombstonesOfPartition(Oid relid, TimestampTz as_of,
									   bool count_only, Snapshot snapshot,
									   List *tids);
extern int64 IdemTombstonePurgeKeysDefault(TimestampTz as_of,
										   int64 *tombstoned);

/*
 * Citus mode, on a worker, from the DDL guard's event trigger before a DROP
 * TABLE: when relid is a shard of a partition of idempotency.keys placed on
 * this node, lock its parent shard as the drop will, and write the
 * tombstones of its rows into the colocated shard of tombstones.
 */
extern void IdemTombstonesBeforeShardDrop(Oid relid);

/*
 * For maintenance: the distinct tombstone_ttl in use (the setting's and the
 * endpoints'), and the delete of the default partition's rows whose
 * expires_at is at most as_of (returns how many).
 */
extern int	IdemTombstoneTtls(int64 **ttls);
extern int64 IdemTombstonePurgeDefault(TimestampTz as_of);

#endif							/* IDEM_TOMBSTONE_WRITE_H */
