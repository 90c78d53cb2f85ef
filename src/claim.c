/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  The claim/finish protocol: idem_claim, idem_finish, idem_finish_bytes,
 *	  idem_finish_ref, idem_release, idem_fail, idem_heartbeat, idem_resolve,
 *	  idem_lookup.
 *
 *	  A call reads its scope (scope.c), takes or finds the scope's lock,
 *	  and reads and writes the scope's row through the key store
 *	  (keystore.c), which alone knows how rows are stored.  This file keeps
 *	  what the protocol decides: the claims of the transaction still
 *	  pending, and what happens to them when (sub)transactions end.
 *
 *	  Uniqueness.  PostgreSQL cannot enforce one live row per (tenant,
 *	  endpoint, key) with a unique index, since the key does not contain the
 *	  partition column (expires_at).  A claim therefore first takes a
 *	  transaction-scoped lock in the extension's own lock space, keyed by a
 *	  hash of the scope, and only then reads the scope's rows with the
 *	  latest snapshot (not the transaction's, so that REPEATABLE READ and
 *	  SERIALIZABLE callers see what committed while they waited).  Each
 *	  partition's unique index on the scope is a safety net.
 *
 *	  Atomic mode (no lease).  The claim inserts nothing: it keeps the scope
 *	  lock and remembers the claim in backend memory; idem_finish inserts the
 *	  completed row in the same transaction.  A concurrent duplicate waits on
 *	  the lock, then sees the committed row (replay) or nothing (execute).
 *	  Committing with a claim neither finished nor released is an error.
 *
 *	  Lease mode.  The claim inserts an in_progress row with a random lease
 *	  token and locked_until, which the caller commits; later transactions
 *	  present the token to finish, fail, release or extend the lease.
 *
 *	  Expired keys.  A claim that finds no live row, on an endpoint that
 *	  keeps tombstones (tombstone.c), looks for the latest expired key of its
 *	  scope, as a row not yet dropped or as a tombstone: another fingerprint
 *	  is refused (422), the same one executes or, per endpoint, answers 409
 *	  key_expired.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/int.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/nodeFuncs.h"
#include "port/pg_bswap.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"
#include "utils/wait_event.h"

#include "audit.h"
#include "canonical_json.h"
#include "claim.h"
#include "diag_bound.h"
#include "diagnostics.h"
#include "endpoint.h"
#include "guc.h"
#include "idempotency.h"
#include "keys.h"
#include "keystore.h"
#include "response.h"
#include "scope.h"
#include "stats.h"
#include "tombstone.h"

/* how long a waiting claim sleeps between two looks at a leased row */
#define IDEM_LEASE_POLL_MS		20

/*
 * A claim of this transaction that holds its scope lock: in atomic mode,
 * waiting for its finish (or finished, failed or released in a
 * subtransaction that may still roll back); in lease mode, a row inserted.
 *
 * The list follows subtransactions exactly as the locks do (they belong to
 * the subtransaction that took them, and pass to the parent when it
 * commits): an entry made in a subtransaction that rolls back goes with its
 * lock, and the end of a claim (done_level) is undone when the
 * subtransaction that ended it rolls back, since the row written by the
 * finish (or fail) goes too.  A claim that is pending again must then be
 * finished before COMMIT, which otherwise raises IK500 and so rolls back
 * the business writes of a key without a completion.
 */
typedef struct PendingClaim
{
	struct PendingClaim *next;
	text	   *tenant;
	text	   *endpoint;
	text	   *key;
	bytea	   *fingerprint;
	bytea	   *request_digest; /* NULL: none kept */
	TimestampTz created_at;
	TimestampTz expires_at;
	LOCKTAG		tag;
	int			nest_level;		/* subtransaction whose lock it is */
	int			done_level;		/* 0: pending; else the subtransaction that
								 * ended it (made it, for a lease) */
} PendingClaim;

static PendingClaim *pending_claims = NULL;
static int	claims_held = 0;	/* entries in pending_claims */

/*
 * A claim's wait in milliseconds, months counted as 30 days: not negative,
 * and at most INT_MAX, the longest idempotency.claim_wait and lock wait, so
 * that the deadline cannot overflow.  An interval whose microseconds do not
 * fit in 64 bits is judged by its sign.
 */
static int64
IdemWaitMs(const Interval *iv)
{
	int64		months;
	int64		days;
	int64		usecs;
	bool		overflow;

	overflow = pg_mul_s64_overflow(iv->month, (int64) DAYS_PER_MONTH * USECS_PER_DAY, &months) ||
		pg_mul_s64_overflow(iv->day, USECS_PER_DAY, &days) ||
		pg_add_s64_overflow(months, days, &usecs) ||
		pg_add_s64_overflow(usecs, iv->time, &usecs);
	if (overflow ? (double) iv->month * DAYS_PER_MONTH * USECS_PER_DAY +
		(double) iv->day * USECS_PER_DAY + (double) iv->time < 0 :
		usecs / 1000 < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("wait must not be negative")));
	if (overflow || usecs / 1000 > INT_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("wait is too long"),
				 errdetail_plural("A claim waits at most %d millisecond (about 24 days).",
								  "A claim waits at most %d milliseconds (about 24 days).",
								  INT_MAX, INT_MAX)));
	return usecs / 1000;
}

/*
 * ts + iv, where iv is the argument named what.  No ttl, lease or extension
 * is meant to last a century: a longer one (or an infinite one) is refused
 * as an invalid argument, naming it, before the sum could overflow the
 * timestamp type.
 */
#define IDEM_MAX_INTERVAL_YEARS 100

