/*-------------------------------------------------------------------------
 *
 * keygen.c
 *	  Key helpers: idem_uuidv7(), idem_ulid() and idem_token() mint keys
 *	  server-side from pg_strong_random(); idem_downstream_key() derives the
 *	  key of a call to another service from the whole scope; idem_key_hash()
 *	  is what logs and the audit trail show instead of a key.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "compat.h"
#include "keygen.h"
#include "keys.h"
#include "sha256.h"
#include "util.h"

PG_FUNCTION_INFO_V1(idem_uuidv7);
PG_FUNCTION_INFO_V1(idem_ulid);
PG_FUNCTION_INFO_V1(idem_token);
PG_FUNCTION_INFO_V1(idem_downstream_key);
PG_FUNCTION_INFO_V1(idem_key_hash);

#define DOWNSTREAM_LABEL	"idempotency downstream key v1"

static const char base64url_chars[] =
"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static const char crockford_chars[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/* last values handed out by this backend, for monotonicity */
static int64 uuid_last_ms = -1;
static uint16 uuid_last_counter = 0;
static int64 ulid_last_ms = -1;
static uint8 ulid_last_rand[10];

static void
IdemRandom(void *buf, size_t len)
{
	if (!pg_strong_random(buf, len))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate random values")));
}

/* milliseconds since the Unix epoch */
static int64
IdemUnixMillis(void)
{
	TimestampTz now = GetCurrentTimestamp();

	return now / 1000 +
		(int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * 1000;
}

/* base64url without padding; out must hold 4 * ceil(len / 3) + 1 bytes */
static int
IdemBase64Url(const uint8 *in, int len, char *out)
{
	int			i;
	int			n = 0;

	for (i = 0; i < len; i += 3)
	{
		uint32		v = (uint32) in[i] << 16;
		int			rest = len - i;

		if (rest > 1)
			v |= (uint32) in[i + 1] << 8;
		if (rest > 2)
			v |= in[i + 2];
		out[n++] = base64url_chars[(v >> 18) & 0x3F];
		out[n++] = base64url_chars[(v >> 12) & 0x3F];
		if (rest > 1)
			out[n++] = base64url_chars[(v >> 6) & 0x3F];
		if (rest > 2)
			out[n++] = base64url_chars[v & 0x3F];
	}
	out[n] = '\0';
	return n;
}

/*
 * The label, then each part framed by its length, absorbed by the
 * extension's own SHA-256 (sha256.c): no digest context, and no buffer of
 * the framed input (which would hold the raw key); the state, which does,
 * is zeroed by IdemSha256Final.
 */
void
IdemFramedSha256(const char *label, int nparts,
				 const char *const *parts, const int *lens,
				 uint8 out[PG_SHA256_DIGEST_LENGTH])
{
	IdemSha256	s;

	StaticAssertStmt(PG_SHA256_DIGEST_LENGTH == IDEM_SHA256_LEN,
					 "SHA-256 digests differ in length");
	IdemSha256Init(&s);
	if (label != NULL)
		IdemSha256Update(&s, label, strlen(label));
	for (int i = 0; i < nparts; i++)
		IdemSha256UpdateFramed(&s, parts[i], (uint32) lens[i]);
	IdemSha256Final(&s, out);
}

void
IdemKeyHash(const char *tenant, int tenant_len,
			const char *endpoint, int endpoint_len,
			const char *key, int key_len,
			char out[IDEM_KEY_HASH_LEN + 1])
{
	const char *parts[3] = {tenant, endpoint, key};
	int			lens[3] = {tenant_len, endpoint_len, key_len};
	uint8		digest[PG_SHA256_DIGEST_LENGTH];

	IdemFramedSha256(NULL, 3, parts, lens, digest);
	hex_encode((const char *) digest, IDEM_KEY_HASH_LEN / 2, out);
	out[IDEM_KEY_HASH_LEN] = '\0';
}

/*
 * idem_uuidv7() RETURNS uuid
 *		RFC 9562 version 7: 48 bits of Unix milliseconds, the version, 12
 *		bits of rand_a used as a counter (method 1 of section 6.2), the
 *		variant and 62 random bits.  Within a backend every value is larger
 *		than the previous one: when the clock has not moved on (or went
 *		back), the counter is incremented; when the counter is exhausted,
 *		the timestamp is moved one millisecond ahead.  A fresh millisecond
 *		starts the counter at a random value below 2048, so that at least
 *		2048 values fit in each millisecond.
 */
Datum
idem_uuidv7(PG_FUNCTION_ARGS)
{
	pg_uuid_t  *uuid = palloc(sizeof(pg_uuid_t));
	int64		ms = IdemUnixMillis();
	uint16		counter;
	int			i;

	IdemRandom(uuid->data, UUID_LEN);

	if (ms > uuid_last_ms)
		counter = ((uuid->data[6] << 8) | uuid->data[7]) & 0x07FF;
	else
	{
		ms = uuid_last_ms;
		counter = uuid_last_counter + 1;
		if (counter > 0x0FFF)
		{
			ms++;
			counter = ((uuid->data[6] << 8) | uuid->data[7]) & 0x07FF;
		}
	}
	uuid_last_ms = ms;
	uuid_last_counter = counter;

	for (i = 0; i < 6; i++)
		uuid->data[i] = (uint8) (ms >> (8 * (5 - i)));
	uuid->data[6] = 0x70 | (uint8) (counter >> 8);
	uuid->data[7] = (uint8) counter;
	uuid->data[8] = (uuid->data[8] & 0x3F) | 0x80;

	PG_RETURN_UUID_P(uuid);
}

/*
 * idem_ulid() RETURNS text
 *		A ULID: 48 bits of Unix milliseconds and 80 random bits, written as
 *		26 characters of Crockford's base32.  Within a millisecond of one
 *		backend the random part is incremented instead of drawn again, so
 *		that successive values sort in the order they were made; should it
 *		overflow, the timestamp moves one millisecond ahead.
 */
Datum
idem_ulid(PG_FUNCTION_ARGS)
{
	int64		ms = IdemUnixMillis();
	uint8		bin[16];
	char		out[27];
	int			i;

	if (ms > ulid_last_ms)
		IdemRandom(ulid_last_rand, sizeof(ulid_last_rand));
	else
	{
		ms = ulid_last_ms;
		for (i = sizeof(ulid_last_rand) - 1; i >= 0; i--)
			if (++ulid_last_rand[i] != 0)
				break;
		if (i < 0)
		{
			ms++;
			IdemRandom(ulid_last_rand, sizeof(ulid_last_rand));
		}
	}
	ulid_last_ms = ms;

	for (i = 0; i < 6; i++)
		bin[i] = (uint8) (ms >> (8 * (5 - i)));
	memcpy(bin + 6, ulid_last_rand, sizeof(ulid_last_rand));

	/*
	 * 26 characters of 5 bits are 130 bits: the first character carries
	 * only the 3 most significant bits of the 128.
	 */
	for (i = 0; i < 26; i++)
	{
		int			start = i * 5 - 2;	/* first bit, counted from the top */
		int			v = 0;
		int			b;

		for (b = start; b < start + 5; b++)
		{
			v <<= 1;
			if (b >= 0)
				v |= (bin[b / 8] >> (7 - b % 8)) & 1;
		}
		out[i] = crockford_chars[v];
	}
	out[26] = '\0';

	PG_RETURN_TEXT_P(cstring_to_text_with_len(out, 26));
}

/*
 * idem_token() RETURNS text
 *		16 random bytes in base64url without padding: 22 characters.
 */
Datum
idem_token(PG_FUNCTION_ARGS)
{
	uint8		bin[16];
	char		out[25];
	int			len;

	IdemRandom(bin, sizeof(bin));
	len = IdemBase64Url(bin, sizeof(bin), out);
	PG_RETURN_TEXT_P(cstring_to_text_with_len(out, len));
}

/*
 * idem_downstream_key(tenant text, endpoint text, key text, step text)
 *		RETURNS text
 *		The key to send with step "step" of the operation (tenant, endpoint,
 *		key) to another service: base64url of the SHA-256 of a label and
 *		the four strings, each preceded by its length (43 characters, a
 *		valid idempotency key).  The same arguments always give the same
 *		key, so that a retry reuses it; any difference in the scope gives
 *		another key.
 */
Datum
idem_downstream_key(PG_FUNCTION_ARGS)
{
	text	   *args[4];
	const char *parts[4];
	int			lens[4];
	uint8		digest[PG_SHA256_DIGEST_LENGTH];
	char		out[45];
	int			len;
	int			i;

	for (i = 0; i < 4; i++)
		args[i] = PG_ARGISNULL(i) ? NULL : PG_GETARG_TEXT_PP(i);

	IdemCheckScope(args[0], args[1]);
	IdemCheckKey(args[2]);
	if (args[3] == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("step name must not be NULL"),
				 errdetail("A downstream key is derived from the scope, the key and a non-empty step name.")));
	if (VARSIZE_ANY_EXHDR(args[3]) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("step name must not be empty"),
				 errdetail("A downstream key is derived from the scope, the key and a non-empty step name.")));

	for (i = 0; i < 4; i++)
	{
		parts[i] = VARDATA_ANY(args[i]);
		lens[i] = VARSIZE_ANY_EXHDR(args[i]);
	}
	IdemFramedSha256(DOWNSTREAM_LABEL, 4, parts, lens, digest);
	len = IdemBase64Url(digest, sizeof(digest), out);

	PG_RETURN_TEXT_P(cstring_to_text_with_len(out, len));
}

