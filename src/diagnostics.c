/*-------------------------------------------------------------------------
 *
 * diagnostics.c
 *	  Mismatch diagnostics: idem_request_digest, and what a claim of a
 *	  reused key with another request says about the difference.
 *
 *	  A request digest is a structural summary of the canonical request:
 *	  one entry per JSON Pointer of the body, down to a bounded depth, in
 *	  document order, each holding the member's name (array elements have
 *	  none: their place is their index), its kind (object, array, other
 *	  value) and a keyed hash of its canonical value (RFC 8785, as
 *	  idem_canonical_json gives it, exclusions applied), truncated to 8
 *	  bytes.  Method and path, when given, have a keyed hash each.  No
 *	  value is ever stored; names and the shape of the document are.
 *
 *	  The hashes are keyed with a key of the scope: HMAC-SHA256(secret,
 *	  SHA-256 of tenant, endpoint and key, framed), where the secret is 32
 *	  random bytes made for the database by CREATE EXTENSION and kept in
 *	  idempotency.diagnostics_secret, readable by the extension's owner
 *	  only.  So the same body gives unrelated digests under two keys, and
 *	  whoever reads a stored digest without the secret cannot test guesses
 *	  of a value (an amount) against it.
 *
 *	  Each node's hash is SHA-256 of the scope's key followed by its kind
 *	  and either the canonical bytes of a value that is not a container or,
 *	  for an object or array, its members' names and full hashes (computed
 *	  bottom-up, Merkle-style); a digest keeps the first 8 bytes.  Two nodes
 *	  of one scope have the same hash exactly when their canonical forms
 *	  are the same.
 *
 *	  Size.  Entries are kept down to IDEM_DIAG_MAX_DEPTH, containers of
 *	  more than IDEM_DIAG_MAX_MEMBERS members are summarised by their own
 *	  entry (their members are not listed), and when the digest would be
 *	  larger than idempotency.diagnostics_max_bytes the depth is lowered
 *	  until it fits (the root alone always does): a deeper difference is
 *	  then reported at the member that holds it, marked truncated.
 *
 *	  Format (version 1):
 *		byte 0		version (1)
 *		bytes 1-8	scope tag: HMAC-SHA256(scope key, "scope"), first 8 bytes
 *		byte 9		flags: 1 method, 2 path, 4 body, 8 summarised
 *		[8 bytes]	method hash, [8 bytes] path hash, when flagged
 *		entries, when the body is flagged, in preorder:
 *			depth (1 byte, 0 for the root), entry flags (1 byte: 1 members
 *			listed, 2 array element, 4 object, 8 array), the name (member
 *			of an object only: its length in 1 byte below 128, else 2 bytes
 *			with the top bit set, then the canonical name without quotes),
 *			the hash (8 bytes)
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/cryptohash.h"
#include "common/hmac.h"
#include "common/sha2.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"

#include "canonical_json.h"
#include "diagnostics.h"
#include "endpoint.h"
#include "guc.h"
#include "idempotency.h"
#include "keygen.h"
#include "keys.h"
#include "keystore.h"
#include "schema.h"
#include "scope.h"

#define IDEM_DIAG_VERSION		1
#define IDEM_DIAG_MAC_LEN		8
#define IDEM_DIAG_HEADER_LEN	10
#define IDEM_DIAG_MAX_DEPTH		8
#define IDEM_DIAG_MAX_MEMBERS	256
#define IDEM_DIAG_MAX_NAME		32767
#define IDEM_DIAG_SECRET_LEN	32

/* header flags */
#define DIAG_HAS_METHOD		0x01
#define DIAG_HAS_PATH		0x02
#define DIAG_HAS_BODY		0x04
#define DIAG_SUMMARISED		0x08

/* entry flags */
#define DIAG_LISTED			0x01
#define DIAG_ELEMENT		0x02
#define DIAG_OBJECT			0x04
#define DIAG_ARRAY			0x08
#define DIAG_KIND(f)		((f) & (DIAG_OBJECT | DIAG_ARRAY))

/* ----------------------------------------------------------------
 *		the secret and the scope's key
 * ----------------------------------------------------------------
 */

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
	IdemBeginOwnerSection(&section, IdemKeystoreOwner(), 0);
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
static void
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

/* ----------------------------------------------------------------
 *		building a digest from canonical JSON text
 * ----------------------------------------------------------------
 */