static TimestampTz
IdemAddInterval(TimestampTz ts, const Interval *iv, const char *what)
{
	const int64 max_days = (int64) (IDEM_MAX_INTERVAL_YEARS * DAYS_PER_YEAR);

	if (iv->month > IDEM_MAX_INTERVAL_YEARS * MONTHS_PER_YEAR ||
		iv->month < -IDEM_MAX_INTERVAL_YEARS * MONTHS_PER_YEAR ||
		iv->day > max_days || iv->day < -max_days ||
		iv->time > max_days * USECS_PER_DAY ||
		iv->time < -max_days * USECS_PER_DAY)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is out of range", what),
				 errdetail("An interval of more than %d years, or an infinite one, is not accepted.",
						   IDEM_MAX_INTERVAL_YEARS)));
	return DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
												   TimestampTzGetDatum(ts),
												   IntervalPGetDatum(iv)));
}

/* ----------------------------------------------------------------
 *		pending claims of atomic mode
 * ----------------------------------------------------------------
 */

static bool
IdemTextEqual(const text *a, const text *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

/* The pending (unfinished) atomic claim of a scope, or NULL. */
static PendingClaim *
IdemFindPending(const IdemScope *scope, PendingClaim ***link)
{
	PendingClaim **p;

	for (p = &pending_claims; *p != NULL; p = &(*p)->next)
	{
		if ((*p)->done_level == 0 &&
			IdemTextEqual((*p)->key, scope->key) &&
			IdemTextEqual((*p)->endpoint, scope->endpoint) &&
			IdemTextEqual((*p)->tenant, scope->tenant))
		{
			if (link)
				*link = p;
			return *p;
		}
	}
	return NULL;
}

/*
 * Remember a claim that keeps its scope lock until the transaction ends:
 * pending (atomic mode), or ended at once (leased).  Refused with IK429
 * when the transaction already holds idempotency.max_claims_per_transaction
 * of them, before the lock table of the whole server is at risk.
 */
static void
IdemAddPending(const IdemScope *scope, const bytea *fingerprint,
			   const bytea *request_digest, TimestampTz created_at,
			   TimestampTz expires_at, const LOCKTAG *tag, bool leased)
{
	MemoryContext old;
	PendingClaim *pc;

	if (claims_held >= idem_max_claims_per_transaction)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_TOO_MANY_CLAIMS),
				 errmsg("too many idempotency keys claimed in one transaction"),
				 errdetail_plural("The transaction already holds %d claim, the most idempotency.max_claims_per_transaction allows.",
								  "The transaction already holds %d claims, the most idempotency.max_claims_per_transaction allows.",
								  claims_held, claims_held),
				 errhint("Each claim holds a lock until the transaction ends: claim fewer keys per transaction, or raise idempotency.max_claims_per_transaction together with max_locks_per_transaction.")));

	old = MemoryContextSwitchTo(TopTransactionContext);
	pc = palloc(sizeof(PendingClaim));
	pc->tenant = DatumGetTextPCopy(PointerGetDatum(scope->tenant));
	pc->endpoint = DatumGetTextPCopy(PointerGetDatum(scope->endpoint));
	pc->key = DatumGetTextPCopy(PointerGetDatum(scope->key));
	pc->fingerprint = DatumGetByteaPCopy(PointerGetDatum(fingerprint));
	pc->request_digest = request_digest == NULL ? NULL :
		DatumGetByteaPCopy(PointerGetDatum(request_digest));
	pc->created_at = created_at;
	pc->expires_at = expires_at;
	pc->tag = *tag;
	pc->nest_level = GetCurrentTransactionNestLevel();
	pc->done_level = leased ? pc->nest_level : 0;
	pc->next = pending_claims;
	pending_claims = pc;
	claims_held++;
	MemoryContextSwitchTo(old);
}

/* Unlink an entry (*link) and free it. */
static void
IdemForgetPending(PendingClaim **link)
{
	PendingClaim *pc = *link;

	*link = pc->next;
	claims_held--;
	pfree(pc->tenant);
	pfree(pc->endpoint);
	pfree(pc->key);
	pfree(pc->fingerprint);
	if (pc->request_digest)
		pfree(pc->request_digest);
	pfree(pc);
}

/*
 * End a pending claim (finished, failed or released).  With release_lock,
 * also give up the scope lock now, so that a waiting duplicate proceeds
 * before this transaction ends; only where the claim and its lock belong to
 * the current subtransaction, whose rollback would undo the claim anyway,
 * and the entry then goes.  Otherwise the entry stays, ended at this level,
 * to be made pending again if this subtransaction rolls back.
 */
static void
IdemEndPending(PendingClaim **link, bool release_lock)
{
	PendingClaim *pc = *link;
	int			level = GetCurrentTransactionNestLevel();

	if (release_lock && pc->nest_level == level)
	{
		IdemReleaseScopeLock(&pc->tag);
		IdemForgetPending(link);
	}
	else
		pc->done_level = level;
}

static void
IdemXactCallback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PARALLEL_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			{
				PendingClaim *first = NULL;
				PendingClaim *pc;
				int			n = 0;

				for (pc = pending_claims; pc != NULL; pc = pc->next)
				{
					if (pc->done_level != 0)
						continue;
					if (first == NULL)
						first = pc;
					n++;
				}
				if (n == 0)
					break;
				pending_claims = NULL;
				claims_held = 0;
				ereport(ERROR,
						(errcode(ERRCODE_IDEM_UNFINISHED_CLAIM),
						 errmsg("transaction claimed an idempotency key but neither finished nor released it"),
						 errdetail_plural("%d key of endpoint \"%s\" (tenant \"%s\") was claimed in atomic mode and is still unfinished.",
										  "%d keys were claimed in atomic mode and are still unfinished, one of endpoint \"%s\" (tenant \"%s\").",
										  n, n, text_to_cstring(first->endpoint),
										  text_to_cstring(first->tenant)),
						 errhint("Call idem_finish, idem_fail or idem_release before COMMIT; the transaction has been rolled back.")));
			}
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			/* the memory went with TopTransactionContext */
			pending_claims = NULL;
			claims_held = 0;
			break;
	}
}

