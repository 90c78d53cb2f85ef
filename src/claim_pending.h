/*-------------------------------------------------------------------------
 *
 * claim_pending.h
 *	  The claims of the current transaction that hold their scope lock
 *	  (claim_pending.c), and the (sub)transaction callbacks that end them.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CLAIM_PENDING_H
#define IDEM_CLAIM_PENDING_H

#include "access/xact.h"
#include "datatype/timestamp.h"
#include "storage/lock.h"

#include "compat.h"
#include "scope.h"

/*
 * A claim of this transaction that holds its scope lock: in atomic mode,
 * waiting for its finish (or finished, failed or released in a
 * subtransaction that may still roll back); in lease mode, a row inserted.
 *
 * The list follows subtransactions exactly as the locks do (they belong to
 * the subtransaction that took them, and pass to the parent when it
 * commits): an entry made in a subtransaction that rolls back goes with its
 * lock, and the end of a claim (done_level) is undone when the
 * subtransaction that ended it rolls back, since the row written by the
 * finish (or fail) goes too.  A claim that is pending again must then be
 * finished before COMMIT, which otherwise raises IK500 and so rolls back
 * the business writes of a key without a completion.
 */
typedef struct PendingClaim
{
	struct PendingClaim *next;
	text	   *tenant;
	text	   *endpoint;
	text	   *key;
	bytea	   *fingerprint;
	bytea	   *request_digest; /* NULL: none kept */
	TimestampTz created_at;
	TimestampTz expires_at;
	LOCKTAG		tag;
	int			nest_level;		/* subtransaction whose lock it is */
	int			done_level;		/* 0: pending; else the subtransaction that
								 * ended it (made it, for a lease) */
} PendingClaim;

/* Whether two texts (or byteas) hold the same bytes. */
static inline bool
IdemTextEqual(const text *a, const text *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

/*
 * The pending (unfinished) claim of a scope, or NULL; with link, also where
 * the list points to it (for IdemEndPending).
 */
extern PendingClaim *IdemFindPending(const IdemScope *scope,
									 PendingClaim ***link);

/*
 * Remember a claim that keeps its scope lock until the transaction ends:
 * pending (atomic mode), or ended at once (leased).  Refused with IK429
 * when the transaction already holds idempotency.max_claims_per_transaction
 * of them.
 */
extern void IdemAddPending(const IdemScope *scope, const bytea *fingerprint,
						   const bytea *request_digest, TimestampTz created_at,
						   TimestampTz expires_at, const LOCKTAG *tag,
						   bool leased);

/*
 * End a pending claim (finished, failed or released); with release_lock,
 * also give up its scope lock now where that is safe.
 */
extern void IdemEndPending(PendingClaim **link, bool release_lock);

/* The callbacks that end pending claims, registered by IdemClaimInit. */
extern void IdemPendingXactCallback(XactEvent event, void *arg);
extern void IdemPendingSubXactCallback(SubXactEvent event,
									   SubTransactionId mySubid,
									   SubTransactionId parentSubid,
									   void *arg);

#endif							/* IDEM_CLAIM_PENDING_H */
