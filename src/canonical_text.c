/*-------------------------------------------------------------------------
 *
 * canonical_text.c
 *	  The fast path of canonical JSON for raw JSON text: a recursive-descent
 *	  scan of the UTF-8 text writes the canonical form directly, in one
 *	  pass.  Each object's "name":value pairs are written in the text's
 *	  order, then sorted with the order of canonical_json.c (which also
 *	  finds duplicate names) and moved into place; numbers go through
 *	  number_format.c, strings through IdemEmitString.  The scan only tries:
 *	  on anything it does not take (invalid JSON, duplicate names, \u0000 or
 *	  lone surrogates, numbers beyond a double or numeric's bounds, deep
 *	  nesting, long text, a database not in UTF-8) it gives up, writing and
 *	  hashing nothing, and the text goes the slow way: through jsonb, which
 *	  gives the same bytes and raises the errors, then checked for
 *	  duplicate member names (which jsonb silently collapsed).
 *
 *	  Its primitives (strings, numbers, white space) also serve the build of
 *	  jsonb from text (json_build.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"

#include "canonical_json_int.h"
#include "canonical_json.h"
#include "compat.h"
#include "number_format.h"

static bool IdemTextValue(TextScan *ts, int depth, const int *active,
						  int nactive);

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
	IdemPlainBytes(plain_byte);
	plain_ready = true;
}

void
IdemTextScanReady(void)
{
	if (!plain_ready)
		IdemInitPlainBytes();
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
bool
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
const char *
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

static bool
IdemTextLiteral(TextScan *ts, const char *word, int len)
{
	if (!IdemTextWord(ts, word, len))
		return false;
	appendBinaryStringInfo(ts->st.out, word, len);
	return true;
}

/*
 * The members of an object written from body on, in the text's order, put
 * in the sorted order; false when two have the same name.
 */
static bool
IdemTextSortMembers(TextScan *ts, Member *members, int n, int body)
{
	CanonState *st = &ts->st;
	StringInfo	out = st->out;
	int			last = -1;
	bool		sorted = true;
	uint8		order[ORDER_CACHE_MAX];

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
				return false;
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
	return true;
}

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

/*
 * An object: each member's "name":value is written in the text's order,
 * then the members are sorted as in IdemEmitObject, duplicate names are
 * refused, and the bytes are reordered when they are out of order.
 */
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
	bool		ok = false;

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
	ok = IdemTextSortMembers(ts, members, n, body);

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
