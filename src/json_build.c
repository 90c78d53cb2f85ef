/*-------------------------------------------------------------------------
 *
 * json_build.c
 *	  Raw JSON text turned into jsonb directly (replays of stored JSON
 *	  bodies), with the scan of canonical_text.c and pushJsonbValue as
 *	  jsonb_in does; it gives up as that scan does, leaving the text to
 *	  jsonb_in.  And the slow path's check that no object of a text has two
 *	  members of the same name (which jsonb silently collapses).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/jsonapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonfuncs.h"
#include "utils/numeric.h"

#include "canonical_json_int.h"
#include "canonical_json.h"
#include "compat.h"

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
	IdemTextScanReady();
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
