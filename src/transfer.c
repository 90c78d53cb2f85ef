/*-------------------------------------------------------------------------
 *
 * transfer.c
 *	  The checks idem_import_keys (sql/parts/60_transfer.sql) applies to
 *	  each row before it writes it: the rules a claim and a finish apply to
 *	  what they store, with the same functions (keys.c, response.c), so
 *	  that an import stores nothing a claim and a finish would not.
 *
 *	  idem_import_check is called by the SECURITY DEFINER import alone:
 *	  EXECUTE on it is granted to nobody (sql/parts/99_privileges.sql).  An
 *	  error names the refused element of the import and its column.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

#include "endpoint.h"
#include "keys.h"
#include "response.h"
#include "util.h"

/* the columns of idempotency.keys the checks read, and their types */
typedef enum IdemImportCol
{
	COL_TENANT,
	COL_ENDPOINT,
	COL_KEY,
	COL_FINGERPRINT,
	COL_STATE,
	COL_RESPONSE_STATUS,
	COL_RESPONSE_HEADERS,
	COL_BODY_KIND,
	COL_BODY_ENCRYPTED,
	COL_RESPONSE_BODY,
	COL_BODY_REF,
	COL_CREATED_AT,
	COL_EXPIRES_AT,
	NUM_IMPORT_COLS
} IdemImportCol;

static const struct
{
	const char *name;
	Oid			type;
}			import_cols[NUM_IMPORT_COLS] = {
	[COL_TENANT] = {"tenant", TEXTOID},
	[COL_ENDPOINT] = {"endpoint", TEXTOID},
	[COL_KEY] = {"key", TEXTOID},
	[COL_FINGERPRINT] = {"fingerprint", BYTEAOID},
	[COL_STATE] = {"state", TEXTOID},
	[COL_RESPONSE_STATUS] = {"response_status", INT4OID},
	[COL_RESPONSE_HEADERS] = {"response_headers", JSONBOID},
	[COL_BODY_KIND] = {"body_kind", TEXTOID},
	[COL_BODY_ENCRYPTED] = {"body_encrypted", BOOLOID},
	[COL_RESPONSE_BODY] = {"response_body", BYTEAOID},
	[COL_BODY_REF] = {"body_ref", TEXTOID},
	[COL_CREATED_AT] = {"created_at", TIMESTAMPTZOID},
	[COL_EXPIRES_AT] = {"expires_at", TIMESTAMPTZOID},
};

typedef struct IdemImportRow
{
	TupleDesc	desc;
	Datum	   *values;
	bool	   *nulls;
	int			attno[NUM_IMPORT_COLS]; /* 0-based index in values */
} IdemImportRow;

/* A column's index in the row, after checking its type. */
static void
IdemImportFindColumns(IdemImportRow *row)
{
	for (int c = 0; c < NUM_IMPORT_COLS; c++)
	{
		row->attno[c] = -1;
		for (int i = 0; i < row->desc->natts; i++)
		{
			Form_pg_attribute att = TupleDescAttr(row->desc, i);

			if (!att->attisdropped &&
				strcmp(NameStr(att->attname), import_cols[c].name) == 0)
			{
				if (att->atttypid != import_cols[c].type)
					elog(ERROR, "column \"%s\" of the row to import has type %u, not %u",
						 import_cols[c].name, att->atttypid, import_cols[c].type);
				row->attno[c] = i;
				break;
			}
		}
		if (row->attno[c] < 0)
			elog(ERROR, "the row to import has no column \"%s\"",
				 import_cols[c].name);
	}
}

static inline bool
IdemImportIsNull(const IdemImportRow *row, IdemImportCol c)
{
	return row->nulls[row->attno[c]];
}

static inline Datum
IdemImportValue(const IdemImportRow *row, IdemImportCol c)
{
	return row->values[row->attno[c]];
}

static text *
IdemImportText(const IdemImportRow *row, IdemImportCol c)
{
	return IdemImportIsNull(row, c) ? NULL :
		DatumGetTextPP(IdemImportValue(row, c));
}

static void
IdemImportSet(IdemImportRow *row, IdemImportCol c, Datum value, bool isnull)
{
	row->values[row->attno[c]] = value;
	row->nulls[row->attno[c]] = isnull;
}

