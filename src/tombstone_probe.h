/*-------------------------------------------------------------------------
 *
 * tombstone_probe.h
 *	  Tombstones of expired keys (idempotency.tombstones): what is kept of
 *	  a key once its row is gone, so that a claim can still refuse the key
 *	  with another payload.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TOMBSTONE_PROBE_H
#define IDEM_TOMBSTONE_PROBE_H

#include "datatype/timestamp.h"

#include "endpoint.h"
#include "scope.h"
#include "tombstone_row.h"

/*
 * Whether claims of the endpoint honour tombstones (never in a schema
 * older than 0.3.0, which has no table of them, nor in the Citus mode
 * while idempotency.tombstones is not distributed).
 */
extern bool IdemTombstonesActive(void);
extern bool IdemTombstonesOn(const IdemEndpointPolicy *policy);

/*
 * The latest tombstone of a scope not yet expired at now (latest by the
 * expiry of the key it stands for): true, with its fingerprint (in cxt)
 * and the key's expiry; false when there is none.  Reads with the latest
 * snapshot and takes no predicate lock.
 */
extern bool IdemTombstoneFind(const IdemScope *scope, TimestampTz now,
							  bytea **fingerprint, TimestampTz *expired_at,
							  MemoryContext cxt);

/*
 * The keyed hash of a scope under which its tombstone is kept (the first
 * IDEM_TOMBSTONE_HASH_LEN bytes of idem_tombstone_hash's), into out.
 */
extern void IdemTombstoneHash(const text *tenant, const text *endpoint,
							  const text *key,
							  uint8 out[IDEM_TOMBSTONE_HASH_LEN]);

/* idempotency.tombstones (an error where it does not exist) */
extern Oid	IdemTombstoneRelid(void);

/* In the Citus mode, whether tombstones are distributed (and so kept). */
extern bool IdemTombstonesCitus(void);

#endif							/* IDEM_TOMBSTONE_PROBE_H */
