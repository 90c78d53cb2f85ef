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
 *	  The output (strings, the order of members, the pointers still
 *	  matching, the hash sink) is shared with the scan of raw JSON text
 *	  (canonical_text.c) through canonical_json_int.h.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/numeric.h"

#include "canonical_json_int.h"
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

static void IdemEmitValue(CanonState *st, const ChildRef *ref, int depth,
						  const int *active, int nactive);

/* hand the buffered bytes to the hash sink */
void
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

void
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

int
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
void
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
Member *
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
bool
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

void
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

void
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
int *
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

/*
 * Fill plain[c] for each byte c: whether it stands for itself in a string,
 * in the text and in the output (ASCII that IdemEmitString does not escape).
 */
void
IdemPlainBytes(bool plain[256])
{
	for (int c = 0; c < 0x80; c++)
		plain[c] = (escape_class[c] == 0);
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
