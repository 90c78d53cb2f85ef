/*-------------------------------------------------------------------------
 *
 * canonical_json.c
 *	  RFC 8785 serialization of jsonb: members sorted by their names' UTF-16
 *	  code units, numbers through the IEEE-754 double in ECMAScript form
 *	  (number_format.c), strings with JSON.stringify's minimal escaping, no
 *	  white space.  The jsonb binary container is walked directly, in one
 *	  pass, without building JsonbValue trees; each object's members are
 *	  sorted once (jsonb keeps them ordered by length first, which is not
 *	  the RFC's order).
 *
 *	  Members and array elements named by JSON Pointers (RFC 6901, with "*"
 *	  for any member or element) are dropped on the way.
 *
 *	  Raw JSON text takes a fast path when it can: a recursive-descent scan
 *	  of the UTF-8 text writes the canonical form directly, in one pass.
 *	  Each object's "name":value pairs are written in the text's order, then
 *	  sorted with the same ordering as above (which also finds duplicate
 *	  names) and moved into place; numbers go through number_format.c,
 *	  strings through IdemEmitString.  The scan only tries: on anything it
 *	  does not take (invalid JSON, duplicate names, \u0000 or lone
 *	  surrogates, numbers beyond a double or numeric's bounds, deep
 *	  nesting, long text, a database not in UTF-8) it gives up, writing and
 *	  hashing nothing, and the text goes the slow way: through jsonb, which
 *	  gives the same bytes and raises the errors, then checked for
 *	  duplicate member names (which jsonb silently collapsed).
 *
 *	  The same scan builds jsonb from raw JSON text (replays of stored JSON
 *	  bodies), with pushJsonbValue as jsonb_in does, and gives up in the
 *	  same way, leaving the text to jsonb_in.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "catalog/pg_type.h"
#include "common/jsonapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonfuncs.h"
#include "utils/numeric.h"

#include "canonical_json.h"
#include "compat.h"
#include "number_format.h"

/* bytes are handed to the hash sink once the buffer holds this many */
#define SINK_CHUNK 65536

/* ---------- JSON Pointers ---------- */

typedef struct PointerToken
{
	char	   *name;			/* unescaped reference token */
	int			len;
	bool		star;			/* "*": any member or element */
	int			index;			/* array index, or -1 if not one */
} PointerToken;

typedef struct JsonPointer
{
	int			ntokens;
	PointerToken *tokens;
} JsonPointer;

struct IdemExclusions
{
	int			npointers;
	JsonPointer *pointers;
};

/* an error, or (soft) just false */
static bool
IdemBadPointer(const char *ptr, const char *detail, bool soft)
{
	if (!soft)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid JSON pointer \"%s\" in exclusion list", ptr),
				 errdetail("%s", detail),
				 errhint("Write RFC 6901 pointers such as \"/meta/trace_id\" or \"/items/*/added_at\", with \"~0\" for \"~\" and \"~1\" for \"/\".")));
	return false;
}

static bool
IdemParsePointer(const char *ptr, JsonPointer *result, bool soft)
{
	int			ntokens = 0;
	const char *p;

	if (ptr[0] == '\0')
		return IdemBadPointer(ptr, "The empty pointer names the whole document, which cannot be excluded.", soft);
	if (ptr[0] != '/')
		return IdemBadPointer(ptr, "A JSON pointer must start with \"/\".", soft);

	for (p = ptr; *p; p++)
		if (*p == '/')
			ntokens++;
	result->ntokens = ntokens;
	result->tokens = palloc(sizeof(PointerToken) * ntokens);

	p = ptr + 1;
	for (int t = 0; t < ntokens; t++)
	{
		PointerToken *tok = &result->tokens[t];
		StringInfoData buf;

		initStringInfo(&buf);
		for (; *p && *p != '/'; p++)
		{
			if (*p == '~')
			{
				if (p[1] == '0')
					appendStringInfoChar(&buf, '~');
				else if (p[1] == '1')
					appendStringInfoChar(&buf, '/');
				else
					return IdemBadPointer(ptr, "\"~\" must be followed by \"0\" or \"1\".", soft);
				p++;
			}
			else
				appendStringInfoChar(&buf, *p);
		}
		if (*p == '/')
			p++;
		tok->name = buf.data;
		tok->len = buf.len;
		tok->star = (buf.len == 1 && buf.data[0] == '*');
		tok->index = -1;
		/* RFC 6901 array index: "0" or digits without a leading zero */
		if (buf.len > 0 && buf.len <= 9 &&
			(buf.len == 1 || buf.data[0] != '0'))
		{
			int			v = 0;
			int			i;

			for (i = 0; i < buf.len && buf.data[i] >= '0' && buf.data[i] <= '9'; i++)
				v = v * 10 + (buf.data[i] - '0');
			if (i == buf.len)
				tok->index = v;
		}
	}
	return true;
}

/* IdemParseExclusions into *result; soft: false instead of its errors */
static bool
IdemParseExclusionList(ArrayType *pointers, bool soft, IdemExclusions **result)
{
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;
	IdemExclusions *ex;

	*result = NULL;
	if (pointers == NULL)
		return true;
	deconstruct_array(pointers, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, &nelems);
	if (nelems == 0)
		return true;

	ex = palloc(sizeof(IdemExclusions));
	ex->npointers = nelems;
	ex->pointers = palloc(sizeof(JsonPointer) * nelems);
	for (int i = 0; i < nelems; i++)
	{
		if (nulls[i])
		{
			if (soft)
				return false;
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("exclusion list must not contain NULL elements")));
		}
		if (!IdemParsePointer(TextDatumGetCString(elems[i]), &ex->pointers[i],
							  soft))
			return false;
	}
	*result = ex;
	return true;
}

IdemExclusions *
IdemParseExclusions(ArrayType *pointers)
{
	IdemExclusions *ex;

	(void) IdemParseExclusionList(pointers, false, &ex);
	return ex;
}

bool
IdemTryParseExclusions(ArrayType *pointers, IdemExclusions **ex)
{
	return IdemParseExclusionList(pointers, true, ex);
}

/* ---------- serialization ---------- */

/* objects with at most this many members reuse the previous one's order */
#define ORDER_CACHE_MAX 32

