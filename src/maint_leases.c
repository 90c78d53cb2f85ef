/*-------------------------------------------------------------------------
 *
 * maint_leases.c
 *	  Step 1 of a maintenance pass: stale leases.  In_progress rows past
 *	  locked_until (and not expired) become 'unknown', or, when their
 *	  endpoint has a resolver and resolve_on_expiry, are settled by the
 *	  resolver's answer: completed with the response it returns, or failed
 *	  when it finds no business record.  Each resolver call runs in a
 *	  subtransaction, as the endpoint's resolver_role, cut off after
 *	  idempotency.resolver_timeout; a resolver that fails leaves the key as
 *	  it was for the next pass.  The rows are read and changed by the key
 *	  store (keystore.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/regproc.h"
#include "utils/timeout.h"

#include "audit.h"
#include "endpoint.h"
#include "guc.h"
#include "keygen.h"
#include "keystore.h"
#include "maint_leases.h"
#include "resolver.h"
#include "response.h"
#include "stats.h"
#include "util.h"

typedef enum LeaseOutcome
{
	LEASE_UNKNOWN,
	LEASE_COMPLETED,
	LEASE_FAILED,
	LEASE_RESOLVER_ERROR,
	LEASE_GONE					/* changed meanwhile: nothing done */
} LeaseOutcome;

/* the action reported of each outcome but the last */
static const IdemMaintKind lease_outcome_kinds[LEASE_GONE] = {
	[LEASE_UNKNOWN] = IDEM_MAINT_LEASE_UNKNOWN,
	[LEASE_COMPLETED] = IDEM_MAINT_LEASE_COMPLETED,
	[LEASE_FAILED] = IDEM_MAINT_LEASE_FAILED,
	[LEASE_RESOLVER_ERROR] = IDEM_MAINT_RESOLVER_ERROR,
};

/* What logs show of a key: idem_key_hash(tenant, endpoint, key). */
static char *
IdemLeaseKeyHash(const IdemStaleLease *l)
{
	char	   *out = palloc(IDEM_KEY_HASH_LEN + 1);

	IdemKeyHash(l->tenant, strlen(l->tenant), l->endpoint, strlen(l->endpoint),
				l->key, strlen(l->key), out);
	return out;
}

static void
IdemReportLease(const IdemStaleLease *l, const char *to_state, int status)
{
	IdemTransition t;

	memset(&t, 0, sizeof(t));
	t.tenant = l->tenant;
	t.endpoint = l->endpoint;
	t.key = l->key;
	t.fingerprint = l->fingerprint;
	t.from_state = "in_progress";
	t.to_state = to_state;
	t.replayed = false;
	t.response_status = status;
	t.started = l->created_at;
	IdemReportTransition(&t);
}

typedef struct ResolveArgs
{
	const IdemStaleLease *lease;
	const IdemEndpointPolicy *policy;
	LeaseOutcome outcome;
	int			status;
} ResolveArgs;

/*
 * Call the endpoint's resolver about lease l, as the endpoint's
 * resolver_role; returns its answer (*isnull when it returned NULL), and
 * the function it called in *resolver.
 */
static Datum
IdemCallResolver(const IdemStaleLease *l, const IdemEndpointPolicy *policy,
				 Oid *resolver, bool *isnull)
{
	FmgrInfo	flinfo;

	LOCAL_FCINFO(fcinfo, 3);
	Datum		answer;
	Oid			role;
	IdemUserSwitch user;
	int			guc_nest;

	/*
	 * The function is found again by its name at each call; it, and the
	 * role, may have changed since the row was written.
	 */
	role = IdemResolverRole(l->endpoint, policy->resolver_name, resolver);
	IdemResolverCheckSignature(*resolver, l->endpoint);
	IdemResolverCheckRole(*resolver, role, l->endpoint);

	fmgr_info(*resolver, &flinfo);
	InitFunctionCallInfoData(*fcinfo, &flinfo, 3, DEFAULT_COLLATION_OID, NULL, NULL);
	fcinfo->args[0].value = CStringGetTextDatum(l->tenant);
	fcinfo->args[0].isnull = false;
	fcinfo->args[1].value = CStringGetTextDatum(l->endpoint);
	fcinfo->args[1].isnull = false;
	fcinfo->args[2].value = CStringGetTextDatum(l->key);
	fcinfo->args[2].isnull = false;

	/*
	 * The resolver runs as the endpoint's resolver_role (the role that set
	 * it), not as the pass (the extension's owner), and may not change
	 * session state: whoever may edit idempotency.endpoints can name a
	 * resolver, but not run code with rights they do not have.  A SECURITY
	 * DEFINER resolver runs as its owner, who lent those rights by granting
	 * EXECUTE.  An error restores the user with the subtransaction.
	 *
	 * Every setting the resolver changes, with SET as with SET LOCAL, is
	 * undone when it returns (as a rollback would, not as a function's SET
	 * clause does, which keeps a plain SET): the pass goes on as the
	 * extension's owner, and a search_path of the resolver's choosing would
	 * have the owner run whatever functions, operators and types it names.
	 */
	guc_nest = NewGUCNestLevel();
	IdemSwitchUser(&user, role, SECURITY_RESTRICTED_OPERATION);
	answer = FunctionCallInvoke(fcinfo);
	IdemRestoreUser(&user);
	AtEOXact_GUC(false, guc_nest);

	*isnull = fcinfo->isnull;
	return answer;
}

