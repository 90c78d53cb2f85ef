/*-------------------------------------------------------------------------
 *
 * keys.h
 *	  Validation of idempotency keys and of the scope that goes with them.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEYS_H
#define IDEM_KEYS_H

#include "util.h"		/* IDEM_SCOPE_MAX_LEN */

#define IDEM_KEY_MAX_LEN		255
#define IDEM_FINGERPRINT_LEN	32

/* true when key is 1 to 255 characters of [A-Za-z0-9_-] */
extern bool IdemKeyIsValid(const char *key, int len);

/*
 * Check the arguments every key function takes; each raises IK400 with a
 * message naming what is wrong.  NULL pointers stand for SQL NULL.
 */
extern void IdemCheckKey(const text *key);
extern void IdemCheckScope(const text *tenant, const text *endpoint);
/* the tenant (is_tenant) or the endpoint alone, as IdemCheckScope does */
extern void IdemCheckScopePart(const text *value, bool is_tenant);
extern void IdemCheckFingerprint(const bytea *fingerprint);

#endif							/* IDEM_KEYS_H */