typedef struct CanonState
{
	StringInfo	out;
	pg_cryptohash_ctx *sink;
	const IdemExclusions *ex;
	bool		convert;		/* database encoding is not UTF-8 */
	bool		ascii_only;		/* SQL_ASCII: bytes above 0x7F are refused */

	/*
	 * Member names (in jsonb order) of the last object sorted, and their
	 * sorted order: arrays of similar objects sort only once.
	 */
	int			cache_n;
	const char *cache_key[ORDER_CACHE_MAX];
	int			cache_len[ORDER_CACHE_MAX];
	uint8		cache_order[ORDER_CACHE_MAX];

	/*
	 * Member arrays, one per nesting depth, reused by sibling objects: no
	 * allocation per object, and small stack frames for deep documents.
	 */
	struct Member **level_buf;
	int		   *level_cap;
	int			nlevels;
} CanonState;

/* a child of a jsonb container, located */
typedef struct ChildRef
{
	JEntry		entry;
	const char *base;			/* the container's data area */
	uint32		start;			/* offsets of its bytes in that area; */
	uint32		end;			/* numerics and containers are aligned */
} ChildRef;

typedef struct Member
{
	const char *key;			/* UTF-8 */
	int			keylen;
	ChildRef	value;			/* jsonb: the value */
	int			out_start;		/* text: "name":value in the output, */
	int			out_end;		/* out_start -1 when excluded */
	int		   *active;			/* pointers still matching below it */
	int			nactive;
} Member;

static void IdemEmitValue(CanonState *st, const ChildRef *ref, int depth,
						  const int *active, int nactive);

/* hand the buffered bytes to the hash sink */
static void
IdemFeedSink(CanonState *st)
{
	if (pg_cryptohash_update(st->sink, (uint8 *) st->out->data,
							 st->out->len) < 0)
		elog(ERROR, "could not update SHA-256 context: %s",
			 pg_cryptohash_error(st->sink));
	resetStringInfo(st->out);
}

static void
IdemMaybeFlush(CanonState *st)
{
	CHECK_FOR_INTERRUPTS();
	if (st->sink && st->out->len >= SINK_CHUNK)
		IdemFeedSink(st);
}

/*
 * A SQL_ASCII database does not say which characters bytes above 0x7F
 * stand for, so text holding them has no UTF-8 form: refuse it.
 */
static void
IdemRequireAscii(const char *s, int len)
{
	for (int i = 0; i < len; i++)
		if ((unsigned char) s[i] > 0x7F)
			ereport(ERROR,
					(errcode(ERRCODE_CHARACTER_NOT_IN_REPERTOIRE),
					 errmsg("non-ASCII characters cannot be canonicalized in a SQL_ASCII database"),
					 errdetail("A SQL_ASCII database does not say which characters bytes above 0x7F stand for, so they have no UTF-8 form."),
					 errhint("Use a database whose encoding is UTF8 (or another encoding than SQL_ASCII).")));
}

void
IdemRequireAsciiInSqlAscii(const char *s, int len)
{
	if (GetDatabaseEncoding() == PG_SQL_ASCII)
		IdemRequireAscii(s, len);
}

/* text in the database encoding as UTF-8 (no-op in UTF-8 databases) */
static const char *
IdemToUtf8(CanonState *st, const char *s, int *len)
{
	const char *r;

	if (st->ascii_only)
		IdemRequireAscii(s, *len);
	if (!st->convert)
		return s;
	r = pg_server_to_any(s, *len, PG_UTF8);
	if (r != s)
		*len = strlen(r);
	return r;
}

/* characters JSON.stringify escapes: controls, quote, backslash */
static const char escape_class[256] = {
	['\b'] = 'b',['\t'] = 't',['\n'] = 'n',['\f'] = 'f',['\r'] = 'r',
	[0x00] = 'u',[0x01] = 'u',[0x02] = 'u',[0x03] = 'u',[0x04] = 'u',
	[0x05] = 'u',[0x06] = 'u',[0x07] = 'u',[0x0b] = 'u',[0x0e] = 'u',
	[0x0f] = 'u',[0x10] = 'u',[0x11] = 'u',[0x12] = 'u',[0x13] = 'u',
	[0x14] = 'u',[0x15] = 'u',[0x16] = 'u',[0x17] = 'u',[0x18] = 'u',
	[0x19] = 'u',[0x1a] = 'u',[0x1b] = 'u',[0x1c] = 'u',[0x1d] = 'u',
	[0x1e] = 'u',[0x1f] = 'u',
	['"'] = '"',['\\'] = '\\',
};

static void
IdemEmitString(CanonState *st, const char *s, int len)
{
	StringInfo	out = st->out;
	int			run = 0;

	s = IdemToUtf8(st, s, &len);
	enlargeStringInfo(out, len + 2);
	out->data[out->len++] = '"';
	for (int i = 0; i < len; i++)
	{
		char		cls = escape_class[(unsigned char) s[i]];

		if (likely(cls == 0))
			continue;
		if (i > run)
			appendBinaryStringInfo(out, s + run, i - run);
		run = i + 1;
		if (cls == 'u')
		{
			static const char hex[] = "0123456789abcdef";
			char		esc[6] = {'\\', 'u', '0', '0', 0, 0};

			esc[4] = hex[((unsigned char) s[i]) >> 4];
			esc[5] = hex[((unsigned char) s[i]) & 0xf];
			appendBinaryStringInfo(out, esc, 6);
		}
		else
		{
			char		esc[2] = {'\\', cls};

			appendBinaryStringInfo(out, esc, 2);
		}
	}
	if (run == 0)
	{
		/* nothing escaped: room was reserved above */
		memcpy(out->data + out->len, s, len);
		out->len += len;
		out->data[out->len++] = '"';
		out->data[out->len] = '\0';
		return;
	}
	if (len > run)
		appendBinaryStringInfo(out, s + run, len - run);
	appendStringInfoCharMacro(out, '"');
}

/*
 * Order of two UTF-8 strings by their UTF-16 code units.  UTF-8 byte order
 * is code point order, which differs from UTF-16 order only between
 * U+E000..U+FFFF (lead bytes EE, EF) and the supplementary planes (lead
 * bytes F0..F4, surrogate pairs D800..DFFF in UTF-16), which sort first in
 * UTF-16.  At the first differing byte, if one is such a lead byte of each
 * kind, the order flips; a differing continuation byte means both
 * characters share their lead byte and hence their kind.
 */