/*
 * The response that a resolver's answer (not NULL) gives, in *resp; raises
 * when the answer is not a JSON object with a valid "status" and, if any,
 * object "headers".
 */
static void
IdemResolverResponse(Datum answer, Oid resolver, const IdemStaleLease *l,
					 IdemResponse *resp)
{
	Oid			types[2] = {JSONBOID, TEXTOID};
	Datum		values[2];
	int			rc;
	bool		isnull;
	char	   *status_type;
	char	   *status_text;
	char	   *top;
	char	   *headers_type;
	char	   *end = NULL;
	long		status = 0;
	Datum		body;

	/* pick the answer apart */
	values[0] = answer;
	values[1] = CStringGetTextDatum("UTF8");
	rc = SPI_execute_with_args("SELECT pg_catalog.jsonb_typeof($1),"
							   " pg_catalog.jsonb_typeof($1 OPERATOR(pg_catalog.->) 'status'),"
							   " $1 OPERATOR(pg_catalog.->>) 'status',"
							   " pg_catalog.jsonb_typeof($1 OPERATOR(pg_catalog.->) 'headers'),"
							   " $1 OPERATOR(pg_catalog.->) 'headers',"
							   " pg_catalog.convert_to(($1 OPERATOR(pg_catalog.->) 'body')::pg_catalog.text, $2)",
							   2, types, values, NULL, true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "reading a resolver's answer failed: %s", SPI_result_code_string(rc));

	top = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	status_type = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
	status_text = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3);
	headers_type = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 4);

	if (status_text != NULL)
	{
		errno = 0;
		status = strtol(status_text, &end, 10);
	}
	if (top == NULL || strcmp(top, "object") != 0 ||
		status_type == NULL || strcmp(status_type, "number") != 0 ||
		end == NULL || *end != '\0' || errno != 0 || status < 100 || status > 599 ||
		(headers_type != NULL && strcmp(headers_type, "null") != 0 &&
		 strcmp(headers_type, "object") != 0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("resolver %s of endpoint \"%s\" returned an invalid answer",
						format_procedure(resolver), l->endpoint),
				 errdetail("A resolver returns NULL or a JSON object with an integer \"status\" from 100 to 599, an optional \"body\" and an optional object \"headers\".")));

	memset(resp, 0, sizeof(*resp));
	resp->status = (int32) status;
	if (headers_type != NULL && strcmp(headers_type, "object") == 0)
		resp->headers = DatumGetJsonbP(SPI_getbinval(SPI_tuptable->vals[0],
													 SPI_tuptable->tupdesc, 5, &isnull));
	/* no "body": NULL, which must not be detoasted */
	body = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 6, &isnull);
	if (isnull)
	{
		resp->body = NULL;
		resp->body_kind = IDEM_BODY_NONE;
	}
	else
	{
		resp->body = DatumGetByteaP(body);
		resp->body_kind = IDEM_BODY_JSON;
	}
}

