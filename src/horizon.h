/*-------------------------------------------------------------------------
 *
 * horizon.h
 *	  Key horizons: per endpoint, a time before which every row of
 *	  idempotency.keys of that endpoint expires, so that a probe of a scope
 *	  opens only the partitions that can hold it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_HORIZON_H
#define IDEM_HORIZON_H

#include "datatype/timestamp.h"
#include "nodes/pg_list.h"

/* The least bound above a row expiring at expires: every bound is that or more. */
static inline TimestampTz
IdemHorizonJustAfter(TimestampTz expires)
{
	return expires < DT_NOEND - 1 ? expires + 1 : DT_NOEND;
}

/*
 * With shared_preload_libraries: its shared memory, requested and set up by
 * the extension's one request hook and one startup hook (shmem.c).
 */
extern void IdemHorizonShmemRequest(void);
extern void IdemHorizonShmemStartup(void);

/*
 * The horizon of endpoint in the table of keys relid: every row of the
 * endpoint has expires_at < the result; and every row of it in the default
 * partition (or in any partition other than a dated one, util.h's
 * IdemDatedPartition) has expires_at < *dflt, DT_NOBEGIN when no row of the
 * endpoint was written there.  Both DT_NOEND when they are not known (not
 * preloaded, not learned since the server started, in recovery): then
 * every partition must be probed.
 */
extern TimestampTz IdemHorizonOf(Oid relid, const text *endpoint,
								 TimestampTz *dflt);

/*
 * Before a row of endpoint expiring at expires_at is written into the
 * table of keys relid: the endpoint's horizon is raised to bound, which is
 * above expires_at (the upper bound of the partition the row goes to), and
 * when the row goes to a partition that is no dated one (in_default), its
 * bound of the default partition is raised above expires_at.
 */
extern void IdemHorizonRaise(Oid relid, const text *endpoint,
							 TimestampTz expires_at, TimestampTz bound,
							 bool in_default);

/*
 * From the DDL guard, once a command that may bring rows no trigger saw into
 * the table of keys relid holds its lock (ATTACH PARTITION, a trigger
 * disabled or enabled): the database's horizons are unknown again, until
 * maintenance learns them from the rows.
 */
extern void IdemHorizonForget(Oid relid);

/*
 * For maintenance: learn the horizons of the table of keys relid from its
 * rows (every row version, committed or not), once per server start and
 * again after DDL that may bring rows no trigger saw (IdemHorizonForget).
 * Returns how many rows were read, or -1 when nothing was to be learned
 * (or can be now: a partition being attached, the trigger keys_horizon
 * disabled).  The horizons become known only when no such DDL came while
 * the rows were read.
 */
extern int64 IdemHorizonLearn(Oid relid);

#endif							/* IDEM_HORIZON_H */
