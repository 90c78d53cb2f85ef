/*-------------------------------------------------------------------------
 *
 * scope.h
 *	  The scope of an idempotency key, (tenant, endpoint, key): read from a
 *	  call's arguments and validated, and its lock in the extension's own
 *	  lock space.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_SCOPE_H
#define IDEM_SCOPE_H

#include "fmgr.h"
#include "datatype/timestamp.h"
#include "storage/lock.h"

/*
 * The extension's lock space for scopes: advisory locktags whose fourth
 * field is this value, which pg_advisory_lock() never uses (it uses 1 and
 * 2), so that the extension's locks cannot collide with the application's.
 * In pg_locks they show as locktype advisory with objsubid 18756.  (A
 * maintenance pass has a lock space of its own, in maint.h.)
 */
#define IDEM_LOCK_SPACE_SCOPE		0x4944

/* The arguments every key function takes, validated. */
typedef struct IdemScope
{
	text	   *tenant;
	text	   *endpoint;
	text	   *key;
	char	   *endpoint_str;
} IdemScope;

/*
 * Read arguments 0 to 2 (tenant, endpoint, key) and validate them, key
 * first, so that nothing is locked or read for a malformed request;
 * count_invalid counts a malformed key in the endpoint's statistics.
 */
extern void IdemGetScope(FunctionCallInfo fcinfo, IdemScope *scope,
						 bool count_invalid);

/*
 * With shared_preload_libraries: its shared memory (the secret of the lock
 * tags), requested and set up by the extension's one request hook and one
 * startup hook (shmem.c).
 */
extern void IdemScopeShmemRequest(void);
extern void IdemScopeShmemStartup(void);

/*
 * The lock tag of one scope: a keyed hash of tenant, endpoint and key
 * (scope.c), which no role can compute from a guess.  Without
 * shared_preload_libraries, the first call of a backend reads the key as
 * the extension's owner.
 */
extern void IdemScopeLockTag(LOCKTAG *tag, const text *tenant,
							 const text *endpoint, const text *key);

/*
 * Take the scope lock for the current (sub)transaction, waiting until
 * deadline at most; *waited tells whether it had to wait.  False when the
 * lock was not granted in time.
 */
extern bool IdemAcquireScopeLock(const LOCKTAG *tag, TimestampTz deadline,
								 bool *waited);
extern void IdemReleaseScopeLock(const LOCKTAG *tag);

#endif							/* IDEM_SCOPE_H */
