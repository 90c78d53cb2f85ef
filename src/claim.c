/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  idem_claim: the claim of an idempotency key, read top-down as its
 *	  steps (prepare the scope and the terms; take the scope lock; decide
 *	  on a live row; decide on an earlier use of the key; execute), each
 *	  answer built by one function.
 *
 *	  A call reads its scope (scope.c), takes the scope's lock, and reads
 *	  the scope's row through the key store (keystore.c), which alone knows
 *	  how rows are stored.  The claims of the transaction still pending,
 *	  and what happens to them when (sub)transactions end, are in
 *	  claim_pending.c; the calls that follow a claim (finish, fail,
 *	  release, heartbeat, resolve, lookup) in claim_finish.c; the row it
 *	  returns in claim_result.c.
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
 *	  keeps tombstones (tombstone_probe.c), asks whether the key was used
 *	  before (history.c): as an expired row not yet dropped or as a
 *	  tombstone.
 *	  Another fingerprint is refused (422), the same one executes or, per
 *	  endpoint, answers 409 key_expired.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/xact.h"
#include "common/int.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "audit.h"
#include "claim.h"
#include "claim_pending.h"
#include "claim_result.h"
#include "diag.h"
#include "diag_bound.h"
#include "endpoint.h"
#include "guc.h"
#include "history.h"
#include "keys.h"
#include "keystore.h"
#include "scope.h"
#include "stats.h"
#include "tombstone_probe.h"
#include "util.h"

/* how long a waiting claim sleeps between two looks at a leased row */
#define IDEM_LEASE_POLL_MS		20

/*
 * A call of idem_claim: what it claims and on which terms, copied from its
 * arguments and from the endpoint's policy (whose cache may be emptied
 * while the claim waits), and the scope lock it holds.
 */
typedef struct ClaimCall
{
	IdemScope	scope;
	bytea	   *fingerprint;
	Interval	ttl;
	Interval	lease_buf;
	const Interval *lease;		/* NULL: atomic mode; else &lease_buf */
	TimestampTz now;			/* when the claim is made */
	TimestampTz expires_at;		/* of the key: now + ttl */
	TimestampTz locked_until;	/* of the lease: now + lease */
	TimestampTz deadline;		/* of the wait for a duplicate */
	bool		tombstones;		/* the endpoint keeps tombstones */
	bool		expired_conflict;	/* on_expired_reuse = 'conflict' */
	IdemDiagRedaction *redact;	/* what mismatch diagnostics never name */
	bytea	   *digest;			/* the request's digest, or NULL */
	bytea	   *keep_digest;	/* the digest kept with the key, or NULL */
	LOCKTAG		tag;			/* the scope lock */
	bool		locked;			/* it is held */
} ClaimCall;

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

TimestampTz
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

/* A pending claim ends with its (sub)transaction (claim_pending.c). */
void
IdemClaimInit(void)
{
	RegisterXactCallback(IdemPendingXactCallback, NULL);
	RegisterSubXactCallback(IdemPendingSubXactCallback, NULL);
}

void
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

/* ----------------------------------------------------------------
 *		the steps of a claim
 * ----------------------------------------------------------------
 */

/*
 * Read the scope, the fingerprint and the terms of the claim: its
 * lifetime and lease (the argument, else the endpoint's, else the
 * setting), its times, how long it waits, and the request's digest for
 * mismatch diagnostics.
 */
