/*-------------------------------------------------------------------------
 *
 * response.c
 *	  Stored responses: what is kept of a response at finish and given back
 *	  on replay.
 *
 *	  At finish: headers that must never be replayed are dropped, the body
 *	  is omitted where the endpoint keeps none, its size is checked against
 *	  the cap, and it is encrypted with pgcrypto when
 *	  idempotency.encryption_key is set.  On replay: encrypted bodies are
 *	  decrypted; a body that cannot be is an error, never garbage.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "fmgr.h"
#include "nodes/makefuncs.h"
#include "nodes/value.h"
#include "parser/parse_func.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

#include "canonical_json.h"
#include "guc.h"
#include "response.h"
#include "util.h"

static const char *const body_kind_names[] = {
	[IDEM_BODY_NONE] = NULL,
	[IDEM_BODY_JSON] = "json",
	[IDEM_BODY_BYTES] = "bytes",
	[IDEM_BODY_REF] = "ref",
	[IDEM_BODY_OMITTED] = "omitted",
};

/* header added to the replay of a response whose body was not kept */
#define IDEM_OMITTED_HEADER	"Idempotent-Body-Omitted"

/* headers never stored nor replayed, besides idempotency.extra_sensitive_headers */
static const char *const sensitive_headers[] = {
	"set-cookie", "authorization", "proxy-authorization"
};

/* pgcrypto's functions, looked up once per backend and again after DDL */
static bool crypto_ready = false;
static bool crypto_callback = false;
static FmgrInfo encrypt_finfo;
static FmgrInfo decrypt_finfo;

const char *
IdemBodyKindName(IdemBodyKind kind)
{
	return body_kind_names[kind];
}

IdemBodyKind
IdemBodyKindFromName(const char *name)
{
	int			i;

	if (name == NULL)
		return IDEM_BODY_NONE;
	for (i = IDEM_BODY_JSON; i <= IDEM_BODY_OMITTED; i++)
		if (strcmp(name, body_kind_names[i]) == 0)
			return (IdemBodyKind) i;
	elog(ERROR, "unrecognized body kind \"%s\"", name);
	return IDEM_BODY_NONE;		/* keep compiler quiet */
}

/* Is a header named so in the setting's comma-separated list? */
static bool
IdemHeaderInList(const char *list, const char *name, int len)
{
	const char *p = list;

	while (p != NULL && *p != '\0')
	{
		const char *start;
		const char *end;

		while (*p == ' ' || *p == '\t' || *p == ',')
			p++;
		start = p;
		while (*p != '\0' && *p != ',')
			p++;
		end = p;
		while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
			end--;
		/* a list given with SET may quote names */
		if (end - start >= 2 && *start == '"' && end[-1] == '"')
		{
			start++;
			end--;
		}
		if (end - start == len && pg_strncasecmp(start, name, len) == 0)
			return true;
	}
	return false;
}

static bool
IdemHeaderIsSensitive(const char *name, int len)
{
	size_t		i;

	for (i = 0; i < lengthof(sensitive_headers); i++)
		if (strlen(sensitive_headers[i]) == (size_t) len &&
			pg_strncasecmp(sensitive_headers[i], name, len) == 0)
			return true;
	return IdemHeaderInList(idem_extra_sensitive_headers, name, len);
}

/* A header's name must be an HTTP token: "Set-Cookie " is no header. */
static void
IdemCheckHeaderName(const char *name, int len)
{
	bool		ok = len > 0;

	for (int i = 0; ok && i < len; i++)
		ok = IdemIsTokenChar((unsigned char) name[i]);
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid response header name \"%.*s\"", len, name),
				 errdetail("A header name is an HTTP token: letters, digits and !#$%%&'*+-.^_`|~, without spaces.")));
}

/*
 * A header's value may hold visible characters, spaces and tabs, but no
 * other control character: a CR or LF in a stored value would split the
 * replayed header in two (response splitting), and the others are invalid
 * in a field value (RFC 9110, section 5.5).
 */
static void
IdemCheckHeaderText(const char *name, int len, const JsonbValue *v)
{
	for (int i = 0; i < v->val.string.len; i++)
	{
		unsigned char c = (unsigned char) v->val.string.val[i];

		if ((c < 0x20 && c != '\t') || c == 0x7f)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("response header \"%.*s\" holds a control character", len, name),
					 errdetail("Byte %d of the value is 0x%02X; a header value may hold visible characters, spaces and tabs, but no line break or other control character.",
							   i + 1, c)));
	}
}