typedef struct DiagNode
{
	int			depth;
	uint8		flags;			/* DIAG_ELEMENT, DIAG_OBJECT, DIAG_ARRAY */
	const char *name;			/* canonical name, without quotes */
	int			namelen;
	int			nchildren;
	bool		listable;		/* its members may be listed */
	int			end;			/* index after its last descendant */
	uint8		hash[PG_SHA256_DIGEST_LENGTH];
} DiagNode;

typedef struct DiagBuild
{
	pg_cryptohash_ctx *sha;		/* for every node's hash, one at a time */
	const uint8 *key;			/* the scope's key */
	const char *s;				/* canonical text (UTF-8) */
	int			len;
	int			pos;
	DiagNode   *nodes;
	int			nnodes;
	int			maxnodes;
} DiagBuild;

/*
 * out = SHA-256(key || a || b), in ctx (made by the caller, used again):
 * the keyed hash of one node.  What is stored of it is its first
 * IDEM_DIAG_MAC_LEN bytes, which leave out most of the hash's state, so
 * that the secret-prefix construction cannot be extended to other inputs
 * (the attack HMAC's nesting guards against), at half of HMAC's cost per
 * node.
 */
static void
IdemDiagSha(pg_cryptohash_ctx *ctx, const uint8 *key, const void *a, size_t alen,
			const void *b, size_t blen, uint8 out[PG_SHA256_DIGEST_LENGTH])
{
	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, key, PG_SHA256_DIGEST_LENGTH) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) a, alen) < 0 ||
		(blen > 0 && pg_cryptohash_update(ctx, (const uint8 *) b, blen) < 0) ||
		pg_cryptohash_final(ctx, out, PG_SHA256_DIGEST_LENGTH) < 0)
		elog(ERROR, "could not compute SHA-256 hash: %s", pg_cryptohash_error(ctx));
}

/* skip a string whose opening quote is at b->pos; returns the closing one's */
static int
IdemDiagSkipString(DiagBuild *b)
{
	int			p = b->pos + 1;

	while (p < b->len && b->s[p] != '"')
		p += (b->s[p] == '\\') ? 2 : 1;
	if (p >= b->len)
		elog(ERROR, "unterminated string in canonical JSON");
	return p;
}

static void
IdemDiagExpect(DiagBuild *b, char c)
{
	if (b->pos >= b->len || b->s[b->pos] != c)
		elog(ERROR, "unexpected character in canonical JSON at offset %d", b->pos);
	b->pos++;
}

/* Parse the value at b->pos into a node (and its descendants); its index. */
static int
IdemDiagParse(DiagBuild *b, int depth, uint8 flags, const char *name, int namelen)
{
	int			idx;
	DiagNode   *n;
	uint8		hash[PG_SHA256_DIGEST_LENGTH];
	int			nchildren = 0;
	bool		listable = true;
	uint8		kind = 0;

	check_stack_depth();
	CHECK_FOR_INTERRUPTS();
	if (b->nnodes == b->maxnodes)
	{
		b->maxnodes *= 2;
		b->nodes = repalloc(b->nodes, sizeof(DiagNode) * b->maxnodes);
	}
	idx = b->nnodes++;
	if (b->pos >= b->len)
		elog(ERROR, "unexpected end of canonical JSON");

	if (b->s[b->pos] == '{' || b->s[b->pos] == '[')
	{
		bool		object = b->s[b->pos] == '{';
		StringInfoData members;	/* kind, then each member's name and hash */

		initStringInfo(&members);
		appendStringInfoChar(&members, object ? 'o' : 'a');

		kind = object ? DIAG_OBJECT : DIAG_ARRAY;
		b->pos++;
		if (b->pos < b->len && b->s[b->pos] == (object ? '}' : ']'))
			b->pos++;
		else
		{
			for (;;)
			{
				const char *cname = NULL;
				int			cnamelen = 0;
				int			child;

				if (object)
				{
					int			close;
					uint8		lenbuf[4];

					if (b->pos >= b->len || b->s[b->pos] != '"')
						elog(ERROR, "unexpected character in canonical JSON at offset %d", b->pos);
					close = IdemDiagSkipString(b);
					cname = b->s + b->pos + 1;
					cnamelen = close - b->pos - 1;
					b->pos = close + 1;
					IdemDiagExpect(b, ':');
					if (cnamelen > IDEM_DIAG_MAX_NAME)
						listable = false;
					lenbuf[0] = (uint8) ((uint32) cnamelen >> 24);
					lenbuf[1] = (uint8) ((uint32) cnamelen >> 16);
					lenbuf[2] = (uint8) ((uint32) cnamelen >> 8);
					lenbuf[3] = (uint8) cnamelen;
					appendBinaryStringInfo(&members, (const char *) lenbuf, 4);
					appendBinaryStringInfo(&members, cname, cnamelen);
				}
				child = IdemDiagParse(b, depth + 1,
									  object ? 0 : DIAG_ELEMENT, cname, cnamelen);
				appendBinaryStringInfo(&members, (const char *) b->nodes[child].hash,
									   PG_SHA256_DIGEST_LENGTH);
				nchildren++;
				if (b->pos < b->len && b->s[b->pos] == ',')
				{
					b->pos++;
					continue;
				}
				IdemDiagExpect(b, object ? '}' : ']');
				break;
			}
		}
		IdemDiagSha(b->sha, b->key, members.data, members.len, NULL, 0, hash);
		pfree(members.data);
	}
	else
	{
		int			start = b->pos;

		if (b->s[b->pos] == '"')
			b->pos = IdemDiagSkipString(b) + 1;
		else
			while (b->pos < b->len && b->s[b->pos] != ',' &&
				   b->s[b->pos] != ']' && b->s[b->pos] != '}')
				b->pos++;
		IdemDiagSha(b->sha, b->key, "v", 1, b->s + start, b->pos - start, hash);
	}

	n = &b->nodes[idx];
	n->depth = depth;
	n->flags = flags | kind;
	n->name = name;
	n->namelen = namelen;
	n->nchildren = nchildren;
	n->listable = listable && kind != 0 && nchildren <= IDEM_DIAG_MAX_MEMBERS;
	n->end = b->nnodes;
	memcpy(n->hash, hash, sizeof(hash));
	return idx;
}

