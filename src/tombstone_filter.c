/*-------------------------------------------------------------------------
 *
 * tombstone_filter.c
 *	  Membership filters of tombstone partitions.  A claim of a new key
 *	  must prove that no tombstone of its scope lives; without more
 *	  knowledge that means opening every partition of idempotency.tombstones
 *	  whose range has not ended, and probing its index.  Each partition has
 *	  a Bloom filter of the scope hashes written into it, in shared memory,
 *	  and a claim opens a partition only when its filter says the scope may
 *	  be there (about one partition in a thousand when it is not).
 *
 *	  The filters are blocked Bloom filters (every hash sets its bits in one
 *	  64-byte block) in a dynamic shared memory area of
 *	  idempotency.tombstone_filter_memory (32 MB), made at server start in the main
 *	  shared memory.  A partition's filter grows by generations, each twice
 *	  the size of the one before, so that it needs no count in advance.
 *	  Maintenance compacts a filter of three generations or more into one,
 *	  made again from the partition's rows while no transaction writes it
 *	  (IdemTombFilterCompact, in tombstone_filter_learn.c, with learning).
 *
 *	  The rule: a filter may answer "maybe" for anything, and "no" only for
 *	  what it saw completely.  Filters only gain bits, and what is written
 *	  into a partition is added first:
 *	  - every row written into the tombstones table, by maintenance (an
 *	    INSERT ... SELECT), a restore or a logical replication apply, passes
 *	    the trigger tombstones_filter (enabled ALWAYS), which adds its hash
 *	    before the row is written;
 *	  - rows older than the server are learned by maintenance
 *	    (IdemTombFilterLearn, tombstone_filter_learn.c), which reads every
 *	    row version; until then a database's filters are unknown and
 *	    every partition is probed, as without filters.
 *	  A claim takes its snapshot before it reads the filters, so a
 *	  tombstone committed before the snapshot had its bits set before.  A
 *	  row written and rolled back leaves its bits: a false "maybe", never a
 *	  false "no".
 *
 *	  Capacity, and what fails closed:
 *	  - The table of entries (idempotency.tombstone_filter_entries, 8192,
 *	    for the whole server) holds one entry per database that maintenance
 *	    learned and one per tombstone partition holding tombstones (an
 *	    empty partition gets none: it answers "no" as long as its database
 *	    missed nothing).  A tombstone written into a partition that finds
 *	    no entry counts a miss of its database: from then on every
 *	    partition of the database without an entry answers "maybe", and a
 *	    partition without one gets one only from learning (an entry made by
 *	    the next writer would hold its hash alone).  Maintenance learns the
 *	    database again at each pass until every partition was read with
 *	    room for it and nothing was missed meanwhile; then the misses are
 *	    forgotten.  A database that finds no entry of its own stays
 *	    unknown.  Logged once.
 *	  - The area: a partition whose filter cannot grow is marked
 *	    unfiltered (its bits freed) and answers "maybe"; learning gives it
 *	    bits again, and reads its rows, once the area has room.  Logged
 *	    once.
 *	  - A partition entry answers "no" only when it is complete: made by a
 *	    writer while its database was known and had missed nothing, or
 *	    learned, or compacted.  Learning makes the entry first, so that
 *	    every tombstone written from then on goes into it, and reads the
 *	    partition's row versions only once no transaction that may have
 *	    written it before is left (no lock conflicting with SHARE: a writer
 *	    holds ROW EXCLUSIVE from before its trigger until it ends); a
 *	    partition being written, or vacuumed, is left to a later pass.  A
 *	    partition made or attached by a transaction still running may be
 *	    missing from the list learning reads: while the tombstones table
 *	    has a lock conflicting with SHARE UPDATE EXCLUSIVE, a database is
 *	    not learned (nor its misses forgotten).  Until then, "maybe".
 *	  - After a restart (or a crash) every filter is unknown until
 *	    maintenance learned its database: "maybe" for all.
 *	  - Tombstones that pass no trigger (a partition attached already
 *	    holding rows, rows written while tombstones_filter is disabled):
 *	    the DDL guard, at each ATTACH PARTITION, ENABLE or DISABLE TRIGGER
 *	    it lets through and once the command holds its lock, counts a miss
 *	    of the database and makes the entries of the partitions concerned
 *	    incomplete (IdemTombFilterForget, which counts a forget).  A
 *	    learning completes an entry, makes the database known or forgets
 *	    its misses only when no forget was counted since it began, no other
 *	    transaction holds a lock that such a command takes, and the trigger
 *	    fires on every table of the tree (IdemLearnedTreeComplete).
 *	  - The entries (and bit arrays) of a partition that maintenance drops
 *	    are freed when the drop commits; those of a dropped database, or
 *	    of an earlier tombstones table of the same database, at the next
 *	    pass of any database (IdemTombFilterForgetStale).
 *
 *	  A claim reads the filters without the lock.  Each backend keeps a
 *	  copy of the layout of its database's filters (which partitions have
 *	  an entry, where the bit arrays of their generations live and how many
 *	  blocks each has), valid while a shared counter has not moved: every
 *	  change of the layout (an entry made, completed or removed, a
 *	  generation added or freed, a database learned or missing a
 *	  tombstone, a partition unfiltered)
 *	  increments it, under the exclusive lock and before any array is
 *	  freed.  The probe reads the counter, tests the bits of its copy, and
 *	  reads the counter again: the arrays of live generations only gain
 *	  bits, and the area never gets a segment of its own, so a freed array
 *	  is still mapped; should the counter have moved while a partition was
 *	  answered "no", the test is made again under the lock.
 *
 *	  Without shared_preload_libraries, with a memory of 0, on a standby,
 *	  before the update to 0.4.0 (which adds the trigger) and in the Citus
 *	  mode, no filter is known and every partition is probed.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/bufmgr.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/dsa.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "compat.h"
#include "guc.h"
#include "schema.h"
#include "tombstone_filter_int.h"
#include "tombstone_row.h"
#include "util.h"

#define IDEM_TOMBFILTER_TRANCHE		"idempotency tombstone filters"

/* a hint that the cache line at p will be read soon, where the compiler has one */
#if defined(__has_builtin)
#if __has_builtin(__builtin_prefetch)
#define IDEM_PREFETCH(p)	__builtin_prefetch((p), 0, 3)
#endif
#elif defined(__GNUC__)
#define IDEM_PREFETCH(p)	__builtin_prefetch((p), 0, 3)
#endif
#ifndef IDEM_PREFETCH
#define IDEM_PREFETCH(p)	((void) (p))
#endif