/*
 * A header's value must be a string or an array of strings, without
 * control characters.
 */
static void
IdemCheckHeaderValue(const char *name, int len, JsonbValue *v)
{
	bool		ok = v->type == jbvString;

	if (ok)
		IdemCheckHeaderText(name, len, v);

	if (v->type == jbvBinary && JsonContainerIsArray(v->val.binary.data) &&
		!JsonContainerIsScalar(v->val.binary.data))
	{
		JsonbIterator *it = JsonbIteratorInit(v->val.binary.data);
		JsonbIteratorToken tok;
		JsonbValue	elem;

		ok = true;
		while (ok && (tok = JsonbIteratorNext(&it, &elem, true)) != WJB_DONE)
			if (tok == WJB_ELEM)
			{
				ok = elem.type == jbvString;
				if (ok)
					IdemCheckHeaderText(name, len, &elem);
			}
	}
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("response header \"%.*s\" must be a string or an array of strings",
						len, name),
				 errdetail("Header values are stored and replayed as text, for example {\"Link\": [\"<a>; rel=next\", \"<b>; rel=prev\"]}.")));
}

/*
 * The headers without the sensitive ones (compared without regard to
 * case); the same pointer when none is.  Headers are a JSON object whose
 * keys are the header names (HTTP tokens) and whose values are strings or
 * arrays of strings.
 */
static Jsonb *
IdemFilterHeaders(Jsonb *headers)
{
	JsonbParseState *state = NULL;
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	v;
	JsonbValue *res = NULL;
	bool		skip = false;
	bool		changed = false;
	const char *name = NULL;
	int			namelen = 0;

	if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("response headers must be a JSON object"),
				 errdetail("Headers are given as an object whose keys are the header names, for example {\"Content-Type\": \"application/json\"}.")));

	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			name = v.val.string.val;
			namelen = v.val.string.len;
			IdemCheckHeaderName(name, namelen);
			skip = IdemHeaderIsSensitive(name, namelen);
			if (skip)
			{
				changed = true;
				continue;
			}
		}
		else if (tok == WJB_VALUE)
		{
			IdemCheckHeaderValue(name, namelen, &v);
			if (skip)
			{
				skip = false;
				continue;
			}
		}
		res = pushJsonbValue(&state, tok, tok < WJB_BEGIN_ARRAY ? &v : NULL);
	}

	return changed ? JsonbValueToJsonb(res) : headers;
}

static void
IdemCryptoInvalidate(Datum arg, int cacheid, uint32 hashvalue)
{
	crypto_ready = false;
}

/* the schema pgcrypto is installed in */
static Oid
IdemPgcryptoSchema(void)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	Oid			nsp = InvalidOid;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber,
				F_NAMEEQ, CStringGetDatum("pgcrypto"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
		nsp = ((Form_pg_extension) GETSTRUCT(tuple))->extnamespace;
	systable_endscan(scan);
	table_close(rel, AccessShareLock);

	if (!OidIsValid(nsp))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("extension pgcrypto is not installed"),
				 errdetail("Stored responses are encrypted with pgcrypto when idempotency.encryption_key is set."),
				 errhint("Run CREATE EXTENSION pgcrypto.")));
	return nsp;
}

/*
 * Find pgp_sym_encrypt_bytea(bytea, text, text) and
 * pgp_sym_decrypt_bytea(bytea, text) in pgcrypto's schema.  Any change to
 * pg_proc makes the next call look them up again.
 */
static void
IdemCryptoLookup(void)
{
	char	   *nspname;
	Oid			enc_args[3] = {BYTEAOID, TEXTOID, TEXTOID};
	Oid			dec_args[2] = {BYTEAOID, TEXTOID};
	Oid			enc;
	Oid			dec;

	if (crypto_ready)
		return;
	if (!crypto_callback)
	{
		CacheRegisterSyscacheCallback(PROCOID, IdemCryptoInvalidate, (Datum) 0);
		crypto_callback = true;
	}

	nspname = get_namespace_name(IdemPgcryptoSchema());
	enc = LookupFuncName(list_make2(makeString(nspname),
									makeString("pgp_sym_encrypt_bytea")),
						 3, enc_args, false);
	dec = LookupFuncName(list_make2(makeString(nspname),
									makeString("pgp_sym_decrypt_bytea")),
						 2, dec_args, false);
	fmgr_info_cxt(enc, &encrypt_finfo, TopMemoryContext);
	fmgr_info_cxt(dec, &decrypt_finfo, TopMemoryContext);
	crypto_ready = true;
}

