/*-------------------------------------------------------------------------
 *
 * maint_pass.h
 *	  What every step of a maintenance pass shares: the pass's state, the
 *	  begin and end of a step (its transaction, SPI and settings), and the
 *	  report of an action.  The steps are in maint_leases.c and
 *	  maint_partitions.c; maint.c runs them in order.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_MAINT_PASS_H
#define IDEM_MAINT_PASS_H

#include "postgres.h"

#include "datatype/timestamp.h"

/*
 * The kinds of action a pass reports (doc/maintenance.md): the rows of
 * idem_maintenance() name them, the worker logs them.
 */
typedef enum IdemMaintKind
{
	IDEM_MAINT_BUSY,			/* another pass of the database runs */
	IDEM_MAINT_SKIPPED,			/* a step could not get its lock, or the pass
								 * runs on a logical replica */
	IDEM_MAINT_CREATE,			/* a partition made */
	IDEM_MAINT_DROP,			/* a partition dropped */
	IDEM_MAINT_TOMBSTONE,		/* tombstones written of expired rows */
	IDEM_MAINT_PURGE,			/* expired rows left a default partition */
	IDEM_MAINT_LEASE_RESOLVE,	/* stale leases a resolver would settle
								 * (preview only) */
	IDEM_MAINT_LEASE_UNKNOWN,	/* stale leases marked unknown */
	IDEM_MAINT_LEASE_COMPLETED, /* ... completed by their resolver */
	IDEM_MAINT_LEASE_FAILED,	/* ... failed by their resolver */
	IDEM_MAINT_RESOLVER_ERROR	/* ... left as they were: resolver failed */
} IdemMaintKind;

#define IDEM_MAINT_NUM_KINDS	(IDEM_MAINT_RESOLVER_ERROR + 1)

/*
 * The object of the outbox's "purge" (maint_outbox.c), which the worker
 * logs in words of its own.
 */
#define IDEM_MAINT_OUTBOX_OBJECT	"outbox"

/* A kind's name, as idem_maintenance() shows it: "lease_unknown". */
extern const char *IdemMaintKindName(IdemMaintKind kind);

/*
 * Receives one action of a pass: kind, object (NULL when none) and rows
 * (negative when not known).
 */
typedef void (*IdemMaintEmit) (void *arg, IdemMaintKind kind,
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
extern void IdemMaintReport(IdemMaintPass *p, IdemMaintKind kind,
							const char *object, int64 rows);

#endif							/* IDEM_MAINT_PASS_H */
