/*-------------------------------------------------------------------------
 *
 * keystore.h
 *	  Storage of key rows in idempotency.keys: the only code that knows
 *	  where and how they are stored (keystore.c, keystore_rel.c,
 *	  keystore_direct.c; what they share is in keystore_int.h).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEYSTORE_H
#define IDEM_KEYSTORE_H

#include "datatype/timestamp.h"
#include "nodes/pg_list.h"
#include "storage/itemptr.h"
#include "utils/snapshot.h"

#include "response.h"
#include "scope.h"

/* keys.state */
typedef enum IdemState
{
	IDEM_STATE_IN_PROGRESS,
	IDEM_STATE_COMPLETED,
	IDEM_STATE_FAILED,
	IDEM_STATE_UNKNOWN
} IdemState;

extern const char *IdemStateName(IdemState state);

/* The live row of a scope, as read by IdemKeystoreRead or IdemKeystoreLock. */
typedef struct IdemKeyRow
{
	bool		found;			/* a live row exists */
	bool		has_expired;	/* expired rows of the scope exist */
	bytea	   *expired_fingerprint;	/* of the latest expired row read */
	TimestampTz expired_at;		/* its expires_at */
	bytea	   *fingerprint;
	IdemState	state;
	bool		has_token;
	int64		lease_token;
	bool		has_locked_until;
	TimestampTz locked_until;
	IdemResponse resp;
	TimestampTz created_at;
	TimestampTz expires_at;
	bool		has_completed_at;
	TimestampTz completed_at;
	bytea	   *request_digest; /* NULL: none kept */
	/* where the row is, when a probe found it (else partoid is invalid) */
	Oid			partoid;
	ItemPointerData tid;
} IdemKeyRow;

/* A new row: what IdemKeystoreInsert writes. */
typedef struct IdemNewKeyRow
{
	TimestampTz created_at;
	const bytea *fingerprint;
	IdemState	state;
	const int64 *lease_token;	/* NULL: none */
	const TimestampTz *locked_until;	/* NULL: none */
	const IdemResponse *resp;	/* NULL: none */
	const char *fail_reason;	/* NULL: none */
	const TimestampTz *completed_at;	/* NULL: none */
	TimestampTz expires_at;
	const bytea *request_digest;	/* NULL: none */
} IdemNewKeyRow;

/*
 * Rows of one scope.  Every function reads with the latest snapshot, so
 * that what committed since the transaction's snapshot was taken is seen;
 * the caller holds the scope lock, which orders the writers.  Rows are
 * filled in cxt; a row whose expires_at is at or before now is expired.
 */

/*
 * Read the live row (no row lock), probing the partition covering hint
 * first; for calls that may write (the tables are locked in ROW EXCLUSIVE).
 */
extern void IdemKeystoreRead(const IdemScope *scope, TimestampTz now,
							 TimestampTz hint, IdemKeyRow *row,
							 MemoryContext cxt);

/*
 * IdemKeystoreRead that also reads partitions whose range has ended (not
 * yet dropped), so that the latest expired row of the scope is seen: for
 * endpoints that keep tombstones.
 */
extern void IdemKeystoreReadWithExpired(const IdemScope *scope, TimestampTz now,
										TimestampTz hint, IdemKeyRow *row,
										MemoryContext cxt);

/*
 * IdemKeystoreRead for a call that only reads (idem_lookup): the tables are
 * locked in ACCESS SHARE, not ROW EXCLUSIVE, so that it runs in read-only
 * transactions and on standbys.
 */
extern void IdemKeystorePeek(const IdemScope *scope, TimestampTz now,
							 TimestampTz hint, IdemKeyRow *row,
							 MemoryContext cxt);

/* Read and lock (FOR UPDATE) the live row, for a change of it. */
extern void IdemKeystoreLock(const IdemScope *scope, TimestampTz now,
							 IdemKeyRow *row, MemoryContext cxt);

/* Insert a row into the partition that covers its expiry time. */
extern void IdemKeystoreInsert(const IdemScope *scope,
							   const IdemNewKeyRow *newrow);

/* Delete the scope's expired rows. */
extern void IdemKeystoreDeleteExpired(const IdemScope *scope, TimestampTz now);

/* Changes of a live row read by IdemKeystoreLock. */
extern void IdemKeystoreDelete(const IdemScope *scope, const IdemKeyRow *row,
							   TimestampTz now);
extern void IdemKeystoreComplete(const IdemScope *scope, const IdemKeyRow *row,
								 TimestampTz now, const IdemResponse *resp);
extern void IdemKeystoreFail(const IdemScope *scope, const IdemKeyRow *row,
							 TimestampTz now, IdemState outcome,
							 const char *reason);
extern void IdemKeystoreExtendLease(const IdemScope *scope,
									const IdemKeyRow *row, TimestampTz now,
									TimestampTz until);

/*
 * Maintenance: stale leases (in_progress rows past locked_until and not
 * expired as of a time), expired rows of the default partition.
 */
typedef struct IdemStaleLease
{
	char	   *tenant;
	char	   *endpoint;
	char	   *key;
	bytea	   *fingerprint;
	TimestampTz created_at;
	char	   *relation;		/* qualified name of the table holding it */
} IdemStaleLease;

/*
 * Where this node stands with idempotency.keys: an ordinary table of its
 * own, or a Citus distributed table seen from the coordinator or a worker.
 */
typedef enum IdemKeysNode
{
	IDEM_KEYS_LOCAL,
	IDEM_KEYS_CITUS_COORDINATOR,
	IDEM_KEYS_CITUS_WORKER
} IdemKeysNode;

extern bool IdemKeystoreDistributed(void);
extern IdemKeysNode IdemKeystoreNode(void);

/*
 * Lock the stale leases as of as_of, skipping those locked by their holder
 * right now; returns how many, in *leases (by endpoint, tenant, key).
 */
extern int	IdemKeystoreStaleLeases(TimestampTz as_of, IdemStaleLease **leases);

/* Count the stale leases as of as_of per endpoint (in endpoint order). */
extern int	IdemKeystoreCountStaleLeases(TimestampTz as_of, char ***endpoints,
										 int64 **counts);

/*
 * Settle a stale lease, unless it changed meanwhile (then false): to
 * unknown, to failed with reason, or to completed with resp at as_of.
 */
extern bool IdemKeystoreSettleLease(const IdemStaleLease *lease,
									TimestampTz as_of, IdemState to,
									const char *reason,
									const IdemResponse *resp);

/*
 * Delete the rows of the default partition (in the Citus mode, of each of
 * its local shards) whose expires_at is at most as_of; returns how many.
 */
extern int64 IdemKeystorePurgeDefault(TimestampTz as_of);

/*
 * The table itself; its statements run as its owner, IdemExtensionOwner()
 * (util.h).
 */
extern Oid	IdemKeystoreRelid(void);

/*
 * Citus mode: the shard of idempotency.tombstones on this node colocated
 * with tenant's shard of keys, or InvalidOid.
 */
extern Oid	IdemKeystoreTombstoneShard(const text *tenant);

#endif							/* IDEM_KEYSTORE_H */
