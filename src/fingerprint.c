/*-------------------------------------------------------------------------
 *
 * fingerprint.c
 *	  SQL-callable canonicalization and fingerprint functions:
 *	  idem_canonical_json[_sha256], idem_canonical_json_text[_sha256],
 *	  idem_fingerprint, and idem_number_text (ECMAScript form of a float8).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "common/cryptohash.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/resowner.h"

#include "util.h"
#include "canonical_json.h"
#include "fingerprint.h"
#include "number_format.h"

PG_FUNCTION_INFO_V1(idem_canonical_json);
PG_FUNCTION_INFO_V1(idem_canonical_json_sha256);
PG_FUNCTION_INFO_V1(idem_canonical_json_text);
PG_FUNCTION_INFO_V1(idem_canonical_json_text_sha256);
PG_FUNCTION_INFO_V1(idem_fingerprint);
PG_FUNCTION_INFO_V1(idem_number_text);

/*
 * One SHA-256 context per backend, made once and initialized again for each
 * digest: making one costs more than hashing a small request.  It belongs
 * to a resource owner of its own that is never released, so it outlives
 * transactions; an error in the middle of a digest leaves nothing behind
 * that the next initialization does not reset.
 */
static pg_cryptohash_ctx *sha256_ctx = NULL;

static pg_cryptohash_ctx *
IdemSha256Begin(void)
{
	if (sha256_ctx == NULL)
	{
		static ResourceOwner owner = NULL;
		ResourceOwner save = CurrentResourceOwner;

		if (owner == NULL)
			owner = ResourceOwnerCreate(NULL, "idempotency SHA-256");
		CurrentResourceOwner = owner;
		sha256_ctx = pg_cryptohash_create(PG_SHA256);
		CurrentResourceOwner = save;
		if (sha256_ctx == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("out of memory")));
	}
	if (pg_cryptohash_init(sha256_ctx) < 0)
		elog(ERROR, "could not initialize SHA-256 context: %s",
			 pg_cryptohash_error(sha256_ctx));
	return sha256_ctx;
}

static void
IdemSha256Update(pg_cryptohash_ctx *ctx, const char *data, size_t len)
{
	if (pg_cryptohash_update(ctx, (const uint8 *) data, len) < 0)
		elog(ERROR, "could not update SHA-256 context: %s",
			 pg_cryptohash_error(ctx));
}

static void
IdemSha256End(pg_cryptohash_ctx *ctx, uint8 *digest)
{
	if (pg_cryptohash_final(ctx, digest, IDEM_FINGERPRINT_LEN) < 0)
		elog(ERROR, "could not finalize SHA-256 context: %s",
			 pg_cryptohash_error(ctx));
}

static bytea *
IdemDigestToBytea(const uint8 *digest)
{
	bytea	   *result = palloc(VARHDRSZ + IDEM_FINGERPRINT_LEN);

	SET_VARSIZE(result, VARHDRSZ + IDEM_FINGERPRINT_LEN);
	memcpy(VARDATA(result), digest, IDEM_FINGERPRINT_LEN);
	return result;
}

/*
 * The exclusion list, when the call has one.  Each function also exists
 * without it: a call through an argument default costs the parser and the
 * planner more than canonicalizing a small body.
 */
#define EXCLUDE_ARG(n) \
	(PG_NARGS() > (n) && !PG_ARGISNULL(n) ? PG_GETARG_ARRAYTYPE_P(n) : NULL)

/*
 * Canonicalize a body given as jsonb, or as raw JSON text (jb NULL): the
 * text directly when the fast path takes it, else through jsonb, with that
 * path's errors in its order (the text's, then the pointers').
 */
static void
IdemCanonicalBytes(StringInfo buf, Jsonb *jb, text *json, ArrayType *exclude,
				   pg_cryptohash_ctx *sink)
{
	IdemExclusions *ex = NULL;
	bool		have_ex = false;

	if (jb == NULL)
	{
		have_ex = IdemTryParseExclusions(exclude, &ex);
		if (have_ex && IdemTryCanonicalizeJsonText(buf, json, ex, sink))
			return;
		jb = IdemJsonTextToJsonbUnique(json);
	}
	if (!have_ex)
		ex = IdemParseExclusions(exclude);
	IdemCanonicalizeJsonb(buf, jb, ex, sink);
}

static text *
IdemCanonicalText(Jsonb *jb, text *json, ArrayType *exclude)
{
	StringInfoData buf;

	initStringInfo(&buf);
	IdemCanonicalBytes(&buf, jb, json, exclude, NULL);
	return IdemCanonicalToText(buf.data, buf.len);
}

static bytea *
IdemCanonicalSha256(Jsonb *jb, text *json, ArrayType *exclude)
{
	StringInfoData buf;
	pg_cryptohash_ctx *ctx;
	uint8		digest[IDEM_FINGERPRINT_LEN];

	initStringInfo(&buf);
	ctx = IdemSha256Begin();
	IdemCanonicalBytes(&buf, jb, json, exclude, ctx);
	IdemSha256End(ctx, digest);
	return IdemDigestToBytea(digest);
}

