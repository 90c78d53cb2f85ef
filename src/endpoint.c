/*-------------------------------------------------------------------------
 *
 * endpoint.c
 *	  Per-endpoint policy from idempotency.endpoints, cached per backend.
 *
 *	  A statement trigger on the table sends a relcache invalidation for it,
 *	  so every backend drops its cache when a policy changes (at commit);
 *	  invalidations of other relations leave the cache alone.  In the Citus
 *	  mode the trigger fires on the reference table's shard of each node,
 *	  and invalidates idempotency.endpoints of that node as well.
 *
 *	  Endpoint names come from the callers, and most have no row (they use
 *	  the settings), so the cache is bounded: when it holds
 *	  IDEM_ENDPOINT_CACHE_MAX names, it is emptied before the next one goes
 *	  in.  An API has far fewer endpoints than that; a caller that passes
 *	  ever new names costs itself a lookup per call, and the backend no more
 *	  memory than the bound.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "access/htup_details.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "canonical_json.h"
#include "endpoint.h"
#include "keys.h"
#include "schema.h"
#include "util.h"

#define IDEM_ENDPOINT_CACHE_MAX 1000

typedef struct EndpointCacheEntry
{
	char		endpoint[IDEM_SCOPE_MAX_LEN + 1];	/* hash key */
	IdemEndpointPolicy policy;
} EndpointCacheEntry;

static HTAB *endpoint_cache = NULL;
static MemoryContext endpoint_cxt = NULL;	/* the cache and what it points to */
static EndpointCacheEntry *endpoint_last = NULL;	/* the last one asked for */
static bool endpoint_callback_registered = false;
static SPIPlanPtr endpoint_plan = NULL;
static IdemSchema endpoint_plan_schema;	/* the schema endpoint_plan reads */
static Oid	endpoints_relid = InvalidOid;	/* once known */

static void
IdemEndpointCacheEmpty(void)
{
	if (endpoint_cxt != NULL)
	{
		MemoryContextDelete(endpoint_cxt);
		endpoint_cxt = NULL;
	}
	endpoint_cache = NULL;
	endpoint_last = NULL;
}

static void
IdemEndpointCacheReset(Datum arg, Oid relid)
{
	/* the table's own invalidations, or all of them */
	if (OidIsValid(relid) && OidIsValid(endpoints_relid) &&
		relid != endpoints_relid)
		return;
	IdemEndpointCacheEmpty();
	endpoints_relid = InvalidOid;
}

/* The pointers of diagnostics_redact, in UTF-8, in cxt; NULL for none. */
static IdemDiagRedaction *
IdemEndpointRedaction(ArrayType *arr, MemoryContext cxt)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			k = 0;
	IdemDiagRedaction *r;

	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	if (n == 0)
		return NULL;
	r = MemoryContextAlloc(cxt, sizeof(IdemDiagRedaction));
	r->pointers = MemoryContextAlloc(cxt, sizeof(char *) * n);
	for (int i = 0; i < n; i++)
	{
		char	   *s;
		char	   *u;

		if (nulls[i])
			continue;			/* the endpoints trigger refuses them */
		s = TextDatumGetCString(elems[i]);
		u = pg_server_to_any(s, strlen(s), PG_UTF8);
		r->pointers[k++] = MemoryContextStrdup(cxt, u);
	}
	r->n = k;
	return r;
}

/*
 * The statement that reads an endpoint's policy, for the installed schema:
 * a column it lacks reads as NULL (the settings).  The resolver is text from
 * 0.4.0 on, regprocedure before.
 */
static const char *
IdemEndpointQuery(IdemSchema schema)
{
	bool		tombstones = schema >= IDEM_SCHEMA_TOMBSTONES;

	return psprintf("SELECT ttl, lease, on_lease_expiry OPERATOR(pg_catalog.=) 'resolve',"
					" resolver::pg_catalog.text,"
					" max_response_bytes, store_response, %s, %s, %s, %s"
					" FROM idempotency.endpoints e WHERE endpoint OPERATOR(pg_catalog.=) $1",
					schema >= IDEM_SCHEMA_DIAGNOSTICS ?
					"diagnostics" : "NULL::pg_catalog.bool",
					tombstones ?
					"tombstone_ttl OPERATOR(pg_catalog.>) '0'::pg_catalog.interval" :
					"NULL::pg_catalog.bool",
					tombstones ?
					"on_expired_reuse OPERATOR(pg_catalog.=) 'conflict'" :
					"NULL::pg_catalog.bool",
					schema >= IDEM_SCHEMA_REDACTION ?
					"diagnostics_redact" : "NULL::pg_catalog.text[]");
}

/*
 * The policy of an endpoint, read as the table's owner; what it points to
 * is allocated in cxt.
 */