static int
IdemCompareUtf16(const char *a, int alen, const char *b, int blen)
{
	int			n = Min(alen, blen);
	int			i;
	unsigned char ca,
				cb;

	for (i = 0; i < n; i++)
		if (a[i] != b[i])
			break;
	if (i == n)
		return (alen > blen) - (alen < blen);
	ca = (unsigned char) a[i];
	cb = (unsigned char) b[i];
	if (ca >= 0xF0 && (cb == 0xEE || cb == 0xEF))
		return -1;
	if (cb >= 0xF0 && (ca == 0xEE || ca == 0xEF))
		return 1;
	return ca < cb ? -1 : 1;
}

static int
IdemMemberCmp(const void *x, const void *y)
{
	const Member *a = (const Member *) x;
	const Member *b = (const Member *) y;

	return IdemCompareUtf16(a->key, a->keylen, b->key, b->keylen);
}

/*
 * The sorted order of n <= ORDER_CACHE_MAX members into order[]: the cached
 * one when the names are those of the last object sorted, else by
 * insertion sort (which beats qsort's indirect calls on small objects).
 */
static void
IdemOrderMembers(CanonState *st, const Member *members, int n, uint8 *order)
{
	if (n == st->cache_n)
	{
		int			i;

		for (i = 0; i < n; i++)
			if (members[i].keylen != st->cache_len[i] ||
				memcmp(members[i].key, st->cache_key[i], members[i].keylen) != 0)
				break;
		if (i == n)
		{
			memcpy(order, st->cache_order, n);
			return;
		}
	}
	for (int i = 0; i < n; i++)
	{
		int			j = i;

		while (j > 0 &&
			   IdemCompareUtf16(members[order[j - 1]].key, members[order[j - 1]].keylen,
								members[i].key, members[i].keylen) > 0)
		{
			order[j] = order[j - 1];
			j--;
		}
		order[j] = (uint8) i;
	}
	st->cache_n = n;
	for (int i = 0; i < n; i++)
	{
		st->cache_key[i] = members[i].key;
		st->cache_len[i] = members[i].keylen;
	}
	memcpy(st->cache_order, order, n);
}

/* the member array of this depth, with room for n */
static Member *
IdemLevelMembers(CanonState *st, int depth, int n)
{
	if (depth >= st->nlevels)
	{
		int			newn = Max(16, Max(depth + 1, st->nlevels * 2));

		if (st->nlevels == 0)
		{
			st->level_buf = palloc0(sizeof(Member *) * newn);
			st->level_cap = palloc0(sizeof(int) * newn);
		}
		else
		{
			st->level_buf = repalloc(st->level_buf, sizeof(Member *) * newn);
			st->level_cap = repalloc(st->level_cap, sizeof(int) * newn);
			memset(st->level_buf + st->nlevels, 0,
				   sizeof(Member *) * (newn - st->nlevels));
			memset(st->level_cap + st->nlevels, 0,
				   sizeof(int) * (newn - st->nlevels));
		}
		st->nlevels = newn;
	}
	if (st->level_cap[depth] < n)
	{
		int			cap = Max(n, Max(8, st->level_cap[depth] * 2));

		/* kept: the text path grows an object's array member by member */
		if (st->level_buf[depth])
			st->level_buf[depth] = repalloc(st->level_buf[depth],
											sizeof(Member) * cap);
		else
			st->level_buf[depth] = palloc(sizeof(Member) * cap);
		st->level_cap[depth] = cap;
	}
	return st->level_buf[depth];
}

/* end offset of child i given its start */
static inline uint32
IdemChildEnd(JEntry je, uint32 start)
{
	return JBE_HAS_OFF(je) ? JBE_OFFLENFLD(je) : start + JBE_OFFLENFLD(je);
}

/*
 * Which of the active pointers match a member name or element index at
 * this depth: returns true when one of them ends here (drop the child),
 * otherwise fills child[] with those that continue below it.
 */
static bool
IdemMatchPointers(const IdemExclusions *ex, int depth, const int *active,
				  int nactive, const char *key, int keylen, int index,
				  int *child, int *nchild)
{
	*nchild = 0;
	for (int a = 0; a < nactive; a++)
	{
		const JsonPointer *ptr = &ex->pointers[active[a]];
		const PointerToken *tok = &ptr->tokens[depth];
		bool		hit;

		if (tok->star)
			hit = true;
		else if (key)
			hit = tok->len == keylen && memcmp(tok->name, key, keylen) == 0;
		else
			hit = tok->index == index;
		if (!hit)
			continue;
		if (ptr->ntokens == depth + 1)
			return true;
		child[(*nchild)++] = active[a];
	}
	return false;
}

static void
IdemEmitObject(CanonState *st, JsonbContainer *jc, int depth,
			   const int *active, int nactive)
{
	int			n = JsonContainerSize(jc);
	const char *base = (const char *) &jc->children[2 * n];
	Member	   *members = IdemLevelMembers(st, depth, n);
	int		   *activebuf = NULL;
	uint32		start = 0;
	int			kept = 0;
	uint8		order[ORDER_CACHE_MAX];
	StringInfo	out = st->out;

	/* keys are children 0..n-1, their values n..2n-1, bytes in order */
	for (int i = 0; i < n; i++)
	{
		JEntry		je = jc->children[i];
		uint32		end = IdemChildEnd(je, start);

		members[i].key = base + start;
		members[i].keylen = end - start;
		start = end;
	}
	for (int i = 0; i < n; i++)
	{
		JEntry		je = jc->children[n + i];
		uint32		end = IdemChildEnd(je, start);

		members[i].value.entry = je;
		members[i].value.base = base;
		members[i].value.start = start;
		members[i].value.end = end;
		start = end;
	}

	/* drop excluded members, note which pointers go deeper */
	if (nactive > 0)
		activebuf = palloc(sizeof(int) * nactive * n);
	for (int i = 0; i < n; i++)
	{
		Member		m = members[i];

		m.active = NULL;
		m.nactive = 0;
		if (nactive > 0)
		{
			int		   *child = activebuf + kept * nactive;

			if (IdemMatchPointers(st->ex, depth, active, nactive,
								  m.key, m.keylen, -1, child, &m.nactive))
				continue;
			m.active = child;
		}
		m.key = IdemToUtf8(st, m.key, &m.keylen);
		members[kept++] = m;
	}

	if (kept <= ORDER_CACHE_MAX)
		IdemOrderMembers(st, members, kept, order);
	else
	{
		qsort(members, kept, sizeof(Member), IdemMemberCmp);
		/* order[] is not used: members are in order */
	}

	appendStringInfoCharMacro(out, '{');
	for (int i = 0; i < kept; i++)
	{
		const Member *m = &members[kept <= ORDER_CACHE_MAX ? order[i] : i];

		if (i > 0)
			appendStringInfoCharMacro(out, ',');
		/* key already in UTF-8: escape without converting again */
		{
			bool		save = st->convert;

			st->convert = false;
			IdemEmitString(st, m->key, m->keylen);
			st->convert = save;
		}
		appendStringInfoCharMacro(out, ':');
		IdemEmitValue(st, &m->value, depth + 1, m->active, m->nactive);
		IdemMaybeFlush(st);
	}
	appendStringInfoCharMacro(out, '}');

	if (activebuf)
		pfree(activebuf);
}