/*
 * A subtransaction that rolls back takes with it the claims it made (their
 * locks are released with it) and undoes the ends of claims it finished,
 * failed or released (their rows are gone); one that commits passes both to
 * its parent, as its locks pass to the parent's resource owner.
 */
static void
IdemSubXactCallback(SubXactEvent event, SubTransactionId mySubid,
					SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();
	PendingClaim **p = &pending_claims;

	if (event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB)
		return;
	while (*p != NULL)
	{
		PendingClaim *pc = *p;

		if (event == SUBXACT_EVENT_ABORT_SUB)
		{
			if (pc->nest_level >= level)
			{
				IdemForgetPending(p);
				continue;
			}
			if (pc->done_level >= level)
				pc->done_level = 0;
		}
		else
		{
			if (pc->nest_level >= level)
				pc->nest_level = level - 1;
			if (pc->done_level >= level)
				pc->done_level = level - 1;
		}
		p = &pc->next;
	}
}

void
IdemClaimInit(void)
{
	RegisterXactCallback(IdemXactCallback, NULL);
	RegisterSubXactCallback(IdemSubXactCallback, NULL);
}

static void
IdemReport(const IdemScope *scope, const bytea *fingerprint,
		   const char *from_state, const char *to_state, bool replayed,
		   int response_status, TimestampTz started)
{
	IdemTransition t;

	if (!idem_log_transitions && !idem_audit)
		return;					/* nothing would be reported */
	t.tenant = text_to_cstring(scope->tenant);
	t.endpoint = scope->endpoint_str;
	t.key = text_to_cstring(scope->key);
	t.fingerprint = fingerprint;
	t.from_state = from_state;
	t.to_state = to_state;
	t.replayed = replayed;
	t.response_status = response_status;
	t.started = started;
	IdemReportTransition(&t);
}

/* ----------------------------------------------------------------
 *		idem_claim
 * ----------------------------------------------------------------
 */

typedef struct ClaimResult
{
	const char *action;
	int			http_status;	/* -1: NULL */
	const char *error_code;
	int			retry_after;	/* -1: NULL */
	IdemResponse resp;			/* status -1: NULL */
	Jsonb	   *response_json;
	bool		has_token;
	int64		lease_token;
	TimestampTz expires_at;		/* 0: NULL */
	bool		replayed;
	Jsonb	   *mismatch;		/* what differs, on a mismatch; or NULL */
} ClaimResult;

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

static Datum
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

/* seconds until ts, at least 1 */
static int
IdemRetryAfter(TimestampTz ts, TimestampTz now)
{
	double		secs = ceil((double) (ts - now) / USECS_PER_SEC);

	return secs < 1 ? 1 : (secs > INT_MAX ? INT_MAX : (int) secs);
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

/* The stored response, made ready for a replay. */
static void
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

/*
 * The times of a claim made at now: its expiry, now + ttl, and in lease
 * mode (lease not NULL) the end of its lease, now + lease.
 */
static void
IdemClaimTimes(TimestampTz now, const Interval *ttl, const Interval *lease,
			   TimestampTz *expires_at, TimestampTz *locked_until)
{
	*expires_at = IdemAddInterval(now, ttl, "ttl");
	if (*expires_at <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must be positive")));
	if (*expires_at > now + (int64) idem_max_ttl * USECS_PER_SEC)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl exceeds idempotency.max_ttl"),
				 errdetail_plural("Keys may be kept for at most %d second.",
								  "Keys may be kept for at most %d seconds.",
								  idem_max_ttl, idem_max_ttl),
				 errhint("Ask for a shorter ttl, or raise idempotency.max_ttl.")));
	*locked_until = 0;
	if (lease != NULL)
	{
		*locked_until = IdemAddInterval(now, lease, "lease");
		if (*locked_until <= now)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("lease must be positive")));
		if (*locked_until > *expires_at)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("ttl is shorter than the lease"),
					 errdetail("A key must live at least as long as the lease on its work."),
					 errhint("Ask for a longer ttl or a shorter lease.")));
	}
}

PG_FUNCTION_INFO_V1(idem_claim);

/*
 * idem_claim(tenant, endpoint, key, fingerprint, ttl, lease, wait)
 *		RETURNS idempotency.claim_result
 */
