/*-------------------------------------------------------------------------
 *
 * claim_result.h
 *	  What idem_claim answers, and the idempotency.claim_result row it
 *	  returns (claim_result.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CLAIM_RESULT_H
#define IDEM_CLAIM_RESULT_H

#include "fmgr.h"
#include "datatype/timestamp.h"
#include "utils/jsonb.h"

#include "keystore.h"
#include "response.h"
#include "scope.h"

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

/* An answer not yet given: every column NULL. */
extern void IdemClaimResultInit(ClaimResult *r);

/* The answer as a row of the function's result type. */
extern Datum IdemClaimResultDatum(FunctionCallInfo fcinfo,
								  const ClaimResult *r);

/*
 * The replay of a completed row: its stored response, made ready (and
 * marked as replayed in its headers), in the current memory context.
 */
extern void IdemReplayResult(const IdemScope *scope, IdemKeyRow *row,
							 ClaimResult *r);

#endif							/* IDEM_CLAIM_RESULT_H */
