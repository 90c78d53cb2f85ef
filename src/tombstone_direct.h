/*-------------------------------------------------------------------------
 *
 * tombstone_direct.h
 *	  Rows of tombstones (tombstone_row.h) written straight into their
 *	  partitions of idempotency.tombstones, through the table access method
 *	  in batches, instead of an INSERT: what maintenance's drop of a
 *	  partition of keys writes (tombstone_write.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TOMBSTONE_DIRECT_H
#define IDEM_TOMBSTONE_DIRECT_H

#include "datatype/timestamp.h"

typedef struct IdemTombDirect IdemTombDirect;

/*
 * A writer into relid, idempotency.tombstones (locked as an INSERT locks it), in
 * the current memory context; NULL when the table is not as the extension
 * made it (partitioned by range of expires_at alone, every partition a
 * table, no trigger but tombstones_filter), for which an INSERT must be
 * used instead.
 */
extern IdemTombDirect *IdemTombDirectBegin(Oid relid);

/*
 * One row: into the partition that covers expires (or the default one),
 * its hashes added to that partition's filter first, as the trigger
 * tombstones_filter does for an INSERT; written with the rows that follow
 * it into the same partition, by IdemTombDirectEnd at the latest.
 */
extern void IdemTombDirectAdd(IdemTombDirect *d, const uint8 *scope_hash,
							  int hlen, const uint8 *fp, int fplen,
							  TimestampTz expired, TimestampTz expires);

/* Writes the rows held and closes everything; later reads see the rows. */
extern void IdemTombDirectEnd(IdemTombDirect *d);

#endif							/* IDEM_TOMBSTONE_DIRECT_H */
