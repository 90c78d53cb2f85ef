/*-------------------------------------------------------------------------
 *
 * scope.c
 *	  The scope of an idempotency key, (tenant, endpoint, key): read from a
 *	  call's arguments and validated, and its lock in the extension's own
 *	  lock space, which orders every writer of the scope's row (see
 *	  claim.c).
 *
 *	  A scope's lock tag is a keyed hash of (tenant, endpoint, key):
 *	  SipHash-2-4 under a secret key, so that a role that reads pg_locks
 *	  (every role may) cannot test a guess of a key in flight by computing
 *	  its tag.  Every backend of the server must compute the same tag for
 *	  the same scope, so the secret is one for the server (the tag holds
 *	  the database too): with shared_preload_libraries, 16 bytes from
 *	  pg_strong_random() kept in the file idempotency_lock.key of the data
 *	  directory, made at the first start and read into shared memory at
 *	  every start: the locks of prepared transactions outlive a restart,
 *	  and a claim of their scope after it must compute the same tag to wait
 *	  for them (a standby made by a base backup copies the file, so a
 *	  promoted standby computes the tags its prepared transactions hold);
 *	  without it, where no
 *	  backend has shared memory of the extension, 16 bytes derived from the
 *	  database's idempotency.diagnostics_secret (HMAC-SHA256 with a label
 *	  of its own), which only the extension's owner reads, read once per
 *	  backend and again when that table changes.  Replacing that secret
 *	  while claims run changes the tags of claims that start afterwards:
 *	  claims of one scope racing across the change would not exclude each
 *	  other, so replace it while no claim runs (doc/diagnostics.md).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "common/file_perm.h"
#include "common/hmac.h"
#include "common/sha2.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "keys.h"
#include "schema.h"
#include "scope.h"
#include "siphash.h"
#include "stats.h"
#include "tenant.h"
#include "util.h"

/* the label of the key derived from a database's diagnostics secret */
#define IDEM_SCOPE_LOCK_LABEL	"idempotency scope lock v1"
#define IDEM_DIAG_SECRET_BYTES	32

/* the server's lock secret, in the data directory (the working directory) */
#define IDEM_SCOPE_KEY_FILE		"idempotency_lock.key"

/* with shared_preload_libraries: the server's secret */
typedef struct IdemScopeShared
{
	uint8		lock_key[IDEM_SIPHASH_KEY_LEN];
} IdemScopeShared;

static IdemScopeShared *scope_shared = NULL;

/* without it: the key derived from the database's secret, and whence */
static uint8 scope_lock_key[IDEM_SIPHASH_KEY_LEN];
static bool scope_lock_key_valid = false;
static Oid	scope_secret_relid = InvalidOid;
static bool scope_callback_registered = false;

/* its part of the shared memory, from shmem.c's request hook */
void
IdemScopeShmemRequest(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(IdemScopeShared)));
}

/*
 * Reads the server's lock secret from IDEM_SCOPE_KEY_FILE into key: true
 * when the file holds one, false when there is no such file.  A file of
 * another size is an error: a secret that changed would let claims of a
 * prepared transaction's scope run past its lock.
 */
static bool
IdemScopeReadKeyFile(uint8 *key)
{
	uint8		buf[IDEM_SIPHASH_KEY_LEN + 1];
	int			fd;
	int			n;

	fd = OpenTransientFile(IDEM_SCOPE_KEY_FILE, O_RDONLY | PG_BINARY);
	if (fd < 0)
	{
		if (errno == ENOENT)
			return false;
		ereport(FATAL,
				(errcode_for_file_access(),
				 errmsg("could not open file \"%s\": %m", IDEM_SCOPE_KEY_FILE)));
	}
	/* one byte more than a secret: a longer file is found out */
	n = read(fd, buf, sizeof(buf));
	if (n < 0)
		ereport(FATAL,
				(errcode_for_file_access(),
				 errmsg("could not read file \"%s\": %m", IDEM_SCOPE_KEY_FILE)));
	CloseTransientFile(fd);
	if (n != IDEM_SIPHASH_KEY_LEN)
		ereport(FATAL,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("file \"%s\" holds %d bytes instead of %d",
						IDEM_SCOPE_KEY_FILE, n, IDEM_SIPHASH_KEY_LEN),
				 errdetail("The file holds the secret of the idempotency extension's scope locks."),
				 errhint("If no prepared transaction holds a claim, remove the file: the next start makes a new secret.")));
	memcpy(key, buf, IDEM_SIPHASH_KEY_LEN);
	explicit_bzero(buf, sizeof(buf));
	return true;
}

/*
 * Makes a new secret and writes it durably: a temporary file, synced, then
 * renamed over IDEM_SCOPE_KEY_FILE (durable_rename syncs the directory).
 */
static void
IdemScopeWriteKeyFile(uint8 *key)
{
	const char *tmp = IDEM_SCOPE_KEY_FILE ".tmp";
	int			fd;

	if (!pg_strong_random(key, IDEM_SIPHASH_KEY_LEN))
		ereport(FATAL,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate the secret of the idempotency scope locks"),
				 errdetail("pg_strong_random() failed.")));
	fd = OpenTransientFilePerm(tmp, O_WRONLY | O_CREAT | O_TRUNC | PG_BINARY,
							   pg_file_create_mode);
	if (fd < 0)
		ereport(FATAL,
				(errcode_for_file_access(),
				 errmsg("could not create file \"%s\": %m", tmp)));
	errno = 0;
	if (write(fd, key, IDEM_SIPHASH_KEY_LEN) != IDEM_SIPHASH_KEY_LEN)
	{
		if (errno == 0)
			errno = ENOSPC;
		ereport(FATAL,
				(errcode_for_file_access(),
				 errmsg("could not write file \"%s\": %m", tmp)));
	}
	if (pg_fsync(fd) != 0)
		ereport(FATAL,
				(errcode_for_file_access(),
				 errmsg("could not fsync file \"%s\": %m", tmp)));
	CloseTransientFile(fd);
	durable_rename(tmp, IDEM_SCOPE_KEY_FILE, FATAL);
}

