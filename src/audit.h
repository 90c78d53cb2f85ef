/*-------------------------------------------------------------------------
 *
 * audit.h
 *	  State changes of keys: the structured log line
 *	  (idempotency.log_transitions) and the audit trail (idempotency.audit).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_AUDIT_H
#define IDEM_AUDIT_H

#include "utils/timestamp.h"

/* One state change of one key.  States are the keys.state values. */
typedef struct IdemTransition
{
	const char *tenant;
	const char *endpoint;
	const char *key;			/* raw key: never logged as such */
	const bytea *fingerprint;	/* 32 bytes, or NULL when unknown */
	const char *from_state;		/* NULL: no live row before */
	const char *to_state;		/* NULL: the row is gone (released) */
	bool		replayed;		/* a replay, no change of state */
	int			response_status;	/* -1 when none */
	TimestampTz started;		/* creation time of the row, for elapsed
								 * milliseconds; 0 when unknown */
} IdemTransition;

/*
 * Report one state change: a LOG line when idempotency.log_transitions is
 * on, a row in idempotency.events when idempotency.audit is on (in the
 * caller's transaction).  Cheap when both are off.
 */
extern void IdemReportTransition(const IdemTransition *t);

#endif							/* IDEM_AUDIT_H */
