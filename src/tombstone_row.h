/*-------------------------------------------------------------------------
 *
 * tombstone_row.h
 *	  The rows of idempotency.tombstones: a tombstone of its own, or a run
 *	  of many (doc/tombstones.md, "How tombstones are stored").
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TOMBSTONE_ROW_H
#define IDEM_TOMBSTONE_ROW_H

#include "c.h"

/* bytes of a tombstone's scope_hash: the first bytes of a SHA-256 */
#define IDEM_TOMBSTONE_HASH_LEN		16

/*
 * A run: one row that stands for many tombstones of one bucket of hashes,
 * written when maintenance drops a partition of keys that leaves at least
 * IDEM_TOMBSTONE_RUN_MIN of them.  Its scope_hash is the bucket: one byte
 * that says how many bits (IDEM_TOMBROW_MIN_BITS to IDEM_TOMBROW_MAX_BITS,
 * in steps of IDEM_TOMBROW_MIN_BITS), then the first that many bits of its
 * entries' hashes, the rest of the last byte zero; never as long as a
 * hash, so that buckets of every width are looked up by equality, as a
 * hash is.  Its fingerprint holds the entries, sorted by hash, each
 * IDEM_TOMBSTONE_RUN_ENTRY bytes: the hash, the fingerprint (a SHA-256),
 * and two offsets in seconds (big-endian) back from the row's expired_at
 * and expires_at to the entry's.
 */
#define IDEM_TOMBSTONE_RUN_MIN		1024
#define IDEM_TOMBSTONE_FP_LEN		32
#define IDEM_TOMBSTONE_RUN_ENTRY	(IDEM_TOMBSTONE_HASH_LEN + IDEM_TOMBSTONE_FP_LEN + 8)
#define IDEM_TOMBROW_MIN_BITS		4
#define IDEM_TOMBROW_MAX_BITS		24
/* the longest bucket: its byte of width and 24 bits */
#define IDEM_TOMBROW_BUCKET_MAX		4

/* The bucket of hash at bits bits into out; returns its length. */
extern int	IdemTombRowBucket(const uint8 *hash, int bits, uint8 *out);

/*
 * The hashes a row stands for: for a run, its entries (*stride bytes
 * apart, the hash first in each); for any other row, its scope_hash alone.
 * Returns how many (0 for a row that names no hash).
 */
extern int	IdemTombRowHashes(bytea *scope_hash, bytea *fingerprint,
							  const uint8 **first, int *stride);

#endif							/* IDEM_TOMBSTONE_ROW_H */
