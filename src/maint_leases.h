/*-------------------------------------------------------------------------
 *
 * maint_leases.h
 *	  The step of a maintenance pass that settles stale leases: in_progress
 *	  keys past locked_until become 'unknown', or are settled by their
 *	  endpoint's resolver.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_MAINT_LEASES_H
#define IDEM_MAINT_LEASES_H

#include "maint_pass.h"

/* Settle the stale leases as of the pass's as_of (or preview it); one step. */
extern void IdemMaintStaleLeases(IdemMaintPass *p);

#endif							/* IDEM_MAINT_LEASES_H */
