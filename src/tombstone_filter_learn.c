/*-------------------------------------------------------------------------
 *
 * tombstone_filter_learn.c
 *	  Maintenance's side of the membership filters of tombstone partitions
 *	  (tombstone_filter.c): learning a database's filters from the row
 *	  versions of its partitions after a server start, or again for those
 *	  that missed a tombstone (IdemTombFilterLearn), forgetting the filters
 *	  of dropped databases and of earlier tombstones tables, and
 *	  compacting a filter of many generations into one
 *	  (IdemTombFilterCompact).  The rules they follow (what fails closed,
 *	  and when a filter may answer "no") are in tombstone_filter.c's
 *	  banner.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_inherits.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
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
#include "tombstone_filter_learn.h"
#include "tombstone_row.h"
#include "util.h"

/*
 * Forget the entries of an earlier tombstones table of this database and
 * of databases that were dropped, their bit arrays with them.  The
 * databases are looked up without the lock; a database's own entry goes
 * with its partitions' (its filters become unknown, never wrong).
 */
static void
IdemTombFilterForgetStale(Oid parent)
{
	HASH_SEQ_STATUS status;
	TombFilterEntry *e;
	Oid		   *dbids;
	bool	   *gone;
	int			ndb = 0;
	int			cap = 16;

	dbids = palloc(sizeof(Oid) * cap);
	LWLockAcquire(tf_shared->lock, LW_SHARED);
	hash_seq_init(&status, tf_hash);
	while ((e = hash_seq_search(&status)) != NULL)
	{
		int			i;

		if (e->key.dbid == MyDatabaseId)
			continue;
		for (i = 0; i < ndb && dbids[i] != e->key.dbid; i++)
			;
		if (i < ndb)
			continue;
		if (ndb == cap)
		{
			cap *= 2;
			dbids = repalloc(dbids, sizeof(Oid) * cap);
		}
		dbids[ndb++] = e->key.dbid;
	}
	LWLockRelease(tf_shared->lock);

	gone = palloc0(sizeof(bool) * Max(ndb, 1));
	for (int i = 0; i < ndb; i++)
		gone[i] = !SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dbids[i]));

	LWLockAcquire(tf_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&status, tf_hash);
	while ((e = hash_seq_search(&status)) != NULL)
	{
		bool		forget = false;

		if (e->key.dbid == MyDatabaseId)
			forget = e->key.parent != parent;
		else
		{
			for (int i = 0; i < ndb; i++)
				if (dbids[i] == e->key.dbid)
					forget = gone[i];
		}
		if (forget)
		{
			IdemTombFilterLayoutChanges();
			IdemTombFilterFreeGens(e);
			(void) hash_search(tf_hash, &e->key, HASH_REMOVE, NULL);
		}
	}
	LWLockRelease(tf_shared->lock);
	pfree(dbids);
	pfree(gone);
}

typedef struct AddAllState
{
	Oid			parent;
	Oid			partoid;
	AttrNumber	a_hash;
	AttrNumber	a_fp;
} AddAllState;

/*
 * The hashes a row version of a tombstone partition stands for
 * (tombstone_row.h), read from slot by the attribute numbers of scope_hash
 * and fingerprint.
 */
static int
IdemTombFilterSlotHashes(TupleTableSlot *slot, AttrNumber a_hash, AttrNumber a_fp,
						 const uint8 **first, int *stride)
{
	bool		isnull;
	bool		fp_isnull = true;
	Datum		h = slot_getattr(slot, a_hash, &isnull);
	Datum		fp = (Datum) 0;

	if (isnull)
		return 0;
	if (a_fp > 0)
		fp = slot_getattr(slot, a_fp, &fp_isnull);
	return IdemTombRowHashes(DatumGetByteaPP(h),
							 fp_isnull ? NULL : DatumGetByteaPP(fp),
							 first, stride);
}

static void
IdemTombFilterAddRow(TupleTableSlot *slot, void *arg)
{
	AddAllState *st = arg;
	const uint8 *first;
	int			stride;
	int			n = IdemTombFilterSlotHashes(slot, st->a_hash, st->a_fp, &first, &stride);

	for (int i = 0; i < n; i++)
		IdemTombFilterAdd(st->parent, st->partoid, first + (Size) i * stride);
}

