/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Shared-memory counters of the idempotency extension, allocated when
 *	  the library is preloaded, and the SQL functions that read and reset
 *	  them.
 *
 *	  Counters are kept per database: each database has its totals, one
 *	  entry per endpoint counted, and an "untracked" entry for the events
 *	  of endpoints that found the table full.  A database reads and resets
 *	  its own counters only (idem_stats, idem_counters, the views stats
 *	  and health; idem_stats_reset): endpoint names and volumes of another
 *	  database are neither shown nor reset.
 *
 *	  Capacity: one shared hash table sized by
 *	  idempotency.stats_max_endpoints (server start only).  It holds at
 *	  most that many endpoint entries, of all databases together, and
 *	  besides them two entries (totals, untracked) for each of at most as
 *	  many databases.  When it is full: an event of an endpoint that finds
 *	  no room is counted in its database's totals and untracked entry; an
 *	  event of a database that finds no room for its totals is not counted
 *	  (its stats show zeros since the last restart or reset: the counters
 *	  are a measure, they decide nothing).  After a restart every counter
 *	  starts at 0 and reset_at is the server's start.  After its database
 *	  is dropped, its entries stay until the table is full: then the next
 *	  event that finds no room (at most once a second per backend) looks up
 *	  the databases of the entries and frees those of dropped databases.
 *
 *	  Counters are atomics, incremented while holding the lock in shared
 *	  mode, so that counting in many backends at once never loses an
 *	  increment; reading and resetting take the lock exclusively, so that a
 *	  reader sees the totals and the entries of one same moment.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "guc.h"
#include "stats.h"
#include "util.h"

#define IDEM_STATS_TRANCHE	"idempotency_stats"

/* hash key: an endpoint name, zero-padded */
#define IDEM_STATS_KEY_LEN	(IDEM_SCOPE_MAX_LEN + 1)

/* at most one attempt a second per backend to free dropped databases' */
#define IDEM_STATS_RECLAIM_INTERVAL_MS	1000

typedef enum IdemStatsKind
{
	IDEM_STATS_ENDPOINT,		/* one endpoint of a database */
	IDEM_STATS_UNTRACKED,		/* a database's endpoints that found no room */
	IDEM_STATS_TOTAL			/* a database's totals */
} IdemStatsKind;

typedef struct IdemStatsKey
{
	Oid			dbid;
	int32		kind;			/* IdemStatsKind */
	char		endpoint[IDEM_STATS_KEY_LEN];	/* zero-padded; zeros but for
												 * IDEM_STATS_ENDPOINT */
} IdemStatsKey;

typedef struct IdemStatsEntry
{
	IdemStatsKey key;			/* hash key, must be first */
	TimestampTz reset_time;		/* IDEM_STATS_TOTAL: the database's reset */
	pg_atomic_uint64 counters[IDEM_COUNT_NUM];
} IdemStatsEntry;

typedef struct IdemStatsShared
{
	LWLock	   *lock;			/* see the head comment */
	TimestampTz start_time;		/* reset_at of a database never reset */
	int			nendpoints;		/* IDEM_STATS_ENDPOINT entries */
	int			ndatabase;		/* IDEM_STATS_TOTAL and _UNTRACKED entries */
} IdemStatsShared;

static IdemStatsShared *idem_shared = NULL;
static HTAB *idem_stats_hash = NULL;
static TimestampTz idem_stats_last_reclaim = 0;

/* endpoints, and two entries for each of as many databases */
static long
IdemStatsCapacity(void)
{
	return 3L * idem_stats_max_endpoints;
}

static Size
IdemStatsShmemSize(void)
{
	return add_size(MAXALIGN(sizeof(IdemStatsShared)),
					hash_estimate_size(IdemStatsCapacity(),
									   sizeof(IdemStatsEntry)));
}

/*
 * Hash of an entry's key: its database, kind and the endpoint's bytes up to
 * its end, not the whole zero-padded name (equal keys are still compared
 * whole, with memcmp).
 */