/* Call the resolver and apply its answer; runs in a subtransaction. */
static void
IdemResolveLease(IdemMaintPass *p, ResolveArgs *a)
{
	const IdemStaleLease *l = a->lease;
	Oid			resolver;
	Datum		answer;
	bool		isnull;
	IdemResponse resp;

	answer = IdemCallResolver(l, a->policy, &resolver, &isnull);
	if (isnull)
	{
		/* no business record: the operation did not happen */
		if (IdemKeystoreSettleLease(l, p->as_of, IDEM_STATE_FAILED,
									"resolver found no business record", NULL))
			a->outcome = LEASE_FAILED;
		else
			a->outcome = LEASE_GONE;
		return;
	}

	IdemResolverResponse(answer, resolver, l, &resp);

	/* what the endpoint keeps of it (headers, size cap, encryption) */
	IdemResponseForStorage(a->policy, &resp);

	if (!IdemKeystoreSettleLease(l, p->as_of, IDEM_STATE_COMPLETED, NULL, &resp))
		a->outcome = LEASE_GONE;
	else
	{
		a->outcome = LEASE_COMPLETED;
		a->status = resp.status;
	}
}

typedef struct ResolveCall
{
	IdemMaintPass *p;
	ResolveArgs *a;
} ResolveCall;

static void
IdemCallResolveLease(void *arg)
{
	ResolveCall *c = (ResolveCall *) arg;

	IdemResolveLease(c->p, c->a);
}

/*
 * idempotency.resolver_timeout: a timeout of this process's own, which
 * cancels the resolver's call the way a statement timeout cancels a query
 * (the resolver sees a query cancel at its next interrupt check).
 */
static volatile sig_atomic_t resolver_timed_out = false;
static TimeoutId resolver_timeout_id;
static bool resolver_timeout_registered = false;

static void
IdemResolverTimeoutHandler(void)
{
	resolver_timed_out = true;
	InterruptPending = true;
	QueryCancelPending = true;
	SetLatch(MyLatch);
}

/*
 * Settle one stale lease through the endpoint's resolver.  A resolver that
 * raises, or does not answer within idempotency.resolver_timeout, leaves the
 * row as it was: the error is logged and the pass goes on.
 */
static LeaseOutcome
IdemResolveLeaseGuarded(IdemMaintPass *p, const IdemStaleLease *l,
						const IdemEndpointPolicy *policy, int *status)
{
	ResolveArgs a;
	ResolveCall c = {p, &a};
	ErrorData  *edata;
	int			timeout_ms = idem_resolver_timeout;
	bool		timed_out;

	a.lease = l;
	a.policy = policy;
	a.outcome = LEASE_RESOLVER_ERROR;
	a.status = -1;

	if (timeout_ms > 0 && !resolver_timeout_registered)
	{
		resolver_timeout_id = RegisterTimeout(USER_TIMEOUT, IdemResolverTimeoutHandler);
		resolver_timeout_registered = true;
	}
	resolver_timed_out = false;
	if (timeout_ms > 0)
		enable_timeout_after(resolver_timeout_id, timeout_ms);
	edata = IdemRunInSubtransaction(IdemCallResolveLease, &c);
	if (timeout_ms > 0)
		disable_timeout(resolver_timeout_id, false);
	timed_out = resolver_timed_out;
	if (timed_out)
	{
		/* the cancel was this timeout's: none is left for the pass */
		QueryCancelPending = false;
		resolver_timed_out = false;
	}

	if (edata != NULL)
	{
		/* a cancel (not the timeout's) or shutdown stops the pass */
		if ((edata->sqlerrcode == ERRCODE_QUERY_CANCELED && !timed_out) ||
			edata->sqlerrcode == ERRCODE_ADMIN_SHUTDOWN)
			ReThrowError(edata);

		if (timed_out)
			ereport(WARNING,
					(errmsg("idempotency resolver of endpoint \"%s\" did not answer within %d ms for tenant \"%s\", key hash %s",
							l->endpoint, timeout_ms, l->tenant, IdemLeaseKeyHash(l)),
					 errdetail("The key stays in_progress; the next maintenance pass calls the resolver again."),
					 errhint("A resolver should only look the operation up; raise idempotency.resolver_timeout if it needs longer.")));
		else
			ereport(WARNING,
					(errmsg("idempotency resolver of endpoint \"%s\" failed for tenant \"%s\", key hash %s: %s",
							l->endpoint, l->tenant, IdemLeaseKeyHash(l), edata->message),
					 errdetail("The key stays in_progress; the next maintenance pass calls the resolver again.")));
		FreeErrorData(edata);
		a.outcome = LEASE_RESOLVER_ERROR;
	}

	*status = a.status;
	return a.outcome;
}