/*
 * Learn the filter of one partition from its rows, unless its entry is
 * complete already: its entry is made first (or given bits again, when it
 * was unfiltered), so that every tombstone written from then on passes
 * through it; then, once no transaction that may have written the
 * partition before is left, every row version is read into it, and it is
 * complete.  A partition that holds nothing gets no entry.  Adds the rows
 * read to *n.  Returns false when the partition is left to a later pass:
 * no room for its entry (the database's misses counted) or its bits, or a
 * writer still running, or DDL made the database's filters incomplete since
 * the learning began (its count of forgets no longer forgets).
 */
static bool
IdemTombFilterLearnPartition(Oid parent, Oid partoid, uint64 forgets, int64 *n)
{
	TombFilterEntry *db;
	AddAllState st;
	TombFilterKey key;
	TombFilterEntry *e;
	BlockNumber nblocks;
	bool		done = false;
	Relation	part;

	st.parent = parent;
	st.partoid = partoid;
	st.a_hash = get_attnum(partoid, "scope_hash");
	st.a_fp = get_attnum(partoid, "fingerprint");
	if (st.a_hash == InvalidAttrNumber)
		elog(ERROR, "partition %u of idempotency.tombstones lacks scope_hash", partoid);
	IdemTombFilterKeyOf(&key, parent, partoid);

	LWLockAcquire(tf_shared->lock, LW_SHARED);
	e = hash_search(tf_hash, &key, HASH_FIND, NULL);
	done = e != NULL && e->complete && !e->unfiltered;
	LWLockRelease(tf_shared->lock);
	if (done)
		return true;

	part = table_open(partoid, AccessShareLock);
	nblocks = RelationGetNumberOfBlocks(part);
	table_close(part, NoLock);

	/*
	 * Nothing in the file and nobody writing: nothing to learn.  A writer
	 * that comes later makes the entry, or counts a miss.
	 */
	if (e == NULL && nblocks == 0 && !IdemLockConflicts(partoid, ShareLock))
		return true;

	LWLockAcquire(tf_shared->lock, LW_EXCLUSIVE);
	e = hash_search(tf_hash, &key, HASH_FIND, NULL);
	if (e == NULL)
	{
		/* sized for what the file holds (about 70 tombstones a page) */
		e = IdemTombFilterNewEntry(parent, partoid, (int64) nblocks * 70, false);
		if (e == NULL)
		{
			db = IdemTombFilterDbEntry(parent);
			if (db != NULL)
				IdemTombFilterMissed(db);
			LWLockRelease(tf_shared->lock);
			return false;
		}
	}
	else if (e->unfiltered && IdemTombFilterGrow(e, (int64) nblocks * 70))
	{
		/* bits again: from now on every hash written is added */
		e->unfiltered = false;
	}
	done = !e->unfiltered;
	LWLockRelease(tf_shared->lock);
	if (!done || IdemLockConflicts(partoid, ShareLock))
		return false;

	*n += IdemScanRowVersions(partoid, IdemTombFilterAddRow, &st);

	LWLockAcquire(tf_shared->lock, LW_EXCLUSIVE);
	e = hash_search(tf_hash, &key, HASH_FIND, NULL);
	db = IdemTombFilterDbEntry(parent);
	done = e != NULL && !e->unfiltered && e->ngens > 0 &&
		db != NULL && db->forgets == forgets;
	if (done)
	{
		int64		count = 0;

		for (int g = 0; g < e->ngens; g++)
			count += ((TombFilterGen *) dsa_get_address(tf_area, e->gens[g]))->count;
		IdemTombFilterLayoutChanges();
		if (count == 0)
		{
			/* no tombstone: no entry spent on it */
			IdemTombFilterFreeGens(e);
			(void) hash_search(tf_hash, &key, HASH_REMOVE, NULL);
		}
		else
			e->complete = true;
	}
	LWLockRelease(tf_shared->lock);
	return done;
}