static bytea *
IdemEncrypt(bytea *plain)
{
	Datum		result;

	IdemCryptoLookup();
	result = FunctionCall3(&encrypt_finfo,
						   PointerGetDatum(plain),
						   CStringGetTextDatum(idem_encryption_key),
						   CStringGetTextDatum("cipher-algo=aes256"));
	return DatumGetByteaPP(result);
}

static bytea *
IdemDecrypt(bytea *cipher)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile Datum result = (Datum) 0;

	if (idem_encryption_key == NULL || idem_encryption_key[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_DECRYPTION_FAILED),
				 errmsg("stored response is encrypted but no encryption key is set"),
				 errdetail("The body was stored while idempotency.encryption_key was set."),
				 errhint("Set idempotency.encryption_key to the key with which the response was stored.")));

	IdemCryptoLookup();
	PG_TRY();
	{
		result = FunctionCall2(&decrypt_finfo,
							   PointerGetDatum(cipher),
							   CStringGetTextDatum(idem_encryption_key));
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		/* pgcrypto's own errors; anything else (a cancel) goes on as it is */
		if (edata->sqlerrcode != ERRCODE_EXTERNAL_ROUTINE_INVOCATION_EXCEPTION &&
			edata->sqlerrcode != ERRCODE_DATA_CORRUPTED)
			PG_RE_THROW();
		FlushErrorState();
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_DECRYPTION_FAILED),
				 errmsg("stored response cannot be decrypted"),
				 errdetail("pgcrypto reported: %s.", edata->message),
				 errhint("Check that idempotency.encryption_key is the key with which the response was stored.")));
	}
	PG_END_TRY();

	return DatumGetByteaPP(result);
}

/*
 * The cap on what is stored of a response: the body (JSON text or bytes)
 * and the headers (their JSON text) together.
 */
static void
IdemCheckResponseSize(const IdemEndpointPolicy *policy, Size body_bytes,
					  Size header_bytes)
{
	int			limit = idem_max_response_bytes;

	if (policy != NULL && policy->max_response_bytes >= 0)
		limit = policy->max_response_bytes;
	if (body_bytes + header_bytes > (Size) limit)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_RESPONSE_TOO_LARGE),
				 errmsg("response is too large to be stored"),
				 errdetail_plural("The response has %zu bytes (body %zu, headers %zu); at most %d byte is stored for this endpoint.",
								  "The response has %zu bytes (body %zu, headers %zu); at most %d bytes are stored for this endpoint.",
								  limit, body_bytes + header_bytes, body_bytes,
								  header_bytes, limit),
				 errhint("Store the body elsewhere and finish with a reference to it, or raise the limit with idempotency.max_response_bytes or the endpoint's max_response_bytes.")));
}

void
IdemCheckResponseStatus(int32 status)
{
	if (status < 100 || status > 599)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("response status %d is not an HTTP status", status),
				 errdetail("A status is a number from 100 to 599.")));
}

/*
 * What every stored response gets but encryption: sensitive headers
 * dropped and the others checked, the body omitted where the endpoint
 * keeps none, the size cap checked on plain (the body as a replay gives
 * it back).  Returns false when no body is kept (resp->body is then NULL).
 * *field names the column being checked, for the caller's errors.
 */
static bool
IdemResponseKeep(const IdemEndpointPolicy *policy, IdemResponse *resp,
				 const bytea *plain, const char **field)
{
	Size		header_bytes = 0;

	if (resp->headers != NULL)
	{
		*field = "response_headers";
		resp->headers = IdemFilterHeaders(resp->headers);
		header_bytes = strlen(JsonbToCString(NULL, &resp->headers->root,
											 VARSIZE(resp->headers)));
	}

	*field = "response_body";
	/* an endpoint that keeps no bodies keeps no references either */
	if (policy != NULL && policy->found && !policy->store_response &&
		resp->body_kind != IDEM_BODY_NONE)
	{
		IdemCheckResponseSize(policy, 0, header_bytes);
		resp->body_kind = IDEM_BODY_OMITTED;
		resp->body = NULL;
		resp->body_ref = NULL;
		resp->encrypted = false;
		return false;
	}

	if (resp->body_kind != IDEM_BODY_JSON && resp->body_kind != IDEM_BODY_BYTES)
	{
		IdemCheckResponseSize(policy, 0, header_bytes);
		resp->body = NULL;
		resp->encrypted = false;
		return false;
	}
	if (plain == NULL)
		elog(ERROR, "response of kind \"%s\" without a body",
			 IdemBodyKindName(resp->body_kind));

	IdemCheckResponseSize(policy, VARSIZE_ANY_EXHDR(plain), header_bytes);
	return true;
}

