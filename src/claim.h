/*-------------------------------------------------------------------------
 *
 * claim.h
 *	  The claim/finish protocol on idempotency.keys.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CLAIM_H
#define IDEM_CLAIM_H

#include "storage/lock.h"

/*
 * The extension's own lock spaces: advisory locktags whose fourth field is
 * one of these values, which pg_advisory_lock() never uses (it uses 1 and
 * 2), so the extension's locks cannot collide with the application's.  In
 * pg_locks they show as locktype advisory with objsubid 18756 or 18757.
 */
#define IDEM_LOCK_SPACE_SCOPE		0x4944	/* one (tenant, endpoint, key) */
#define IDEM_LOCK_SPACE_MAINTENANCE 0x4945	/* one maintenance pass */

extern void IdemClaimInit(void);

/* The lock tag of one scope (a hash of tenant, endpoint and key). */
extern void IdemScopeLockTag(LOCKTAG *tag, const text *tenant,
							 const text *endpoint, const text *key);

#endif							/* IDEM_CLAIM_H */
