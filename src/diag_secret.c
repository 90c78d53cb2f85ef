/*-------------------------------------------------------------------------
 *
 * diag_secret.c
 *	  The keys of mismatch diagnostics.  The hashes of a request digest are
 *	  keyed with a key of the scope: HMAC-SHA256(secret, SHA-256 of tenant,
 *	  endpoint and key, framed), where the secret is 32 random bytes made
 *	  for the database by CREATE EXTENSION and kept in
 *	  idempotency.diagnostics_secret, readable by the extension's owner
 *	  only.  So the same body gives unrelated digests under two keys, and
 *	  whoever reads a stored digest without the secret cannot test guesses
 *	  of a value (an amount) against it.
 *
 *	  The secret is read once per backend, and again after its table
 *	  changed (its trigger sends a relcache invalidation).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "common/hmac.h"
#include "common/sha2.h"
#include "executor/spi.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"

#include "compat.h"
#include "diag_int.h"
#include "keygen.h"
#include "keys.h"
#include "schema.h"
#include "scope.h"
#include "util.h"

#define IDEM_DIAG_SECRET_LEN	32

static uint8 diag_secret[IDEM_DIAG_SECRET_LEN];
static bool diag_secret_valid = false;

/*
 * The key of the last scope asked for: a request's digest and its claim
 * ask for the same one, in that order.  Forgotten with the secret.
 */
static struct
{
	bool		valid;
	int			lens[3];
	char		parts[3][IDEM_SCOPE_MAX_LEN];
	uint8		key[PG_SHA256_DIGEST_LENGTH];
	uint8		tag[IDEM_DIAG_MAC_LEN];
}			diag_last;
static Oid	diag_secret_relid = InvalidOid;
static bool diag_callback_registered = false;

/* The secret's row changed (its trigger sends an invalidation), or all did. */
static void
IdemDiagSecretInvalidate(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || !OidIsValid(diag_secret_relid) ||
		relid == diag_secret_relid)
	{
		diag_secret_valid = false;
		diag_secret_relid = InvalidOid;
		diag_last.valid = false;
	}
}

/* Read the secret, as the extension's owner (nobody else may). */
static void
IdemDiagLoadSecret(void)
{
	IdemOwnerSection section;
	int			rc;
	bool		isnull;
	Datum		d;
	bytea	   *b;

	if (diag_secret_valid)
		return;
	if (!diag_callback_registered)
	{
		IdemRegisterRelcacheCallback(IdemDiagSecretInvalidate);
		diag_callback_registered = true;
	}
	if (!IdemSchemaHas(IDEM_SCHEMA_DIAGNOSTICS))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table idempotency.diagnostics_secret does not exist"),
				 errhint("Run ALTER EXTENSION idempotency UPDATE.")));
	diag_secret_relid = get_relname_relid("diagnostics_secret",
										  get_namespace_oid("idempotency", false));

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	IdemBeginOwnerSection(&section, IdemExtensionOwner(), 0);
	rc = SPI_execute("SELECT secret FROM idempotency.diagnostics_secret", true, 2);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "reading idempotency.diagnostics_secret failed: %s",
			 SPI_result_code_string(rc));
	if (SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency.diagnostics_secret must hold exactly one row"),
				 errhint("Insert one secret of 32 random bytes, as the extension's install script does.")));
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	b = isnull ? NULL : DatumGetByteaPP(d);
	if (b == NULL || VARSIZE_ANY_EXHDR(b) != IDEM_DIAG_SECRET_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the secret in idempotency.diagnostics_secret is not %d bytes long",
						IDEM_DIAG_SECRET_LEN)));
	memcpy(diag_secret, VARDATA_ANY(b), IDEM_DIAG_SECRET_LEN);
	diag_last.valid = false;
	IdemEndOwnerSection(&section);
	SPI_finish();
	diag_secret_valid = true;
}

static void
IdemDiagHmacFailed(pg_hmac_ctx *ctx)
{
	const char *msg = pg_hmac_error(ctx);

	pg_hmac_free(ctx);
	ereport(ERROR,
			(errcode(ERRCODE_INTERNAL_ERROR),
			 errmsg("could not compute HMAC-SHA256: %s", msg)));
}

/* out = HMAC-SHA256(key, a || b), in ctx (created by the caller) */
static void
IdemDiagHmac(pg_hmac_ctx *ctx, const uint8 *key, size_t keylen,
			 const void *a, size_t alen, const void *b, size_t blen,
			 uint8 out[PG_SHA256_DIGEST_LENGTH])
{
	if (pg_hmac_init(ctx, key, keylen) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) a, alen) < 0 ||
		(blen > 0 && pg_hmac_update(ctx, (const uint8 *) b, blen) < 0) ||
		pg_hmac_final(ctx, out, PG_SHA256_DIGEST_LENGTH) < 0)
		IdemDiagHmacFailed(ctx);
}

/*
 * The key of a scope, and the tag that says which scope (and secret) a
 * digest was made for: HMAC-SHA256(secret, framed SHA-256 of the scope),
 * and the first bytes of HMAC-SHA256(that key, "scope").
 */
void
IdemDiagScopeKey(const IdemScope *scope, uint8 key[PG_SHA256_DIGEST_LENGTH],
				 uint8 tag[IDEM_DIAG_MAC_LEN])
{
	const char *parts[3];
	int			lens[3];
	uint8		framed[PG_SHA256_DIGEST_LENGTH];
	uint8		full[PG_SHA256_DIGEST_LENGTH];
	pg_hmac_ctx *ctx;
	bool		same;

	IdemDiagLoadSecret();
	parts[0] = VARDATA_ANY(scope->tenant);
	lens[0] = VARSIZE_ANY_EXHDR(scope->tenant);
	parts[1] = VARDATA_ANY(scope->endpoint);
	lens[1] = VARSIZE_ANY_EXHDR(scope->endpoint);
	parts[2] = VARDATA_ANY(scope->key);
	lens[2] = VARSIZE_ANY_EXHDR(scope->key);

	same = diag_last.valid;
	for (int i = 0; same && i < 3; i++)
		same = lens[i] == diag_last.lens[i] &&
			memcmp(parts[i], diag_last.parts[i], lens[i]) == 0;
	if (!same)
	{
		ctx = pg_hmac_create(PG_SHA256);
		if (ctx == NULL)
			elog(ERROR, "out of memory");
		IdemFramedSha256("idempotency request digest v1", 3, parts, lens, framed);
		IdemDiagHmac(ctx, diag_secret, IDEM_DIAG_SECRET_LEN,
					 framed, sizeof(framed), NULL, 0, diag_last.key);
		IdemDiagHmac(ctx, diag_last.key, PG_SHA256_DIGEST_LENGTH, "scope", 5,
					 NULL, 0, full);
		pg_hmac_free(ctx);
		memcpy(diag_last.tag, full, IDEM_DIAG_MAC_LEN);
		diag_last.valid = true;
		for (int i = 0; i < 3; i++)
		{
			/* checked scopes have at most IDEM_SCOPE_MAX_LEN bytes */
			if (lens[i] > IDEM_SCOPE_MAX_LEN)
			{
				diag_last.valid = false;
				break;
			}
			diag_last.lens[i] = lens[i];
			memcpy(diag_last.parts[i], parts[i], lens[i]);
		}
	}
	memcpy(key, diag_last.key, PG_SHA256_DIGEST_LENGTH);
	memcpy(tag, diag_last.tag, IDEM_DIAG_MAC_LEN);
}