/* The row's state: one a key may have. */
static char *
IdemImportCheckState(IdemImportRow *row)
{
	char	   *state;

	state = IdemImportIsNull(row, COL_STATE) ? NULL :
		text_to_cstring(DatumGetTextPP(IdemImportValue(row, COL_STATE)));
	if (state == NULL ||
		(strcmp(state, "in_progress") != 0 && strcmp(state, "completed") != 0 &&
		 strcmp(state, "failed") != 0 && strcmp(state, "unknown") != 0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("state must be in_progress, completed, failed or unknown"),
				 errdetail(state == NULL ? "The state is NULL." : "The state is \"%s\".",
						   state)));
	return state;
}

/*
 * The row's created_at and expires_at: both there, finite, and in that
 * order (*field names the one being checked).
 */
static void
IdemImportCheckTimes(IdemImportRow *row, const char **field)
{
	TimestampTz created_at;
	TimestampTz expires_at;

	*field = "created_at";
	if (IdemImportIsNull(row, COL_CREATED_AT))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 errmsg("created_at is missing"),
				 errdetail("Every key has the time of its claim and the time it expires.")));
	created_at = DatumGetTimestampTz(IdemImportValue(row, COL_CREATED_AT));
	if (TIMESTAMP_NOT_FINITE(created_at))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("created_at is infinite"),
				 errdetail("A key is created at the time of its claim.")));
	*field = "expires_at";
	if (IdemImportIsNull(row, COL_EXPIRES_AT))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_KEY),
				 errmsg("expires_at is missing"),
				 errdetail("Every key has the time of its claim and the time it expires.")));
	expires_at = DatumGetTimestampTz(IdemImportValue(row, COL_EXPIRES_AT));
	if (TIMESTAMP_NOT_FINITE(expires_at))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("expires_at is infinite"),
				 errdetail("A key must expire within idempotency.max_ttl of its claim.")));
	if (created_at > expires_at)
	{
		char	   *created = pstrdup(timestamptz_to_str(created_at));

		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("expires_at is before created_at"),
				 errdetail("The key was created at %s and would expire at %s; a key expires after its claim.",
						   created, timestamptz_to_str(expires_at))));
	}
}

/*
 * Check one row, field by field (*field names the column being checked),
 * and change what a finish would change: the sensitive headers dropped,
 * the body omitted where the endpoint keeps none.
 */
static void
IdemImportCheckRow(IdemImportRow *row, const char **field)
{
	text	   *tenant = IdemImportText(row, COL_TENANT);
	text	   *endpoint = IdemImportText(row, COL_ENDPOINT);
	char	   *endpoint_str;
	char	   *state;
	IdemResponse resp;

	/* the claim's checks of the scope and the fingerprint */
	*field = "tenant";
	IdemCheckScopePart(tenant, true);
	*field = "endpoint";
	IdemCheckScopePart(endpoint, false);
	*field = "key";
	IdemCheckKey(IdemImportText(row, COL_KEY));
	*field = "fingerprint";
	IdemCheckFingerprint(IdemImportIsNull(row, COL_FINGERPRINT) ? NULL :
						 DatumGetByteaPP(IdemImportValue(row, COL_FINGERPRINT)));

	*field = "state";
	state = IdemImportCheckState(row);
	IdemImportCheckTimes(row, field);

	/* the finish's checks of the response */
	*field = "response_status";
	memset(&resp, 0, sizeof(resp));
	resp.status = -1;
	if (!IdemImportIsNull(row, COL_RESPONSE_STATUS))
	{
		resp.status = DatumGetInt32(IdemImportValue(row, COL_RESPONSE_STATUS));
		IdemCheckResponseStatus(resp.status);
	}
	else if (strcmp(state, "completed") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("response status must not be NULL"),
				 errdetail("A completed key replays its response, whose status is a number from 100 to 599.")));

	*field = "response_headers";
	if (!IdemImportIsNull(row, COL_RESPONSE_HEADERS))
		resp.headers = DatumGetJsonbP(IdemImportValue(row, COL_RESPONSE_HEADERS));
	*field = "body_kind";
	if (!IdemImportIsNull(row, COL_BODY_KIND))
	{
		char	   *kind = text_to_cstring(DatumGetTextPP(IdemImportValue(row, COL_BODY_KIND)));

		if (strcmp(kind, "json") != 0 && strcmp(kind, "bytes") != 0 &&
			strcmp(kind, "ref") != 0 && strcmp(kind, "omitted") != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("body_kind must be json, bytes, ref, omitted or NULL"),
					 errdetail("The body_kind is \"%s\".", kind)));
		resp.body_kind = IdemBodyKindFromName(kind);
	}
	resp.encrypted = !IdemImportIsNull(row, COL_BODY_ENCRYPTED) &&
		DatumGetBool(IdemImportValue(row, COL_BODY_ENCRYPTED));
	if (!IdemImportIsNull(row, COL_RESPONSE_BODY))
		resp.body = DatumGetByteaPP(IdemImportValue(row, COL_RESPONSE_BODY));
	resp.body_ref = IdemImportText(row, COL_BODY_REF);

	endpoint_str = text_to_cstring(endpoint);
	IdemResponseCheckStored(IdemGetEndpointPolicy(endpoint_str), &resp, field);
	*field = NULL;

	/* what the finish would have stored */
	IdemImportSet(row, COL_RESPONSE_HEADERS, JsonbPGetDatum(resp.headers),
				  resp.headers == NULL);
	IdemImportSet(row, COL_BODY_KIND,
				  resp.body_kind == IDEM_BODY_NONE ? (Datum) 0 :
				  CStringGetTextDatum(IdemBodyKindName(resp.body_kind)),
				  resp.body_kind == IDEM_BODY_NONE);
	IdemImportSet(row, COL_BODY_ENCRYPTED, BoolGetDatum(resp.encrypted), false);
	IdemImportSet(row, COL_RESPONSE_BODY, PointerGetDatum(resp.body),
				  resp.body == NULL);
	IdemImportSet(row, COL_BODY_REF, PointerGetDatum(resp.body_ref),
				  resp.body_ref == NULL);
}