int64
IdemTombFilterLearn(Oid parent)
{
	TombFilterKey key;
	TombFilterEntry *db;
	HASH_SEQ_STATUS status;
	TombFilterEntry *e;
	bool		found;
	bool		needed;
	bool		listed;
	bool		all;
	bool		complete;
	uint64		misses;
	uint64		forgets;
	List	   *parts;
	ListCell   *lc;
	int64		n = 0;

	if (!IdemTombFilterUsable())
		return -1;
	IdemTombFilterForgetStale(parent);

	/*
	 * The database's entry, made now: from then on a tombstone written into
	 * a partition goes into its entry or counts as a miss.  Learning is
	 * needed when the database is not known yet, when a tombstone was
	 * missed, or when a partition's entry is not complete.
	 */
	LWLockAcquire(tf_shared->lock, LW_EXCLUSIVE);
	IdemTombFilterKeyOf(&key, parent, InvalidOid);
	db = hash_search(tf_hash, &key, HASH_ENTER_NULL, &found);
	if (db == NULL)
	{
		LWLockRelease(tf_shared->lock);
		return -1;
	}
	if (!found)
	{
		IdemTombFilterLayoutChanges();
		db->known = false;
		db->misses = 0;
		db->forgets = 0;
		db->complete = false;
		db->unfiltered = false;
		db->ngens = 0;
	}
	needed = !db->known || db->misses > 0;
	misses = db->misses;
	forgets = db->forgets;
	hash_seq_init(&status, tf_hash);
	while ((e = hash_seq_search(&status)) != NULL)
	{
		if (!needed && e->key.dbid == MyDatabaseId && e->key.parent == parent &&
			OidIsValid(e->key.partoid) && !e->complete)
			needed = true;
	}
	LWLockRelease(tf_shared->lock);
	if (!needed)
		return -1;

	/*
	 * A partition made or attached by a transaction still running is not in
	 * the list below, and may hold tombstones written before the database's
	 * entry was made: the database is not learned while one may be.
	 */
	listed = !IdemLockConflicts(parent, ShareUpdateExclusiveLock);
	parts = find_all_inheritors(parent, AccessShareLock, NULL);

	/*
	 * Nor while a trigger of the tree may be disabled, or is: tombstones
	 * written meanwhile pass no filter.  Claims go on answering "maybe".
	 */
	if (!IdemLearnedTreeComplete(parts, "tombstones_filter"))
	{
		list_free(parts);
		return -1;
	}
	all = true;
	foreach(lc, parts)
	{
		Oid			partoid = lfirst_oid(lc);

		if (get_rel_relkind(partoid) == RELKIND_RELATION &&
			!IdemTombFilterLearnPartition(parent, partoid, forgets, &n))
			all = false;
	}
	complete = IdemLearnedTreeComplete(parts, "tombstones_filter");
	list_free(parts);

	/*
	 * Known, when every partition was listed: one without an entry was
	 * found empty, or was made since (its tombstones make its entry, or
	 * count as misses); one whose entry is not complete is probed.  While
	 * the database counts misses every partition without an entry is
	 * probed anyway.  The misses are forgotten only when every partition
	 * was listed and read, and none was missed meanwhile.  Neither, when
	 * DDL made the filters incomplete meanwhile (IdemTombFilterForget, from
	 * the DDL guard under the lock of its command), or is running now.
	 */
	LWLockAcquire(tf_shared->lock, LW_EXCLUSIVE);
	db = IdemTombFilterDbEntry(parent);
	if (db != NULL && complete && db->forgets == forgets)
	{
		IdemTombFilterLayoutChanges();
		if (listed || db->misses > 0)
			db->known = true;
		if (listed && all && db->misses == misses)
			db->misses = 0;
	}
	LWLockRelease(tf_shared->lock);
	return n;
}

/*
 * Compaction: a filter grown by doubling answers "maybe" for nothing once
 * per generation (each about one time in a thousand when full), and a
 * claim reads one block per generation.  A partition whose filter has
 * IDEM_TOMBFILTER_COMPACT_GENS generations or more gets one generation
 * sized for all it holds, made from its rows.
 */
#define IDEM_TOMBFILTER_COMPACT_GENS	3

typedef struct CompactState
{
	TombFilterGen *gen;
	AttrNumber	a_hash;
	AttrNumber	a_fp;
} CompactState;

static void
IdemTombFilterCompactRow(TupleTableSlot *slot, void *arg)
{
	CompactState *st = arg;
	const uint8 *first;
	int			stride;
	int			n = IdemTombFilterSlotHashes(slot, st->a_hash, st->a_fp, &first, &stride);

	for (int i = 0; i < n; i++)
		IdemTombFilterGenSet(st->gen, first + (Size) i * stride);
}