/* idem_canonical_json(body jsonb [, exclude text[]]) returns text */
Datum
idem_canonical_json(PG_FUNCTION_ARGS)
{
	PG_RETURN_TEXT_P(IdemCanonicalText(PG_GETARG_JSONB_P(0), NULL,
									   EXCLUDE_ARG(1)));
}

/* idem_canonical_json_sha256(body jsonb [, exclude text[]]) returns bytea */
Datum
idem_canonical_json_sha256(PG_FUNCTION_ARGS)
{
	PG_RETURN_BYTEA_P(IdemCanonicalSha256(PG_GETARG_JSONB_P(0), NULL,
										  EXCLUDE_ARG(1)));
}

/* idem_canonical_json_text(body text [, exclude text[]]) returns text */
Datum
idem_canonical_json_text(PG_FUNCTION_ARGS)
{
	PG_RETURN_TEXT_P(IdemCanonicalText(NULL, PG_GETARG_TEXT_PP(0),
									   EXCLUDE_ARG(1)));
}

/* idem_canonical_json_text_sha256(body text [, exclude text[]]) returns bytea */
Datum
idem_canonical_json_text_sha256(PG_FUNCTION_ARGS)
{
	PG_RETURN_BYTEA_P(IdemCanonicalSha256(NULL, PG_GETARG_TEXT_PP(0),
										  EXCLUDE_ARG(1)));
}

void
IdemFingerprint(const char *method, const char *path, Jsonb *body,
				const IdemExclusions *ex, uint8 *digest)
{
	pg_cryptohash_ctx *ctx;
	char	   *upper;
	size_t		mlen = strlen(method);
	const char *upath;

	if (mlen == 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 errmsg("request method must not be empty")));
	upper = palloc(mlen + 1);
	for (size_t i = 0; i < mlen; i++)
	{
		unsigned char c = (unsigned char) method[i];

		if (!IdemIsTokenChar(c))
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_INVALID_KEY),
					 errmsg("invalid request method \"%s\"", method),
					 errdetail("A method is an HTTP token: letters, digits and !#$%%&'*+-.^_`|~.")));
		upper[i] = (c >= 'a' && c <= 'z') ? c - ('a' - 'A') : c;
	}
	upper[mlen] = '\0';

	if (path[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 errmsg("request path must not be empty")));
	for (const char *p = path; *p; p++)
		if ((unsigned char) *p < 0x20 || *p == 0x7f)
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_INVALID_KEY),
					 errmsg("request path must not contain control characters")));
	IdemRequireAsciiInSqlAscii(path, strlen(path));
	upath = pg_server_to_any(path, strlen(path), PG_UTF8);

	ctx = IdemSha256Begin();
	IdemSha256Update(ctx, IDEM_FINGERPRINT_MAGIC, strlen(IDEM_FINGERPRINT_MAGIC));
	IdemSha256Update(ctx, upper, mlen);
	IdemSha256Update(ctx, "\n", 1);
	IdemSha256Update(ctx, upath, strlen(upath));
	IdemSha256Update(ctx, "\n", 1);
	if (body)
	{
		StringInfoData buf;

		initStringInfo(&buf);
		IdemCanonicalizeJsonb(&buf, body, ex, ctx);
		pfree(buf.data);
	}
	IdemSha256End(ctx, digest);
	pfree(upper);
}

/*
 * idem_fingerprint(method text, path text, body jsonb [, exclude text[]])
 * returns bytea.  Not strict: a NULL body is a request without one, a NULL
 * exclusion list excludes nothing; NULL method or path is an error (IK400).
 */
Datum
idem_fingerprint(PG_FUNCTION_ARGS)
{
	uint8		digest[IDEM_FINGERPRINT_LEN];
	IdemExclusions *ex = NULL;

	/* missing, like malformed, is the request's fault: IK400 */
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 errmsg("request method is missing")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 errmsg("request path is missing")));
	ex = IdemParseExclusions(EXCLUDE_ARG(3));

	IdemFingerprint(text_to_cstring(PG_GETARG_TEXT_PP(0)),
					text_to_cstring(PG_GETARG_TEXT_PP(1)),
					PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2),
					ex, digest);
	PG_RETURN_BYTEA_P(IdemDigestToBytea(digest));
}

/* idem_number_text(float8) returns text: the ECMAScript form */
Datum
idem_number_text(PG_FUNCTION_ARGS)
{
	float8		value = PG_GETARG_FLOAT8(0);
	char		buf[IDEM_NUMBER_BUFLEN];
	int			len;

	if (isnan(value) || isinf(value))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("%s has no JSON representation",
						isnan(value) ? "NaN" : "infinity")));
	len = IdemFormatDouble(value, buf);
	PG_RETURN_TEXT_P(cstring_to_text_with_len(buf, len));
}