Datum
idem_claim(PG_FUNCTION_ARGS)
{
	MemoryContext cxt = CurrentMemoryContext;
	IdemScope	scope;
	bytea	   *fingerprint;
	const IdemEndpointPolicy *policy;
	Interval	ttl;
	Interval	lease_buf;
	const Interval *lease = NULL;
	int64		wait_ms;
	TimestampTz now;
	TimestampTz expires_at;
	TimestampTz locked_until;
	TimestampTz deadline;
	LOCKTAG		tag;
	bool		locked;
	bool		waited;
	IdemKeyRow	row;
	IdemNewKeyRow newrow = {0};
	ClaimResult r;
	bytea	   *digest = NULL;
	bytea	   *keep_digest = NULL;
	bool		tombstones;
	bool		expired_conflict;
	bool		diagnostics;
	IdemDiagRedaction *redact;

	IdemRequireReadWrite(fcinfo);
	IdemGetScope(fcinfo, &scope, true);
	fingerprint = PG_ARGISNULL(3) ? NULL : PG_GETARG_BYTEA_PP(3);
	IdemCheckFingerprint(fingerprint);

	policy = IdemGetEndpointPolicy(scope.endpoint_str);
	diagnostics = policy->diagnostics;
	redact = IdemDiagRedactionCopy(policy->diagnostics_redact);
	now = GetCurrentTimestamp();
	/* copied, like the lifetimes below */
	tombstones = IdemTombstonesOn(policy);
	expired_conflict = policy->expired_conflict;

	/*
	 * lifetime: the argument, else the endpoint's, else the setting; copied,
	 * since the policy cache may be emptied while the claim waits
	 */
	if (!PG_ARGISNULL(4))
		ttl = *PG_GETARG_INTERVAL_P(4);
	else if (policy->has_ttl)
		ttl = policy->ttl;
	else
	{
		memset(&ttl, 0, sizeof(ttl));
		ttl.time = (int64) idem_default_ttl * USECS_PER_SEC;
	}
	if (!PG_ARGISNULL(5) || policy->has_lease)
	{
		lease_buf = !PG_ARGISNULL(5) ? *PG_GETARG_INTERVAL_P(5) : policy->lease;
		lease = &lease_buf;
	}
	IdemClaimTimes(now, &ttl, lease, &expires_at, &locked_until);

	if (!PG_ARGISNULL(6))
		wait_ms = IdemWaitMs(PG_GETARG_INTERVAL_P(6));
	else
		wait_ms = idem_claim_wait;
	deadline = now + wait_ms * 1000;

	/*
	 * mismatch diagnostics: the request's digest, checked, and kept with the
	 * key when it fits idempotency.diagnostics_max_bytes (a 0.2.0 schema
	 * declares no such argument).  After the policy's last use: reading the
	 * secret may empty the policy cache.
	 */
	if (PG_NARGS() > 7 && !PG_ARGISNULL(7) && diagnostics)
	{
		digest = PG_GETARG_BYTEA_PP(7);
		IdemDiagnosticsCheck(&scope, digest);
		if (VARSIZE_ANY_EXHDR(digest) <= (Size) idem_diagnostics_max_bytes)
			keep_digest = digest;
	}

	IdemStatsCount(scope.endpoint_str, IDEM_COUNT_CLAIMS);
	memset(&r, 0, sizeof(r));
	r.http_status = -1;
	r.retry_after = -1;
	r.resp.status = -1;

	/* a duplicate of a claim this very transaction has not finished yet */
	if (IdemFindPending(&scope, NULL) != NULL)
	{
		r.action = "in_progress";
		r.http_status = 409;
		r.error_code = "request_in_progress";
		r.retry_after = 1;
		IdemStatsCount(scope.endpoint_str, IDEM_COUNT_IN_PROGRESS);
		PG_RETURN_DATUM(IdemClaimResultDatum(fcinfo, &r));
	}

	IdemScopeLockTag(&tag, scope.tenant, scope.endpoint, scope.key);
	locked = IdemAcquireScopeLock(&tag, deadline, &waited);
	if (!locked)
	{
		/* an atomic-mode duplicate is still running */
		r.action = "in_progress";
		r.http_status = 409;
		r.error_code = "request_in_progress";
		r.retry_after = 1;
		IdemStatsCount(scope.endpoint_str, IDEM_COUNT_IN_PROGRESS);
		PG_RETURN_DATUM(IdemClaimResultDatum(fcinfo, &r));
	}

	/*
	 * After a wait, the claim is made now: a row that expired meanwhile is
	 * expired for it, and its own times count from now.
	 */
	if (waited)
	{
		now = GetCurrentTimestamp();
		IdemClaimTimes(now, &ttl, lease, &expires_at, &locked_until);
	}

	for (;;)
	{
		if (tombstones)
			IdemKeystoreReadWithExpired(&scope, now, expires_at, &row, cxt);
		else
			IdemKeystoreRead(&scope, now, expires_at, &row, cxt);

		if (!row.found)
			break;

		/* a live row: never execute, never touch it */
		if (VARSIZE_ANY_EXHDR(row.fingerprint) != VARSIZE_ANY_EXHDR(fingerprint) ||
			memcmp(VARDATA_ANY(row.fingerprint), VARDATA_ANY(fingerprint),
				   VARSIZE_ANY_EXHDR(fingerprint)) != 0)
		{
			r.action = "mismatch";
			r.http_status = 422;
			r.error_code = "idempotency_key_reuse";
			IdemStatsCount(scope.endpoint_str, IDEM_COUNT_MISMATCHES);
			if (digest != NULL && row.request_digest != NULL)
			{
				MemoryContext old = MemoryContextSwitchTo(cxt);

				r.mismatch = IdemDiagnose(row.request_digest, digest, redact);
				MemoryContextSwitchTo(old);

				/*
				 * the key's bound (diag_bound.c): past it the answer names
				 * nothing; counted in shared memory, the row left alone
				 */
				if (r.mismatch != NULL &&
					!IdemDiagBoundAllow(&scope, row.created_at, row.expires_at, now))
					r.mismatch = NULL;
				if (r.mismatch != NULL)
					IdemStatsCount(scope.endpoint_str, IDEM_COUNT_DIAGNOSED);
			}
		}
		else if (row.state == IDEM_STATE_COMPLETED)
		{
			MemoryContext old = MemoryContextSwitchTo(cxt);

			IdemReplayResult(&scope, &row, &r);
			MemoryContextSwitchTo(old);
			IdemStatsCount(scope.endpoint_str, IDEM_COUNT_REPLAYS);
			IdemReport(&scope, fingerprint, "completed", "completed", true,
					   row.resp.status, row.created_at);
		}
		else if (row.state != IDEM_STATE_IN_PROGRESS)
		{
			r.action = "pending";
			r.http_status = 409;
			r.error_code = "outcome_pending";
			IdemStatsCount(scope.endpoint_str, IDEM_COUNT_PENDING);
		}
		else
		{
			TimestampTz t = GetCurrentTimestamp();

			if (t < deadline)
			{
				/* a leased duplicate is running: look again shortly */
				IdemReleaseScopeLock(&tag);
				(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
								 Min(IDEM_LEASE_POLL_MS, (deadline - t) / 1000 + 1),
								 PG_WAIT_EXTENSION);
				ResetLatch(MyLatch);
				CHECK_FOR_INTERRUPTS();
				locked = IdemAcquireScopeLock(&tag, deadline, &waited);
				if (locked)
				{
					now = GetCurrentTimestamp();
					IdemClaimTimes(now, &ttl, lease, &expires_at, &locked_until);
					continue;
				}
				row.has_locked_until = false;
			}
			r.action = "in_progress";
			r.http_status = 409;
			r.error_code = "request_in_progress";
			r.retry_after = row.has_locked_until ?
				IdemRetryAfter(row.locked_until, GetCurrentTimestamp()) : 1;
			IdemStatsCount(scope.endpoint_str, IDEM_COUNT_IN_PROGRESS);
		}
		/* nothing to execute: let the next duplicate in at once */
		if (locked)
			IdemReleaseScopeLock(&tag);
		PG_RETURN_DATUM(IdemClaimResultDatum(fcinfo, &r));
	}

	/*
	 * No live row.  An expired key of the scope, still a row or now a
	 * tombstone (read after the rows, with a later snapshot, so that a
	 * maintenance pass turning rows into tombstones meanwhile is seen on one
	 * side or the other), refuses another payload, and per the endpoint
	 * asks the client about the same one.
	 */
	if (tombstones)
	{
		bytea	   *prev = row.expired_fingerprint;
		TimestampTz prev_at = row.expired_at;
		bytea	   *tomb_fp;
		TimestampTz tomb_at;

		if (IdemTombstoneFind(&scope, now, &tomb_fp, &tomb_at, cxt) &&
			(prev == NULL || tomb_at > prev_at))
			prev = tomb_fp;
		if (prev != NULL)
		{
			IdemStatsCount(scope.endpoint_str, IDEM_COUNT_TOMBSTONE_HITS);
			if (VARSIZE_ANY_EXHDR(prev) != VARSIZE_ANY_EXHDR(fingerprint) ||
				memcmp(VARDATA_ANY(prev), VARDATA_ANY(fingerprint),
					   VARSIZE_ANY_EXHDR(fingerprint)) != 0)
			{
				r.action = "mismatch";
				r.http_status = 422;
				r.error_code = "idempotency_key_reuse";
				IdemStatsCount(scope.endpoint_str, IDEM_COUNT_MISMATCHES);
				IdemReleaseScopeLock(&tag);
				PG_RETURN_DATUM(IdemClaimResultDatum(fcinfo, &r));
			}
			if (expired_conflict)
			{
				r.action = "expired";
				r.http_status = 409;
				r.error_code = "key_expired";
				IdemReleaseScopeLock(&tag);
				PG_RETURN_DATUM(IdemClaimResultDatum(fcinfo, &r));
			}
		}
	}

	/* execute: the key is ours */
	if (row.has_expired)
		IdemKeystoreDeleteExpired(&scope, now);

	r.action = "execute";
	r.expires_at = expires_at;
	if (lease != NULL)
	{
		int64		token;

		do
		{
			if (!pg_strong_random(&token, sizeof(token)))
				ereport(ERROR,
						(errcode(ERRCODE_INTERNAL_ERROR),
						 errmsg("could not generate a random lease token")));
			token &= PG_INT64_MAX;
		} while (token == 0);

		IdemAddPending(&scope, fingerprint, keep_digest, now, expires_at, &tag,
					   true);
		newrow.created_at = now;
		newrow.fingerprint = fingerprint;
		newrow.request_digest = keep_digest;
		newrow.state = IDEM_STATE_IN_PROGRESS;
		newrow.lease_token = &token;
		newrow.locked_until = &locked_until;
		newrow.expires_at = expires_at;
		IdemKeystoreInsert(&scope, &newrow);
		r.has_token = true;
		r.lease_token = token;
	}
	else
		IdemAddPending(&scope, fingerprint, keep_digest, now, expires_at, &tag,
					   false);

	IdemStatsCount(scope.endpoint_str, IDEM_COUNT_EXECUTES);
	IdemReport(&scope, fingerprint, NULL, "in_progress", false, -1, now);
	PG_RETURN_DATUM(IdemClaimResultDatum(fcinfo, &r));
}

