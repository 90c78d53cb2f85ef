/*-------------------------------------------------------------------------
 *
 * audit.c
 *	  State changes of keys: the structured log line and the audit trail.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "audit.h"
#include "guc.h"

/*
 * Report one state change.  Not written yet: the interface that claim.c and
 * maintenance call.
 */
void
IdemReportTransition(const IdemTransition *t)
{
	if (!idem_log_transitions && !idem_audit)
		return;
}