PG_FUNCTION_INFO_V1(idem_import_check);

/*
 * idem_import_check(pos bigint, item idempotency.keys)
 *		RETURNS idempotency.keys
 *		The row as a finish would have stored it, or an error naming the
 *		element (pos, counted from 1) and the column that is refused, with
 *		the SQLSTATE of the check that refused it.
 */
Datum
idem_import_check(PG_FUNCTION_ARGS)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile int64 pos = PG_ARGISNULL(0) ? 0 : PG_GETARG_INT64(0);
	HeapTupleHeader td;
	HeapTupleData tuple;
	IdemImportRow row;
	/* the column being checked, kept where the error handler finds it */
	const char **field = palloc0(sizeof(const char *));

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("element " INT64_FORMAT " of the keys to import is NULL", pos)));
	td = PG_GETARG_HEAPTUPLEHEADER(1);
	row.desc = lookup_rowtype_tupdesc_copy(HeapTupleHeaderGetTypeId(td),
										   HeapTupleHeaderGetTypMod(td));
	tuple.t_len = HeapTupleHeaderGetDatumLength(td);
	ItemPointerSetInvalid(&(tuple.t_self));
	tuple.t_tableOid = InvalidOid;
	tuple.t_data = td;
	row.values = palloc(sizeof(Datum) * row.desc->natts);
	row.nulls = palloc(sizeof(bool) * row.desc->natts);
	heap_deform_tuple(&tuple, row.desc, row.values, row.nulls);
	IdemImportFindColumns(&row);

	PG_TRY();
	{
		IdemImportCheckRow(&row, field);
	}
	PG_CATCH();
	{
		ErrorData  *edata;
		int			category;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		category = ERRCODE_TO_CATEGORY(edata->sqlerrcode);
		/* a cancel, a shutdown or a lack of resources goes on as it is */
		if (*field == NULL ||
			category == ERRCODE_TO_CATEGORY(ERRCODE_OPERATOR_INTERVENTION) ||
			category == ERRCODE_TO_CATEGORY(ERRCODE_INSUFFICIENT_RESOURCES) ||
			category == ERRCODE_TO_CATEGORY(ERRCODE_PROGRAM_LIMIT_EXCEEDED))
			PG_RE_THROW();
		FlushErrorState();
		edata->message = psprintf("element " INT64_FORMAT " of the keys to import is refused, in %s: %s",
								  pos, *field, edata->message);
		ReThrowError(edata);
	}
	PG_END_TRY();

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(row.desc, row.values,
													  row.nulls)));
}

PG_FUNCTION_INFO_V1(idem_import_plain_body);

/*
 * idem_import_plain_body(body bytea, encrypted boolean) RETURNS bytea
 *		A stored body as a replay reads it, so that idem_import_keys finds
 *		a row it imports again unchanged whichever of the two copies is
 *		encrypted (an encryption is new each time).
 */
Datum
idem_import_plain_body(PG_FUNCTION_ARGS)
{
	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	PG_RETURN_BYTEA_P(IdemResponsePlainBody(PG_GETARG_BYTEA_PP(0),
											!PG_ARGISNULL(1) && PG_GETARG_BOOL(1)));
}
