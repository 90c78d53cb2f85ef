/*-------------------------------------------------------------------------
 *
 * idempotency.h
 *	  Declarations shared by every module of the idempotency extension:
 *	  the extension's own SQLSTATEs and the preload check.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_H
#define IDEMPOTENCY_H

#include "postgres.h"

/*
 * SQLSTATEs of the extension's own, in class "IK" (idempotency key).  The
 * last three characters are the HTTP status an application should answer
 * with, so that the mapping is mechanical.  The README lists them.
 */
#define ERRCODE_IDEM_INVALID_KEY			MAKE_SQLSTATE('I','K','4','0','0')
#define ERRCODE_IDEM_LEASE_MISMATCH			MAKE_SQLSTATE('I','K','4','0','3')
#define ERRCODE_IDEM_KEY_NOT_FOUND			MAKE_SQLSTATE('I','K','4','0','4')
#define ERRCODE_IDEM_INVALID_STATE			MAKE_SQLSTATE('I','K','4','0','9')
#define ERRCODE_IDEM_RESPONSE_TOO_LARGE		MAKE_SQLSTATE('I','K','4','1','3')
#define ERRCODE_IDEM_UNFINISHED_CLAIM		MAKE_SQLSTATE('I','K','5','0','0')
#define ERRCODE_IDEM_DECRYPTION_FAILED		MAKE_SQLSTATE('I','K','5','0','1')

/* true when the library was loaded through shared_preload_libraries */
extern bool IdemPreloaded;

extern void IdemRequirePreload(const char *feature);

/*
 * Run fn(arg) in a subtransaction.  Returns NULL when it succeeded; when it
 * raised an error, rolls the subtransaction back and returns a copy of the
 * error (the caller logs it, or raises it again with ReThrowError).
 */
extern ErrorData *IdemRunInSubtransaction(void (*fn) (void *arg), void *arg);

#endif							/* IDEMPOTENCY_H */