static int
IdemDiagNameSize(int namelen)
{
	return namelen < 0x80 ? 1 + namelen : 2 + namelen;
}

/*
 * Bytes of the entries kept with members listed down to depth limit (a
 * container at limit is summarised); *summarised tells whether any
 * container with members is.
 */
static Size
IdemDiagEntriesSize(const DiagBuild *b, int limit, bool *summarised)
{
	Size		size = 0;
	int			i = 0;

	*summarised = false;
	while (i < b->nnodes)
	{
		const DiagNode *n = &b->nodes[i];

		size += 2 + IDEM_DIAG_MAC_LEN;
		if (n->depth > 0 && !(n->flags & DIAG_ELEMENT))
			size += IdemDiagNameSize(n->namelen);
		if (DIAG_KIND(n->flags) && n->nchildren > 0 &&
			!(n->listable && n->depth < limit))
		{
			*summarised = true;
			i = n->end;			/* its members are not kept */
		}
		else
			i++;
	}
	return size;
}

/*
 * The digest of a request for a scope: body is NULL for a request without
 * one, method and path NULL when not given.
 */
static bytea *
IdemRequestDigest(const IdemScope *scope, Jsonb *body, const char *method,
				  const char *path, const IdemExclusions *ex)
{
	pg_cryptohash_ctx *sha = pg_cryptohash_create(PG_SHA256);
	uint8		key[PG_SHA256_DIGEST_LENGTH];
	uint8		h[PG_SHA256_DIGEST_LENGTH];
	uint8		tag[IDEM_DIAG_MAC_LEN];
	StringInfoData out;
	StringInfoData canon;
	DiagBuild	b;
	uint8		flags = 0;
	int			limit = IDEM_DIAG_MAX_DEPTH;
	bool		summarised = false;
	Size		header;
	bytea	   *result;

	if (sha == NULL)
		elog(ERROR, "out of memory");
	IdemDiagScopeKey(scope, key, tag);

	memset(&b, 0, sizeof(b));
	b.sha = sha;
	b.key = key;
	if (body != NULL)
	{
		initStringInfo(&canon);
		IdemCanonicalizeJsonb(&canon, body, ex, NULL);
		b.s = canon.data;
		b.len = canon.len;
		b.maxnodes = 16;
		b.nodes = palloc(sizeof(DiagNode) * b.maxnodes);
		(void) IdemDiagParse(&b, 0, 0, NULL, 0);
		if (b.pos != b.len)
			elog(ERROR, "trailing characters in canonical JSON");
		flags |= DIAG_HAS_BODY;
	}
	if (method != NULL)
		flags |= DIAG_HAS_METHOD;
	if (path != NULL)
		flags |= DIAG_HAS_PATH;
	header = IDEM_DIAG_HEADER_LEN + (method ? IDEM_DIAG_MAC_LEN : 0) +
		(path ? IDEM_DIAG_MAC_LEN : 0);

	/* the deepest listing that fits the setting; the root alone always does */
	if (body != NULL)
	{
		while (limit > 0 &&
			   header + IdemDiagEntriesSize(&b, limit, &summarised) >
			   (Size) idem_diagnostics_max_bytes)
			limit--;
		(void) IdemDiagEntriesSize(&b, limit, &summarised);
		if (summarised)
			flags |= DIAG_SUMMARISED;
	}

	initStringInfo(&out);
	appendStringInfoSpaces(&out, VARHDRSZ);
	appendStringInfoChar(&out, IDEM_DIAG_VERSION);
	appendBinaryStringInfo(&out, (const char *) tag, IDEM_DIAG_MAC_LEN);
	appendStringInfoChar(&out, (char) flags);
	if (method != NULL)
	{
		IdemDiagSha(sha, key, "m", 1, method, strlen(method), h);
		appendBinaryStringInfo(&out, (const char *) h, IDEM_DIAG_MAC_LEN);
	}
	if (path != NULL)
	{
		IdemDiagSha(sha, key, "p", 1, path, strlen(path), h);
		appendBinaryStringInfo(&out, (const char *) h, IDEM_DIAG_MAC_LEN);
	}
	for (int i = 0; body != NULL && i < b.nnodes;)
	{
		const DiagNode *n = &b.nodes[i];
		bool		listed = DIAG_KIND(n->flags) &&
			(n->nchildren == 0 || (n->listable && n->depth < limit));

		appendStringInfoChar(&out, (char) n->depth);
		appendStringInfoChar(&out, (char) (n->flags | (listed ? DIAG_LISTED : 0)));
		if (n->depth > 0 && !(n->flags & DIAG_ELEMENT))
		{
			if (n->namelen < 0x80)
				appendStringInfoChar(&out, (char) n->namelen);
			else
			{
				appendStringInfoChar(&out, (char) (0x80 | (n->namelen >> 8)));
				appendStringInfoChar(&out, (char) (n->namelen & 0xFF));
			}
			appendBinaryStringInfo(&out, n->name, n->namelen);
		}
		appendBinaryStringInfo(&out, (const char *) n->hash, IDEM_DIAG_MAC_LEN);
		i = listed ? i + 1 : n->end;
	}
	pg_cryptohash_free(sha);

	result = (bytea *) out.data;
	SET_VARSIZE(result, out.len);
	return result;
}

