/*-------------------------------------------------------------------------
 *
 * keys.c
 *	  Validation of idempotency keys, tenants, endpoints and fingerprints,
 *	  done before any lock is taken or row is read.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/builtins.h"

#include "compat.h"
#include "keys.h"
#include "stats.h"
#include "util.h"

/* the alphabet of UUIDs, ULIDs and other base32, and base64url */
static inline bool
IdemKeyChar(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		(c >= '0' && c <= '9') || c == '-' || c == '_';
}

bool
IdemKeyIsValid(const char *key, int len)
{
	int			i;

	if (len < 1 || len > IDEM_KEY_MAX_LEN)
		return false;
	for (i = 0; i < len; i++)
		if (!IdemKeyChar((unsigned char) key[i]))
			return false;
	return true;
}

void
IdemCheckKey(const text *key)
{
	const char *p;
	int			len;
	int			i;

	if (key == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 errmsg("idempotency key is missing"),
				 errdetail("The key is NULL."),
				 errhint("Send an Idempotency-Key of 1 to 255 characters from A-Z, a-z, 0-9, \"-\" and \"_\".")));

	p = VARDATA_ANY(key);
	len = VARSIZE_ANY_EXHDR(key);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 errmsg("idempotency key is empty"),
				 errhint("Send an Idempotency-Key of 1 to 255 characters from A-Z, a-z, 0-9, \"-\" and \"_\".")));
	if (len > IDEM_KEY_MAX_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 errmsg("idempotency key is too long"),
				 errdetail_plural("The key has %d byte; at most %d characters are allowed.",
								  "The key has %d bytes; at most %d characters are allowed.",
								  len, len, IDEM_KEY_MAX_LEN)));
	for (i = 0; i < len; i++)
		if (!IdemKeyChar((unsigned char) p[i]))
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_INVALID_KEY),
					 errmsg("idempotency key contains a character that is not allowed"),
					 errdetail("The byte at position %d is not one of A-Z, a-z, 0-9, \"-\" and \"_\".",
							   i + 1),
					 errhint("Use a UUID, a ULID or another base32 or base64url string.")));
}

void
IdemCheckScopePart(const text *value, bool is_tenant)
{
	int			len;

	if (value == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 is_tenant ? errmsg("tenant is missing") :
				 errmsg("endpoint is missing"),
				 errdetail("Every key is scoped by tenant and endpoint; neither may be NULL.")));
	len = VARSIZE_ANY_EXHDR(value);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 is_tenant ? errmsg("tenant is empty") :
				 errmsg("endpoint is empty"),
				 errdetail("Every key is scoped by tenant and endpoint; neither may be empty.")));
	if (len > IDEM_SCOPE_MAX_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 is_tenant ? errmsg("tenant is too long") :
				 errmsg("endpoint is too long"),
				 errdetail_plural("It has %d byte; at most %d are allowed.",
								  "It has %d bytes; at most %d are allowed.",
								  len, len, IDEM_SCOPE_MAX_LEN)));
}

void
IdemCheckScope(const text *tenant, const text *endpoint)
{
	IdemCheckScopePart(tenant, true);
	IdemCheckScopePart(endpoint, false);
}

void
IdemCheckFingerprint(const bytea *fingerprint)
{
	if (fingerprint == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 errmsg("request fingerprint is missing"),
				 errhint("Pass the SHA-256 of the canonical request, for example idempotency.idem_fingerprint(method, path, body).")));
	if (VARSIZE_ANY_EXHDR(fingerprint) != IDEM_FINGERPRINT_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 errmsg_plural("request fingerprint must be %d byte",
							   "request fingerprint must be %d bytes",
							   IDEM_FINGERPRINT_LEN, IDEM_FINGERPRINT_LEN),
				 errdetail_plural("The fingerprint given has %d byte.",
								  "The fingerprint given has %d bytes.",
								  (int) VARSIZE_ANY_EXHDR(fingerprint),
								  (int) VARSIZE_ANY_EXHDR(fingerprint)),
				 errhint("Pass the SHA-256 of the canonical request, for example idempotency.idem_fingerprint(method, path, body).")));
}

PG_FUNCTION_INFO_V1(idem_key_valid);

/*
 * idem_key_valid(key text) RETURNS boolean
 *		The rule idem_claim enforces; NULL is not a valid key.
 */
Datum
idem_key_valid(PG_FUNCTION_ARGS)
{
	text	   *key;

	if (PG_ARGISNULL(0))
		PG_RETURN_BOOL(false);
	key = PG_GETARG_TEXT_PP(0);
	PG_RETURN_BOOL(IdemKeyIsValid(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key)));
}