static void
IdemEmitArray(CanonState *st, JsonbContainer *jc, int depth,
			  const int *active, int nactive)
{
	int			n = JsonContainerSize(jc);
	const char *base = (const char *) &jc->children[n];
	uint32		start = 0;
	bool		first = true;
	int		   *child = nactive > 0 ? palloc(sizeof(int) * nactive) : NULL;
	StringInfo	out = st->out;

	appendStringInfoCharMacro(out, '[');
	for (int i = 0; i < n; i++)
	{
		JEntry		je = jc->children[i];
		uint32		end = IdemChildEnd(je, start);
		ChildRef	ref;
		int			nchild = 0;

		ref.entry = je;
		ref.base = base;
		ref.start = start;
		ref.end = end;
		start = end;
		if (nactive > 0 &&
			IdemMatchPointers(st->ex, depth, active, nactive, NULL, 0, i,
							  child, &nchild))
			continue;
		if (!first)
			appendStringInfoCharMacro(out, ',');
		first = false;
		IdemEmitValue(st, &ref, depth + 1, child, nchild);
		IdemMaybeFlush(st);
	}
	appendStringInfoCharMacro(out, ']');
	if (child)
		pfree(child);
}

static void
IdemEmitValue(CanonState *st, const ChildRef *ref, int depth,
			  const int *active, int nactive)
{
	JEntry		je = ref->entry;

	if (JBE_ISSTRING(je))
		IdemEmitString(st, ref->base + ref->start, ref->end - ref->start);
	else if (JBE_ISNUMERIC(je))
		IdemAppendCanonicalNumeric(st->out,
								   (Numeric) (ref->base + INTALIGN(ref->start)));
	else if (JBE_ISBOOL_TRUE(je))
		appendBinaryStringInfo(st->out, "true", 4);
	else if (JBE_ISBOOL_FALSE(je))
		appendBinaryStringInfo(st->out, "false", 5);
	else if (JBE_ISNULL(je))
		appendBinaryStringInfo(st->out, "null", 4);
	else
	{
		JsonbContainer *jc = (JsonbContainer *) (ref->base + INTALIGN(ref->start));

		check_stack_depth();
		CHECK_FOR_INTERRUPTS();
		if (JsonContainerIsObject(jc))
			IdemEmitObject(st, jc, depth, active, nactive);
		else
			IdemEmitArray(st, jc, depth, active, nactive);
	}
}

static void
IdemCanonInit(CanonState *st, StringInfo out, const IdemExclusions *ex,
			  pg_cryptohash_ctx *sink)
{
	int			encoding = GetDatabaseEncoding();

	st->out = out;
	st->sink = sink;
	st->ex = ex;
	st->convert = (encoding != PG_UTF8 && encoding != PG_SQL_ASCII);
	st->ascii_only = (encoding == PG_SQL_ASCII);
	st->cache_n = -1;
	st->level_buf = NULL;
	st->level_cap = NULL;
	st->nlevels = 0;
}

static void
IdemCanonFree(CanonState *st)
{
	for (int i = 0; i < st->nlevels; i++)
		if (st->level_buf[i])
			pfree(st->level_buf[i]);
	if (st->nlevels > 0)
	{
		pfree(st->level_buf);
		pfree(st->level_cap);
	}
}

/* the pointers active at the root container: all of them */
static int *
IdemRootActive(const IdemExclusions *ex, int *nactive)
{
	int		   *active;

	*nactive = 0;
	if (ex == NULL)
		return NULL;
	*nactive = ex->npointers;
	active = palloc(sizeof(int) * ex->npointers);
	for (int i = 0; i < ex->npointers; i++)
		active[i] = i;
	return active;
}

void
IdemCanonicalizeJsonb(StringInfo out, Jsonb *jb, const IdemExclusions *ex,
					  pg_cryptohash_ctx *sink)
{
	CanonState	st;
	JsonbContainer *root = &jb->root;
	int		   *active;
	int			nactive;

	IdemCanonInit(&st, out, ex, sink);

	if (JsonContainerIsScalar(root))
	{
		/* a bare scalar: a one-element array flagged as scalar */
		ChildRef	ref;

		ref.entry = root->children[0];
		ref.base = (const char *) &root->children[1];
		ref.start = 0;
		ref.end = JBE_OFFLENFLD(ref.entry);
		IdemEmitValue(&st, &ref, 0, NULL, 0);
	}
	else
	{
		active = IdemRootActive(ex, &nactive);
		check_stack_depth();
		if (JsonContainerIsObject(root))
			IdemEmitObject(&st, root, 0, active, nactive);
		else
			IdemEmitArray(&st, root, 0, active, nactive);
	}

	IdemCanonFree(&st);
	if (sink && out->len > 0)
		IdemFeedSink(&st);
}

text *
IdemCanonicalToText(const char *utf8, int len)
{
	int			encoding = GetDatabaseEncoding();

	if (encoding != PG_UTF8 && encoding != PG_SQL_ASCII)
	{
		char	   *conv = pg_any_to_server(utf8, len, PG_UTF8);

		if (conv != utf8)
			return cstring_to_text(conv);
	}
	return cstring_to_text_with_len(utf8, len);
}

/* ---------- raw JSON text, directly ---------- */

/*
 * Bounds of the fast path.  Past them the text goes through jsonb, whose
 * own limits (256 MB containers, numeric's range of scales and weights,
 * the stack check) raise the errors: 4 MB of text stays far from the
 * first, and numbers of at most 512 characters with exponents below 1000
 * from the second.
 */
#define TEXT_MAX_LEN		(4 * 1024 * 1024)
#define TEXT_MAX_DEPTH		64
#define TEXT_MAX_NUMBER		512
#define TEXT_MAX_EXPONENT	999