/* ----------------------------------------------------------------
 *		reading a digest
 * ----------------------------------------------------------------
 */

typedef struct DiagEntry
{
	int			depth;
	uint8		flags;
	const char *name;
	int			namelen;
	const uint8 *mac;
	int			first_child;	/* -1: none */
	int			next_sibling;	/* -1: none */
	int			nchildren;
} DiagEntry;

typedef struct DiagParsed
{
	const uint8 *tag;
	uint8		flags;
	const uint8 *method_mac;
	const uint8 *path_mac;
	DiagEntry  *e;
	int			n;
} DiagParsed;

/*
 * A member name as a digest holds it (canonical, without quotes) that a
 * JSON Pointer can be made of: no NUL byte, escapes that undo to a
 * character other than NUL or a lone surrogate, and valid UTF-8 once they
 * are undone.  A digest made here never holds another; a forged one might.
 */
static bool
IdemDiagNameValid(const char *name, int len)
{
	StringInfoData buf;
	bool		valid = true;

	if (memchr(name, '\\', len) == NULL)
		return memchr(name, '\0', len) == NULL &&
			pg_verify_mbstr(PG_UTF8, name, len, true);
	initStringInfo(&buf);
	for (const char *p = name, *end = name + len; valid && p < end; p++)
	{
		if (*p == '\0')
			valid = false;
		else if (*p != '\\')
			appendStringInfoChar(&buf, *p);
		else
			valid = IdemJsonUnescape(&p, end, &buf);
	}
	valid = valid && memchr(buf.data, '\0', buf.len) == NULL &&
		pg_verify_mbstr(PG_UTF8, buf.data, buf.len, true);
	pfree(buf.data);
	return valid;
}

