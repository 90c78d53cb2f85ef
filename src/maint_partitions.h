/*-------------------------------------------------------------------------
 *
 * maint_partitions.h
 *	  The steps of a maintenance pass that handle the partitions of
 *	  idempotency.keys and idempotency.tombstones: premake, retention, and
 *	  the purge of their default partitions.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_MAINT_PARTITIONS_H
#define IDEM_MAINT_PARTITIONS_H

#include "maint_pass.h"

/* The tables partitioned by RANGE (expires_at) that maintenance looks after */
typedef enum IdemPartitionedTable
{
	IDEM_PARTITIONED_KEYS,
	IDEM_PARTITIONED_TOMBSTONES
} IdemPartitionedTable;

/*
 * Premake: dated partitions of the table cover from as_of to as_of + how far
 * ahead it needs + one partition width; rows of a new partition's range are
 * first moved out of the default partition.  Each partition in a step.
 */
extern void IdemMaintPremake(IdemMaintPass *p, IdemPartitionedTable table);

/*
 * Retention: partitions of the table whose range has ended are dropped
 * whole, after the tombstones of their rows (of keys) are written.  One
 * step.
 */
extern void IdemMaintRetention(IdemMaintPass *p, IdemPartitionedTable table);

/*
 * Expired rows leave the default partition of keys, leaving their
 * tombstones; expired tombstones leave the default partition of
 * tombstones.  One step each.
 */
extern void IdemMaintPurgeKeysDefault(IdemMaintPass *p);
extern void IdemMaintPurgeTombstonesDefault(IdemMaintPass *p);

#endif							/* IDEM_MAINT_PARTITIONS_H */