typedef struct TextScan
{
	CanonState	st;
	const char *p;				/* next byte of the text */
	const char *end;
	StringInfoData scratch;		/* a string with escapes, unescaped */
	StringInfoData tmp;			/* an object's members, being reordered */
} TextScan;

static bool IdemTextValue(TextScan *ts, int depth, const int *active,
						  int nactive);

/* the JSON white space jsonb's parser skips */
static inline void
IdemSkipSpace(TextScan *ts)
{
	while (ts->p < ts->end && (unsigned char) *ts->p <= ' ' &&
		   (*ts->p == ' ' || *ts->p == '\n' || *ts->p == '\r' || *ts->p == '\t'))
		ts->p++;
}

/* room for n more bytes (and the terminator) in out */
static inline void
IdemReserve(StringInfo out, int n)
{
	if (unlikely(out->len + n >= out->maxlen))
		enlargeStringInfo(out, n);
}

/*
 * Bytes that stand for themselves in a string, in the text and in the
 * output: ASCII that IdemEmitString does not escape.
 */
static bool plain_byte[256];
static bool plain_ready = false;

static void
IdemInitPlainBytes(void)
{
	for (int c = 0; c < 0x80; c++)
		plain_byte[c] = (escape_class[c] == 0);
	plain_ready = true;
}

/* a buffer of the scan, allocated on first use, emptied */
static StringInfo
IdemScanBuffer(StringInfo buf)
{
	if (buf->data == NULL)
		initStringInfo(buf);
	else
		resetStringInfo(buf);
	return buf;
}