/* Read a digest; false when it is malformed. */
static bool
IdemDiagRead(const bytea *digest, DiagParsed *p)
{
	const uint8 *s = (const uint8 *) VARDATA_ANY(digest);
	int			len = VARSIZE_ANY_EXHDR(digest);
	int			pos;
	int			parent[256];
	int			last_at[256];
	int			max = 0;

	memset(p, 0, sizeof(*p));
	if (len < IDEM_DIAG_HEADER_LEN || s[0] != IDEM_DIAG_VERSION ||
		(s[9] & ~(DIAG_HAS_METHOD | DIAG_HAS_PATH | DIAG_HAS_BODY | DIAG_SUMMARISED)) != 0)
		return false;
	p->tag = s + 1;
	p->flags = s[9];
	pos = IDEM_DIAG_HEADER_LEN;
	if (p->flags & DIAG_HAS_METHOD)
	{
		if (pos + IDEM_DIAG_MAC_LEN > len)
			return false;
		p->method_mac = s + pos;
		pos += IDEM_DIAG_MAC_LEN;
	}
	if (p->flags & DIAG_HAS_PATH)
	{
		if (pos + IDEM_DIAG_MAC_LEN > len)
			return false;
		p->path_mac = s + pos;
		pos += IDEM_DIAG_MAC_LEN;
	}
	if (!(p->flags & DIAG_HAS_BODY))
		return pos == len;

	while (pos < len)
	{
		DiagEntry  *e;
		int			depth = s[pos];
		uint8		flags;

		if (pos + 2 > len)
			return false;
		flags = s[pos + 1];
		if ((flags & ~(DIAG_LISTED | DIAG_ELEMENT | DIAG_OBJECT | DIAG_ARRAY)) != 0 ||
			DIAG_KIND(flags) == (DIAG_OBJECT | DIAG_ARRAY) ||
			((flags & DIAG_LISTED) && DIAG_KIND(flags) == 0))
			return false;
		/*
		 * the root first and once; then members of a listed container, as
		 * deep and as many as a digest made here can have (which also
		 * bounds the comparison's work)
		 */
		if ((p->n == 0) != (depth == 0) || depth > IDEM_DIAG_MAX_DEPTH)
			return false;
		if (depth > 0)
		{
			const DiagEntry *par;

			if (depth > p->e[p->n - 1].depth + 1)
				return false;
			par = &p->e[parent[depth - 1]];
			if (!(par->flags & DIAG_LISTED) ||
				((flags & DIAG_ELEMENT) != 0) != ((par->flags & DIAG_ARRAY) != 0))
				return false;
		}
		else if (flags & DIAG_ELEMENT)
			return false;
		if (p->n == max)
		{
			max = max ? max * 2 : 16;
			p->e = p->e ? repalloc(p->e, sizeof(DiagEntry) * max) :
				palloc(sizeof(DiagEntry) * max);
		}
		e = &p->e[p->n];
		e->depth = depth;
		e->flags = flags;
		e->name = NULL;
		e->namelen = 0;
		e->first_child = -1;
		e->next_sibling = -1;
		e->nchildren = 0;
		pos += 2;
		if (depth > 0 && !(flags & DIAG_ELEMENT))
		{
			int			namelen;

			if (pos >= len)
				return false;
			if (s[pos] < 0x80)
				namelen = s[pos++];
			else
			{
				if (pos + 2 > len)
					return false;
				namelen = ((s[pos] & 0x7F) << 8) | s[pos + 1];
				pos += 2;
			}
			if (pos + namelen > len ||
				!IdemDiagNameValid((const char *) s + pos, namelen))
				return false;
			e->name = (const char *) s + pos;
			e->namelen = namelen;
			pos += namelen;
		}
		if (pos + IDEM_DIAG_MAC_LEN > len)
			return false;
		e->mac = s + pos;
		pos += IDEM_DIAG_MAC_LEN;

		/* link it to its parent and previous sibling */
		if (depth > 0)
		{
			DiagEntry  *par = &p->e[parent[depth - 1]];

			if (par->nchildren == IDEM_DIAG_MAX_MEMBERS)
				return false;
			if (par->nchildren == 0)
				par->first_child = p->n;
			else
				p->e[last_at[depth]].next_sibling = p->n;
			par->nchildren++;
		}
		parent[depth] = p->n;
		last_at[depth] = p->n;
		p->n++;
	}
	return p->n > 0;
}