/*
 * The layout of one partition's filter, as this backend last read it: its
 * answer when it has no bits (TF_NO: no entry, nothing was written there;
 * TF_MAYBE: an entry not complete or unfiltered, or no entry in a database
 * that missed a tombstone), or its generations.
 */
typedef enum TombFilterLocalKind
{
	TF_NO,
	TF_MAYBE,
	TF_BITS
} TombFilterLocalKind;

typedef struct TombFilterLocalGen
{
	const uint64 *words;		/* the first block */
	uint32		mask;			/* nblocks - 1 */
	int			part;			/* its partition's index in tf_local.parts */
} TombFilterLocalGen;

typedef struct TombFilterLocalPart
{
	TombFilterLocalKind kind;
} TombFilterLocalPart;

/*
 * The backend's copy of the layout of the filters of one tombstones table,
 * for one list of its partitions (the last a claim asked about), valid
 * while tf_shared->layout equals its layout.
 */
typedef struct TombFilterLocal
{
	bool		valid;
	uint64		layout;
	Oid			parent;
	bool		known;			/* the database's filters were learned */
	int			nparts;
	int			ngens;
	int			cap_parts;
	int			cap_gens;
	Oid		   *partoids;
	TombFilterLocalPart *parts;
	TombFilterLocalGen *gens;
	bool	   *no;				/* the answers of one probe */
} TombFilterLocal;

TombFilterShared *tf_shared = NULL;
HTAB	   *tf_hash = NULL;
dsa_area   *tf_area = NULL;
static TombFilterLocal tf_local;

/* filters to free when the transaction that dropped their partition commits */
static List *tf_dropped = NIL;
static bool tf_callback_registered = false;

static Size
IdemTombFilterAreaSize(void)
{
	Size		size = (Size) idem_tombstone_filter_memory * 1024;

	return size < dsa_minimum_size() ? 0 : size;
}

/* its part of the shared memory, from shmem.c's request hook */
void
IdemTombFilterShmemRequest(void)
{
	RequestAddinShmemSpace(add_size(add_size(MAXALIGN(sizeof(TombFilterShared)),
											 IdemTombFilterAreaSize()),
									hash_estimate_size(idem_tombstone_filter_entries,
													   sizeof(TombFilterEntry))));
	RequestNamedLWLockTranche(IDEM_TOMBFILTER_TRANCHE, 1);
}