typedef struct LeaseCount
{
	char	   *endpoint;
	int64		n[LEASE_GONE];
} LeaseCount;

/*
 * Preview of step 1: per endpoint, the stale leases that a pass would give
 * to the endpoint's resolver ("lease_resolve") or mark unknown.
 */
static void
IdemStaleLeasesPreview(IdemMaintPass *p)
{
	int			nrows;
	char	  **endpoints;
	int64	   *counts;

	nrows = IdemKeystoreCountStaleLeases(p->as_of, &endpoints, &counts);
	for (int i = 0; i < nrows; i++)
	{
		const IdemEndpointPolicy *policy = IdemGetEndpointPolicy(endpoints[i]);

		IdemMaintReport(p, policy->resolve_on_expiry && policy->has_resolver ?
				 IDEM_MAINT_LEASE_RESOLVE : IDEM_MAINT_LEASE_UNKNOWN,
				 endpoints[i], counts[i]);
	}
}

void
IdemMaintStaleLeases(IdemMaintPass *p)
{
	int			nrows;
	IdemStaleLease *leases;
	List	   *counts = NIL;
	ListCell   *lc;

	IdemMaintStepBegin(p);
	if (p->preview)
	{
		IdemStaleLeasesPreview(p);
		IdemMaintStepEnd(p);
		return;
	}
	nrows = IdemKeystoreStaleLeases(p->as_of, &leases);

	for (int i = 0; i < nrows; i++)
	{
		IdemStaleLease *l = &leases[i];
		IdemEndpointPolicy policy = *IdemGetEndpointPolicy(l->endpoint);
		LeaseOutcome outcome;
		int			status = -1;
		LeaseCount *count = NULL;

		CHECK_FOR_INTERRUPTS();

		if (policy.resolve_on_expiry && policy.has_resolver)
			outcome = IdemResolveLeaseGuarded(p, l, &policy, &status);
		else
			outcome = IdemKeystoreSettleLease(l, p->as_of, IDEM_STATE_UNKNOWN,
											  NULL, NULL) ?
				LEASE_UNKNOWN : LEASE_GONE;

		/* counted once per key: when its state changed */
		if (outcome == LEASE_UNKNOWN || outcome == LEASE_COMPLETED ||
			outcome == LEASE_FAILED)
			IdemStatsCount(l->endpoint, IDEM_COUNT_LEASES_EXPIRED);

		switch (outcome)
		{
			case LEASE_UNKNOWN:
				ereport(WARNING,
						(errmsg("idempotency lease expired: tenant \"%s\", endpoint \"%s\", key hash %s is now unknown",
								l->tenant, l->endpoint, IdemLeaseKeyHash(l)),
						 errdetail("Its holder neither finished nor renewed the lease in time; duplicates get outcome_pending until an operator resolves the key."),
						 errhint("Record the real outcome with idempotency.idem_resolve().")));
				IdemReportLease(l, "unknown", -1);
				break;
			case LEASE_COMPLETED:
				IdemStatsCount(l->endpoint, IDEM_COUNT_RESOLVED);
				IdemReportLease(l, "completed", status);
				break;
			case LEASE_FAILED:
				IdemStatsCount(l->endpoint, IDEM_COUNT_RESOLVED);
				IdemReportLease(l, "failed", -1);
				break;
			case LEASE_RESOLVER_ERROR:
			case LEASE_GONE:
				break;
		}
		if (outcome == LEASE_GONE)
			continue;

		/* one result row per endpoint and outcome; rows come by endpoint */
		if (counts != NIL)
		{
			count = llast(counts);
			if (strcmp(count->endpoint, l->endpoint) != 0)
				count = NULL;
		}
		if (count == NULL)
		{
			count = palloc0(sizeof(LeaseCount));
			count->endpoint = l->endpoint;
			counts = lappend(counts, count);
		}
		count->n[outcome]++;
	}

	foreach(lc, counts)
	{
		LeaseCount *count = lfirst(lc);
		int			o;

		for (o = 0; o < LEASE_GONE; o++)
			if (count->n[o] > 0)
				IdemMaintReport(p, lease_outcome_kinds[o], count->endpoint, count->n[o]);
	}
	IdemMaintStepEnd(p);
}
