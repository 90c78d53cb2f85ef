/*-------------------------------------------------------------------------
 *
 * tombstone_filter_learn.h
 *	  Maintenance's side of the tombstone filters: learning them from the
 *	  rows of the tombstone partitions, and compacting them.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TOMBSTONE_FILTER_LEARN_H
#define IDEM_TOMBSTONE_FILTER_LEARN_H

#include "c.h"

/*
 * For maintenance: learn the filters of the tombstones table parent from
 * its rows (every row version), after a server start, and again for the
 * partitions whose filters missed a tombstone (no room) until each was
 * read, and again after DDL that may bring tombstones no trigger saw
 * (IdemTombFilterForget); forgets the filters of dropped databases.
 * Nothing is completed while such DDL runs or a trigger tombstones_filter
 * of the tree is disabled.  Returns how many rows were read, or -1 when
 * nothing was to be learned.  And the filter of a
 * partition dropped by the current transaction is freed at its commit.
 */
extern int64 IdemTombFilterLearn(Oid parent);

/*
 * For maintenance: each partition of parent whose filter has grown to
 * three generations or more, and that no transaction is writing, gets one
 * generation sized for what it holds, made again from its rows.  Returns
 * how many were compacted, or -1 when the database's filters are not known.
 */
extern int	IdemTombFilterCompact(Oid parent);

#endif							/* IDEM_TOMBSTONE_FILTER_LEARN_H */