/* its part of the shared memory, from shmem.c's startup hook */
void
IdemScopeShmemStartup(void)
{
	bool		found;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	scope_shared = ShmemInitStruct("idempotency scope lock key",
								   sizeof(IdemScopeShared), &found);
	if (!found && !IdemScopeReadKeyFile(scope_shared->lock_key))
		IdemScopeWriteKeyFile(scope_shared->lock_key);
	LWLockRelease(AddinShmemInitLock);
}

/* The diagnostics secret's table changed (or every relation did). */
static void
IdemScopeSecretInvalidate(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || !OidIsValid(scope_secret_relid) ||
		relid == scope_secret_relid)
	{
		scope_lock_key_valid = false;
		scope_secret_relid = InvalidOid;
	}
}

/*
 * Without shared memory: the key derived from the database's diagnostics
 * secret, read as the extension's owner (nobody else may).  A schema older
 * than that table (during an update from 0.2.0) has a fixed key: every
 * backend of the database still computes the same tags.
 */
static void
IdemScopeLoadKey(void)
{
	IdemOwnerSection section;
	uint8		mac[PG_SHA256_DIGEST_LENGTH];
	pg_hmac_ctx *ctx;
	bytea	   *b = NULL;
	bool		isnull;
	Datum		d;
	int			rc;

	if (!scope_callback_registered)
	{
		IdemRegisterRelcacheCallback(IdemScopeSecretInvalidate);
		scope_callback_registered = true;
	}
	if (!IdemSchemaHas(IDEM_SCHEMA_DIAGNOSTICS))
	{
		memset(scope_lock_key, 0, sizeof(scope_lock_key));
		scope_lock_key_valid = true;
		return;
	}
	scope_secret_relid = get_relname_relid("diagnostics_secret",
										   get_namespace_oid("idempotency", false));

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	IdemBeginOwnerSection(&section, IdemExtensionOwner(), 0);
	rc = SPI_execute("SELECT secret FROM idempotency.diagnostics_secret", true, 2);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "reading idempotency.diagnostics_secret failed: %s",
			 SPI_result_code_string(rc));
	if (SPI_processed == 1)
	{
		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		b = isnull ? NULL : DatumGetByteaPP(d);
	}
	if (b == NULL || VARSIZE_ANY_EXHDR(b) != IDEM_DIAG_SECRET_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency.diagnostics_secret must hold one secret of %d bytes",
						IDEM_DIAG_SECRET_BYTES),
				 errdetail("Without shared_preload_libraries, the locks of claims are keyed with it."),
				 errhint("Insert one secret of 32 random bytes, as the extension's install script does.")));
	ctx = pg_hmac_create(PG_SHA256);
	if (ctx == NULL)
		elog(ERROR, "out of memory");
	if (pg_hmac_init(ctx, (const uint8 *) VARDATA_ANY(b), IDEM_DIAG_SECRET_BYTES) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) IDEM_SCOPE_LOCK_LABEL,
					   strlen(IDEM_SCOPE_LOCK_LABEL)) < 0 ||
		pg_hmac_final(ctx, mac, sizeof(mac)) < 0)
	{
		const char *msg = pg_hmac_error(ctx);

		pg_hmac_free(ctx);
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not compute HMAC-SHA256: %s", msg)));
	}
	pg_hmac_free(ctx);
	memcpy(scope_lock_key, mac, IDEM_SIPHASH_KEY_LEN);
	explicit_bzero(mac, sizeof(mac));
	IdemEndOwnerSection(&section);
	SPI_finish();
	scope_lock_key_valid = true;
}

/* The key of the scope locks' tags (see the head comment). */
static const uint8 *
IdemScopeLockKey(void)
{
	if (scope_shared != NULL)
		return scope_shared->lock_key;
	if (!scope_lock_key_valid)
		IdemScopeLoadKey();
	return scope_lock_key;
}

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
	char		buf[3 * (sizeof(uint32) + IDEM_SCOPE_MAX_LEN)];
	char	   *p = buf;
	const uint8 *lock_key = IdemScopeLockKey();
	uint64		h;
	int			i;

	/* framed by lengths so that ("ab", "c") and ("a", "bc") differ */
	for (i = 0; i < 3; i++)
	{
		uint32		len = VARSIZE_ANY_EXHDR(parts[i]);

		/* checked scopes have at most IDEM_SCOPE_MAX_LEN bytes a part */
		if (len > IDEM_SCOPE_MAX_LEN)
			elog(ERROR, "scope part of %u bytes is too long for its lock tag", len);
		memcpy(p, &len, sizeof(len));
		p += sizeof(len);
		memcpy(p, VARDATA_ANY(parts[i]), len);
		p += len;
	}
	h = IdemSipHash24(lock_key, buf, p - buf);
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