static uint32
IdemStatsKeyHash(const void *key, Size keysize)
{
	const IdemStatsKey *k = (const IdemStatsKey *) key;
	uint32		h;

	h = hash_bytes_uint32((uint32) k->dbid) ^ (uint32) k->kind;
	return hash_combine(h, hash_bytes((const unsigned char *) k->endpoint,
									  strnlen(k->endpoint, IDEM_STATS_KEY_LEN)));
}

/* its part of the shared memory, from shmem.c's request hook */
void
IdemStatsShmemRequest(void)
{
	RequestAddinShmemSpace(IdemStatsShmemSize());
	RequestNamedLWLockTranche(IDEM_STATS_TRANCHE, 1);
}

/* its part of the shared memory, from shmem.c's startup hook */
void
IdemStatsShmemStartup(void)
{
	bool		found;
	HASHCTL		info;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	idem_shared = ShmemInitStruct("idempotency stats", sizeof(IdemStatsShared),
								 &found);
	if (!found)
	{
		idem_shared->lock = &(GetNamedLWLockTranche(IDEM_STATS_TRANCHE))->lock;
		idem_shared->start_time = GetCurrentTimestamp();
		idem_shared->nendpoints = 0;
		idem_shared->ndatabase = 0;
	}

	info.keysize = sizeof(IdemStatsKey);
	info.entrysize = sizeof(IdemStatsEntry);
	info.hash = IdemStatsKeyHash;
	idem_stats_hash = ShmemInitHash("idempotency stats by database and endpoint",
									IdemStatsCapacity(),
									IdemStatsCapacity(),
									&info,
									HASH_ELEM | HASH_FUNCTION | HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

/* Fail clearly where the counters do not exist. */
static void
IdemStatsRequire(const char *feature)
{
	IdemRequirePreload(feature);
	if (idem_shared == NULL || idem_stats_hash == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency statistics are not available in this process")));
}

/*
 * The hash key of an entry of the current database; false when endpoint is
 * too long (or empty) for an endpoint entry.
 */
static bool
IdemStatsMakeKey(IdemStatsKey *key, IdemStatsKind kind, const char *endpoint)
{
	memset(key, 0, sizeof(IdemStatsKey));
	key->dbid = MyDatabaseId;
	key->kind = kind;
	if (kind == IDEM_STATS_ENDPOINT)
	{
		size_t		len = endpoint ? strlen(endpoint) : 0;

		if (len == 0 || len > IDEM_SCOPE_MAX_LEN)
			return false;
		memcpy(key->endpoint, endpoint, len);
	}
	return true;
}

/*
 * Find or make the entry of key, under the exclusive lock; NULL when the
 * table has no room for it.
 */
static IdemStatsEntry *
IdemStatsEnter(const IdemStatsKey *key)
{
	IdemStatsEntry *entry;
	bool		found;
	int		   *n;
	int			i;

	entry = hash_search(idem_stats_hash, key, HASH_FIND, NULL);
	if (entry != NULL)
		return entry;
	if (key->kind == IDEM_STATS_ENDPOINT)
		n = &idem_shared->nendpoints;
	else
		n = &idem_shared->ndatabase;
	if (*n >= (key->kind == IDEM_STATS_ENDPOINT ? 1 : 2) * idem_stats_max_endpoints)
		return NULL;
	/* HASH_ENTER_NULL: NULL instead of an error when the table is full */
	entry = hash_search(idem_stats_hash, key, HASH_ENTER_NULL, &found);
	if (entry == NULL)
		return NULL;
	(*n)++;
	entry->reset_time = idem_shared->start_time;
	for (i = 0; i < IDEM_COUNT_NUM; i++)
		pg_atomic_init_u64(&entry->counters[i], 0);
	return entry;
}

/* Remove an entry, under the exclusive lock. */
static void
IdemStatsRemove(IdemStatsEntry *entry)
{
	if (entry->key.kind == IDEM_STATS_ENDPOINT)
		idem_shared->nendpoints--;
	else
		idem_shared->ndatabase--;
	/* removing the entry just returned by a scan is allowed */
	(void) hash_search(idem_stats_hash, &entry->key, HASH_REMOVE, NULL);
}

/*
 * The table had no room: free the entries of dropped databases, at most
 * once a second in this backend (the look-ups are not free).  True when it
 * freed any.  Takes and releases the lock itself.
 */
static bool
IdemStatsReclaim(void)
{
	TimestampTz now = GetCurrentTimestamp();
	HASH_SEQ_STATUS seq;
	IdemStatsEntry *entry;
	Oid		   *dbs;
	int			ndbs = 0;
	int			ngone = 0;
	int			i;
	bool		freed = false;

	if (!IsTransactionState() ||
		!TimestampDifferenceExceeds(idem_stats_last_reclaim, now,
									IDEM_STATS_RECLAIM_INTERVAL_MS))
		return false;
	idem_stats_last_reclaim = now;

	/* the databases of the totals entries (every database counted has one) */
	dbs = palloc(sizeof(Oid) * (2 * idem_stats_max_endpoints + 1));
	LWLockAcquire(idem_shared->lock, LW_SHARED);
	hash_seq_init(&seq, idem_stats_hash);
	while ((entry = hash_seq_search(&seq)) != NULL)
		if (entry->key.kind == IDEM_STATS_TOTAL &&
			ndbs < 2 * idem_stats_max_endpoints)
			dbs[ndbs++] = entry->key.dbid;
	LWLockRelease(idem_shared->lock);

	/* looked up without the lock */
	for (i = 0; i < ndbs; i++)
		if (IdemDatabaseDropped(dbs[i]))
			dbs[ngone++] = dbs[i];

	if (ngone > 0)
	{
		LWLockAcquire(idem_shared->lock, LW_EXCLUSIVE);
		hash_seq_init(&seq, idem_stats_hash);
		while ((entry = hash_seq_search(&seq)) != NULL)
			for (i = 0; i < ngone; i++)
				if (entry->key.dbid == dbs[i])
				{
					IdemStatsRemove(entry);
					freed = true;
					break;
				}
		LWLockRelease(idem_shared->lock);
	}
	pfree(dbs);
	return freed;
}

/* what IdemStatsCountLocked did */
typedef enum IdemStatsCounted
{
	IDEM_STATS_NOT_COUNTED,		/* no room for the database's totals */
	IDEM_STATS_COUNTED_UNTRACKED,	/* counted, the endpoint as untracked */
	IDEM_STATS_COUNTED			/* counted in every entry it belongs to */
} IdemStatsCounted;

/*
 * Count one event under the lock.  In shared mode only where every entry
 * exists (otherwise it counts nothing and answers IDEM_STATS_NOT_COUNTED,
 * to be called again exclusively); exclusively, it makes the entries that
 * are missing, where there is room.
 */
static IdemStatsCounted
IdemStatsCountLocked(const char *endpoint, IdemCounter counter, bool exclusive)
{
	IdemStatsKey tkey;
	IdemStatsKey ekey;
	IdemStatsKey ukey;
	IdemStatsEntry *total;
	IdemStatsEntry *entry = NULL;
	bool		keyed;
	bool		tracked;

	(void) IdemStatsMakeKey(&tkey, IDEM_STATS_TOTAL, NULL);
	keyed = IdemStatsMakeKey(&ekey, IDEM_STATS_ENDPOINT, endpoint);

	if (exclusive)
	{
		total = IdemStatsEnter(&tkey);
		if (total != NULL && keyed)
			entry = IdemStatsEnter(&ekey);
	}
	else
	{
		total = hash_search(idem_stats_hash, &tkey, HASH_FIND, NULL);
		if (keyed)
			entry = hash_search(idem_stats_hash, &ekey, HASH_FIND, NULL);
	}
	if (total == NULL || (!exclusive && keyed && entry == NULL))
		return IDEM_STATS_NOT_COUNTED;
	tracked = endpoint == NULL || entry != NULL;
	if (entry == NULL && endpoint != NULL)
	{
		/* an endpoint without its entry: the untracked entry */
		(void) IdemStatsMakeKey(&ukey, IDEM_STATS_UNTRACKED, NULL);
		entry = exclusive ? IdemStatsEnter(&ukey) :
			hash_search(idem_stats_hash, &ukey, HASH_FIND, NULL);
		if (entry == NULL && !exclusive)
			return IDEM_STATS_NOT_COUNTED;
	}
	if (entry != NULL)
		pg_atomic_fetch_add_u64(&entry->counters[counter], 1);
	pg_atomic_fetch_add_u64(&total->counters[counter], 1);
	return tracked ? IDEM_STATS_COUNTED : IDEM_STATS_COUNTED_UNTRACKED;
}

/*
 * Count one event.  The shared lock keeps a reset or a reader out while the
 * entry and the total move together; concurrent counters use atomics.  A
 * missing entry is added under the exclusive lock, when there is room; when
 * there is none, the entries of dropped databases are freed (see the head
 * comment) and an event not counted at all is counted then.
 */
void
IdemStatsCount(const char *endpoint, IdemCounter counter)
{
	IdemStatsCounted counted;

	if (idem_shared == NULL || idem_stats_hash == NULL ||
		counter < 0 || counter >= IDEM_COUNT_NUM || !OidIsValid(MyDatabaseId))
		return;

	LWLockAcquire(idem_shared->lock, LW_SHARED);
	counted = IdemStatsCountLocked(endpoint, counter, false);
	LWLockRelease(idem_shared->lock);
	if (counted == IDEM_STATS_COUNTED)
		return;

	LWLockAcquire(idem_shared->lock, LW_EXCLUSIVE);
	counted = IdemStatsCountLocked(endpoint, counter, true);
	LWLockRelease(idem_shared->lock);
	if (counted == IDEM_STATS_COUNTED || !IdemStatsReclaim())
		return;

	LWLockAcquire(idem_shared->lock, LW_EXCLUSIVE);
	if (counted == IDEM_STATS_NOT_COUNTED)
		(void) IdemStatsCountLocked(endpoint, counter, true);
	else
	{
		IdemStatsKey ekey;

		/* counted as untracked: room for the endpoint's later events */
		if (IdemStatsMakeKey(&ekey, IDEM_STATS_ENDPOINT, endpoint))
			(void) IdemStatsEnter(&ekey);
	}
	LWLockRelease(idem_shared->lock);
}

static void
IdemStatsPutRow(Tuplestorestate *store, TupleDesc desc, const char *endpoint,
				bool untracked, pg_atomic_uint64 *counters, TimestampTz reset)
{
	Datum		values[IDEM_COUNT_NUM + 3];
	bool		nulls[IDEM_COUNT_NUM + 3];
	int			ncounters = desc->natts - 3;	/* fewer under an older schema */
	int			i;

	memset(nulls, 0, sizeof(nulls));
	if (endpoint != NULL)
		values[0] = CStringGetTextDatum(endpoint);
	else
		nulls[0] = true;
	values[1] = BoolGetDatum(untracked);
	for (i = 0; i < ncounters; i++)
		values[i + 2] = counters ? Int64GetDatum((int64) pg_atomic_read_u64(&counters[i])) :
			Int64GetDatum(0);
	values[ncounters + 2] = TimestampTzGetDatum(reset);
	tuplestore_putvalues(store, desc, values, nulls);
}

PG_FUNCTION_INFO_V1(idem_stats);

/*
 * idem_stats(missing_ok boolean DEFAULT false) RETURNS SETOF record
 *		The current database's counters: one row per endpoint counted, one
 *		row (endpoint NULL, untracked true) for the endpoints that found the
 *		table full, when there are any, and one row of totals (endpoint
 *		NULL, untracked false).  Without the library preloaded: an error,
 *		or no rows when missing_ok.
 */
Datum
idem_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool		missing_ok = !PG_ARGISNULL(0) && PG_GETARG_BOOL(0);
	HASH_SEQ_STATUS seq;
	IdemStatsEntry *entry;
	IdemStatsEntry *total = NULL;
	IdemStatsEntry *untracked = NULL;
	TimestampTz reset;
	int			i;

	if (missing_ok && (!IdemPreloaded || idem_shared == NULL))
	{
		InitMaterializedSRF(fcinfo, 0);
		return (Datum) 0;
	}
	IdemStatsRequire("idem_stats()");
	InitMaterializedSRF(fcinfo, 0);
	/*
	 * older declarations lack the last counters: 0.3.0's diagnoses_withheld,
	 * 0.2.0's also diagnosed and tombstone_hits
	 */
	if (rsinfo->setDesc->natts != IDEM_COUNT_NUM + 3 &&
		rsinfo->setDesc->natts != IDEM_COUNT_NUM + 2 &&
		rsinfo->setDesc->natts != IDEM_COUNT_NUM)
		elog(ERROR, "idem_stats() is declared with %d columns, expected %d",
			 rsinfo->setDesc->natts, IDEM_COUNT_NUM + 3);

	/*
	 * Exclusively, so that the rows are of one same moment.  An error in
	 * between releases the lock with the transaction's abort.
	 */
	LWLockAcquire(idem_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, idem_stats_hash);
	while ((entry = hash_seq_search(&seq)) != NULL)
	{
		if (entry->key.dbid != MyDatabaseId)
			continue;
		if (entry->key.kind == IDEM_STATS_TOTAL)
			total = entry;
		else if (entry->key.kind == IDEM_STATS_UNTRACKED)
			untracked = entry;
	}
	reset = total ? total->reset_time : idem_shared->start_time;
	hash_seq_init(&seq, idem_stats_hash);
	while ((entry = hash_seq_search(&seq)) != NULL)
		if (entry->key.dbid == MyDatabaseId &&
			entry->key.kind == IDEM_STATS_ENDPOINT)
			IdemStatsPutRow(rsinfo->setResult, rsinfo->setDesc,
							entry->key.endpoint, false, entry->counters, reset);
	if (untracked != NULL)
		for (i = 0; i < IDEM_COUNT_NUM; i++)
			if (pg_atomic_read_u64(&untracked->counters[i]) != 0)
			{
				IdemStatsPutRow(rsinfo->setResult, rsinfo->setDesc, NULL, true,
								untracked->counters, reset);
				break;
			}
	IdemStatsPutRow(rsinfo->setResult, rsinfo->setDesc, NULL, false,
					total ? total->counters : NULL, reset);
	LWLockRelease(idem_shared->lock);

	return (Datum) 0;
}

PG_FUNCTION_INFO_V1(idem_stats_reset);

/*
 * idem_stats_reset() RETURNS timestamptz
 *		Zero every counter of the current database and forget its
 *		endpoints; returns the new reset time.  Other databases' counters
 *		are left alone.
 */
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	TimestampTz now = GetCurrentTimestamp();
	HASH_SEQ_STATUS seq;
	IdemStatsEntry *entry;
	IdemStatsKey tkey;
	int			i;

	IdemStatsRequire("idem_stats_reset()");

	LWLockAcquire(idem_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, idem_stats_hash);
	while ((entry = hash_seq_search(&seq)) != NULL)
		if (entry->key.dbid == MyDatabaseId &&
			entry->key.kind != IDEM_STATS_TOTAL)
			IdemStatsRemove(entry);
	(void) IdemStatsMakeKey(&tkey, IDEM_STATS_TOTAL, NULL);
	entry = IdemStatsEnter(&tkey);
	if (entry != NULL)
	{
		for (i = 0; i < IDEM_COUNT_NUM; i++)
			pg_atomic_write_u64(&entry->counters[i], 0);
		entry->reset_time = now;
	}
	LWLockRelease(idem_shared->lock);

	if (entry == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("the table of idempotency counters has no room for this database"),
				 errdetail("Its entries are taken by the counters of other databases."),
				 errhint("Raise idempotency.stats_max_endpoints (server start only).")));

	PG_RETURN_TIMESTAMPTZ(now);
}
