/*-------------------------------------------------------------------------
 *
 * tombstone_direct.h
 *	  What maintenance's drop of a partition of keys reads and writes
 *	  (tombstone_write.c), straight through the table access method
 *	  instead of SQL: the partition's rows, and the rows of tombstones
 *	  (tombstone_row.h) written into their partitions of
 *	  idempotency.tombstones in batches.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TOMBSTONE_DIRECT_H
#define IDEM_TOMBSTONE_DIRECT_H

#include "datatype/timestamp.h"
#include "utils/snapshot.h"

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

/* The keyed hash of a scope (tombstone_probe.h), 16 bytes into out. */
typedef void (*IdemTombDirectHash) (const text *tenant, const text *endpoint,
									const text *key, uint8 *out);

/* One tombstone read by IdemTombDirectRead. */
typedef void (*IdemTombDirectEmit) (void *arg, const uint8 *hash, int hlen,
									const uint8 *fp, int fplen,
									TimestampTz expired, TimestampTz expires);

/*
 * The tombstones of the rows of relid, a partition of idempotency.keys,
 * read with snapshot straight from it (a scan of the table, no executor):
 * of each row expired at as_of whose endpoint keeps tombstones
 * (tombstone_ttl, else the setting idempotency.tombstone_ttl, above 0)
 * and whose tombstone still lives at as_of, the keyed hash of its scope
 * (by hash), its fingerprint, its expiry and its tombstone's, passed to emit: what
 * the SQL of tombstone_write.c makes of the same rows.  Returns false,
 * having read nothing, when relid is not a table with those columns.
 * Called within SPI (it reads idempotency.endpoints with snapshot).
 */
extern bool IdemTombDirectRead(Oid relid, TimestampTz as_of, Snapshot snapshot,
							   IdemTombDirectHash hash, IdemTombDirectEmit emit,
							   void *arg);

#endif							/* IDEM_TOMBSTONE_DIRECT_H */