/*
 * Prepare a response for storage.  Everything that can fail is checked
 * before anything is written (the caller writes after this returns).
 */
void
IdemResponseForStorage(const IdemEndpointPolicy *policy, IdemResponse *resp)
{
	const char *field;

	if (!IdemResponseKeep(policy, resp, resp->body, &field))
		return;

	resp->encrypted = false;
	if (idem_encryption_key != NULL && idem_encryption_key[0] != '\0')
	{
		resp->body = IdemEncrypt(resp->body);
		resp->encrypted = true;
	}
}

/*
 * A stored body as a replay reads it: decrypted when it is marked encrypted
 * (IK501 when this database's key cannot decrypt it), as it is otherwise.
 */
bytea *
IdemResponsePlainBody(bytea *body, bool encrypted)
{
	return encrypted ? IdemDecrypt(body) : body;
}

/* The columns of a stored response must agree with its body_kind. */
static void
IdemCheckBodyColumns(const IdemResponse *resp)
{
	bool		body = resp->body != NULL;
	bool		ref = resp->body_ref != NULL;
	bool		ok;

	switch (resp->body_kind)
	{
		case IDEM_BODY_JSON:
		case IDEM_BODY_BYTES:
			ok = body && !ref;
			break;
		case IDEM_BODY_REF:
			ok = !body && ref && VARSIZE_ANY_EXHDR(resp->body_ref) > 0 &&
				!resp->encrypted;
			break;
		default:
			ok = !body && !ref && !resp->encrypted;
			break;
	}
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("response body does not match its body_kind \"%s\"",
						resp->body_kind == IDEM_BODY_NONE ? "NULL" :
						IdemBodyKindName(resp->body_kind)),
				 errdetail("A body_kind of json or bytes has a response_body and no body_ref, ref has a non-empty body_ref alone, unencrypted; NULL and omitted have neither.")));
}

/*
 * A JSON body must be text that a replay can read back as jsonb, with the
 * parser the replay uses (claim_result.c).
 */
static void
IdemCheckJsonBody(const bytea *body)
{
	if (IdemTryJsonTextToJsonb(VARDATA_ANY(body), VARSIZE_ANY_EXHDR(body)) == NULL)
		(void) DirectFunctionCall1(jsonb_in,
								   CStringGetDatum(text_to_cstring((const text *) body)));
}

void
IdemResponseCheckStored(const IdemEndpointPolicy *policy, IdemResponse *resp,
						const char **field)
{
	const bytea *plain = resp->body;

	*field = "body_kind";
	IdemCheckBodyColumns(resp);
	if (resp->body != NULL && resp->encrypted)
	{
		/* the key a replay here would decrypt it with */
		*field = "response_body";
		plain = IdemDecrypt(resp->body);
	}
	if (resp->body_kind == IDEM_BODY_JSON && plain != NULL)
	{
		*field = "response_body";
		IdemCheckJsonBody(plain);
	}
	if (!IdemResponseKeep(policy, resp, plain, field) || resp->encrypted)
		return;
	/* a plain body is stored as a finish here would store it */
	if (idem_encryption_key != NULL && idem_encryption_key[0] != '\0')
	{
		resp->body = IdemEncrypt(resp->body);
		resp->encrypted = true;
	}
}

/*
 * Prepare a stored response for replay: decrypt an encrypted body.  Bodies
 * stored unencrypted (before a key was set) are given back as they are.  A
 * body that the endpoint did not keep is announced by the header
 * Idempotent-Body-Omitted: true, so that the client knows the replay has
 * no body rather than an empty one.
 */
void
IdemResponseForReplay(IdemResponse *resp)
{
	if (resp->body_kind == IDEM_BODY_OMITTED)
	{
		Datum		mark = DirectFunctionCall1(jsonb_in,
											   CStringGetDatum("{\"" IDEM_OMITTED_HEADER "\": \"true\"}"));

		if (resp->headers != NULL && JB_ROOT_IS_OBJECT(resp->headers) &&
			!JB_ROOT_IS_SCALAR(resp->headers))
			mark = DirectFunctionCall2(jsonb_concat,
									   JsonbPGetDatum(resp->headers), mark);
		resp->headers = DatumGetJsonbP(mark);
	}
	if (!resp->encrypted)
		return;
	if (resp->body != NULL)
		resp->body = IdemDecrypt(resp->body);
	resp->encrypted = false;
}