static void
IdemEndpointLoad(const char *endpoint, IdemEndpointPolicy *policy,
				 MemoryContext cxt)
{
	IdemOwnerSection section;
	IdemSchema	schema;
	Datum		arg;
	int			rc;

	memset(policy, 0, sizeof(*policy));
	policy->max_response_bytes = -1;
	policy->store_response = true;
	policy->diagnostics = true;

	if (!OidIsValid(endpoints_relid))
		endpoints_relid = get_relname_relid("endpoints",
											get_namespace_oid("idempotency", false));

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	IdemBeginOwnerSection(&section, IdemExtensionOwner(), 0);
	schema = IdemSchemaVersion();
	if (endpoint_plan == NULL || endpoint_plan_schema != schema)
	{
		Oid			argtypes[1] = {TEXTOID};
		SPIPlanPtr	plan;

		if (endpoint_plan != NULL)
			SPI_freeplan(endpoint_plan);
		endpoint_plan = NULL;
		plan = SPI_prepare(IdemEndpointQuery(schema), 1, argtypes);
		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
		SPI_keepplan(plan);
		endpoint_plan = plan;
		endpoint_plan_schema = schema;
	}
	arg = CStringGetTextDatum(endpoint);
	rc = SPI_execute_plan(endpoint_plan, &arg, NULL, true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "reading idempotency.endpoints failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 1)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		d;

		policy->found = true;
		d = SPI_getbinval(tup, desc, 1, &isnull);
		if (!isnull)
		{
			policy->has_ttl = true;
			policy->ttl = *DatumGetIntervalP(d);
		}
		d = SPI_getbinval(tup, desc, 2, &isnull);
		if (!isnull)
		{
			policy->has_lease = true;
			policy->lease = *DatumGetIntervalP(d);
		}
		d = SPI_getbinval(tup, desc, 3, &isnull);
		policy->resolve_on_expiry = !isnull && DatumGetBool(d);
		d = SPI_getbinval(tup, desc, 4, &isnull);
		policy->has_resolver = !isnull;
		if (!isnull)
		{
			char	   *name = TextDatumGetCString(d);

			/*
			 * The trigger never stores one this long; a longer one, cut,
			 * matches no row when the call reads the row again.
			 */
			strlcpy(policy->resolver_name, name, sizeof(policy->resolver_name));
		}
		d = SPI_getbinval(tup, desc, 5, &isnull);
		policy->max_response_bytes = isnull ? -1 : DatumGetInt32(d);
		d = SPI_getbinval(tup, desc, 6, &isnull);
		policy->store_response = isnull || DatumGetBool(d);
		d = SPI_getbinval(tup, desc, 7, &isnull);
		policy->diagnostics = isnull || DatumGetBool(d);
		d = SPI_getbinval(tup, desc, 8, &isnull);
		policy->has_tombstone_ttl = !isnull;
		policy->tombstones_on = !isnull && DatumGetBool(d);
		d = SPI_getbinval(tup, desc, 9, &isnull);
		policy->expired_conflict = !isnull && DatumGetBool(d);
		d = SPI_getbinval(tup, desc, 10, &isnull);
		if (!isnull)
			policy->diagnostics_redact = IdemEndpointRedaction(DatumGetArrayTypeP(d), cxt);
	}
	IdemEndOwnerSection(&section);
	SPI_finish();
}

const IdemEndpointPolicy *
IdemGetEndpointPolicy(const char *endpoint)
{
	EndpointCacheEntry *entry;
	bool		found;
	char		keybuf[IDEM_SCOPE_MAX_LEN + 1];

	if (endpoint_last != NULL && strcmp(endpoint_last->endpoint, endpoint) == 0)
		return &endpoint_last->policy;
	if (!endpoint_callback_registered)
	{
		IdemRegisterRelcacheCallback(IdemEndpointCacheReset);
		endpoint_callback_registered = true;
	}
	if (endpoint_cache != NULL &&
		hash_get_num_entries(endpoint_cache) >= IDEM_ENDPOINT_CACHE_MAX)
		IdemEndpointCacheEmpty();
	if (endpoint_cache == NULL)
	{
		HASHCTL		ctl;

		endpoint_cxt = AllocSetContextCreate(CacheMemoryContext,
											 "idempotency endpoint policies",
											 ALLOCSET_SMALL_SIZES);
		ctl.keysize = sizeof(keybuf);
		ctl.entrysize = sizeof(EndpointCacheEntry);
		ctl.hcxt = endpoint_cxt;
		endpoint_cache = hash_create("idempotency endpoint policies", 64, &ctl,
									 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}

	memset(keybuf, 0, sizeof(keybuf));
	strlcpy(keybuf, endpoint, sizeof(keybuf));
	entry = hash_search(endpoint_cache, keybuf, HASH_FIND, NULL);
	if (entry == NULL)
	{
		IdemEndpointPolicy policy;

		/* load first: an error must not leave a half-made entry behind */
		IdemEndpointLoad(keybuf, &policy, CurrentMemoryContext);
		if (endpoint_cache == NULL)
			return IdemGetEndpointPolicy(endpoint);	/* reset meanwhile */
		if (policy.diagnostics_redact != NULL)
		{
			MemoryContext old = MemoryContextSwitchTo(endpoint_cxt);

			policy.diagnostics_redact = IdemDiagRedactionCopy(policy.diagnostics_redact);
			MemoryContextSwitchTo(old);
		}
		entry = hash_search(endpoint_cache, keybuf, HASH_ENTER, &found);
		entry->policy = policy;
	}
	endpoint_last = entry;
	return &entry->policy;
}

PG_FUNCTION_INFO_V1(idem_endpoints_changed);

/*
 * Statement trigger on idempotency.endpoints: tell every backend to drop its
 * cached policies once this transaction commits.
 */
Datum
idem_endpoints_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Oid			relid;
	Oid			named;

	IdemRequireTriggerCall(fcinfo, "idem_endpoints_changed", NULL);
	relid = RelationGetRelid(trigdata->tg_relation);
	CacheInvalidateRelcacheByRelid(relid);

	/*
	 * In the Citus mode the table is a reference table, and the trigger
	 * fires on its shard of each node, not on idempotency.endpoints, which
	 * the cache reads and listens for: tell that one too.
	 */
	named = get_relname_relid("endpoints", get_namespace_oid("idempotency", false));
	if (OidIsValid(named) && named != relid)
		CacheInvalidateRelcacheByRelid(named);
	return PointerGetDatum(NULL);
}

