/*-------------------------------------------------------------------------
 *
 * claim_result.c
 *	  The row idem_claim returns (idempotency.claim_result), its row type
 *	  kept for the backend, and the replay of a stored response: its
 *	  headers marked as replayed, its JSON body as jsonb.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "nodes/nodeFuncs.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/typcache.h"

#include "canonical_json.h"
#include "claim_result.h"
#include "compat.h"
#include "keystore.h"
#include "response.h"
#include "scope.h"

void
IdemClaimResultInit(ClaimResult *r)
{
	memset(r, 0, sizeof(*r));
	r->http_status = -1;
	r->retry_after = -1;
	r->resp.status = -1;
}

/*
 * The row type of the functions' result, kept for the backend while the
 * type is unchanged: a FunctionScan makes a new FmgrInfo at every execution,
 * so a cache in fn_extra would be rebuilt for every call.  Type cache entries
 * live as long as the backend, and an entry's tupDesc_identifier changes (or
 * drops to 0) whenever the row type does.
 */
static TypeCacheEntry *result_tce = NULL;
static uint64 result_identifier = 0;	/* result_tce's identifier when copied */
static TupleDesc result_desc = NULL;

static TupleDesc
IdemResultDesc(FunctionCallInfo fcinfo)
{
	Oid			typid = InvalidOid;
	TupleDesc	desc;
	MemoryContext old;

	/* the call's result type, without a catalog lookup when there is one */
	if (fcinfo->flinfo->fn_expr != NULL)
		typid = exprType(fcinfo->flinfo->fn_expr);
	if (result_desc != NULL && result_tce->type_id == typid &&
		result_tce->tupDesc_identifier == result_identifier)
		return result_desc;
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE ||
		desc->tdtypeid == RECORDOID)
		elog(ERROR, "return type must be a named row type");
	if (result_desc != NULL)
		FreeTupleDesc(result_desc);
	result_desc = NULL;
	result_tce = lookup_type_cache(desc->tdtypeid, TYPECACHE_TUPDESC);
	old = MemoryContextSwitchTo(CacheMemoryContext);
	result_desc = CreateTupleDescCopy(desc);
	MemoryContextSwitchTo(old);
	result_identifier = result_tce->tupDesc_identifier;
	return result_desc;
}

Datum
IdemClaimResultDatum(FunctionCallInfo fcinfo, const ClaimResult *r)
{
	TupleDesc	desc = IdemResultDesc(fcinfo);
	Datum		values[13];
	bool		nulls[13];

	memset(nulls, 0, sizeof(nulls));
	values[0] = CStringGetTextDatum(r->action);
	values[1] = Int32GetDatum(r->http_status);
	nulls[1] = r->http_status < 0;
	values[2] = r->error_code ? CStringGetTextDatum(r->error_code) : (Datum) 0;
	nulls[2] = r->error_code == NULL;
	values[3] = Int32GetDatum(r->retry_after);
	nulls[3] = r->retry_after < 0;
	values[4] = Int32GetDatum(r->resp.status);
	nulls[4] = r->resp.status < 0;
	values[5] = PointerGetDatum(r->resp.headers);
	nulls[5] = r->resp.headers == NULL;
	values[6] = PointerGetDatum(r->resp.body);
	nulls[6] = r->resp.body == NULL;
	values[7] = PointerGetDatum(r->response_json);
	nulls[7] = r->response_json == NULL;
	values[8] = Int64GetDatum(r->lease_token);
	nulls[8] = !r->has_token;
	values[9] = TimestampTzGetDatum(r->expires_at);
	nulls[9] = r->expires_at == 0;
	values[10] = BoolGetDatum(r->replayed);
	values[11] = PointerGetDatum(r->resp.body_ref);
	nulls[11] = r->resp.body_ref == NULL;
	/* 0.2.0's claim_result has no mismatch column */
	values[12] = PointerGetDatum(r->mismatch);
	nulls[12] = r->mismatch == NULL;
	if (desc->natts < 12 || desc->natts > 13)
		elog(ERROR, "claim_result has %d columns, expected 13", desc->natts);
	return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

static void
IdemPushJsonbString(JsonbParseState **state, JsonbIteratorToken token,
					const char *s, int len)
{
	JsonbValue	v;

	v.type = jbvString;
	v.val.string.val = (char *) s;
	v.val.string.len = len;
	(void) pushJsonbValue(state, token, &v);
}

void
IdemReplayResult(const IdemScope *scope, IdemKeyRow *row, ClaimResult *r)
{
	JsonbParseState *state = NULL;
	Datum		marks;

	IdemResponseForReplay(&row->resp);

	/* {"Idempotent-Replayed": "true", "Idempotency-Key": key}, built directly */
	(void) pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	IdemPushJsonbString(&state, WJB_KEY, "Idempotent-Replayed", 19);
	IdemPushJsonbString(&state, WJB_VALUE, "true", 4);
	IdemPushJsonbString(&state, WJB_KEY, "Idempotency-Key", 15);
	IdemPushJsonbString(&state, WJB_VALUE, VARDATA_ANY(scope->key),
						VARSIZE_ANY_EXHDR(scope->key));
	marks = JsonbPGetDatum(JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT,
															 NULL)));

	r->action = "replay";
	r->http_status = row->resp.status;
	r->resp = row->resp;
	if (row->resp.headers != NULL &&
		JB_ROOT_IS_OBJECT(row->resp.headers))
		r->resp.headers = DatumGetJsonbP(DirectFunctionCall2(jsonb_concat,
															 JsonbPGetDatum(row->resp.headers),
															 marks));
	else
		r->resp.headers = DatumGetJsonbP(marks);
	if (row->resp.body_kind == IDEM_BODY_JSON && row->resp.body != NULL)
	{
		bytea	   *body = pg_detoast_datum_packed(row->resp.body);

		r->response_json = IdemTryJsonTextToJsonb(VARDATA_ANY(body),
												  VARSIZE_ANY_EXHDR(body));
		if (r->response_json == NULL)
			r->response_json = DatumGetJsonbP(DirectFunctionCall1(jsonb_in,
																  CStringGetDatum(text_to_cstring((text *) body))));
	}
	r->expires_at = row->expires_at;
	r->replayed = true;
}