/* four hex digits at p into *cp */
static bool
IdemHex4(const char *p, const char *end, pg_wchar *cp)
{
	pg_wchar	v = 0;

	if (end - p < 4)
		return false;
	for (int i = 0; i < 4; i++)
	{
		char		c = p[i];

		if (c >= '0' && c <= '9')
			v = (v << 4) | (c - '0');
		else if (c >= 'a' && c <= 'f')
			v = (v << 4) | (c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v = (v << 4) | (c - 'A' + 10);
		else
			return false;
	}
	*cp = v;
	return true;
}

/*
 * The escape after the backslash at *pp, unescaped onto buf; *pp is left on
 * its last byte.  \u0000 and lone surrogates are for jsonb's parser to
 * refuse.
 */
bool
IdemJsonUnescape(const char **pp, const char *end, StringInfo buf)
{
	const char *p = *pp + 1;
	char		c;

	if (p >= end)
		return false;
	switch (*p)
	{
		case '"':
		case '\\':
		case '/':
			c = *p;
			break;
		case 'b':
			c = '\b';
			break;
		case 'f':
			c = '\f';
			break;
		case 'n':
			c = '\n';
			break;
		case 'r':
			c = '\r';
			break;
		case 't':
			c = '\t';
			break;
		case 'u':
			{
				pg_wchar	cp;
				pg_wchar	lo;

				if (!IdemHex4(p + 1, end, &cp))
					return false;
				p += 4;
				if (cp >= 0xD800 && cp <= 0xDBFF)
				{
					/* a high surrogate: its low one must follow */
					if (end - p < 3 || p[1] != '\\' || p[2] != 'u' ||
						!IdemHex4(p + 3, end, &lo) || lo < 0xDC00 || lo > 0xDFFF)
						return false;
					cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
					p += 6;
				}
				else if (cp == 0 || (cp >= 0xDC00 && cp <= 0xDFFF))
					return false;
				enlargeStringInfo(buf, 4);
				unicode_to_utf8(cp, (unsigned char *) buf->data + buf->len);
				buf->len += pg_utf_mblen((unsigned char *) buf->data + buf->len);
				buf->data[buf->len] = '\0';
				*pp = p;
				return true;
			}
		default:
			return false;
	}
	appendStringInfoCharMacro(buf, c);
	*pp = p;
	return true;
}

/*
 * The string whose opening quote is at ts->p: *s and *len its unescaped
 * UTF-8, in the text itself when it has no escapes (*escaped false), else
 * in ts->scratch.  False for what jsonb's parser would refuse (control
 * characters, bad escapes) and for text that is not valid UTF-8.
 */
static bool
IdemTextString(TextScan *ts, const char **s, int *len, bool *escaped)
{
	const char *p = ts->p + 1;
	const char *end = ts->end;
	const char *run = p;
	StringInfo	buf = NULL;

	for (;;)
	{
		unsigned char c;

		while (end - p >= 4 &&
			   plain_byte[(unsigned char) p[0]] &&
			   plain_byte[(unsigned char) p[1]] &&
			   plain_byte[(unsigned char) p[2]] &&
			   plain_byte[(unsigned char) p[3]])
			p += 4;
		while (p < end && plain_byte[(unsigned char) *p])
			p++;
		if (p >= end)
			return false;
		c = (unsigned char) *p;
		if (c == '"')
			break;
		if (c >= 0x80)
		{
			int			l = pg_utf_mblen((const unsigned char *) p);

			if (l > end - p || !pg_utf8_islegal((const unsigned char *) p, l))
				return false;
			p += l;
			continue;
		}
		if (c != '\\')
			return false;		/* a raw control character */
		if (buf == NULL)
			buf = IdemScanBuffer(&ts->scratch);
		appendBinaryStringInfo(buf, run, p - run);
		if (!IdemJsonUnescape(&p, end, buf))
			return false;
		run = ++p;
	}
	if (buf)
	{
		appendBinaryStringInfo(buf, run, p - run);
		*s = buf->data;
		*len = buf->len;
	}
	else
	{
		*s = run;
		*len = p - run;
	}
	*escaped = (buf != NULL);
	ts->p = p + 1;
	return true;
}

static void
IdemTextEmitString(TextScan *ts, const char *s, int len, bool escaped)
{
	StringInfo	out = ts->st.out;

	if (escaped)
	{
		IdemEmitString(&ts->st, s, len);
		return;
	}
	/* as it was written: nothing in it needs escaping */
	IdemReserve(out, len + 2);
	out->data[out->len++] = '"';
	memcpy(out->data + out->len, s, len);
	out->len += len;
	out->data[out->len++] = '"';
	out->data[out->len] = '\0';
}

/*
 * The end of the JSON number at p: its grammar, within the bounds of the
 * fast path; NULL for anything else.
 */
static const char *
IdemScanNumber(const char *p, const char *end)
{
	const char *s = p;
	int			exponent = 0;

	if (p < end && *p == '-')
		p++;
	if (p >= end || *p < '0' || *p > '9')
		return NULL;
	if (*p++ != '0')
		while (p < end && *p >= '0' && *p <= '9')
			p++;
	if (p < end && *p == '.')
	{
		p++;
		if (p >= end || *p < '0' || *p > '9')
			return NULL;
		while (p < end && *p >= '0' && *p <= '9')
			p++;
	}
	if (p < end && (*p == 'e' || *p == 'E'))
	{
		p++;
		if (p < end && (*p == '+' || *p == '-'))
			p++;
		if (p >= end || *p < '0' || *p > '9')
			return NULL;
		for (; p < end && *p >= '0' && *p <= '9'; p++)
		{
			exponent = exponent * 10 + (*p - '0');
			if (exponent > TEXT_MAX_EXPONENT)
				return NULL;
		}
	}
	if (p - s > TEXT_MAX_NUMBER)
		return NULL;
	return p;
}

/* the number through number_format.c */
static bool
IdemTextNumber(TextScan *ts)
{
	const char *p = IdemScanNumber(ts->p, ts->end);

	if (p == NULL ||
		!IdemTryAppendCanonicalNumber(ts->st.out, ts->p, p - ts->p))
		return false;
	ts->p = p;
	return true;
}

/* the literal word at ts->p, skipped */
static inline bool
IdemTextWord(TextScan *ts, const char *word, int len)
{
	if (ts->end - ts->p < len || memcmp(ts->p, word, len) != 0)
		return false;
	ts->p += len;
	return true;
}

static bool
IdemTextLiteral(TextScan *ts, const char *word, int len)
{
	if (!IdemTextWord(ts, word, len))
		return false;
	appendBinaryStringInfo(ts->st.out, word, len);
	return true;
}

/* "," to go on (true) or the closing byte (false, *ok) after a child */
static bool
IdemTextNext(TextScan *ts, char close, bool *ok)
{
	IdemSkipSpace(ts);
	*ok = false;
	if (ts->p < ts->end && *ts->p == ',')
	{
		ts->p++;
		IdemSkipSpace(ts);
		return true;
	}
	if (ts->p < ts->end && *ts->p == close)
	{
		ts->p++;
		*ok = true;
	}
	return false;
}

/*
 * An object: each member's "name":value is written in the text's order,
 * then the members are sorted as in IdemEmitObject, duplicate names are
 * refused, and the bytes are reordered when they are out of order.
 */
/*
 * Step over the opening bracket of a container (copied to the output) and
 * any white space; true when the container is empty (its closing bracket
 * is stepped over too, and left for the caller to write).
 */
static bool
IdemTextOpen(TextScan *ts, char open, char close)
{
	ts->p++;
	appendStringInfoCharMacro(ts->st.out, open);
	IdemSkipSpace(ts);
	if (ts->p < ts->end && *ts->p == close)
	{
		ts->p++;
		return true;
	}
	return false;
}

/*
 * Write a container's closing bracket when it was read whole; free the
 * pointers still matching below it.  Returns ok.
 */
static bool
IdemTextClose(TextScan *ts, bool ok, char close, int *child)
{
	if (ok)
		appendStringInfoCharMacro(ts->st.out, close);
	if (child)
		pfree(child);
	return ok;
}

static bool
IdemTextObject(TextScan *ts, int depth, const int *active, int nactive)
{
	CanonState *st = &ts->st;
	StringInfo	out = st->out;
	int		   *child = nactive > 0 ? palloc(sizeof(int) * nactive) : NULL;
	Member	   *members = NULL;
	int			n = 0;
	int			cap = 0;
	int			body;
	int			last = -1;
	bool		sorted = true;
	bool		ok = false;
	uint8		order[ORDER_CACHE_MAX];

	ok = IdemTextOpen(ts, '{', '}');
	body = out->len;
	if (!ok)
		for (;;)
		{
			Member	   *m;
			const char *key;
			int			keylen;
			bool		escaped;
			int			mark = out->len;
			int			nchild = 0;
			bool		drop;

			if (ts->p >= ts->end || *ts->p != '"' ||
				!IdemTextString(ts, &key, &keylen, &escaped))
				goto done;
			if (escaped)
			{
				/* scratch is reused: the name must outlive the object */
				char	   *copy = palloc(keylen + 1);

				memcpy(copy, key, keylen);
				copy[keylen] = '\0';
				key = copy;
			}
			IdemSkipSpace(ts);
			if (ts->p >= ts->end || *ts->p != ':')
				goto done;
			ts->p++;
			IdemSkipSpace(ts);

			drop = nactive > 0 &&
				IdemMatchPointers(st->ex, depth, active, nactive,
								  key, keylen, -1, child, &nchild);
			if (out->len > body)
				appendStringInfoCharMacro(out, ',');
			if (n == cap)
			{
				members = IdemLevelMembers(st, depth, n + 1);
				cap = st->level_cap[depth];
			}
			m = &members[n++];
			m->key = key;
			m->keylen = keylen;
			m->out_start = out->len;
			IdemTextEmitString(ts, key, keylen, escaped);
			appendStringInfoCharMacro(out, ':');
			/* an excluded value is still read: it must be valid */
			if (!IdemTextValue(ts, depth + 1, child, drop ? 0 : nchild))
				goto done;
			m->out_end = out->len;
			if (drop)
			{
				out->len = mark;
				m->out_start = -1;
			}
			if (!IdemTextNext(ts, '}', &ok))
				break;
		}
	if (!ok || n == 0)
		goto done;
	ok = false;

	/* sorted order, in which equal names are neighbours */
	if (n <= ORDER_CACHE_MAX)
		IdemOrderMembers(st, members, n, order);
	else
		qsort(members, n, sizeof(Member), IdemMemberCmp);
	for (int i = 0; i < n; i++)
	{
		const Member *m = &members[n <= ORDER_CACHE_MAX ? order[i] : i];

		if (i > 0)
		{
			const Member *prev = &members[n <= ORDER_CACHE_MAX ? order[i - 1] : i - 1];

			if (prev->keylen == m->keylen &&
				memcmp(prev->key, m->key, m->keylen) == 0)
				goto done;
		}
		if (m->out_start < 0)
			continue;
		if (m->out_start < last)
			sorted = false;
		last = m->out_start;
	}

	if (!sorted)
	{
		/* the same bytes in the sorted order, in place */
		StringInfo	tmp = IdemScanBuffer(&ts->tmp);
		char	   *dst = out->data + body;

		appendBinaryStringInfo(tmp, out->data + body, out->len - body);
		for (int i = 0; i < n; i++)
		{
			const Member *m = &members[n <= ORDER_CACHE_MAX ? order[i] : i];
			int			len = m->out_end - m->out_start;

			if (m->out_start < 0)
				continue;
			if (dst > out->data + body)
				*dst++ = ',';
			memcpy(dst, tmp->data + (m->out_start - body), len);
			dst += len;
		}
		Assert(dst == out->data + out->len);
	}
	ok = true;

done:
	return IdemTextClose(ts, ok, '}', child);
}

static bool
IdemTextArray(TextScan *ts, int depth, const int *active, int nactive)
{
	StringInfo	out = ts->st.out;
	int		   *child = nactive > 0 ? palloc(sizeof(int) * nactive) : NULL;
	int			body;
	int			index = 0;
	bool		ok = IdemTextOpen(ts, '[', ']');

	body = out->len;
	if (!ok)
		for (;;)
		{
			int			mark = out->len;
			int			nchild = 0;
			bool		drop;

			drop = nactive > 0 &&
				IdemMatchPointers(ts->st.ex, depth, active, nactive,
								  NULL, 0, index, child, &nchild);
			index++;
			if (out->len > body)
				appendStringInfoCharMacro(out, ',');
			if (!IdemTextValue(ts, depth + 1, child, drop ? 0 : nchild))
				break;
			if (drop)
				out->len = mark;
			if (!IdemTextNext(ts, ']', &ok))
				break;
		}
	return IdemTextClose(ts, ok, ']', child);
}

static bool
IdemTextValue(TextScan *ts, int depth, const int *active, int nactive)
{
	if (ts->p >= ts->end)
		return false;
	switch (*ts->p)
	{
		case '{':
		case '[':
			if (depth >= TEXT_MAX_DEPTH)
				return false;
			CHECK_FOR_INTERRUPTS();
			if (*ts->p == '{')
				return IdemTextObject(ts, depth, active, nactive);
			return IdemTextArray(ts, depth, active, nactive);
		case '"':
			{
				const char *s;
				int			len;
				bool		escaped;

				if (!IdemTextString(ts, &s, &len, &escaped))
					return false;
				IdemTextEmitString(ts, s, len, escaped);
				return true;
			}
		case 't':
			return IdemTextLiteral(ts, "true", 4);
		case 'f':
			return IdemTextLiteral(ts, "false", 5);
		case 'n':
			return IdemTextLiteral(ts, "null", 4);
		default:
			return IdemTextNumber(ts);
	}
}

bool
IdemTryCanonicalizeJsonText(StringInfo out, text *json,
							const IdemExclusions *ex, pg_cryptohash_ctx *sink)
{
	TextScan	ts;
	int			start = out->len;
	int		   *active;
	int			nactive;
	bool		ok;

	if (GetDatabaseEncoding() != PG_UTF8 ||
		VARSIZE_ANY_EXHDR(json) > TEXT_MAX_LEN)
		return false;
	if (!plain_ready)
		IdemInitPlainBytes();
	/* the output is about as long as the text: grow once */
	enlargeStringInfo(out, VARSIZE_ANY_EXHDR(json) + 64);

	/* no sink yet: nothing is hashed before the whole text is read */
	IdemCanonInit(&ts.st, out, ex, NULL);
	ts.p = VARDATA_ANY(json);
	ts.end = ts.p + VARSIZE_ANY_EXHDR(json);
	ts.scratch.data = NULL;
	ts.tmp.data = NULL;
	active = IdemRootActive(ex, &nactive);

	IdemSkipSpace(&ts);
	ok = IdemTextValue(&ts, 0, active, nactive);
	IdemSkipSpace(&ts);
	ok = ok && ts.p == ts.end;

	IdemCanonFree(&ts.st);
	if (active)
		pfree(active);
	if (ts.scratch.data)
		pfree(ts.scratch.data);
	if (ts.tmp.data)
		pfree(ts.tmp.data);

	if (!ok)
	{
		out->len = start;
		out->data[start] = '\0';
		return false;
	}
	if (sink && out->len > 0)
	{
		ts.st.sink = sink;
		IdemFeedSink(&ts.st);
	}
	return true;
}

/* ---------- raw JSON text to jsonb, directly ---------- */

/*
 * The same scan builds jsonb: the values are pushed with pushJsonbValue in
 * the order, and with the contents, jsonb_in's parser callbacks push them
 * (numbers through numeric_in, a scalar document as a one-element raw
 * scalar array), so that JsonbValueToJsonb gives the same datum, duplicate
 * names collapsed the same way.  Only ts's text fields are used.
 */
typedef struct JsonbBuild
{
	TextScan	ts;
	JsonbParseState *state;
	JsonbValue *res;
} JsonbBuild;

static bool IdemBuildValue(JsonbBuild *b, int depth);

/* the scalar at ts->p into *v */
static bool
IdemBuildScalar(TextScan *ts, JsonbValue *v)
{
	switch (*ts->p)
	{
		case '"':
			{
				const char *s;
				int			len;
				bool		escaped;

				if (!IdemTextString(ts, &s, &len, &escaped))
					return false;
				v->type = jbvString;
				/* one with escapes is in scratch, which is reused: copied */
				v->val.string.val = escaped ? pnstrdup(s, len) : (char *) s;
				v->val.string.len = len;
				return true;
			}
		case 't':
			v->type = jbvBool;
			v->val.boolean = true;
			return IdemTextWord(ts, "true", 4);
		case 'f':
			v->type = jbvBool;
			v->val.boolean = false;
			return IdemTextWord(ts, "false", 5);
		case 'n':
			v->type = jbvNull;
			return IdemTextWord(ts, "null", 4);
		default:
			{
				const char *p = IdemScanNumber(ts->p, ts->end);
				char		buf[TEXT_MAX_NUMBER + 1];

				/* within the bounds, numeric_in raises no error */
				if (p == NULL)
					return false;
				memcpy(buf, ts->p, p - ts->p);
				buf[p - ts->p] = '\0';
				v->type = jbvNumeric;
				v->val.numeric = DatumGetNumeric(DirectFunctionCall3(numeric_in,
																	 CStringGetDatum(buf),
																	 ObjectIdGetDatum(InvalidOid),
																	 Int32GetDatum(-1)));
				ts->p = p;
				return true;
			}
	}
}

/* the object or array at ts->p */
static bool
IdemBuildContainer(JsonbBuild *b, int depth)
{
	TextScan   *ts = &b->ts;
	bool		object = (*ts->p == '{');
	char		close = object ? '}' : ']';
	bool		ok = false;

	ts->p++;
	b->res = pushJsonbValue(&b->state,
							object ? WJB_BEGIN_OBJECT : WJB_BEGIN_ARRAY, NULL);
	IdemSkipSpace(ts);
	if (ts->p < ts->end && *ts->p == close)
	{
		ts->p++;
		ok = true;
	}
	else
		for (;;)
		{
			if (object)
			{
				JsonbValue	key;

				if (ts->p >= ts->end || *ts->p != '"' ||
					!IdemBuildScalar(ts, &key))
					return false;
				b->res = pushJsonbValue(&b->state, WJB_KEY, &key);
				IdemSkipSpace(ts);
				if (ts->p >= ts->end || *ts->p != ':')
					return false;
				ts->p++;
				IdemSkipSpace(ts);
			}
			if (!IdemBuildValue(b, depth + 1))
				return false;
			if (!IdemTextNext(ts, close, &ok))
				break;
		}
	if (!ok)
		return false;
	b->res = pushJsonbValue(&b->state,
							object ? WJB_END_OBJECT : WJB_END_ARRAY, NULL);
	return true;
}

static bool
IdemBuildValue(JsonbBuild *b, int depth)
{
	JsonbValue	v;

	if (b->ts.p >= b->ts.end)
		return false;
	if (*b->ts.p == '{' || *b->ts.p == '[')
		return depth < TEXT_MAX_DEPTH && IdemBuildContainer(b, depth);
	if (!IdemBuildScalar(&b->ts, &v))
		return false;
	if (b->state == NULL)
	{
		/* a scalar document: the raw scalar array jsonb_in makes of it */
		JsonbValue	va;

		va.type = jbvArray;
		va.val.array.rawScalar = true;
		va.val.array.nElems = 1;
		(void) pushJsonbValue(&b->state, WJB_BEGIN_ARRAY, &va);
		(void) pushJsonbValue(&b->state, WJB_ELEM, &v);
		b->res = pushJsonbValue(&b->state, WJB_END_ARRAY, NULL);
	}
	else
		b->res = pushJsonbValue(&b->state,
								b->state->contVal.type == jbvArray ?
								WJB_ELEM : WJB_VALUE, &v);
	return true;
}

Jsonb *
IdemTryJsonTextToJsonb(const char *s, int len)
{
	JsonbBuild	b;
	bool		ok;

	if (GetDatabaseEncoding() != PG_UTF8 || len > TEXT_MAX_LEN)
		return NULL;
	if (!plain_ready)
		IdemInitPlainBytes();
	b.ts.p = s;
	b.ts.end = s + len;
	b.ts.scratch.data = NULL;
	b.ts.tmp.data = NULL;
	b.state = NULL;
	b.res = NULL;

	IdemSkipSpace(&b.ts);
	ok = IdemBuildValue(&b, 0);
	IdemSkipSpace(&b.ts);
	ok = ok && b.ts.p == b.ts.end;

	if (b.ts.scratch.data)
		pfree(b.ts.scratch.data);
	/* what was pushed before a refusal is left to the memory context */
	if (!ok)
		return NULL;
	Assert(b.state == NULL && b.res != NULL);
	return JsonbValueToJsonb(b.res);
}

/* ---------- raw JSON text: duplicate member names ---------- */

typedef struct DupFrame
{
	List	   *keys;			/* char * */
	struct DupFrame *outer;
} DupFrame;

typedef struct DupState
{
	DupFrame   *top;
} DupState;

static IdemJsonSemResult
IdemDupObjectStart(void *state)
{
	DupState   *ds = (DupState *) state;
	DupFrame   *f = palloc(sizeof(DupFrame));

	f->keys = NIL;
	f->outer = ds->top;
	ds->top = f;
	return IDEM_JSON_SEM_OK;
}

static IdemJsonSemResult
IdemDupObjectFieldStart(void *state, char *fname, bool isnull)
{
	DupState   *ds = (DupState *) state;

	ds->top->keys = lappend(ds->top->keys, fname);
	return IDEM_JSON_SEM_OK;
}

static int
IdemCstringCmp(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

static IdemJsonSemResult
IdemDupObjectEnd(void *state)
{
	DupState   *ds = (DupState *) state;
	DupFrame   *f = ds->top;
	int			n = list_length(f->keys);

	if (n > 1)
	{
		char	  **keys = palloc(sizeof(char *) * n);
		int			i = 0;
		ListCell   *lc;

		foreach(lc, f->keys)
			keys[i++] = lfirst(lc);
		qsort(keys, n, sizeof(char *), IdemCstringCmp);
		for (i = 1; i < n; i++)
			if (strcmp(keys[i - 1], keys[i]) == 0)
				ereport(ERROR,
						(errcode(ERRCODE_DUPLICATE_JSON_OBJECT_KEY_VALUE),
						 errmsg("duplicate member name \"%s\" in JSON object",
								keys[i]),
						 errdetail("RFC 8785 canonicalization requires I-JSON input, in which member names are unique.")));
		pfree(keys);
	}
	list_free_deep(f->keys);
	ds->top = f->outer;
	pfree(f);
	return IDEM_JSON_SEM_OK;
}

/*
 * jsonb_in reads the text first, so that a text with several faults raises
 * the error the jsonb path raises (that of the first fault); repeated names
 * are looked for only in text that jsonb took.
 */
Jsonb *
IdemJsonTextToJsonbUnique(text *json)
{
	Jsonb	   *jb;
	JsonLexContext *lex;
	JsonSemAction sem;
	DupState	ds;

	jb = DatumGetJsonbP(DirectFunctionCall1(jsonb_in,
											CStringGetDatum(text_to_cstring(json))));

	lex = IdemMakeJsonLexContext(json, true);
	memset(&sem, 0, sizeof(sem));
	ds.top = NULL;
	sem.semstate = &ds;
	sem.object_start = IdemDupObjectStart;
	sem.object_end = IdemDupObjectEnd;
	sem.object_field_start = IdemDupObjectFieldStart;
	pg_parse_json_or_ereport(lex, &sem);

	return jb;
}
