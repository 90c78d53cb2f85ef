/*-------------------------------------------------------------------------
 *
 * tombstone_filter_int.h
 *	  What the files of the tombstone filters share (tombstone_filter.c, the
 *	  filters, their shared memory and the probe; tombstone_filter_learn.c,
 *	  maintenance's learning and compaction): the entries and generations
 *	  in shared memory, and the functions that change them.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TOMBSTONE_FILTER_INT_H
#define IDEM_TOMBSTONE_FILTER_INT_H

#include "port/atomics.h"
#include "storage/lwlock.h"
#include "utils/dsa.h"
#include "utils/hsearch.h"

#include "tombstone_filter.h"

/* generations of one partition's filter: the last is 2^15 times the first */
#define IDEM_TOMBFILTER_MAX_GENS	16
/*
 * Blocks of 512 bits, 32 hashes a block (16 bits a hash) with 10 bits set
 * by each: about one false "maybe" in a thousand, so that a claim seldom
 * opens a partition for nothing even where dozens of partitions hold
 * tombstones.  The first generation has 64 blocks.
 */
#define IDEM_TOMBFILTER_MIN_BLOCKS	64
#define IDEM_TOMBFILTER_BLOCK_WORDS	8
#define IDEM_TOMBFILTER_PER_BLOCK	32
#define IDEM_TOMBFILTER_K			10
/* a block's bytes, and the alignment of a generation's blocks */
#define IDEM_TOMBFILTER_BLOCK_BYTES	(IDEM_TOMBFILTER_BLOCK_WORDS * sizeof(uint64))

typedef struct TombFilterKey
{
	Oid			dbid;
	Oid			parent;			/* idempotency.tombstones of that database */
	Oid			partoid;		/* InvalidOid: the database's own entry */
} TombFilterKey;

typedef struct TombFilterEntry
{
	TombFilterKey key;
	/* the database's own entry: */
	bool		known;			/* learned since the server started */
	uint64		misses;			/* tombstones written, since the entry was
								 * made, into a partition that found no
								 * entry: while not 0, a partition without
								 * one is probed */
	uint64		forgets;		/* times DDL made its filters incomplete
								 * (IdemTombFilterForget): a learning that
								 * began before completes nothing */
	/* a partition's entry: */
	bool		complete;		/* holds every hash written into the
								 * partition: may answer "no" */
	bool		unfiltered;		/* no room for its bits: always probed */
	int			ngens;
	dsa_pointer gens[IDEM_TOMBFILTER_MAX_GENS];
} TombFilterEntry;

typedef struct TombFilterGen
{
	uint32		nblocks;		/* a power of two */
	uint32		count;
	uint32		capacity;
	uint32		words_off;		/* bytes from the header to the first block,
								 * aligned on a cache line */
	uint64		space[FLEXIBLE_ARRAY_MEMBER];
} TombFilterGen;

typedef struct TombFilterShared
{
	LWLock	   *lock;
	int			dsa_tranche;
	Size		area_size;
	bool		full_logged;	/* the area was found full */
	bool		entries_logged; /* the table of entries was found full */
	/* incremented by every change of the layout (see the banner) */
	pg_atomic_uint64 layout;
} TombFilterShared;

extern TombFilterShared *tf_shared;
extern HTAB *tf_hash;
extern dsa_area *tf_area;

/*
 * The layout changes, under the exclusive lock: before any bit array is
 * freed (a backend reading it without the lock then sees the counter move
 * when it may have read the array after it was reused; the atomic
 * increment is a full barrier).
 */
static inline void
IdemTombFilterLayoutChanges(void)
{
	Assert(LWLockHeldByMeInMode(tf_shared->lock, LW_EXCLUSIVE));
	(void) pg_atomic_fetch_add_u64(&tf_shared->layout, 1);
}

extern uint32 IdemTombFilterBlocksFor(uint32 nblocks, int64 hint);
extern TombFilterEntry *IdemTombFilterDbEntry(Oid parent);
extern void IdemTombFilterFreeGens(TombFilterEntry *e);
extern void IdemTombFilterGenSet(TombFilterGen *gen, const uint8 *hash);
extern bool IdemTombFilterGrow(TombFilterEntry *e, int64 hint);
extern void IdemTombFilterKeyOf(TombFilterKey *key, Oid parent, Oid partoid);
extern TombFilterEntry *IdemTombFilterKnownLocked(Oid parent);
extern void IdemTombFilterMissed(TombFilterEntry *db);
extern TombFilterEntry *IdemTombFilterNewEntry(Oid parent, Oid partoid,
											   int64 hint, bool complete);
extern dsa_pointer IdemTombFilterNewGen(uint32 nblocks);
extern bool IdemTombFilterUsable(void);

#endif							/* IDEM_TOMBSTONE_FILTER_INT_H */