/*
 * idem_key_hash(tenant text, endpoint text, key text) RETURNS text
 *		What logs and idempotency.events show instead of a key: the hex of
 *		the first 8 bytes of the SHA-256 of the three strings, each preceded
 *		by its length as 4 bytes big-endian.  The scope is checked as the
 *		claim checks its form (IK400); the session's tenant is not, since
 *		the hash tells nothing the caller did not pass.
 */
Datum
idem_key_hash(PG_FUNCTION_ARGS)
{
	text	   *tenant = PG_ARGISNULL(0) ? NULL : PG_GETARG_TEXT_PP(0);
	text	   *endpoint = PG_ARGISNULL(1) ? NULL : PG_GETARG_TEXT_PP(1);
	text	   *key = PG_ARGISNULL(2) ? NULL : PG_GETARG_TEXT_PP(2);
	char		out[IDEM_KEY_HASH_LEN + 1];

	IdemCheckKey(key);
	IdemCheckScope(tenant, endpoint);

	IdemKeyHash(VARDATA_ANY(tenant), VARSIZE_ANY_EXHDR(tenant),
				VARDATA_ANY(endpoint), VARSIZE_ANY_EXHDR(endpoint),
				VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key), out);
	PG_RETURN_TEXT_P(cstring_to_text(out));
}
