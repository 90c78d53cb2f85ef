/*-------------------------------------------------------------------------
 *
 * diag_compare.c
 *	  Mismatch diagnostics: the comparison of the digest stored with a key
 *	  and the digest of a reused key's request, which names the members
 *	  (as JSON Pointers) that changed, were added or removed.  Two entries
 *	  with the same hash are the same member; a difference inside a member
 *	  whose own members were not listed (summarised, or deeper than the
 *	  digest went) is named at that member, marked truncated.  Members at or
 *	  under a redacted pointer of the endpoint are never named, nor a member
 *	  above one for a difference its digests cannot place outside it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "utils/jsonb.h"

#include "canonical_json.h"
#include "diag.h"
#include "diag_int.h"

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
