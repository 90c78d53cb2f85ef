/*-------------------------------------------------------------------------
 *
 * tombfilter.c
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
 *	  the size of the one before, so that it needs no count in advance; a
 *	  partition whose filter cannot grow (the area is full) is marked
 *	  unfiltered and always probed.
 *
 *	  Filters only gain bits, and what is written into a partition is added
 *	  first:
 *	  - every row written into the tombstones table, by maintenance (an
 *	    INSERT ... SELECT), a restore or a logical replication apply, passes
 *	    the trigger tombstones_filter (enabled ALWAYS), which adds its hash
 *	    before the row is written;
 *	  - rows older than the server are learned by maintenance
 *	    (IdemTombFilterLearn), which reads every row version once per server
 *	    start; until then a database's filters are unknown and every
 *	    partition is probed, as without filters.
 *	  A claim takes its snapshot before it reads the filters, so a
 *	  tombstone committed before the snapshot had its bits set before.  The
 *	  filter of a partition that maintenance drops is freed when the drop
 *	  commits.  A row written and rolled back leaves its bits: a false
 *	  "maybe", never a false "no".
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
#include "commands/trigger.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/ipc.h"
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
#include "idempotency.h"
#include "schema.h"
#include "tombfilter.h"
#include "tombstone.h"

#define IDEM_TOMBFILTER_TRANCHE		"idempotency tombstone filters"
/* headers of the shared table: databases and their tombstone partitions */
#define IDEM_TOMBFILTER_ENTRIES		8192
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
	bool		overflow;		/* a partition found no header: those
								 * without one are probed */
	/* a partition's entry: */
	bool		unfiltered;		/* no room to grow: always probed */
	int			ngens;
	dsa_pointer gens[IDEM_TOMBFILTER_MAX_GENS];
} TombFilterEntry;

typedef struct TombFilterGen
{
	uint32		nblocks;		/* a power of two */
	uint32		count;
	uint32		capacity;
	uint32		pad;
	uint64		words[FLEXIBLE_ARRAY_MEMBER];
} TombFilterGen;

typedef struct TombFilterShared
{
	LWLock	   *lock;
	int			dsa_tranche;
	Size		area_size;
	bool		full_logged;
} TombFilterShared;

static TombFilterShared *tf_shared = NULL;
static HTAB *tf_hash = NULL;
static dsa_area *tf_area = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* filters to free when the transaction that dropped their partition commits */
static List *tf_dropped = NIL;
static bool tf_callback_registered = false;

static Size
IdemTombFilterAreaSize(void)
{
	Size		size = (Size) idem_tombstone_filter_memory * 1024;

	return size < dsa_minimum_size() ? 0 : size;
}

static void
IdemTombFilterShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(add_size(add_size(MAXALIGN(sizeof(TombFilterShared)),
											 IdemTombFilterAreaSize()),
									hash_estimate_size(IDEM_TOMBFILTER_ENTRIES,
													   sizeof(TombFilterEntry))));
	RequestNamedLWLockTranche(IDEM_TOMBFILTER_TRANCHE, 1);
}