void
IdemDiagnosticsCheck(const IdemScope *scope, const bytea *digest)
{
	DiagParsed	p;
	uint8		key[PG_SHA256_DIGEST_LENGTH];
	uint8		tag[IDEM_DIAG_MAC_LEN];

	if (VARSIZE_ANY_EXHDR(digest) > IDEM_DIAG_HARD_MAX_BYTES ||
		!IdemDiagRead(digest, &p))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 errmsg("request digest is malformed"),
				 errhint("Pass what idem_request_digest returns, or NULL.")));
	IdemDiagScopeKey(scope, key, tag);
	if (memcmp(tag, p.tag, IDEM_DIAG_MAC_LEN) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 errmsg("request digest was not made for this idempotency key"),
				 errdetail("It was made for another tenant, endpoint or key, or under another diagnostics secret."),
				 errhint("Compute the digest with the claim's own tenant, endpoint and key.")));
	if (p.e)
		pfree(p.e);
}

/* ----------------------------------------------------------------
 *		comparing two digests
 * ----------------------------------------------------------------
 */

typedef struct DiagCompare
{
	const DiagParsed *a;		/* stored: the first request */
	const DiagParsed *b;		/* given: the reused key's request */
	const IdemDiagRedaction *redact;	/* never named; or NULL */
	List	   *changed;		/* JSON Pointers, in the database encoding */
	List	   *added;
	List	   *removed;
	bool		truncated;
} DiagCompare;

/* Append a reference token to a JSON Pointer: a canonical name, or an index. */
static void
IdemDiagAppendToken(StringInfo ptr, const DiagEntry *e, int index)
{
	StringInfoData name;

	appendStringInfoChar(ptr, '/');
	if (e->flags & DIAG_ELEMENT)
	{
		appendStringInfo(ptr, "%d", index);
		return;
	}
	/* the name's canonical escapes undone, then escaped as RFC 6901 wants */
	initStringInfo(&name);
	for (const char *p = e->name, *end = e->name + e->namelen; p < end; p++)
	{
		if (*p != '\\' || !IdemJsonUnescape(&p, end, &name))
			appendStringInfoChar(&name, *p);
	}
	for (int i = 0; i < name.len; i++)
	{
		if (name.data[i] == '~')
			appendBinaryStringInfo(ptr, "~0", 2);
		else if (name.data[i] == '/')
			appendBinaryStringInfo(ptr, "~1", 2);
		else
			appendStringInfoChar(ptr, name.data[i]);
	}
	pfree(name.data);
}

static void
IdemDiagPush(List **list, StringInfo ptr)
{
	char	   *s = pg_any_to_server(ptr->data, ptr->len, PG_UTF8);

	*list = lappend(*list, s == ptr->data ? pstrdup(s) : s);
}

#define DIAG_REDACT_NONE	0
#define DIAG_REDACT_ABOVE	1	/* a redacted member lies below it */
#define DIAG_REDACT_UNDER	2	/* at or under a redacted pointer */

/*
 * Where the member at ptr (RFC 6901, UTF-8) stands to the redacted
 * pointers: compared token by token, "*" in a redacted pointer matching
 * any one token.
 */
static int
IdemDiagRedactedAt(const IdemDiagRedaction *r, const char *ptr, int len)
{
	int			result = DIAG_REDACT_NONE;

	for (int i = 0; r != NULL && i < r->n; i++)
	{
		const char *a = ptr;
		const char *aend = ptr + len;
		const char *b = r->pointers[i];
		const char *bend = b + strlen(b);

		for (;;)
		{
			const char *ta;
			const char *tb;

			if (b >= bend)
				return DIAG_REDACT_UNDER;
			if (a >= aend)
			{
				result = DIAG_REDACT_ABOVE;
				break;
			}
			/* both at a "/" */
			ta = memchr(a + 1, '/', aend - a - 1);
			tb = memchr(b + 1, '/', bend - b - 1);
			if (ta == NULL)
				ta = aend;
			if (tb == NULL)
				tb = bend;
			if (!(tb - b == 2 && b[1] == '*') &&
				(ta - a != tb - b || memcmp(a, b, ta - a) != 0))
				break;
			a = ta;
			b = tb;
		}
	}
	return result;
}

/* Push ptr onto list unless it is at or under a redacted pointer. */
static void
IdemDiagPushNamed(DiagCompare *c, List **list, StringInfo ptr)
{
	if (IdemDiagRedactedAt(c->redact, ptr->data, ptr->len) != DIAG_REDACT_UNDER)
		IdemDiagPush(list, ptr);
}

