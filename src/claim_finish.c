/*-------------------------------------------------------------------------
 *
 * claim_finish.c
 *	  The calls that follow a claim: idem_finish, idem_finish_bytes,
 *	  idem_finish_ref, idem_fail, idem_release, idem_heartbeat (lease
 *	  mode), idem_resolve (an operator's reconciliation), and idem_lookup.
 *
 *	  A claim of this transaction in atomic mode is pending
 *	  (claim_pending.c): finishing or failing it inserts its row, releasing
 *	  it gives its scope lock up.  A leased claim's row is read and locked
 *	  through the key store (keystore.c), its token checked, and changed.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "claim.h"
#include "claim_pending.h"
#include "endpoint.h"
#include "guc.h"
#include "keystore.h"
#include "response.h"
#include "scope.h"
#include "stats.h"
#include "util.h"

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
	IdemCheckResponseStatus(resp->status);
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
