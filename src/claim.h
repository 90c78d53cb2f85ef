/*-------------------------------------------------------------------------
 *
 * claim.h
 *	  The claim/finish protocol on idempotency keys: idem_claim (claim.c),
 *	  and the calls that follow a claim (claim_finish.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CLAIM_H
#define IDEM_CLAIM_H

#include "datatype/timestamp.h"

#include "scope.h"

/* registers the (sub)transaction callbacks that end pending claims */
extern void IdemClaimInit(void);

/*
 * ts + iv, where iv is the argument named what; more than a century (or an
 * infinite interval) is refused as an invalid argument, naming it.
 */
extern TimestampTz IdemAddInterval(TimestampTz ts, const Interval *iv,
								   const char *what);

/*
 * Report a key's transition from from_state to to_state (NULL: no row) to
 * the transition log and the audit trail, when either is on.
 */
extern void IdemReport(const IdemScope *scope, const bytea *fingerprint,
					   const char *from_state, const char *to_state,
					   bool replayed, int response_status,
					   TimestampTz started);

#endif							/* IDEM_CLAIM_H */
