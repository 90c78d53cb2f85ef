/*-------------------------------------------------------------------------
 *
 * scope.c
 *	  The scope of an idempotency key, (tenant, endpoint, key): read from a
 *	  call's arguments and validated, and its lock in the extension's own
 *	  lock space, which orders every writer of the scope's row (see
 *	  claim.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"
#include "keys.h"
#include "scope.h"
#include "stats.h"
#include "tenant.h"

void
IdemGetScope(FunctionCallInfo fcinfo, IdemScope *scope, bool count_invalid)
{
	text	   *tenant = PG_ARGISNULL(0) ? NULL : PG_GETARG_TEXT_PP(0);
	text	   *endpoint = PG_ARGISNULL(1) ? NULL : PG_GETARG_TEXT_PP(1);
	text	   *key = PG_ARGISNULL(2) ? NULL : PG_GETARG_TEXT_PP(2);

	if (count_invalid &&
		(key == NULL || !IdemKeyIsValid(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key))))
	{
		bool		endpoint_ok = endpoint != NULL &&
			VARSIZE_ANY_EXHDR(endpoint) > 0 &&
			VARSIZE_ANY_EXHDR(endpoint) <= IDEM_SCOPE_MAX_LEN;

		IdemStatsCount(endpoint_ok ? text_to_cstring(endpoint) : NULL,
					   IDEM_COUNT_INVALID_KEYS);
	}
	IdemCheckKey(key);
	IdemCheckScope(tenant, endpoint);
	IdemCheckTenant(tenant);

	scope->tenant = tenant;
	scope->endpoint = endpoint;
	scope->key = key;
	scope->endpoint_str = text_to_cstring(endpoint);
}

void
IdemScopeLockTag(LOCKTAG *tag, const text *tenant, const text *endpoint,
				 const text *key)
{
	const text *parts[3] = {tenant, endpoint, key};
	uint64		h = 0;
	int			i;

	/* chained so that ("ab", "c") and ("a", "bc") hash differently */
	for (i = 0; i < 3; i++)
	{
		uint32		len = VARSIZE_ANY_EXHDR(parts[i]);

		h = hash_bytes_extended((const unsigned char *) &len, sizeof(len), h);
		h = hash_bytes_extended((const unsigned char *) VARDATA_ANY(parts[i]),
								len, h);
	}
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 IDEM_LOCK_SPACE_SCOPE);
}

/*
 * Scope locks belong to the current (sub)transaction, not to the statement
 * that took them, so that a later statement of the transaction can release
 * them and a rolled-back subtransaction releases its own.
 */
static bool
IdemLockScope(const LOCKTAG *tag, bool dontWait)
{
	ResourceOwner save = CurrentResourceOwner;
	volatile LockAcquireResult res = LOCKACQUIRE_NOT_AVAIL;

	CurrentResourceOwner = CurTransactionResourceOwner;
	PG_TRY();
	{
		res = LockAcquire(tag, ExclusiveLock, false, dontWait);
	}
	PG_FINALLY();
	{
		CurrentResourceOwner = save;
	}
	PG_END_TRY();
	return res != LOCKACQUIRE_NOT_AVAIL;
}

void
IdemReleaseScopeLock(const LOCKTAG *tag)
{
	ResourceOwner save = CurrentResourceOwner;

	CurrentResourceOwner = CurTransactionResourceOwner;
	LockRelease(tag, ExclusiveLock, false);
	CurrentResourceOwner = save;
}

static void
IdemLockScopeWaiting(void *tag)
{
	(void) IdemLockScope((const LOCKTAG *) tag, false);
}

/*
 * Wait at most wait_ms for the scope lock held by a concurrent claim.  The
 * lock manager's own wait is used, bounded by lock_timeout (set for the
 * wait alone, through the GUC machinery), inside a subtransaction so that
 * the timeout error can be caught; the lock then passes to the enclosing
 * (sub)transaction.
 */
static bool
IdemWaitForLock(const LOCKTAG *tag, int64 wait_ms)
{
	char		timeout[32];
	int			nestlevel;
	ErrorData  *edata;

	if (wait_ms <= 0)
		return false;

	snprintf(timeout, sizeof(timeout), "%d", (int) Min(wait_ms, INT_MAX));
	nestlevel = NewGUCNestLevel();
	(void) set_config_option("lock_timeout", timeout,
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);
	edata = IdemRunInSubtransaction(IdemLockScopeWaiting, (void *) tag);
	AtEOXact_GUC(true, nestlevel);
	if (edata == NULL)
		return true;
	if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
		ReThrowError(edata);
	FreeErrorData(edata);
	return false;
}

bool
IdemAcquireScopeLock(const LOCKTAG *tag, TimestampTz deadline, bool *waited)
{
	int64		left_ms;

	*waited = false;
	if (IdemLockScope(tag, true))
		return true;
	*waited = true;
	left_ms = (deadline - GetCurrentTimestamp() + 999) / 1000;
	return IdemWaitForLock(tag, left_ms);
}