/* ----------------------------------------------------------------
 *		finish, fail, release, heartbeat, resolve
 * ----------------------------------------------------------------
 */

/* What a call does to the row of a leased claim. */
typedef enum IdemLeasedOp
{
	IDEM_OP_FINISH,
	IDEM_OP_FAIL,
	IDEM_OP_RELEASE,
	IDEM_OP_HEARTBEAT
} IdemLeasedOp;

/*
 * Read and lock the live row of a leased claim and check the token:
 * raises IK404 when there is no live row, IK403 for a wrong token, IK409
 * when the state is not one of allowed (a bitmask of 1 << IdemState).
 */
static void
IdemLeasedRow(FunctionCallInfo fcinfo, int tokenarg, const IdemScope *scope,
			  TimestampTz now, int allowed, IdemLeasedOp op, IdemKeyRow *row,
			  MemoryContext cxt)
{
	bool		has_token = !PG_ARGISNULL(tokenarg);
	int64		token = has_token ? PG_GETARG_INT64(tokenarg) : 0;

	IdemKeystoreLock(scope, now, row, cxt);
	if (!row->found)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_KEY_NOT_FOUND),
				 errmsg("no live claim exists for this idempotency key"),
				 errdetail("The key was never claimed for this tenant and endpoint, was released, or has expired."),
				 errhint("In atomic mode, %s must run in the transaction that claimed the key.",
						 get_func_name(fcinfo->flinfo->fn_oid))));
	if ((allowed & (1 << row->state)) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_STATE),
				 op == IDEM_OP_FINISH ?
				 errmsg("cannot finish an idempotency key in state %s",
						IdemStateName(row->state)) :
				 op == IDEM_OP_FAIL ?
				 errmsg("cannot fail an idempotency key in state %s",
						IdemStateName(row->state)) :
				 op == IDEM_OP_RELEASE ?
				 errmsg("cannot release an idempotency key in state %s",
						IdemStateName(row->state)) :
				 errmsg("cannot extend the lease of an idempotency key in state %s",
						IdemStateName(row->state)),
				 row->state == IDEM_STATE_COMPLETED ?
				 errdetail("The key was already completed; a retry replays its response.") :
				 errdetail("Only keys in another state allow this."),
				 (row->state == IDEM_STATE_FAILED || row->state == IDEM_STATE_UNKNOWN) ?
				 errhint("An operator reconciles failed and unknown keys with idem_resolve.") : 0));
	if (!has_token)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_LEASE_MISMATCH),
				 errmsg("a lease token is required"),
				 errdetail("The key was claimed with a lease in another transaction."),
				 errhint("Pass the lease_token that idem_claim returned.")));
	if (!row->has_token || row->lease_token != token)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_LEASE_MISMATCH),
				 errmsg("lease token does not match the claim"),
				 errdetail("The token is wrong or belongs to an earlier claim of the key.")));
}