static void
IdemClaimPrepare(FunctionCallInfo fcinfo, ClaimCall *c)
{
	const IdemEndpointPolicy *policy;
	bool		diagnostics;
	int64		wait_ms;

	IdemGetScope(fcinfo, &c->scope, true);
	c->fingerprint = PG_ARGISNULL(3) ? NULL : PG_GETARG_BYTEA_PP(3);
	IdemCheckFingerprint(c->fingerprint);

	policy = IdemGetEndpointPolicy(c->scope.endpoint_str);
	diagnostics = policy->diagnostics;
	c->redact = IdemDiagRedactionCopy(policy->diagnostics_redact);
	c->now = GetCurrentTimestamp();
	c->tombstones = IdemTombstonesOn(policy);
	c->expired_conflict = policy->expired_conflict;

	if (!PG_ARGISNULL(4))
		c->ttl = *PG_GETARG_INTERVAL_P(4);
	else if (policy->has_ttl)
		c->ttl = policy->ttl;
	else
	{
		memset(&c->ttl, 0, sizeof(c->ttl));
		c->ttl.time = (int64) idem_default_ttl * USECS_PER_SEC;
	}
	c->lease = NULL;
	if (!PG_ARGISNULL(5) || policy->has_lease)
	{
		c->lease_buf = !PG_ARGISNULL(5) ? *PG_GETARG_INTERVAL_P(5) : policy->lease;
		c->lease = &c->lease_buf;
	}
	IdemClaimTimes(c->now, &c->ttl, c->lease, &c->expires_at, &c->locked_until);

	if (!PG_ARGISNULL(6))
		wait_ms = IdemWaitMs(PG_GETARG_INTERVAL_P(6));
	else
		wait_ms = idem_claim_wait;
	c->deadline = c->now + wait_ms * 1000;

	/*
	 * the request's digest, checked, and kept with the key when it fits
	 * idempotency.diagnostics_max_bytes (a 0.2.0 schema declares no such
	 * argument).  After the policy's last use: reading the secret may empty
	 * the policy cache.
	 */
	c->digest = NULL;
	c->keep_digest = NULL;
	if (PG_NARGS() > 7 && !PG_ARGISNULL(7) && diagnostics)
	{
		c->digest = PG_GETARG_BYTEA_PP(7);
		IdemDiagnosticsCheck(&c->scope, c->digest);
		if (VARSIZE_ANY_EXHDR(c->digest) <= (Size) idem_diagnostics_max_bytes)
			c->keep_digest = c->digest;
	}
	c->locked = false;
}

/*
 * Take the scope lock, waiting until the deadline at most: false when a
 * duplicate in atomic mode still holds it.  After a wait, the claim is made
 * now: a row that expired meanwhile is expired for it, and its own times
 * count from now.
 */
static bool
IdemClaimLock(ClaimCall *c)
{
	bool		waited;

	IdemScopeLockTag(&c->tag, c->scope.tenant, c->scope.endpoint, c->scope.key);
	c->locked = IdemAcquireScopeLock(&c->tag, c->deadline, &waited);
	if (c->locked && waited)
	{
		c->now = GetCurrentTimestamp();
		IdemClaimTimes(c->now, &c->ttl, c->lease, &c->expires_at, &c->locked_until);
	}
	return c->locked;
}

/*
 * A duplicate with a lease is running, and the deadline (checked at t) is
 * still ahead: give the scope lock up, sleep a little, and take it again.
 * True when it is held again, the claim made now; false when the deadline
 * passed meanwhile.
 */
static bool
IdemClaimWaitForLease(ClaimCall *c, TimestampTz t)
{
	bool		waited;

	IdemReleaseScopeLock(&c->tag);
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 Min(IDEM_LEASE_POLL_MS, (c->deadline - t) / 1000 + 1),
					 PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
	c->locked = IdemAcquireScopeLock(&c->tag, c->deadline, &waited);
	if (c->locked)
	{
		c->now = GetCurrentTimestamp();
		IdemClaimTimes(c->now, &c->ttl, c->lease, &c->expires_at, &c->locked_until);
	}
	return c->locked;
}

/* seconds until ts, at least 1 */
static int
IdemRetryAfter(TimestampTz ts, TimestampTz now)
{
	double		secs = ceil((double) (ts - now) / USECS_PER_SEC);

	return secs < 1 ? 1 : (secs > INT_MAX ? INT_MAX : (int) secs);
}

/*
 * The answers of a claim that does not execute, each built here only.
 *
 * In progress (409, request_in_progress): a duplicate is running.  Retry
 * after the end of the lease of leased, the row of the duplicate when its
 * lease is known (NULL: in a second).
 */