static void
IdemTombFilterShmemStartup(void)
{
	bool		found;
	HASHCTL		info;
	Size		area_size = IdemTombFilterAreaSize();

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	tf_shared = ShmemInitStruct("idempotency tombstone filters",
								add_size(MAXALIGN(sizeof(TombFilterShared)), area_size),
								&found);
	if (!found)
	{
		tf_shared->lock = &(GetNamedLWLockTranche(IDEM_TOMBFILTER_TRANCHE))->lock;
		tf_shared->area_size = area_size;
		tf_shared->full_logged = false;
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
							IDEM_TOMBFILTER_ENTRIES, IDEM_TOMBFILTER_ENTRIES,
							&info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

void
IdemTombFilterInit(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = IdemTombFilterShmemRequest;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = IdemTombFilterShmemStartup;
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

static bool
IdemTombFilterUsable(void)
{
	return tf_hash != NULL && IdemTombFilterArea() != NULL &&
		!RecoveryInProgress() && IdemSchemaHas(IDEM_SCHEMA_HORIZONS);
}

static void
IdemTombFilterKeyOf(TombFilterKey *key, Oid parent, Oid partoid)
{
	memset(key, 0, sizeof(*key));
	key->dbid = MyDatabaseId;
	key->parent = parent;
	key->partoid = partoid;
}

/*
 * The block of a hash in a generation (from its first 8 bytes' low bits),
 * and the 10 bits it sets there, 9 bits each: 7 from its next 8 bytes, 3
 * from the high bits of the first 8 (above any block number's).
 */
static inline uint64 *
IdemTombFilterBlock(TombFilterGen *gen, const uint8 *hash, int *pos)
{
	uint64		a;
	uint64		b;

	memcpy(&a, hash, sizeof(a));
	memcpy(&b, hash + 8, sizeof(b));
	for (int i = 0; i < 7; i++)
		pos[i] = (b >> (9 * i)) & 511;
	for (int i = 0; i < IDEM_TOMBFILTER_K - 7; i++)
		pos[7 + i] = (a >> (32 + 9 * i)) & 511;
	return gen->words + (a & (gen->nblocks - 1)) * IDEM_TOMBFILTER_BLOCK_WORDS;
}

static bool
IdemTombFilterGenHas(TombFilterGen *gen, const uint8 *hash)
{
	int			pos[IDEM_TOMBFILTER_K];
	uint64	   *block = IdemTombFilterBlock(gen, hash, pos);

	for (int i = 0; i < IDEM_TOMBFILTER_K; i++)
	{
		if ((block[pos[i] >> 6] & (UINT64CONST(1) << (pos[i] & 63))) == 0)
			return false;
	}
	return true;
}

static void
IdemTombFilterGenSet(TombFilterGen *gen, const uint8 *hash)
{
	int			pos[IDEM_TOMBFILTER_K];
	uint64	   *block = IdemTombFilterBlock(gen, hash, pos);

	for (int i = 0; i < IDEM_TOMBFILTER_K; i++)
		block[pos[i] >> 6] |= UINT64CONST(1) << (pos[i] & 63);
	gen->count++;
}

static void
IdemTombFilterFreeGens(TombFilterEntry *e)
{
	for (int i = 0; i < e->ngens; i++)
		dsa_free(tf_area, e->gens[i]);
	e->ngens = 0;
}

/*
 * A new generation of e's filter, for about hint hashes (0: twice the last
 * one); false, the partition unfiltered, when there is no room.
 */
static bool
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
	while (hint > 0 && (int64) nblocks * IDEM_TOMBFILTER_PER_BLOCK < hint &&
		   nblocks < (UINT32_MAX / 2 / IDEM_TOMBFILTER_BLOCK_WORDS / 8))
		nblocks *= 2;
	if (e->ngens < IDEM_TOMBFILTER_MAX_GENS)
		dp = dsa_allocate_extended(tf_area,
								   offsetof(TombFilterGen, words) +
								   (Size) nblocks * IDEM_TOMBFILTER_BLOCK_WORDS * sizeof(uint64),
								   DSA_ALLOC_NO_OOM | DSA_ALLOC_ZERO | DSA_ALLOC_HUGE);
	if (!DsaPointerIsValid(dp))
	{
		IdemTombFilterFreeGens(e);
		e->unfiltered = true;
		if (!tf_shared->full_logged)
		{
			tf_shared->full_logged = true;
			ereport(LOG,
					(errmsg("idempotency: the tombstone filters are full: a tombstone partition will be probed by every claim"),
					 errhint("Raise idempotency.tombstone_filter_memory (a restart is needed).")));
		}
		return false;
	}
	gen = dsa_get_address(tf_area, dp);
	gen->nblocks = nblocks;
	gen->count = 0;
	gen->capacity = nblocks * IDEM_TOMBFILTER_PER_BLOCK;
	e->gens[e->ngens++] = dp;
	return true;
}

/*
 * The entry of a partition, made when missing, under the exclusive lock;
 * NULL (and the database's entry marked) when the table is full.
 */
static TombFilterEntry *
IdemTombFilterEntryOf(Oid parent, Oid partoid, int64 hint)
{
	TombFilterKey key;
	TombFilterEntry *e;
	bool		found;

	IdemTombFilterKeyOf(&key, parent, partoid);
	e = hash_search(tf_hash, &key, HASH_ENTER_NULL, &found);
	if (e == NULL)
	{
		IdemTombFilterKeyOf(&key, parent, InvalidOid);
		e = hash_search(tf_hash, &key, HASH_FIND, NULL);
		if (e != NULL)
			e->overflow = true;
		return NULL;
	}
	if (!found)
	{
		e->known = false;
		e->overflow = false;
		e->unfiltered = false;
		e->ngens = 0;
		if (OidIsValid(partoid))
			(void) IdemTombFilterGrow(e, hint);
	}
	return e;
}

static void
IdemTombFilterAddLocked(Oid parent, Oid partoid, const uint8 *hash)
{
	TombFilterEntry *e = IdemTombFilterEntryOf(parent, partoid, 0);
	TombFilterGen *gen;

	if (e == NULL || e->unfiltered)
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

/* Whether partoid may hold hash, under the shared lock; db is known. */
static bool
IdemTombFilterMaybeLocked(TombFilterEntry *db, Oid parent, Oid partoid,
						  const uint8 *hash)
{
	TombFilterKey key;
	TombFilterEntry *e;
	bool		maybe;

	IdemTombFilterKeyOf(&key, parent, partoid);
	e = hash_search(tf_hash, &key, HASH_FIND, NULL);
	if (e == NULL)
		return db->overflow;	/* else nothing was ever written there */
	if (e->unfiltered)
		return true;
	maybe = false;
	for (int i = 0; i < e->ngens && !maybe; i++)
		maybe = IdemTombFilterGenHas(dsa_get_address(tf_area, e->gens[i]), hash);
	return maybe;
}

/* The database's entry when its filters are known, under the lock. */
static TombFilterEntry *
IdemTombFilterKnownLocked(Oid parent)
{
	TombFilterKey key;
	TombFilterEntry *db;

	IdemTombFilterKeyOf(&key, parent, InvalidOid);
	db = hash_search(tf_hash, &key, HASH_FIND, NULL);
	return db != NULL && db->known ? db : NULL;
}

void
IdemTombFilterSkip(Oid parent, const Oid *partoids, int n, const uint8 *hash,
				   bool *skip)
{
	TombFilterEntry *db;

	if (!IdemTombFilterUsable())
		return;
	LWLockAcquire(tf_shared->lock, LW_SHARED);
	db = IdemTombFilterKnownLocked(parent);
	for (int i = 0; db != NULL && i < n; i++)
	{
		if (!skip[i] && !IdemTombFilterMaybeLocked(db, parent, partoids[i], hash))
			skip[i] = true;
	}
	LWLockRelease(tf_shared->lock);
}

/* Forget the entries of an earlier tombstones table of this database. */
static void
IdemTombFilterForgetOthers(Oid parent)
{
	HASH_SEQ_STATUS status;
	TombFilterEntry *e;

	hash_seq_init(&status, tf_hash);
	while ((e = hash_seq_search(&status)) != NULL)
	{
		if (e->key.dbid == MyDatabaseId && e->key.parent != parent)
		{
			IdemTombFilterFreeGens(e);
			(void) hash_search(tf_hash, &e->key, HASH_REMOVE, NULL);
		}
	}
}

typedef struct AddAllState
{
	Oid			parent;
	Oid			partoid;
	AttrNumber	a_hash;
	AttrNumber	a_fp;
} AddAllState;

/*
 * Every hash a row of tombstones stands for (one, or the entries of a run,
 * tombstone.h) into the filter of partoid.
 */
static void
IdemTombFilterAddHashes(Oid parent, Oid partoid, bytea *scope_hash, bytea *fingerprint)
{
	const uint8 *h;
	int			stride;
	int			n = IdemTombstoneRowHashes(scope_hash, fingerprint, &h, &stride);

	StaticAssertStmt(IDEM_TOMBFILTER_HASH_LEN <= IDEM_TOMBSTONE_HASH_LEN,
					 "a filter reads more of a hash than a tombstone keeps");
	for (int i = 0; i < n; i++, h += stride)
		IdemTombFilterAdd(parent, partoid, h);
}

static void
IdemTombFilterAddRow(TupleTableSlot *slot, void *arg)
{
	AddAllState *st = arg;
	bool		isnull;
	bool		fp_isnull;
	Datum		h = slot_getattr(slot, st->a_hash, &isnull);
	Datum		fp = st->a_fp > 0 ? slot_getattr(slot, st->a_fp, &fp_isnull) : (Datum) 0;

	if (st->a_fp <= 0)
		fp_isnull = true;
	if (!isnull)
		IdemTombFilterAddHashes(st->parent, st->partoid, DatumGetByteaPP(h),
								fp_isnull ? NULL : DatumGetByteaPP(fp));
}

/* Every row version of one partition, into its filter. */
static int64
IdemTombFilterAddAll(Oid parent, Oid partoid)
{
	AddAllState st;

	st.parent = parent;
	st.partoid = partoid;
	st.a_hash = get_attnum(partoid, "scope_hash");
	st.a_fp = get_attnum(partoid, "fingerprint");
	if (st.a_hash == InvalidAttrNumber)
		elog(ERROR, "partition %u of idempotency.tombstones lacks scope_hash", partoid);
	if (tf_hash == NULL || IdemTombFilterArea() == NULL)
		return 0;
	/* sized for what the file holds (about 70 tombstones a page) */
	{
		Relation	part = table_open(partoid, AccessShareLock);
		int64		hint = (int64) RelationGetNumberOfBlocks(part) * 70;

		table_close(part, NoLock);
		LWLockAcquire(tf_shared->lock, LW_EXCLUSIVE);
		(void) IdemTombFilterEntryOf(parent, partoid, hint);
		LWLockRelease(tf_shared->lock);
	}
	return IdemScanRowVersions(partoid, IdemTombFilterAddRow, &st);
}

int64
IdemTombFilterLearn(Oid parent)
{
	TombFilterEntry *db;
	List	   *parts;
	ListCell   *lc;
	int64		n = 0;

	if (!IdemTombFilterUsable())
		return -1;

	/* the database's entry, made now: its partitions' entries follow it */
	LWLockAcquire(tf_shared->lock, LW_EXCLUSIVE);
	IdemTombFilterForgetOthers(parent);
	db = IdemTombFilterEntryOf(parent, InvalidOid, 0);
	if (db == NULL || db->known)
	{
		LWLockRelease(tf_shared->lock);
		return -1;
	}
	LWLockRelease(tf_shared->lock);

	parts = find_all_inheritors(parent, AccessShareLock, NULL);
	foreach(lc, parts)
	{
		Oid			partoid = lfirst_oid(lc);

		if (get_rel_relkind(partoid) == RELKIND_RELATION)
			n += IdemTombFilterAddAll(parent, partoid);
	}
	list_free(parts);

	LWLockAcquire(tf_shared->lock, LW_EXCLUSIVE);
	db = IdemTombFilterEntryOf(parent, InvalidOid, 0);
	if (db != NULL)
		db->known = true;
	LWLockRelease(tf_shared->lock);
	return n;
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
												  &rel);
	int			a_hash;
	int			a_fp;
	bool		isnull;
	bool		fp_isnull = true;
	Datum		d;
	Datum		fp = (Datum) 0;

	if (tf_hash == NULL || !rel->rd_rel->relispartition)
		return PointerGetDatum(tuple);
	a_hash = get_attnum(RelationGetRelid(rel), "scope_hash");
	a_fp = get_attnum(RelationGetRelid(rel), "fingerprint");
	if (a_hash > 0)
	{
		d = heap_getattr(tuple, a_hash, RelationGetDescr(rel), &isnull);
		if (a_fp > 0)
			fp = heap_getattr(tuple, a_fp, RelationGetDescr(rel), &fp_isnull);
		if (!isnull)
			IdemTombFilterAddHashes(IdemPartitionRoot(rel), RelationGetRelid(rel),
									DatumGetByteaPP(d),
									fp_isnull ? NULL : DatumGetByteaPP(fp));
	}
	return PointerGetDatum(tuple);
}