/*
 * Every hash of the row versions of partoid into the generation dp, which
 * is this backend's alone until it is put in; freed on an error.
 */
static void
IdemTombFilterFill(Oid partoid, dsa_pointer dp)
{
	CompactState st;

	st.gen = dsa_get_address(tf_area, dp);
	st.a_hash = get_attnum(partoid, "scope_hash");
	st.a_fp = get_attnum(partoid, "fingerprint");
	PG_TRY();
	{
		if (st.a_hash == InvalidAttrNumber)
			elog(ERROR, "partition %u of idempotency.tombstones lacks scope_hash", partoid);
		(void) IdemScanRowVersions(partoid, IdemTombFilterCompactRow, &st);
	}
	PG_CATCH();
	{
		dsa_free(tf_area, dp);
		PG_RE_THROW();
	}
	PG_END_TRY();
}

int
IdemTombFilterCompact(Oid parent)
{
	List	   *parts;
	ListCell   *lc;
	TombFilterEntry *db;
	bool		known;
	uint64		forgets = 0;
	int			compacted = 0;

	if (!IdemTombFilterUsable())
		return -1;
	LWLockAcquire(tf_shared->lock, LW_SHARED);
	db = IdemTombFilterKnownLocked(parent);
	known = db != NULL;
	if (known)
		forgets = db->forgets;
	LWLockRelease(tf_shared->lock);
	if (!known)
		return -1;

	/*
	 * A compacted filter is complete: not while a trigger of the tree is
	 * disabled, or may be (learning's rule), since a tombstone written after
	 * the rows were read would pass no filter.
	 */
	parts = find_all_inheritors(parent, AccessShareLock, NULL);
	if (!IdemLearnedTreeComplete(parts, "tombstones_filter"))
	{
		list_free(parts);
		return -1;
	}
	foreach(lc, parts)
	{
		Oid			partoid = lfirst_oid(lc);
		TombFilterKey key;
		TombFilterEntry *e;
		dsa_pointer dp = InvalidDsaPointer;

		if (get_rel_relkind(partoid) != RELKIND_RELATION)
			continue;

		/*
		 * No writer of the partition is left, nor can one begin, while the
		 * rows are read: every hash added to the filter before is in a row
		 * version of the file by then (a writer holds ROW EXCLUSIVE from
		 * before its trigger adds the hash until its transaction ends).
		 * Claims, which only read, go on.  A partition being written is
		 * left for a later pass.
		 */
		if (!ConditionalLockRelationOid(partoid, ShareLock))
			continue;

		IdemTombFilterKeyOf(&key, parent, partoid);
		LWLockAcquire(tf_shared->lock, LW_EXCLUSIVE);
		e = hash_search(tf_hash, &key, HASH_FIND, NULL);
		if (e != NULL && !e->unfiltered && e->ngens >= IDEM_TOMBFILTER_COMPACT_GENS)
		{
			int64		count = 0;

			for (int g = 0; g < e->ngens; g++)
				count += ((TombFilterGen *) dsa_get_address(tf_area, e->gens[g]))->count;
			/* a quarter more: room for what comes next before it grows */
			dp = IdemTombFilterNewGen(IdemTombFilterBlocksFor(IDEM_TOMBFILTER_MIN_BLOCKS,
															  count + count / 4));
		}
		LWLockRelease(tf_shared->lock);

		if (DsaPointerIsValid(dp))
		{
			IdemTombFilterFill(partoid, dp);
			LWLockAcquire(tf_shared->lock, LW_EXCLUSIVE);
			e = hash_search(tf_hash, &key, HASH_FIND, NULL);
			db = IdemTombFilterDbEntry(parent);
			if (e != NULL && !e->unfiltered && e->ngens > 0 &&
				db != NULL && db->forgets == forgets)
			{
				/* the layout changes before the old arrays are freed */
				IdemTombFilterFreeGens(e);
				e->gens[0] = dp;
				e->ngens = 1;
				/* read whole while nobody could write: it holds every hash */
				IdemTombFilterLayoutChanges();
				e->complete = true;
				compacted++;
			}
			else
				dsa_free(tf_area, dp);
			LWLockRelease(tf_shared->lock);
		}
		UnlockRelationOid(partoid, ShareLock);
	}
	list_free(parts);
	return compacted;
}
