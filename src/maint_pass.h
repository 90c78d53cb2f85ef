/*-------------------------------------------------------------------------
 *
 * maint_pass.h
 *	  What every step of a maintenance pass shares: the pass's state, the
 *	  begin and end of a step (its transaction, SPI and settings), and the
 *	  report of an action.  The steps are in maint_leases.c and
 *	  maint_partitions.c; maintenance.c runs them in order.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_MAINT_PASS_H
#define IDEM_MAINT_PASS_H

#include "postgres.h"

#include "datatype/timestamp.h"

/*
 * Receives one action of a pass: kind, object (NULL when none) and rows
 * (negative when not known).
 */
typedef void (*IdemMaintEmit) (void *arg, const char *kind,
							   const char *object, int64 rows);

/* One pass, from its start to its end. */
typedef struct IdemMaintPass
{
	TimestampTz as_of;
	bool		own_xacts;
	bool		preview;		/* report what would be done, do nothing */
	IdemMaintEmit emit;
	void	   *arg;
	int			guc_nest;
	MemoryContext cxt;			/* lives as long as the pass */
} IdemMaintPass;

/*
 * Begin one step: a transaction of its own for the worker (own_xacts), SPI,
 * and the settings every step runs with; end it.
 */
extern void IdemMaintStepBegin(IdemMaintPass *p);
extern void IdemMaintStepEnd(IdemMaintPass *p);

/* Report one action of the pass to its receiver. */
extern void IdemMaintReport(IdemMaintPass *p, const char *kind,
							const char *object, int64 rows);

#endif							/* IDEM_MAINT_PASS_H */
