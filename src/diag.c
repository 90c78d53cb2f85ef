/*-------------------------------------------------------------------------
 *
 * diag.c
 *	  Mismatch diagnostics: request digests, made (idem_request_digest)
 *	  and read (a claim checks the one it is given).  The comparison of
 *	  two is in diag_compare.c, the keys in diag_secret.c, the format in
 *	  diag_int.h.
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
 *	  The hashes are keyed with a key of the scope (diag_secret.c), so that
 *	  the same body gives unrelated digests under two keys, and whoever
 *	  reads a stored digest without the secret cannot test guesses of a
 *	  value (an amount) against it.
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
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/cryptohash.h"
#include "common/sha2.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

#include "canonical_json.h"
#include "diag.h"
#include "diag_int.h"
#include "endpoint.h"
#include "guc.h"
#include "scope.h"
#include "util.h"

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

/* the reading of a digest's entries */
typedef struct DiagReader
{
	const uint8 *s;
	int			len;
	int			pos;
	int			max;			/* entries allocated */
	int			parent[256];	/* the last entry read at each depth */
	int			last_at[256];
} DiagReader;

/* Read the header of a digest into p; the offset of its entries, -1 if malformed. */
static int
IdemDiagReadHeader(const uint8 *s, int len, DiagParsed *p)
{
	int			pos;

	if (len < IDEM_DIAG_HEADER_LEN || s[0] != IDEM_DIAG_VERSION ||
		(s[9] & ~(DIAG_HAS_METHOD | DIAG_HAS_PATH | DIAG_HAS_BODY | DIAG_SUMMARISED)) != 0)
		return -1;
	p->tag = s + 1;
	p->flags = s[9];
	pos = IDEM_DIAG_HEADER_LEN;
	if (p->flags & DIAG_HAS_METHOD)
	{
		if (pos + IDEM_DIAG_MAC_LEN > len)
			return -1;
		p->method_mac = s + pos;
		pos += IDEM_DIAG_MAC_LEN;
	}
	if (p->flags & DIAG_HAS_PATH)
	{
		if (pos + IDEM_DIAG_MAC_LEN > len)
			return -1;
		p->path_mac = s + pos;
		pos += IDEM_DIAG_MAC_LEN;
	}
	return pos;
}

/* Whether an entry of this depth and flags may come next in the digest. */
static bool
IdemDiagEntryFits(const DiagReader *r, const DiagParsed *p, int depth, uint8 flags)
{
	if ((flags & ~(DIAG_LISTED | DIAG_ELEMENT | DIAG_OBJECT | DIAG_ARRAY)) != 0 ||
		DIAG_KIND(flags) == (DIAG_OBJECT | DIAG_ARRAY) ||
		((flags & DIAG_LISTED) && DIAG_KIND(flags) == 0))
		return false;

	/*
	 * the root first and once; then members of a listed container, as deep
	 * and as many as a digest made here can have (which also bounds the
	 * comparison's work)
	 */
	if ((p->n == 0) != (depth == 0) || depth > IDEM_DIAG_MAX_DEPTH)
		return false;
	if (depth > 0)
	{
		const DiagEntry *par;

		if (depth > p->e[p->n - 1].depth + 1)
			return false;
		par = &p->e[r->parent[depth - 1]];
		if (!(par->flags & DIAG_LISTED) ||
			((flags & DIAG_ELEMENT) != 0) != ((par->flags & DIAG_ARRAY) != 0))
			return false;
	}
	else if (flags & DIAG_ELEMENT)
		return false;
	return true;
}

/* Read the name (of an object's member) and the hash of e; false if malformed. */
static bool
IdemDiagReadNameHash(DiagReader *r, DiagEntry *e)
{
	const uint8 *s = r->s;

	if (e->depth > 0 && !(e->flags & DIAG_ELEMENT))
	{
		int			namelen;

		if (r->pos >= r->len)
			return false;
		if (s[r->pos] < 0x80)
			namelen = s[r->pos++];
		else
		{
			if (r->pos + 2 > r->len)
				return false;
			namelen = ((s[r->pos] & 0x7F) << 8) | s[r->pos + 1];
			r->pos += 2;
		}
		if (r->pos + namelen > r->len ||
			!IdemDiagNameValid((const char *) s + r->pos, namelen))
			return false;
		e->name = (const char *) s + r->pos;
		e->namelen = namelen;
		r->pos += namelen;
	}
	if (r->pos + IDEM_DIAG_MAC_LEN > r->len)
		return false;
	e->mac = s + r->pos;
	r->pos += IDEM_DIAG_MAC_LEN;
	return true;
}

/* Read the entry at r->pos into p, linked to its parent; false if malformed. */
static bool
IdemDiagReadEntry(DiagReader *r, DiagParsed *p)
{
	DiagEntry  *e;
	int			depth = r->s[r->pos];
	uint8		flags;

	if (r->pos + 2 > r->len)
		return false;
	flags = r->s[r->pos + 1];
	if (!IdemDiagEntryFits(r, p, depth, flags))
		return false;
	if (p->n == r->max)
	{
		r->max = r->max ? r->max * 2 : 16;
		p->e = p->e ? repalloc(p->e, sizeof(DiagEntry) * r->max) :
			palloc(sizeof(DiagEntry) * r->max);
	}
	e = &p->e[p->n];
	e->depth = depth;
	e->flags = flags;
	e->name = NULL;
	e->namelen = 0;
	e->first_child = -1;
	e->next_sibling = -1;
	e->nchildren = 0;
	r->pos += 2;
	if (!IdemDiagReadNameHash(r, e))
		return false;

	/* link it to its parent and previous sibling */
	if (depth > 0)
	{
		DiagEntry  *par = &p->e[r->parent[depth - 1]];

		if (par->nchildren == IDEM_DIAG_MAX_MEMBERS)
			return false;
		if (par->nchildren == 0)
			par->first_child = p->n;
		else
			p->e[r->last_at[depth]].next_sibling = p->n;
		par->nchildren++;
	}
	r->parent[depth] = p->n;
	r->last_at[depth] = p->n;
	p->n++;
	return true;
}

bool
IdemDiagRead(const bytea *digest, DiagParsed *p)
{
	DiagReader	r;

	memset(p, 0, sizeof(*p));
	r.s = (const uint8 *) VARDATA_ANY(digest);
	r.len = VARSIZE_ANY_EXHDR(digest);
	r.max = 0;
	r.pos = IdemDiagReadHeader(r.s, r.len, p);
	if (r.pos < 0)
		return false;
	if (!(p->flags & DIAG_HAS_BODY))
		return r.pos == r.len;
	while (r.pos < r.len)
		if (!IdemDiagReadEntry(&r, p))
			return false;
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
