/*-------------------------------------------------------------------------
 *
 * claim.h
 *	  The claim/finish protocol on idempotency keys.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CLAIM_H
#define IDEM_CLAIM_H

/* registers the (sub)transaction callbacks that end pending claims */
extern void IdemClaimInit(void);

#endif							/* IDEM_CLAIM_H */