static void
IdemAnswerInProgress(const ClaimCall *c, const IdemKeyRow *leased,
					 ClaimResult *r)
{
	r->action = "in_progress";
	r->http_status = 409;
	r->error_code = "request_in_progress";
	r->retry_after = leased != NULL && leased->has_locked_until ?
		IdemRetryAfter(leased->locked_until, GetCurrentTimestamp()) : 1;
	IdemStatsCount(c->scope.endpoint_str, IDEM_COUNT_IN_PROGRESS);
}

/*
 * Mismatch (422, idempotency_key_reuse): the key was used with another
 * fingerprint.  For a live row (live not NULL) that kept its request's
 * digest, and a claim that gives one, the answer names what differs, up to
 * the key's bound (diag_bound.c): past it the answer names nothing, counted
 * in shared memory, the row left alone.
 */
static void
IdemAnswerMismatch(const ClaimCall *c, const IdemKeyRow *live, ClaimResult *r,
				   MemoryContext cxt)
{
	r->action = "mismatch";
	r->http_status = 422;
	r->error_code = "idempotency_key_reuse";
	IdemStatsCount(c->scope.endpoint_str, IDEM_COUNT_MISMATCHES);
	if (live != NULL && c->digest != NULL && live->request_digest != NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(cxt);

		r->mismatch = IdemDiagnose(live->request_digest, c->digest, c->redact);
		MemoryContextSwitchTo(old);
		if (r->mismatch != NULL &&
			!IdemDiagBoundAllow(&c->scope, live->created_at, live->expires_at,
								c->now))
			r->mismatch = NULL;
		if (r->mismatch != NULL)
			IdemStatsCount(c->scope.endpoint_str, IDEM_COUNT_DIAGNOSED);
	}
}

/* Replay: the key was completed; its stored response is given back. */
static void
IdemAnswerReplay(const ClaimCall *c, IdemKeyRow *row, ClaimResult *r,
				 MemoryContext cxt)
{
	MemoryContext old = MemoryContextSwitchTo(cxt);

	IdemReplayResult(&c->scope, row, r);
	MemoryContextSwitchTo(old);
	IdemStatsCount(c->scope.endpoint_str, IDEM_COUNT_REPLAYS);
	IdemReport(&c->scope, c->fingerprint, "completed", "completed", true,
			   row->resp.status, row->created_at);
}

/* Pending (409, outcome_pending): the key failed or its outcome is unknown. */
static void
IdemAnswerPending(const ClaimCall *c, ClaimResult *r)
{
	r->action = "pending";
	r->http_status = 409;
	r->error_code = "outcome_pending";
	IdemStatsCount(c->scope.endpoint_str, IDEM_COUNT_PENDING);
}

/* Expired (409, key_expired): the key expired, and the endpoint says so. */
static void
IdemAnswerExpired(ClaimResult *r)
{
	r->action = "expired";
	r->http_status = 409;
	r->error_code = "key_expired";
}

/*
 * Decide on the scope's live row, read into row: true with the answer in
 * r when there is one (a live row is never executed, never touched); a
 * leased duplicate still running is looked at again until the deadline.
 * False when there is none, the scope lock held.
 */
static bool
IdemClaimOnLiveRow(ClaimCall *c, IdemKeyRow *row, ClaimResult *r,
				   MemoryContext cxt)
{
	for (;;)
	{
		TimestampTz t;

		if (c->tombstones)
			IdemKeystoreReadWithExpired(&c->scope, c->now, c->expires_at, row, cxt);
		else
			IdemKeystoreRead(&c->scope, c->now, c->expires_at, row, cxt);
		if (!row->found)
			return false;

		if (!IdemTextEqual(row->fingerprint, c->fingerprint))
			IdemAnswerMismatch(c, row, r, cxt);
		else if (row->state == IDEM_STATE_COMPLETED)
			IdemAnswerReplay(c, row, r, cxt);
		else if (row->state != IDEM_STATE_IN_PROGRESS)
			IdemAnswerPending(c, r);
		else
		{
			t = GetCurrentTimestamp();
			if (t < c->deadline && IdemClaimWaitForLease(c, t))
				continue;
			/* the lease is known while the lock is held */
			IdemAnswerInProgress(c, c->locked ? row : NULL, r);
		}
		return true;
	}
}