/* The longest ttl or lease an endpoint may set: what a claim accepts. */
#define IDEM_ENDPOINT_MAX_YEARS	100
#define IDEM_ENDPOINT_MAX_REDACT	64

/* Refuse column name of the new row unless it is NULL or in (0, 100 years]. */
static void
IdemEndpointCheckInterval(HeapTuple tup, Relation rel, const char *name,
						  const char *endpoint)
{
	int			attnum = IdemTriggerColumn(rel, name, INTERVALOID, false,
										   "idem_endpoints_check");
	TupleDesc	desc = RelationGetDescr(rel);
	Interval	zero;
	Interval	max;
	Datum		d;
	bool		isnull;

	if (attnum <= 0)
		return;
	d = heap_getattr(tup, attnum, desc, &isnull);
	if (isnull)
		return;
	memset(&zero, 0, sizeof(zero));
	memset(&max, 0, sizeof(max));
	max.month = IDEM_ENDPOINT_MAX_YEARS * MONTHS_PER_YEAR;
	if (!DatumGetBool(DirectFunctionCall2(interval_gt, d, IntervalPGetDatum(&zero))) ||
		DatumGetBool(DirectFunctionCall2(interval_gt, d, IntervalPGetDatum(&max))))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s of endpoint \"%s\" is out of range", name, endpoint),
				 errdetail("An endpoint's %s must be positive and at most %d years, or NULL.",
						   name, IDEM_ENDPOINT_MAX_YEARS),
				 errhint("A claim also refuses a ttl longer than idempotency.max_ttl.")));
}

PG_FUNCTION_INFO_V1(idem_endpoints_check);

/*
 * Row trigger on idempotency.endpoints, before an insert or update: the
 * ranges of ttl and lease, and the pointers of diagnostics_redact, checked
 * with errors that name the column (22023).
 */
Datum
idem_endpoints_check(PG_FUNCTION_ARGS)
{
	Relation	rel;
	HeapTuple	tup = IdemBeforeRowTriggerTuple(fcinfo, "idem_endpoints_check",
												"endpoints", &rel);
	TupleDesc	desc = RelationGetDescr(rel);
	int			attnum;
	char	   *endpoint;
	Datum		d;
	bool		isnull;

	endpoint = SPI_getvalue(tup, desc,
							IdemTriggerColumn(rel, "endpoint", TEXTOID, true,
											  "idem_endpoints_check"));
	if (endpoint == NULL)
		endpoint = pstrdup("");

	IdemEndpointCheckInterval(tup, rel, "ttl", endpoint);
	IdemEndpointCheckInterval(tup, rel, "lease", endpoint);

	if (!IdemSchemaHas(IDEM_SCHEMA_REDACTION))
		return PointerGetDatum(tup);
	attnum = IdemTriggerColumn(rel, "diagnostics_redact", TEXTARRAYOID, true,
							   "idem_endpoints_check");
	d = heap_getattr(tup, attnum, desc, &isnull);
	if (!isnull)
	{
		ArrayType  *arr = DatumGetArrayTypeP(d);
		IdemExclusions *ex;
		int			n = ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr));

		if (n > IDEM_ENDPOINT_MAX_REDACT)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("diagnostics_redact of endpoint \"%s\" has too many pointers", endpoint),
					 errdetail("It has %d; at most %d are allowed.", n, IDEM_ENDPOINT_MAX_REDACT)));
		if (!IdemTryParseExclusions(arr, &ex))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("diagnostics_redact of endpoint \"%s\" holds a NULL or malformed JSON pointer", endpoint),
					 errdetail("Each element must be an RFC 6901 pointer such as \"/card/number\" or \"/items/*/card\", with \"~0\" for \"~\" and \"~1\" for \"/\"."),
					 errhint("To name no member at all, set diagnostics to false.")));
	}
	return PointerGetDatum(tup);
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
