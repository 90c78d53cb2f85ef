/*-------------------------------------------------------------------------
 *
 * tombstone.h
 *	  Tombstones of expired keys (idempotency.tombstones): what is kept of
 *	  a key once its row is gone, so that a claim can still refuse the key
 *	  with another payload.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TOMBSTONE_H
#define IDEM_TOMBSTONE_H

#include "datatype/timestamp.h"

#include "endpoint.h"
#include "scope.h"

/* bytes of a tombstone's scope_hash: the first bytes of a SHA-256 */
#define IDEM_TOMBSTONE_HASH_LEN		16

/*
 * Whether claims of the endpoint honour tombstones (never in a schema
 * older than 0.3.0, which has no table of them).
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
 * The statements that make tombstones of key rows: a FROM and WHERE clause
 * over source (rows with columns tenant, endpoint, key, fingerprint and
 * expires_at, named s) that keeps the rows whose endpoint keeps tombstones
 * and whose tombstone would still live at $1 (a timestamptz), and the
 * INSERT that goes before it.  The key store (keystore.c) runs them on its
 * rows.
 */
extern char *IdemTombstoneSourceSql(const char *source);

#define IDEM_TOMBSTONE_INSERT_SQL \
	"INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)" \
	" SELECT idempotency.idem_tombstone_hash(s.tenant, s.endpoint, s.key)," \
	" s.fingerprint, s.expires_at, s.expires_at + t.ttl"

/*
 * For maintenance: the table, the longest tombstone_ttl in seconds (the
 * setting's or an endpoint's), and the delete of the default partition's
 * rows whose expires_at is at most as_of (returns how many).
 */
extern Oid	IdemTombstoneRelid(void);
extern bool IdemTombstoneTableExists(void);	/* false before 0.3.0 */
extern int64 IdemTombstoneMaxTtl(void);
extern int64 IdemTombstonePurgeDefault(TimestampTz as_of);

#endif							/* IDEM_TOMBSTONE_H */
