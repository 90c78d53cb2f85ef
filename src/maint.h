/*-------------------------------------------------------------------------
 *
 * maint.h
 *	  One maintenance pass over idempotency.keys: stale leases, expired rows
 *	  of the default partition, premade partitions, dropped partitions.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_MAINT_H
#define IDEM_MAINT_H

#include "datatype/timestamp.h"

#include "maint_pass.h"

/*
 * Field 4 of the advisory locktag that keeps two passes of the same database
 * apart ("IM"); pg_advisory_lock only uses 1 and 2 there.
 */
#define IDEM_LOCKTAG_MAINTENANCE	0x494D

/*
 * Run one pass as if the clock read as_of.  With own_xacts, each step runs
 * in a transaction of its own (the background worker, outside any
 * transaction); otherwise everything runs in the caller's transaction.
 * Returns false, having emitted a "busy" action, when another pass of the
 * same database is running.
 */
extern bool IdemMaintenancePass(TimestampTz as_of, bool own_xacts,
								IdemMaintEmit emit, void *arg);

/*
 * Report what a pass as of as_of would do, in the caller's transaction,
 * changing nothing (no "busy" either: a preview takes no pass lock).
 */
extern void IdemMaintenancePreview(TimestampTz as_of, IdemMaintEmit emit,
								   void *arg);

#endif							/* IDEM_MAINT_H */