static void
IdemDiagCompareNodes(DiagCompare *c, int ia, int ib, StringInfo ptr)
{
	const DiagEntry *a = &c->a->e[ia];
	const DiagEntry *b = &c->b->e[ib];
	int			base = ptr->len;
	int			redacted = IdemDiagRedactedAt(c->redact, ptr->data, ptr->len);

	check_stack_depth();
	CHECK_FOR_INTERRUPTS();
	if (redacted == DIAG_REDACT_UNDER ||
		memcmp(a->mac, b->mac, IDEM_DIAG_MAC_LEN) == 0)
		return;
	if (!(a->flags & DIAG_LISTED) || !(b->flags & DIAG_LISTED) ||
		DIAG_KIND(a->flags) != DIAG_KIND(b->flags))
	{
		/*
		 * not listed on both sides: the difference may be in a redacted
		 * member below, and naming this one would tell whether it is
		 */
		if (redacted == DIAG_REDACT_ABOVE)
			return;
		IdemDiagPush(&c->changed, ptr);
		if (DIAG_KIND(a->flags) != 0 && DIAG_KIND(a->flags) == DIAG_KIND(b->flags))
			c->truncated = true;	/* somewhere inside a summarised member */
		return;
	}
	if (DIAG_KIND(a->flags) == DIAG_ARRAY)
	{
		int			ca = a->first_child;
		int			cb = b->first_child;
		int			index = 0;

		for (; ca >= 0 || cb >= 0; index++)
		{
			if (ca >= 0 && cb >= 0)
			{
				IdemDiagAppendToken(ptr, &c->a->e[ca], index);
				IdemDiagCompareNodes(c, ca, cb, ptr);
			}
			else if (ca >= 0)
			{
				IdemDiagAppendToken(ptr, &c->a->e[ca], index);
				IdemDiagPushNamed(c, &c->removed, ptr);
			}
			else
			{
				IdemDiagAppendToken(ptr, &c->b->e[cb], index);
				IdemDiagPushNamed(c, &c->added, ptr);
			}
			ptr->len = base;
			ptr->data[base] = '\0';
			if (ca >= 0)
				ca = c->a->e[ca].next_sibling;
			if (cb >= 0)
				cb = c->b->e[cb].next_sibling;
		}
	}
	else
	{
		bool	   *matched = palloc0(sizeof(bool) * (b->nchildren + 1));
		int			ca;
		int			cb;
		int			k;

		for (ca = a->first_child; ca >= 0; ca = c->a->e[ca].next_sibling)
		{
			const DiagEntry *ea = &c->a->e[ca];

			for (cb = b->first_child, k = 0; cb >= 0; cb = c->b->e[cb].next_sibling, k++)
			{
				const DiagEntry *eb = &c->b->e[cb];

				if (!matched[k] && ea->namelen == eb->namelen &&
					memcmp(ea->name, eb->name, ea->namelen) == 0)
					break;
			}
			IdemDiagAppendToken(ptr, ea, 0);
			if (cb >= 0)
			{
				matched[k] = true;
				IdemDiagCompareNodes(c, ca, cb, ptr);
			}
			else
				IdemDiagPushNamed(c, &c->removed, ptr);
			ptr->len = base;
			ptr->data[base] = '\0';
		}
		for (cb = b->first_child, k = 0; cb >= 0; cb = c->b->e[cb].next_sibling, k++)
		{
			if (matched[k])
				continue;
			IdemDiagAppendToken(ptr, &c->b->e[cb], 0);
			IdemDiagPushNamed(c, &c->added, ptr);
			ptr->len = base;
			ptr->data[base] = '\0';
		}
		pfree(matched);
	}
}

static void
IdemDiagPutKey(JsonbParseState **state, const char *key)
{
	JsonbValue	v;

	v.type = jbvString;
	v.val.string.val = (char *) key;
	v.val.string.len = strlen(key);
	(void) pushJsonbValue(state, WJB_KEY, &v);
}

static void
IdemDiagPutList(JsonbParseState **state, const char *key, List *list)
{
	ListCell   *lc;

	IdemDiagPutKey(state, key);
	(void) pushJsonbValue(state, WJB_BEGIN_ARRAY, NULL);
	foreach(lc, list)
	{
		JsonbValue	v;

		v.type = jbvString;
		v.val.string.val = lfirst(lc);
		v.val.string.len = strlen(lfirst(lc));
		(void) pushJsonbValue(state, WJB_ELEM, &v);
	}
	(void) pushJsonbValue(state, WJB_END_ARRAY, NULL);
}