#define STATE_BIT(s)	(1 << (s))

/* A claim of this transaction in atomic mode has no token to present. */
static void
IdemRefuseToken(FunctionCallInfo fcinfo, int tokenarg)
{
	if (!PG_ARGISNULL(tokenarg))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_LEASE_MISMATCH),
				 errmsg("lease token does not match the claim"),
				 errdetail("This transaction claimed the key without a lease.")));
}

/*
 * Read the response arguments status (argument statusarg) and headers
 * (argument headersarg) and check them.
 */
static void
IdemGetResponse(FunctionCallInfo fcinfo, int statusarg, int headersarg,
				IdemResponse *resp)
{
	memset(resp, 0, sizeof(*resp));
	if (PG_ARGISNULL(statusarg))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("response status must not be NULL")));
	resp->status = PG_GETARG_INT32(statusarg);
	if (resp->status < 100 || resp->status > 599)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("response status %d is not an HTTP status", resp->status),
				 errdetail("A status is a number from 100 to 599.")));
	if (!PG_ARGISNULL(headersarg))
	{
		resp->headers = PG_GETARG_JSONB_P(headersarg);
		if (!JB_ROOT_IS_OBJECT(resp->headers) || JB_ROOT_IS_SCALAR(resp->headers))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("response headers must be a JSON object"),
					 errdetail("Give headers as {\"Name\": \"value\", ...}.")));
	}
}

/* A jsonb body as stored: its text form, byte for byte on replay. */
static void
IdemJsonBody(Jsonb *body, IdemResponse *resp)
{
	char	   *s = JsonbToCString(NULL, &body->root, VARSIZE(body));
	Size		len = strlen(s);
	bytea	   *b = palloc(VARHDRSZ + len);

	SET_VARSIZE(b, VARHDRSZ + len);
	memcpy(VARDATA(b), s, len);
	resp->body_kind = IDEM_BODY_JSON;
	resp->body = b;
}

static void
IdemFinishCommon(FunctionCallInfo fcinfo, IdemScope *scope,
				 IdemResponse *resp, int tokenarg)
{
	MemoryContext cxt = CurrentMemoryContext;
	TimestampTz now = GetCurrentTimestamp();
	PendingClaim **link;
	PendingClaim *pc;

	IdemResponseForStorage(IdemGetEndpointPolicy(scope->endpoint_str), resp);

	pc = IdemFindPending(scope, &link);
	if (pc != NULL)
	{
		IdemNewKeyRow newrow = {0};

		IdemRefuseToken(fcinfo, tokenarg);
		newrow.created_at = pc->created_at;
		newrow.fingerprint = pc->fingerprint;
		newrow.request_digest = pc->request_digest;
		newrow.state = IDEM_STATE_COMPLETED;
		newrow.resp = resp;
		newrow.completed_at = &now;
		newrow.expires_at = pc->expires_at;
		IdemKeystoreInsert(scope, &newrow);
		IdemReport(scope, pc->fingerprint, "in_progress", "completed", false,
				   resp->status, pc->created_at);
		IdemEndPending(link, false);
	}
	else
	{
		IdemKeyRow	row;

		IdemLeasedRow(fcinfo, tokenarg, scope, now,
					  STATE_BIT(IDEM_STATE_IN_PROGRESS) | STATE_BIT(IDEM_STATE_UNKNOWN),
					  IDEM_OP_FINISH, &row, cxt);
		IdemKeystoreComplete(scope, &row, now, resp);
		IdemReport(scope, row.fingerprint, IdemStateName(row.state),
				   "completed", false, resp->status, row.created_at);
	}
	IdemStatsCount(scope->endpoint_str, IDEM_COUNT_FINISHES);
}

/*
 * The three finish functions differ only in the type of their fifth
 * argument, the body: jsonb, bytea, or a reference (text) to a body kept
 * elsewhere.
 */