/*
 * Decide on an earlier use of the key (history.c), for a claim that found
 * no live row: another fingerprint is refused, the same one is answered
 * key_expired where the endpoint says so.  False when the claim executes.
 */
static bool
IdemClaimOnEarlierUse(const ClaimCall *c, const IdemKeyRow *row,
					  ClaimResult *r, MemoryContext cxt)
{
	IdemKeyHistory history = IdemKeyHistoryFind(&c->scope, row, c->tombstones,
												c->now, cxt);

	if (!history.used)
		return false;
	IdemStatsCount(c->scope.endpoint_str, IDEM_COUNT_TOMBSTONE_HITS);
	if (!IdemTextEqual(history.fingerprint, c->fingerprint))
		IdemAnswerMismatch(c, NULL, r, cxt);
	else if (c->expired_conflict)
		IdemAnswerExpired(r);
	else
		return false;
	return true;
}

/* A random lease token: positive, never 0. */
static int64
IdemNewLeaseToken(void)
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
	return token;
}

/*
 * Execute: the key is ours.  The scope's expired rows go; the claim is
 * remembered with its lock (claim_pending.c), and in lease mode its
 * in_progress row inserted.
 */
static void
IdemClaimExecute(const ClaimCall *c, const IdemKeyRow *row, ClaimResult *r)
{
	if (row->has_expired)
		IdemKeystoreDeleteExpired(&c->scope, c->now);

	r->action = "execute";
	r->expires_at = c->expires_at;
	if (c->lease != NULL)
	{
		int64		token = IdemNewLeaseToken();
		IdemNewKeyRow newrow = {0};

		IdemAddPending(&c->scope, c->fingerprint, c->keep_digest, c->now,
					   c->expires_at, &c->tag, true);
		newrow.created_at = c->now;
		newrow.fingerprint = c->fingerprint;
		newrow.request_digest = c->keep_digest;
		newrow.state = IDEM_STATE_IN_PROGRESS;
		newrow.lease_token = &token;
		newrow.locked_until = &c->locked_until;
		newrow.expires_at = c->expires_at;
		IdemKeystoreInsert(&c->scope, &newrow);
		r->has_token = true;
		r->lease_token = token;
	}
	else
		IdemAddPending(&c->scope, c->fingerprint, c->keep_digest, c->now,
					   c->expires_at, &c->tag, false);

	IdemStatsCount(c->scope.endpoint_str, IDEM_COUNT_EXECUTES);
	IdemReport(&c->scope, c->fingerprint, NULL, "in_progress", false, -1,
			   c->now);
}

/* ----------------------------------------------------------------
 *		idem_claim
 * ----------------------------------------------------------------
 */

PG_FUNCTION_INFO_V1(idem_claim);

/*
 * idem_claim(tenant, endpoint, key, fingerprint, ttl, lease, wait,
 *			  request_digest) RETURNS idempotency.claim_result
 */
Datum
idem_claim(PG_FUNCTION_ARGS)
{
	MemoryContext cxt = CurrentMemoryContext;
	ClaimCall	c;
	IdemKeyRow	row;
	ClaimResult r;

	IdemRequireReadWrite(fcinfo);
	IdemClaimPrepare(fcinfo, &c);
	IdemStatsCount(c.scope.endpoint_str, IDEM_COUNT_CLAIMS);
	IdemClaimResultInit(&r);

	/*
	 * A duplicate of a claim this very transaction has not finished yet, or
	 * of one in atomic mode that another still runs when the wait is over.
	 */
	if (IdemFindPending(&c.scope, NULL) != NULL || !IdemClaimLock(&c))
		IdemAnswerInProgress(&c, NULL, &r);
	else if (IdemClaimOnLiveRow(&c, &row, &r, cxt) ||
			 IdemClaimOnEarlierUse(&c, &row, &r, cxt))
	{
		/* nothing to execute: let the next duplicate in at once */
		if (c.locked)
			IdemReleaseScopeLock(&c.tag);
	}
	else
		IdemClaimExecute(&c, &row, &r);
	PG_RETURN_DATUM(IdemClaimResultDatum(fcinfo, &r));
}