/* true, false or null (not given on both sides) */
static void
IdemDiagPutSame(JsonbParseState **state, const char *key,
				const uint8 *a, const uint8 *b)
{
	JsonbValue	v;

	IdemDiagPutKey(state, key);
	if (a == NULL || b == NULL)
		v.type = jbvNull;
	else
	{
		v.type = jbvBool;
		v.val.boolean = memcmp(a, b, IDEM_DIAG_MAC_LEN) != 0;
	}
	(void) pushJsonbValue(state, WJB_VALUE, &v);
}

IdemDiagRedaction *
IdemDiagRedactionCopy(const IdemDiagRedaction *r)
{
	IdemDiagRedaction *copy;

	if (r == NULL || r->n == 0)
		return NULL;
	copy = palloc(sizeof(IdemDiagRedaction));
	copy->n = r->n;
	copy->pointers = palloc(sizeof(char *) * r->n);
	for (int i = 0; i < r->n; i++)
		copy->pointers[i] = pstrdup(r->pointers[i]);
	return copy;
}

Jsonb *
IdemDiagnose(const bytea *stored, const bytea *given,
			 const IdemDiagRedaction *redact)
{
	DiagParsed	a;
	DiagParsed	b;
	DiagCompare c;
	JsonbParseState *state = NULL;
	JsonbValue	v;
	StringInfoData ptr;

	if (!IdemDiagRead(stored, &a) || !IdemDiagRead(given, &b) ||
		memcmp(a.tag, b.tag, IDEM_DIAG_MAC_LEN) != 0)
		return NULL;

	memset(&c, 0, sizeof(c));
	c.a = &a;
	c.b = &b;
	c.redact = redact;
	initStringInfo(&ptr);
	if ((a.flags & DIAG_HAS_BODY) && (b.flags & DIAG_HAS_BODY))
		IdemDiagCompareNodes(&c, 0, 0, &ptr);
	else if ((a.flags & DIAG_HAS_BODY) != (b.flags & DIAG_HAS_BODY))
		IdemDiagPush(&c.changed, &ptr);	/* "": the whole body */

	(void) pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	IdemDiagPutList(&state, "changed", c.changed);
	IdemDiagPutList(&state, "added", c.added);
	IdemDiagPutList(&state, "removed", c.removed);
	IdemDiagPutSame(&state, "method", a.method_mac, b.method_mac);
	IdemDiagPutSame(&state, "path", a.path_mac, b.path_mac);
	IdemDiagPutKey(&state, "truncated");
	v.type = jbvBool;
	v.val.boolean = c.truncated;
	(void) pushJsonbValue(&state, WJB_VALUE, &v);
	return JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, NULL));
}

/* ----------------------------------------------------------------
 *		idem_request_digest
 * ----------------------------------------------------------------
 */

PG_FUNCTION_INFO_V1(idem_request_digest);

/*
 * idem_request_digest(tenant, endpoint, key, body jsonb, method text,
 *					   path text, exclude text[]) RETURNS bytea
 *		The digest to pass to idem_claim; NULL when the endpoint keeps no
 *		diagnostics.  A NULL body is a request without one; method, path
 *		and exclude are optional.
 */
Datum
idem_request_digest(PG_FUNCTION_ARGS)
{
	IdemScope	scope;
	IdemExclusions *ex = NULL;
	char	   *method = NULL;

	IdemGetScope(fcinfo, &scope, false);
	if (!IdemGetEndpointPolicy(scope.endpoint_str)->diagnostics)
		PG_RETURN_NULL();
	if (!PG_ARGISNULL(6))
		ex = IdemParseExclusions(PG_GETARG_ARRAYTYPE_P(6));
	if (!PG_ARGISNULL(4))
	{
		method = text_to_cstring(PG_GETARG_TEXT_PP(4));
		for (char *m = method; *m; m++)
			if (*m >= 'a' && *m <= 'z')
				*m -= 'a' - 'A';
	}
	PG_RETURN_BYTEA_P(IdemRequestDigest(&scope,
										PG_ARGISNULL(3) ? NULL : PG_GETARG_JSONB_P(3),
										method,
										PG_ARGISNULL(5) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(5)),
										ex));
}