static void
IdemFinishWithBody(FunctionCallInfo fcinfo, IdemBodyKind kind)
{
	IdemScope	scope;
	IdemResponse resp;

	IdemRequireReadWrite(fcinfo);
	IdemGetScope(fcinfo, &scope, false);
	IdemGetResponse(fcinfo, 3, 5, &resp);
	if (kind == IDEM_BODY_REF && PG_ARGISNULL(4))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("body_ref must not be NULL"),
				 errhint("Use idem_finish without a body when the response has none.")));
	if (kind == IDEM_BODY_REF && VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(4)) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("body_ref must not be empty"),
				 errhint("Use idem_finish without a body when the response has none.")));
	if (!PG_ARGISNULL(4))
	{
		if (kind == IDEM_BODY_JSON)
			IdemJsonBody(PG_GETARG_JSONB_P(4), &resp);
		else if (kind == IDEM_BODY_BYTES)
			resp.body = PG_GETARG_BYTEA_P_COPY(4);
		else
			resp.body_ref = PG_GETARG_TEXT_P_COPY(4);
		resp.body_kind = kind;
	}
	IdemFinishCommon(fcinfo, &scope, &resp, 6);
}

PG_FUNCTION_INFO_V1(idem_finish);

/*
 * idem_finish(tenant, endpoint, key, status int, body jsonb, headers jsonb,
 *			   lease_token bigint) RETURNS void
 */
Datum
idem_finish(PG_FUNCTION_ARGS)
{
	IdemFinishWithBody(fcinfo, IDEM_BODY_JSON);
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(idem_finish_bytes);

/*
 * idem_finish_bytes(tenant, endpoint, key, status int, body bytea,
 *					 headers jsonb, lease_token bigint) RETURNS void
 */
Datum
idem_finish_bytes(PG_FUNCTION_ARGS)
{
	IdemFinishWithBody(fcinfo, IDEM_BODY_BYTES);
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(idem_finish_ref);

/*
 * idem_finish_ref(tenant, endpoint, key, status int, body_ref text,
 *				   headers jsonb, lease_token bigint) RETURNS void
 *		Finish with a reference to a body kept elsewhere (object storage),
 *		for bodies larger than the stored-response cap; a replay returns the
 *		reference in response_body_ref.
 */
Datum
idem_finish_ref(PG_FUNCTION_ARGS)
{
	IdemFinishWithBody(fcinfo, IDEM_BODY_REF);
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(idem_fail);

/*
 * idem_fail(tenant, endpoint, key, outcome text, reason text,
 *			 lease_token bigint) RETURNS void
 *		Record that the work failed ('failed') or that its outcome is not
 *		known ('unknown'); duplicates then get outcome_pending until an
 *		operator resolves the key.
 */
Datum
idem_fail(PG_FUNCTION_ARGS)
{
	MemoryContext cxt = CurrentMemoryContext;
	IdemScope	scope;
	IdemState	outcome;
	char	   *outcome_str;
	char	   *reason;
	TimestampTz now;
	PendingClaim **link;
	PendingClaim *pc;

	IdemRequireReadWrite(fcinfo);
	IdemGetScope(fcinfo, &scope, false);
	outcome_str = PG_ARGISNULL(3) ? "unknown" : text_to_cstring(PG_GETARG_TEXT_PP(3));
	if (strcmp(outcome_str, "failed") == 0)
		outcome = IDEM_STATE_FAILED;
	else if (strcmp(outcome_str, "unknown") == 0)
		outcome = IDEM_STATE_UNKNOWN;
	else
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outcome must be \"failed\" or \"unknown\", not \"%s\"", outcome_str)));
	reason = PG_ARGISNULL(4) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(4));
	now = GetCurrentTimestamp();

	pc = IdemFindPending(&scope, &link);
	if (pc != NULL)
	{
		IdemNewKeyRow newrow = {0};

		IdemRefuseToken(fcinfo, 5);
		newrow.created_at = pc->created_at;
		newrow.fingerprint = pc->fingerprint;
		newrow.request_digest = pc->request_digest;
		newrow.state = outcome;
		newrow.fail_reason = reason;
		newrow.expires_at = pc->expires_at;
		IdemKeystoreInsert(&scope, &newrow);
		IdemReport(&scope, pc->fingerprint, "in_progress",
				   IdemStateName(outcome), false, -1, pc->created_at);
		IdemEndPending(link, false);
	}
	else
	{
		IdemKeyRow	row;

		IdemLeasedRow(fcinfo, 5, &scope, now,
					  STATE_BIT(IDEM_STATE_IN_PROGRESS) | STATE_BIT(IDEM_STATE_UNKNOWN),
					  IDEM_OP_FAIL, &row, cxt);
		IdemKeystoreFail(&scope, &row, now, outcome, reason);
		IdemReport(&scope, row.fingerprint, IdemStateName(row.state),
				   IdemStateName(outcome), false, -1, row.created_at);
	}
	IdemStatsCount(scope.endpoint_str, IDEM_COUNT_FAILS);
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(idem_release);

/*
 * idem_release(tenant, endpoint, key, lease_token bigint) RETURNS void
 *		Give the key back before any side effect: the next claim executes.
 */