/* its part of the shared memory, from shmem.c's startup hook */
void
IdemTombFilterShmemStartup(void)
{
	bool		found;
	HASHCTL		info;
	Size		area_size = IdemTombFilterAreaSize();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	tf_shared = ShmemInitStruct("idempotency tombstone filters",
								add_size(MAXALIGN(sizeof(TombFilterShared)), area_size),
								&found);
	if (!found)
	{
		tf_shared->lock = &(GetNamedLWLockTranche(IDEM_TOMBFILTER_TRANCHE))->lock;
		tf_shared->area_size = area_size;
		tf_shared->full_logged = false;
		tf_shared->entries_logged = false;
		pg_atomic_init_u64(&tf_shared->layout, 0);
		tf_shared->dsa_tranche = LWLockNewTrancheId();
		if (area_size > 0)
		{
			dsa_area   *area;

			area = dsa_create_in_place((char *) tf_shared + MAXALIGN(sizeof(TombFilterShared)),
									   area_size, tf_shared->dsa_tranche, NULL);
			/* the main shared memory only: never a segment of its own */
			dsa_set_size_limit(area, area_size);
			dsa_pin(area);
			dsa_detach(area);
		}
	}
	info.keysize = sizeof(TombFilterKey);
	info.entrysize = sizeof(TombFilterEntry);
	tf_hash = ShmemInitHash("idempotency tombstone filters by partition",
							idem_tombstone_filter_entries, idem_tombstone_filter_entries,
							&info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

/* The area, attached in this backend; NULL when there is none. */
static dsa_area *
IdemTombFilterArea(void)
{
	if (tf_area == NULL && tf_shared != NULL && tf_shared->area_size > 0)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		LWLockRegisterTranche(tf_shared->dsa_tranche, IDEM_TOMBFILTER_TRANCHE);
		tf_area = dsa_attach_in_place((char *) tf_shared + MAXALIGN(sizeof(TombFilterShared)),
									  NULL);
		dsa_pin_mapping(tf_area);
		MemoryContextSwitchTo(old);
	}
	return tf_area;
}

bool
IdemTombFilterUsable(void)
{
	return tf_hash != NULL && IdemTombFilterArea() != NULL &&
		!RecoveryInProgress() && IdemSchemaHas(IDEM_SCHEMA_HORIZONS);
}

void
IdemTombFilterKeyOf(TombFilterKey *key, Oid parent, Oid partoid)
{
	memset(key, 0, sizeof(*key));
	key->dbid = MyDatabaseId;
	key->parent = parent;
	key->partoid = partoid;
}

/*
 * Where a hash goes in a generation: the block (from its first 8 bytes' low
 * bits, masked by the generation's number of blocks less one), and the 10
 * bits it sets there, 9 bits each: 7 from its next 8 bytes, 3 from the high
 * bits of the first 8 (above any block number's), as a mask of the block's
 * words.  The bits are the same in every generation, so a probe computes
 * them once.
 */
typedef struct TombFilterProbe
{
	uint64		block_of;		/* to be masked */
	uint64		bits[IDEM_TOMBFILTER_BLOCK_WORDS];
} TombFilterProbe;

static inline void
IdemTombFilterProbeOf(TombFilterProbe *probe, const uint8 *hash)
{
	uint64		a;
	uint64		b;
	int			pos;

	memcpy(&a, hash, sizeof(a));
	memcpy(&b, hash + 8, sizeof(b));
	memset(probe->bits, 0, sizeof(probe->bits));
	for (int i = 0; i < IDEM_TOMBFILTER_K; i++)
	{
		pos = i < 7 ? (b >> (9 * i)) & 511 : (a >> (32 + 9 * (i - 7))) & 511;
		probe->bits[pos >> 6] |= UINT64CONST(1) << (pos & 63);
	}
	probe->block_of = a;
}

static inline const uint64 *
IdemTombFilterBlockAt(const uint64 *words, uint32 mask,
					  const TombFilterProbe *probe)
{
	return words + (probe->block_of & mask) * IDEM_TOMBFILTER_BLOCK_WORDS;
}

/* whether every bit of the probe is set in block */
static inline bool
IdemTombFilterBlockHas(const uint64 *block, const TombFilterProbe *probe)
{
	uint64		missing = 0;

	for (int w = 0; w < IDEM_TOMBFILTER_BLOCK_WORDS; w++)
		missing |= probe->bits[w] & ~block[w];
	return missing == 0;
}

static inline uint64 *
IdemTombFilterWords(TombFilterGen *gen)
{
	return (uint64 *) ((char *) gen + gen->words_off);
}

void
IdemTombFilterGenSet(TombFilterGen *gen, const uint8 *hash)
{
	TombFilterProbe probe;
	uint64	   *block;

	IdemTombFilterProbeOf(&probe, hash);
	block = (uint64 *) IdemTombFilterBlockAt(IdemTombFilterWords(gen),
											 gen->nblocks - 1, &probe);
	for (int w = 0; w < IDEM_TOMBFILTER_BLOCK_WORDS; w++)
		block[w] |= probe.bits[w];
	gen->count++;
}


void
IdemTombFilterFreeGens(TombFilterEntry *e)
{
	if (e->ngens == 0)
		return;
	IdemTombFilterLayoutChanges();
	for (int i = 0; i < e->ngens; i++)
		dsa_free(tf_area, e->gens[i]);
	e->ngens = 0;
}

/*
 * Blocks for a generation of at least nblocks (a power of two) that holds
 * hint hashes at its capacity.
 */
uint32
IdemTombFilterBlocksFor(uint32 nblocks, int64 hint)
{
	while (hint > 0 && (int64) nblocks * IDEM_TOMBFILTER_PER_BLOCK < hint &&
		   nblocks < (UINT32_MAX / 2 / IDEM_TOMBFILTER_BLOCK_WORDS / 8))
		nblocks *= 2;
	return nblocks;
}

/*
 * A new, empty generation of nblocks blocks, under the exclusive lock and
 * attached to no entry yet; InvalidDsaPointer when the area is full.
 */
dsa_pointer
IdemTombFilterNewGen(uint32 nblocks)
{
	dsa_pointer dp;
	TombFilterGen *gen;

	/* room to align the first block on a cache line */
	dp = dsa_allocate_extended(tf_area,
							   offsetof(TombFilterGen, space) +
							   IDEM_TOMBFILTER_BLOCK_BYTES +
							   (Size) nblocks * IDEM_TOMBFILTER_BLOCK_BYTES,
							   DSA_ALLOC_NO_OOM | DSA_ALLOC_ZERO | DSA_ALLOC_HUGE);
	if (!DsaPointerIsValid(dp))
		return dp;
	gen = dsa_get_address(tf_area, dp);
	gen->nblocks = nblocks;
	gen->count = 0;
	gen->capacity = nblocks * IDEM_TOMBFILTER_PER_BLOCK;
	/* the main shared memory is at the same address in every backend */
	gen->words_off = (uint32) (TYPEALIGN(IDEM_TOMBFILTER_BLOCK_BYTES,
										 (uintptr_t) gen->space) - (uintptr_t) gen);
	return dp;
}

/*
 * A new generation of e's filter, for about hint hashes (0: twice the last
 * one); false, the partition unfiltered, when there is no room.
 */
bool
IdemTombFilterGrow(TombFilterEntry *e, int64 hint)
{
	uint32		nblocks = IDEM_TOMBFILTER_MIN_BLOCKS;
	dsa_pointer dp = InvalidDsaPointer;
	TombFilterGen *gen;

	if (e->ngens > 0)
	{
		gen = dsa_get_address(tf_area, e->gens[e->ngens - 1]);
		nblocks = gen->nblocks * 2;
	}
	nblocks = IdemTombFilterBlocksFor(nblocks, hint);
	if (e->ngens < IDEM_TOMBFILTER_MAX_GENS)
		dp = IdemTombFilterNewGen(nblocks);
	IdemTombFilterLayoutChanges();
	if (!DsaPointerIsValid(dp))
	{
		IdemTombFilterFreeGens(e);
		e->unfiltered = true;
		e->complete = false;
		if (!tf_shared->full_logged)
		{
			tf_shared->full_logged = true;
			ereport(LOG,
					(errmsg("idempotency: the tombstone filters are full: a tombstone partition will be probed by every claim"),
					 errhint("Raise idempotency.tombstone_filter_memory (a restart is needed).")));
		}
		return false;
	}
	e->gens[e->ngens++] = dp;
	return true;
}

/* The database's own entry of the tombstones table parent, under the lock. */
TombFilterEntry *
IdemTombFilterDbEntry(Oid parent)
{
	TombFilterKey key;

	IdemTombFilterKeyOf(&key, parent, InvalidOid);
	return hash_search(tf_hash, &key, HASH_FIND, NULL);
}

/*
 * A tombstone of the database db (whose entry exists) was written into a
 * partition that found no entry, under the exclusive lock: from now on the
 * database's partitions without an entry are probed, until learning has
 * read them again (IdemTombFilterLearn).
 */
void
IdemTombFilterMissed(TombFilterEntry *db)
{
	IdemTombFilterLayoutChanges();
	db->misses++;
	if (!tf_shared->entries_logged)
	{
		tf_shared->entries_logged = true;
		ereport(LOG,
				(errmsg("idempotency: the table of tombstone filters is full: tombstone partitions without a filter will be probed by every claim"),
				 errdetail("It has %d entries, one per database and one per tombstone partition holding tombstones, for the whole server.",
						   idem_tombstone_filter_entries),
				 errhint("Raise idempotency.tombstone_filter_entries (a restart is needed); maintenance learns the partitions again once there is room.")));
	}
}

void
IdemTombFilterForget(Oid parent, List *partoids)
{
	TombFilterEntry *db;
	HASH_SEQ_STATUS status;
	TombFilterEntry *e;

	if (tf_hash == NULL || IdemTombFilterArea() == NULL)
		return;
	LWLockAcquire(tf_shared->lock, LW_EXCLUSIVE);
	db = IdemTombFilterDbEntry(parent);
	/* without its entry the database is unknown, and learning reads it all */
	if (db != NULL)
	{
		IdemTombFilterLayoutChanges();
		db->forgets++;
		/* partitions without an entry: "maybe" until learning read them */
		db->misses++;
		/* those with one: "maybe" until learning read them again */
		hash_seq_init(&status, tf_hash);
		while ((e = hash_seq_search(&status)) != NULL)
		{
			if (e->key.dbid == MyDatabaseId && e->key.parent == parent &&
				OidIsValid(e->key.partoid) &&
				(partoids == NIL || list_member_oid(partoids, e->key.partoid)))
				e->complete = false;
		}
	}
	LWLockRelease(tf_shared->lock);
}

/*
 * A new entry of partition partoid, under the exclusive lock, with a first
 * generation for about hint hashes (unfiltered when the area has no room);
 * NULL when the table is full.  complete says whether it may answer "no"
 * as it is: whether every tombstone written into the partition before
 * passed through a filter of the database.
 */
TombFilterEntry *
IdemTombFilterNewEntry(Oid parent, Oid partoid, int64 hint, bool complete)
{
	TombFilterKey key;
	TombFilterEntry *e;
	bool		found;

	IdemTombFilterKeyOf(&key, parent, partoid);
	e = hash_search(tf_hash, &key, HASH_ENTER_NULL, &found);
	if (e == NULL)
		return NULL;
	if (!found)
	{
		IdemTombFilterLayoutChanges();
		e->known = false;
		e->misses = 0;
		e->forgets = 0;
		e->complete = false;
		e->unfiltered = false;
		e->ngens = 0;
		if (IdemTombFilterGrow(e, hint))
			e->complete = complete;
	}
	return e;
}

static void
IdemTombFilterAddLocked(Oid parent, Oid partoid, const uint8 *hash)
{
	TombFilterKey key;
	TombFilterEntry *e;
	TombFilterGen *gen;

	IdemTombFilterKeyOf(&key, parent, partoid);
	e = hash_search(tf_hash, &key, HASH_FIND, NULL);
	if (e == NULL)
	{
		TombFilterEntry *db = IdemTombFilterDbEntry(parent);

		/*
		 * Without the database's entry its filters are unknown: learning
		 * reads every row.  Once a tombstone of the database went
		 * unrecorded, a partition without an entry gets one only from
		 * learning, which reads its rows: an entry made now would hold
		 * the new hash alone.
		 */
		if (db == NULL)
			return;
		if (db->misses == 0)
			e = IdemTombFilterNewEntry(parent, partoid, 0, db->known);
		if (e == NULL)
		{
			IdemTombFilterMissed(db);
			return;
		}
	}
	if (e->unfiltered)
		return;
	gen = e->ngens > 0 ? dsa_get_address(tf_area, e->gens[e->ngens - 1]) : NULL;
	if (gen == NULL || gen->count >= gen->capacity)
	{
		if (!IdemTombFilterGrow(e, 0))
			return;
		gen = dsa_get_address(tf_area, e->gens[e->ngens - 1]);
	}
	IdemTombFilterGenSet(gen, hash);
}

void
IdemTombFilterAdd(Oid parent, Oid partoid, const uint8 *hash)
{
	if (tf_hash == NULL || IdemTombFilterArea() == NULL)
		return;
	LWLockAcquire(tf_shared->lock, LW_EXCLUSIVE);
	IdemTombFilterAddLocked(parent, partoid, hash);
	LWLockRelease(tf_shared->lock);
}

/* The database's entry when its filters are known, under the lock. */
TombFilterEntry *
IdemTombFilterKnownLocked(Oid parent)
{
	TombFilterEntry *db = IdemTombFilterDbEntry(parent);

	return db != NULL && db->known ? db : NULL;
}

/* Room in the local copy for nparts partitions and ngens generations. */
static void
IdemTombFilterLocalReserve(int nparts, int ngens)
{
	if (nparts > tf_local.cap_parts)
	{
		int			cap = Max(nparts, 2 * tf_local.cap_parts);

		if (tf_local.partoids == NULL)
		{
			tf_local.partoids = MemoryContextAlloc(TopMemoryContext, sizeof(Oid) * cap);
			tf_local.parts = MemoryContextAlloc(TopMemoryContext,
												sizeof(TombFilterLocalPart) * cap);
			tf_local.no = MemoryContextAlloc(TopMemoryContext, sizeof(bool) * cap);
		}
		else
		{
			tf_local.partoids = repalloc(tf_local.partoids, sizeof(Oid) * cap);
			tf_local.parts = repalloc(tf_local.parts, sizeof(TombFilterLocalPart) * cap);
			tf_local.no = repalloc(tf_local.no, sizeof(bool) * cap);
		}
		tf_local.cap_parts = cap;
	}
	if (ngens > tf_local.cap_gens)
	{
		int			cap = Max(ngens, 2 * tf_local.cap_gens);

		if (tf_local.gens == NULL)
			tf_local.gens = MemoryContextAlloc(TopMemoryContext,
											   sizeof(TombFilterLocalGen) * cap);
		else
			tf_local.gens = repalloc(tf_local.gens, sizeof(TombFilterLocalGen) * cap);
		tf_local.cap_gens = cap;
	}
}

/*
 * Copy the layout of the filters of the n partitions partoids of parent,
 * under the lock (in either mode: the layout changes only under the
 * exclusive lock, so the counter read here is the copy's).
 */
static void
IdemTombFilterLocalLoad(Oid parent, const Oid *partoids, int n)
{
	TombFilterEntry *db;

	/* invalid until complete: an allocation may fail on the way */
	tf_local.valid = false;
	IdemTombFilterLocalReserve(n, 0);
	tf_local.layout = pg_atomic_read_u64(&tf_shared->layout);
	tf_local.parent = parent;
	tf_local.nparts = n;
	tf_local.ngens = 0;
	memcpy(tf_local.partoids, partoids, sizeof(Oid) * n);
	db = IdemTombFilterKnownLocked(parent);
	tf_local.known = db != NULL;
	for (int i = 0; db != NULL && i < n; i++)
	{
		TombFilterLocalPart *lp = &tf_local.parts[i];
		TombFilterKey key;
		TombFilterEntry *e;

		IdemTombFilterKeyOf(&key, parent, partoids[i]);
		e = hash_search(tf_hash, &key, HASH_FIND, NULL);
		if (e == NULL)
			lp->kind = db->misses > 0 ? TF_MAYBE : TF_NO;
		else if (!e->complete || e->unfiltered || e->ngens == 0)
			lp->kind = TF_MAYBE;
		else
		{
			lp->kind = TF_BITS;
			IdemTombFilterLocalReserve(0, tf_local.ngens + e->ngens);
			for (int g = 0; g < e->ngens; g++)
			{
				TombFilterGen *gen = dsa_get_address(tf_area, e->gens[g]);
				TombFilterLocalGen *lg = &tf_local.gens[tf_local.ngens++];

				lg->words = IdemTombFilterWords(gen);
				lg->mask = gen->nblocks - 1;
				lg->part = i;
			}
		}
	}
	tf_local.valid = true;
}

/* The block of the probe's hash in a generation of the local copy. */
static inline const uint64 *
IdemTombFilterLocalBlock(const TombFilterLocalGen *lg, const TombFilterProbe *probe)
{
	return IdemTombFilterBlockAt(lg->words, lg->mask, probe);
}

/*
 * The answers of the local copy: no[i] for each partition not yet skipped
 * that holds no tombstone of the probe's hash.  One pass over the
 * generations of every partition (tf_local.gens, in the order of the
 * partitions): the cache lines of every block to be read are asked for
 * first, so that their loads overlap, then each block is tested.  Returns
 * whether any partition was answered "no".
 */
static bool
IdemTombFilterLocalAnswer(const TombFilterProbe *probe, const bool *skip)
{
	bool		any = false;

	/*
	 * "no" for a partition not skipped that has no bits and holds nothing
	 * (TF_NO), or has bits (TF_BITS) until a generation of its has the
	 * probe's; "maybe" for the others (already skipped: nothing to answer).
	 */
	for (int i = 0; i < tf_local.nparts; i++)
		tf_local.no[i] = !skip[i] && tf_local.parts[i].kind != TF_MAYBE;
	for (int g = 0; g < tf_local.ngens; g++)
	{
		const TombFilterLocalGen *lg = &tf_local.gens[g];

		if (tf_local.no[lg->part])
			IDEM_PREFETCH(IdemTombFilterLocalBlock(lg, probe));
	}
	for (int g = 0; g < tf_local.ngens; g++)
	{
		const TombFilterLocalGen *lg = &tf_local.gens[g];

		if (tf_local.no[lg->part] &&
			IdemTombFilterBlockHas(IdemTombFilterLocalBlock(lg, probe), probe))
			tf_local.no[lg->part] = false;
	}
	for (int i = 0; i < tf_local.nparts; i++)
		any |= tf_local.no[i];
	return any;
}

void
IdemTombFilterSkip(Oid parent, const Oid *partoids, int n, const uint8 *hash,
				   bool *skip)
{
	TombFilterProbe probe;
	uint64		layout;
	bool		any;

	if (n <= 0 || !IdemTombFilterUsable())
		return;
	IdemTombFilterProbeOf(&probe, hash);

	/*
	 * Without the lock, while the local copy is the layout's: its arrays
	 * are those of live generations, and they only gain bits.  The read
	 * barriers keep the bits read between the two reads of the counter.
	 */
	layout = pg_atomic_read_u64(&tf_shared->layout);
	pg_read_barrier();
	if (tf_local.valid && tf_local.layout == layout &&
		tf_local.parent == parent && tf_local.nparts == n &&
		memcmp(tf_local.partoids, partoids, sizeof(Oid) * n) == 0)
	{
		if (!tf_local.known)
			return;
		any = IdemTombFilterLocalAnswer(&probe, skip);
		pg_read_barrier();

		/*
		 * A "no" stands only when no array can have been freed, and so
		 * reused, while it was read.
		 */
		if (!any || pg_atomic_read_u64(&tf_shared->layout) == layout)
		{
			for (int i = 0; any && i < n; i++)
				skip[i] |= tf_local.no[i];
			return;
		}
	}

	/* Under the lock: the copy is made again, and the bits read under it. */
	LWLockAcquire(tf_shared->lock, LW_SHARED);
	IdemTombFilterLocalLoad(parent, partoids, n);
	any = tf_local.known && IdemTombFilterLocalAnswer(&probe, skip);
	LWLockRelease(tf_shared->lock);
	for (int i = 0; any && i < n; i++)
		skip[i] |= tf_local.no[i];
}

/*
 * Every hash a row of tombstones stands for (one, or the entries of a run,
 * tombstone_row.h) into the filter of partoid, under one taking of the
 * lock (tombstone_filter.h).
 */
void
IdemTombFilterAddRowHashes(Oid parent, Oid partoid, bytea *scope_hash,
						   bytea *fingerprint)
{
	const uint8 *h;
	int			stride;
	int			n;

	StaticAssertStmt(IDEM_TOMBFILTER_HASH_LEN <= IDEM_TOMBSTONE_HASH_LEN,
					 "a filter reads more of a hash than a tombstone keeps");
	if (tf_hash == NULL || IdemTombFilterArea() == NULL)
		return;
	n = IdemTombRowHashes(scope_hash, fingerprint, &h, &stride);
	if (n == 0)
		return;
	LWLockAcquire(tf_shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < n; i++, h += stride)
		IdemTombFilterAddLocked(parent, partoid, h);
	LWLockRelease(tf_shared->lock);
}

static void
IdemTombFilterXactCallback(XactEvent event, void *arg)
{
	ListCell   *lc;

	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			/* a drop whose subtransaction rolled back left its partition */
			foreach(lc, tf_dropped)
			{
				TombFilterKey *key = lfirst(lc);

				if (SearchSysCacheExists1(RELOID, ObjectIdGetDatum(key->partoid)))
					key->partoid = InvalidOid;
			}
			break;
		case XACT_EVENT_COMMIT:
			if (tf_dropped != NIL && tf_hash != NULL && IdemTombFilterArea() != NULL)
			{
				LWLockAcquire(tf_shared->lock, LW_EXCLUSIVE);
				foreach(lc, tf_dropped)
				{
					TombFilterKey *key = lfirst(lc);
					TombFilterEntry *e;

					if (!OidIsValid(key->partoid))
						continue;
					e = hash_search(tf_hash, key, HASH_FIND, NULL);
					if (e != NULL)
					{
						IdemTombFilterLayoutChanges();
						IdemTombFilterFreeGens(e);
						(void) hash_search(tf_hash, key, HASH_REMOVE, NULL);
					}
				}
				LWLockRelease(tf_shared->lock);
			}
			list_free_deep(tf_dropped);
			tf_dropped = NIL;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
			/* a prepared drop leaves its filters: stale bits, never missing ones */
			list_free_deep(tf_dropped);
			tf_dropped = NIL;
			break;
		default:
			break;
	}
}