Datum
idem_release(PG_FUNCTION_ARGS)
{
	MemoryContext cxt = CurrentMemoryContext;
	IdemScope	scope;
	PendingClaim **link;
	PendingClaim *pc;

	IdemRequireReadWrite(fcinfo);
	IdemGetScope(fcinfo, &scope, false);
	pc = IdemFindPending(&scope, &link);
	if (pc != NULL)
	{
		IdemRefuseToken(fcinfo, 3);
		IdemReport(&scope, pc->fingerprint, "in_progress", NULL, false, -1,
				   pc->created_at);
		IdemEndPending(link, true);
	}
	else
	{
		TimestampTz now = GetCurrentTimestamp();
		IdemKeyRow	row;

		IdemLeasedRow(fcinfo, 3, &scope, now,
					  STATE_BIT(IDEM_STATE_IN_PROGRESS), IDEM_OP_RELEASE, &row, cxt);
		IdemKeystoreDelete(&scope, &row, now);
		IdemReport(&scope, row.fingerprint, "in_progress", NULL, false, -1,
				   row.created_at);
	}
	IdemStatsCount(scope.endpoint_str, IDEM_COUNT_RELEASES);
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(idem_heartbeat);

/*
 * idem_heartbeat(tenant, endpoint, key, lease_token bigint, extend interval)
 *		RETURNS timestamptz
 *		Extend the lease to now + extend; returns the new locked_until.
 */
Datum
idem_heartbeat(PG_FUNCTION_ARGS)
{
	MemoryContext cxt = CurrentMemoryContext;
	IdemScope	scope;
	TimestampTz now;
	TimestampTz until;
	IdemKeyRow	row;

	IdemRequireReadWrite(fcinfo);
	IdemGetScope(fcinfo, &scope, false);
	if (PG_ARGISNULL(4))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("extend must not be NULL")));
	now = GetCurrentTimestamp();
	until = IdemAddInterval(now, PG_GETARG_INTERVAL_P(4), "extend");
	if (until <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("extend must be positive")));

	IdemLeasedRow(fcinfo, 3, &scope, now,
				  STATE_BIT(IDEM_STATE_IN_PROGRESS), IDEM_OP_HEARTBEAT,
				  &row, cxt);
	if (until > row.expires_at)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the lease would outlive the key"),
				 errdetail("The key expires before the extended lease would end."),
				 errhint("Claim with a longer ttl, or extend by less.")));
	IdemKeystoreExtendLease(&scope, &row, now, until);
	PG_RETURN_TIMESTAMPTZ(until);
}

PG_FUNCTION_INFO_V1(idem_resolve);

/*
 * idem_resolve(tenant, endpoint, key, status int, body jsonb, headers jsonb)
 *		RETURNS void
 *		Reconciliation by an operator: a failed or unknown key becomes
 *		completed with the real outcome, which retries then replay.
 */
Datum
idem_resolve(PG_FUNCTION_ARGS)
{
	MemoryContext cxt = CurrentMemoryContext;
	IdemScope	scope;
	IdemResponse resp;
	TimestampTz now;
	IdemKeyRow	row;

	IdemRequireReadWrite(fcinfo);
	IdemGetScope(fcinfo, &scope, false);
	IdemGetResponse(fcinfo, 3, 5, &resp);
	if (!PG_ARGISNULL(4))
		IdemJsonBody(PG_GETARG_JSONB_P(4), &resp);
	IdemResponseForStorage(IdemGetEndpointPolicy(scope.endpoint_str), &resp);
	now = GetCurrentTimestamp();

	IdemKeystoreLock(&scope, now, &row, cxt);
	if (!row.found)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_KEY_NOT_FOUND),
				 errmsg("no live claim exists for this idempotency key"),
				 errdetail("The key was never claimed for this tenant and endpoint, was released, or has expired.")));
	if (row.state != IDEM_STATE_FAILED && row.state != IDEM_STATE_UNKNOWN)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_STATE),
				 errmsg("cannot resolve an idempotency key in state %s",
						IdemStateName(row.state)),
				 errdetail("Only failed and unknown keys are reconciled.")));
	IdemKeystoreComplete(&scope, &row, now, &resp);

	IdemReport(&scope, row.fingerprint, IdemStateName(row.state), "completed",
			   false, resp.status, row.created_at);
	IdemStatsCount(scope.endpoint_str, IDEM_COUNT_RESOLVED);
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(idem_lookup);

/*
 * idem_lookup(tenant, endpoint, key) RETURNS TABLE (state, fingerprint,
 *		lease_held, created_at, completed_at, expires_at, locked_until,
 *		response_status)
 *		The live row of a scope, without its response; no row when there is
 *		none.  A claim of this transaction not yet finished shows as
 *		in_progress.
 */
Datum
idem_lookup(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext cxt = CurrentMemoryContext;
	IdemScope	scope;
	PendingClaim *pc;
	Datum		values[8];
	bool		nulls[8];

	IdemGetScope(fcinfo, &scope, false);
	InitMaterializedSRF(fcinfo, 0);
	memset(nulls, 0, sizeof(nulls));

	pc = IdemFindPending(&scope, NULL);
	if (pc != NULL)
	{
		values[0] = CStringGetTextDatum("in_progress");
		values[1] = PointerGetDatum(pc->fingerprint);
		values[2] = BoolGetDatum(false);
		values[3] = TimestampTzGetDatum(pc->created_at);
		nulls[4] = true;
		values[5] = TimestampTzGetDatum(pc->expires_at);
		nulls[6] = nulls[7] = true;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	else
	{
		IdemKeyRow	row;
		TimestampTz now = GetCurrentTimestamp();

		IdemKeystorePeek(&scope, now,
						 now + (int64) idem_default_ttl * USECS_PER_SEC,
						 &row, cxt);
		if (row.found)
		{
			values[0] = CStringGetTextDatum(IdemStateName(row.state));
			values[1] = PointerGetDatum(row.fingerprint);
			values[2] = BoolGetDatum(row.has_token);
			values[3] = TimestampTzGetDatum(row.created_at);
			values[4] = TimestampTzGetDatum(row.completed_at);
			nulls[4] = !row.has_completed_at;
			values[5] = TimestampTzGetDatum(row.expires_at);
			values[6] = TimestampTzGetDatum(row.locked_until);
			nulls[6] = !row.has_locked_until;
			values[7] = Int32GetDatum(row.resp.status);
			nulls[7] = row.resp.status < 0;
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	return (Datum) 0;
}