void
IdemTombFilterDropped(Oid parent, Oid partoid)
{
	TombFilterKey *key;
	MemoryContext old;

	/* attached now, not while committing */
	if (tf_hash == NULL || IdemTombFilterArea() == NULL)
		return;
	if (!tf_callback_registered)
	{
		RegisterXactCallback(IdemTombFilterXactCallback, NULL);
		tf_callback_registered = true;
	}
	/* the list outlives the statement, up to the end of the transaction */
	old = MemoryContextSwitchTo(TopMemoryContext);
	key = palloc(sizeof(TombFilterKey));
	IdemTombFilterKeyOf(key, parent, partoid);
	tf_dropped = lappend(tf_dropped, key);
	MemoryContextSwitchTo(old);
}

PG_FUNCTION_INFO_V1(idem_tombstones_filter_trigger);


/*
 * idem_tombstones_filter_trigger() RETURNS trigger: BEFORE INSERT OR UPDATE
 * FOR EACH ROW of idempotency.tombstones (the trigger tombstones_filter,
 * cloned onto each partition): adds the new row's scope_hash to the filter
 * of the partition it is written into.
 */
Datum
idem_tombstones_filter_trigger(PG_FUNCTION_ARGS)
{
	Relation	rel;
	HeapTuple	tuple = IdemBeforeRowTriggerTuple(fcinfo, "idem_tombstones_filter_trigger",
												  "tombstones", &rel);
	int			a_hash;
	int			a_fp;
	bool		isnull;
	bool		fp_isnull = true;
	Datum		d;
	Datum		fp = (Datum) 0;

	if (tf_hash == NULL || !rel->rd_rel->relispartition)
		return PointerGetDatum(tuple);
	a_hash = IdemTriggerColumn(rel, "scope_hash", BYTEAOID, false,
							   "idem_tombstones_filter_trigger");
	a_fp = IdemTriggerColumn(rel, "fingerprint", BYTEAOID, false,
							 "idem_tombstones_filter_trigger");
	if (a_hash > 0)
	{
		d = heap_getattr(tuple, a_hash, RelationGetDescr(rel), &isnull);
		if (a_fp > 0)
			fp = heap_getattr(tuple, a_fp, RelationGetDescr(rel), &fp_isnull);
		if (!isnull)
			IdemTombFilterAddRowHashes(IdemPartitionRoot(rel),
									   RelationGetRelid(rel), DatumGetByteaPP(d),
									   fp_isnull ? NULL : DatumGetByteaPP(fp));
	}
	return PointerGetDatum(tuple);
}
