/*-------------------------------------------------------------------------
 *
 * horizon.c
 *	  Key horizons.  A claim of a new key must prove that no partition of
 *	  idempotency.keys holds its scope; without more knowledge that means a
 *	  probe of every partition whose range has not ended, up to max_ttl
 *	  ahead.  The horizon of an endpoint is a time before which every row of
 *	  the endpoint expires, so that a probe opens only the partitions that
 *	  begin before it: with a ttl of a day and partitions of a day, two.
 *
 *	  Horizons live in shared memory, one entry per database, table of keys
 *	  and endpoint (by a 64-bit hash of its name: two endpoints whose hashes
 *	  collide share one horizon, the later of theirs, which costs probes and
 *	  never a row).  They only grow:
 *	  - a row written by the extension raises its endpoint's horizon before
 *	    it is written (keystore_direct.c), to the upper bound of the
 *	    partition it goes to;
 *	  - a row written by SQL (an import, maintenance moving rows out of the
 *	    default partition, a restore, logical replication) raises it from
 *	    the trigger keys_horizon (idem_keys_horizon_trigger), enabled
 *	    ALWAYS so that it fires for a replication apply too;
 *	  - rows older than the server are learned by maintenance
 *	    (IdemHorizonLearn), which reads every row version of the table once
 *	    per server start; until then a database's horizons are unknown and
 *	    every partition is probed, as without horizons.
 *	  Each entry also keeps a second bound, dflt, for the rows of the
 *	  endpoint in the default partition (which holds the rows no dated
 *	  partition covers): every such row expires before it, DT_NOBEGIN when
 *	  none was written there.  A claim skips the default partition when no
 *	  row it looks for can be there: a claim of an endpoint keeping
 *	  tombstones looks for expired rows too, and without dflt it would open
 *	  the default partition every time, for the gap before the first dated
 *	  partition.  dflt is raised where the horizon is, by the writes into
 *	  the default partition only, and learned from its rows.
 *	  A later claim of the scope holds the scope lock that the writer held
 *	  until it committed, so it reads the raised horizon.  A writer that
 *	  rolls back leaves its endpoint's horizon raised: later probes open a
 *	  partition more than needed until the horizon passes.
 *
 *	  Capacity, and what fails closed (a horizon may be too late, costing
 *	  probes, never too early):
 *	  - The table of entries (idempotency.horizon_entries, 4096, for the
 *	    whole server) holds one entry per database and table of keys and
 *	    one per endpoint with keys.  When it is full, a database's
 *	    endpoints without an entry share one horizon (the database's own
 *	    entry, which is raised by every row of theirs), and none of them
 *	    gets an entry later.  A database that finds no entry of its own
 *	    has its horizons unknown (every partition is probed); the bound of
 *	    a row it writes then raises a server-wide floor, and every
 *	    database entry made later starts from that floor, so that a
 *	    learning made once room appears cannot miss the row, written after
 *	    it has read the table.  Logged once.
 *	  - After a restart (or a crash) every horizon is unknown until
 *	    maintenance learned its database.
 *	  - Rows that pass no trigger (a partition attached already holding
 *	    rows, rows written while keys_horizon is disabled): the DDL guard
 *	    makes the database unknown at each ATTACH PARTITION, ENABLE or
 *	    DISABLE TRIGGER it lets through, once the command holds its lock
 *	    (IdemHorizonForget, which counts a forget).  A learning makes the
 *	    database known only when no forget was counted since it began, no
 *	    other transaction holds a lock that such a command takes, and the
 *	    trigger fires on every table of the tree (IdemLearnedTreeComplete).
 *	  - While a database is being learned, its entry exists: every row
 *	    written raises it as usual, and what learning read is raised too
 *	    before the database is known.
 *	  - The entries of a dropped database, or of an earlier table of keys
 *	    of the same database, are freed at the next pass of any database
 *	    (IdemHorizonForgetStale).
 *	  Without shared_preload_libraries, on a standby, before the update to
 *	  0.4.0 (which adds the trigger) and in the Citus mode (whose shards
 *	  also receive rows by shard moves) no horizon is known.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "access/xlog.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "compat.h"
#include "guc.h"
#include "horizon.h"
#include "schema.h"
#include "util.h"

#define IDEM_HORIZON_TRANCHE	"idempotency horizons"

typedef struct HorizonKey
{
	Oid			dbid;
	Oid			relid;			/* idempotency.keys of that database */
	uint64		ephash;			/* 0: the database's own entry */
} HorizonKey;

typedef struct HorizonEntry
{
	HorizonKey	key;
	TimestampTz horizon;		/* every row expires before it */
	TimestampTz dflt;			/* every row in the default partition
								 * expires before it */
	/* the database's own entry only: */
	bool		known;			/* learned since the server started */
	bool		full;			/* an endpoint found no entry: all without
								 * one use this entry's horizon */
	TimestampTz floor;			/* no horizon of the database is below it:
								 * the orphan horizon when the entry was
								 * made */
	uint64		forgets;		/* times it was made unknown by DDL
								 * (IdemHorizonForget): a learning that
								 * began before does not make it known */
} HorizonEntry;

typedef struct HorizonShared
{
	LWLock	   *lock;

	/*
	 * Above every bound raised for a database that found no entry of its
	 * own (the table full): such a raise is lost, and the row it was for
	 * may be written after a learning has read the table, so every
	 * database's entry made later starts from it.
	 */
	TimestampTz orphan;
	bool		full_logged;
} HorizonShared;

static HorizonShared *horizon_shared = NULL;
static HTAB *horizon_hash = NULL;

/* its part of the shared memory, from shmem.c's request hook */
void
IdemHorizonShmemRequest(void)
{
	RequestAddinShmemSpace(add_size(MAXALIGN(sizeof(HorizonShared)),
									hash_estimate_size(idem_horizon_entries,
													   sizeof(HorizonEntry))));
	RequestNamedLWLockTranche(IDEM_HORIZON_TRANCHE, 1);
}

/* its part of the shared memory, from shmem.c's startup hook */
void
IdemHorizonShmemStartup(void)
{
	bool		found;
	HASHCTL		info;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	horizon_shared = ShmemInitStruct("idempotency horizons",
									 sizeof(HorizonShared), &found);
	if (!found)
	{
		horizon_shared->lock = &(GetNamedLWLockTranche(IDEM_HORIZON_TRANCHE))->lock;
		horizon_shared->orphan = DT_NOBEGIN;
		horizon_shared->full_logged = false;
	}
	info.keysize = sizeof(HorizonKey);
	info.entrysize = sizeof(HorizonEntry);
	horizon_hash = ShmemInitHash("idempotency horizons by endpoint",
								 idem_horizon_entries, idem_horizon_entries,
								 &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

static uint64
IdemHorizonHash(const char *endpoint, int len)
{
	uint64		h = hash_bytes_extended((const unsigned char *) endpoint, len, 0);

	return h != 0 ? h : 1;
}

static void
IdemHorizonKey(HorizonKey *key, Oid relid, uint64 ephash)
{
	memset(key, 0, sizeof(*key));
	key->dbid = MyDatabaseId;
	key->relid = relid;
	key->ephash = ephash;
}

TimestampTz
IdemHorizonOf(Oid relid, const text *endpoint, TimestampTz *dflt)
{
	HorizonKey	key;
	HorizonEntry *db;
	HorizonEntry *ep;
	TimestampTz result = DT_NOEND;

	*dflt = DT_NOEND;
	if (horizon_hash == NULL || RecoveryInProgress() ||
		!IdemSchemaHas(IDEM_SCHEMA_HORIZONS))
		return DT_NOEND;
	LWLockAcquire(horizon_shared->lock, LW_SHARED);
	IdemHorizonKey(&key, relid, 0);
	db = hash_search(horizon_hash, &key, HASH_FIND, NULL);
	if (db != NULL && db->known)
	{
		key.ephash = IdemHorizonHash(VARDATA_ANY(endpoint),
									 VARSIZE_ANY_EXHDR(endpoint));
		ep = hash_search(horizon_hash, &key, HASH_FIND, NULL);
		if (ep != NULL)
		{
			result = ep->horizon;
			*dflt = ep->dflt;
		}
		else if (db->full)
		{
			result = db->horizon;
			*dflt = db->dflt;
		}
		else
		{
			/* no row of the endpoint at all */
			result = DT_NOBEGIN;
			*dflt = DT_NOBEGIN;
		}
		result = Max(result, db->floor);
		*dflt = Max(*dflt, db->floor);
	}
	LWLockRelease(horizon_shared->lock);
	return result;
}

static void
IdemHorizonFull(void)
{
	if (horizon_shared->full_logged)
		return;
	horizon_shared->full_logged = true;
	ereport(LOG,
			(errmsg("idempotency: the table of key horizons is full: endpoints without an entry share their database's horizon"),
			 errdetail("It has %d entries, one per database and one per endpoint with keys, for the whole server.",
					   idem_horizon_entries),
			 errhint("Raise idempotency.horizon_entries (a restart is needed).")));
}

/*
 * The database's own entry of the table of keys relid, made (unknown) when
 * missing, under the exclusive lock; NULL when the table is full.
 */
static HorizonEntry *
IdemHorizonDbEntry(Oid relid)
{
	HorizonKey	key;
	HorizonEntry *db;
	bool		found;

	IdemHorizonKey(&key, relid, 0);
	db = hash_search(horizon_hash, &key, HASH_ENTER_NULL, &found);
	if (db != NULL && !found)
	{
		db->horizon = DT_NOBEGIN;
		db->dflt = DT_NOBEGIN;
		db->known = false;
		db->full = false;
		db->floor = horizon_shared->orphan;
		db->forgets = 0;
	}
	return db;
}

/*
 * Raise the horizon of ephash to bound, and its bound of the default
 * partition to dflt (DT_NOBEGIN: no row written there), under the exclusive
 * lock; the database's entry is made (unknown) when missing.
 */
static void
IdemHorizonRaiseLocked(Oid relid, uint64 ephash, TimestampTz bound,
					   TimestampTz dflt)
{
	HorizonKey	key;
	HorizonEntry *db;
	HorizonEntry *ep = NULL;
	bool		found;

	db = IdemHorizonDbEntry(relid);
	if (db == NULL)
	{
		/* the database's horizons stay unknown; an entry made later covers this */
		horizon_shared->orphan = Max(horizon_shared->orphan, Max(bound, dflt));
		IdemHorizonFull();
		return;
	}
	IdemHorizonKey(&key, relid, 0);
	key.ephash = ephash;
	/* once full, an endpoint without an entry never gets one */
	ep = hash_search(horizon_hash, &key, db->full ? HASH_FIND : HASH_ENTER_NULL,
					 &found);
	if (ep == NULL)
	{
		db->full = true;
		db->horizon = Max(db->horizon, bound);
		db->dflt = Max(db->dflt, dflt);
		IdemHorizonFull();
		return;
	}
	if (!found)
	{
		ep->horizon = DT_NOBEGIN;
		ep->dflt = DT_NOBEGIN;
	}
	ep->horizon = Max(ep->horizon, bound);
	ep->dflt = Max(ep->dflt, dflt);
}

void
IdemHorizonRaise(Oid relid, const text *endpoint, TimestampTz expires_at,
				 TimestampTz bound, bool in_default)
{
	HorizonKey	key;
	HorizonEntry *ep;
	uint64		ephash;
	bool		covered = false;

	if (horizon_hash == NULL)
		return;
	Assert(bound > expires_at);
	ephash = IdemHorizonHash(VARDATA_ANY(endpoint), VARSIZE_ANY_EXHDR(endpoint));
	IdemHorizonKey(&key, relid, ephash);

	/* most rows land before their endpoint's horizon: a shared lock */
	LWLockAcquire(horizon_shared->lock, LW_SHARED);
	ep = hash_search(horizon_hash, &key, HASH_FIND, NULL);
	if (ep != NULL && ep->horizon > expires_at &&
		(!in_default || ep->dflt > expires_at))
		covered = true;
	LWLockRelease(horizon_shared->lock);
	if (covered)
		return;

	LWLockAcquire(horizon_shared->lock, LW_EXCLUSIVE);
	IdemHorizonRaiseLocked(relid, ephash, bound,
						   !in_default ? DT_NOBEGIN :
						   IdemHorizonJustAfter(expires_at));
	LWLockRelease(horizon_shared->lock);
}

void
IdemHorizonForget(Oid relid)
{
	HorizonKey	key;
	HorizonEntry *db;

	if (horizon_hash == NULL)
		return;
	LWLockAcquire(horizon_shared->lock, LW_EXCLUSIVE);
	IdemHorizonKey(&key, relid, 0);
	db = hash_search(horizon_hash, &key, HASH_FIND, NULL);
	/* without an entry the database is unknown, and learning reads it all */
	if (db != NULL)
	{
		db->known = false;
		db->forgets++;
	}
	LWLockRelease(horizon_shared->lock);
}

/* Forget the entries of dropped databases and of replaced tables of keys. */
static void
IdemHorizonForgetStale(Oid relid)
{
	HASH_SEQ_STATUS status;
	HorizonEntry *e;

	hash_seq_init(&status, horizon_hash);
	while ((e = hash_seq_search(&status)) != NULL)
	{
		if ((e->key.dbid == MyDatabaseId && e->key.relid != relid) ||
			(e->key.dbid != MyDatabaseId &&
			 !SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(e->key.dbid))))
			(void) hash_search(horizon_hash, &e->key, HASH_REMOVE, NULL);
	}
}

typedef struct LearnedEntry
{
	uint64		ephash;
	TimestampTz horizon;
	TimestampTz dflt;
} LearnedEntry;

/* what a learning reads of one partition, into learned */
typedef struct LearnState
{
	HTAB	   *learned;
	AttrNumber	a_endpoint;
	AttrNumber	a_expires;
	bool		in_default;		/* the default partition (or not a dated one) */
} LearnState;

static void
IdemHorizonLearnRow(TupleTableSlot *slot, void *arg)
{
	LearnState *ls = arg;
	bool		isnull;
	text	   *endpoint;
	TimestampTz expires;
	uint64		ephash;
	LearnedEntry *le;
	bool		found;

	endpoint = DatumGetTextPP(slot_getattr(slot, ls->a_endpoint, &isnull));
	if (isnull)
		return;
	expires = DatumGetTimestampTz(slot_getattr(slot, ls->a_expires, &isnull));
	if (isnull)
		return;
	ephash = IdemHorizonHash(VARDATA_ANY(endpoint), VARSIZE_ANY_EXHDR(endpoint));
	le = hash_search(ls->learned, &ephash, HASH_ENTER, &found);
	if (!found)
	{
		le->horizon = DT_NOBEGIN;
		le->dflt = DT_NOBEGIN;
	}
	if (le->horizon <= expires)
		le->horizon = IdemHorizonJustAfter(expires);
	if (ls->in_default && le->dflt <= expires)
		le->dflt = IdemHorizonJustAfter(expires);
}

int64
IdemHorizonLearn(Oid relid)
{
	HorizonKey	key;
	HorizonEntry *db;
	bool		known;
	uint64		forgets;
	bool		complete;
	HTAB	   *learned;
	HASHCTL		ctl;
	List	   *parts;
	ListCell   *lc;
	HASH_SEQ_STATUS status;
	LearnedEntry *le;
	int64		n = 0;

	/* before the update to 0.4.0 no trigger raises the horizons of SQL writes */
	if (horizon_hash == NULL || RecoveryInProgress() ||
		!IdemSchemaHas(IDEM_SCHEMA_HORIZONS))
		return -1;

	/* the database's entry, made now so that writers raise into it */
	LWLockAcquire(horizon_shared->lock, LW_EXCLUSIVE);
	IdemHorizonForgetStale(relid);
	db = IdemHorizonDbEntry(relid);
	known = db == NULL || db->known;
	forgets = db != NULL ? db->forgets : 0;
	LWLockRelease(horizon_shared->lock);
	if (known)
		return -1;

	/*
	 * Not while a partition may be attached, or the trigger keys_horizon
	 * may be disabled, or is: rows that passed no trigger may come in
	 * after they are read.  Claims go on probing every partition.
	 */
	parts = find_all_inheritors(relid, AccessShareLock, NULL);
	if (!IdemLearnedTreeComplete(parts, "keys_horizon"))
	{
		list_free(parts);
		return -1;
	}

	ctl.keysize = sizeof(uint64);
	ctl.entrysize = sizeof(LearnedEntry);
	ctl.hcxt = CurrentMemoryContext;
	learned = hash_create("idempotency learned horizons", 64, &ctl,
						  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	foreach(lc, parts)
	{
		Oid			partoid = lfirst_oid(lc);
		LearnState	ls;

		if (get_rel_relkind(partoid) != RELKIND_RELATION)
			continue;
		ls.learned = learned;
		ls.in_default = !IdemDatedPartition(relid, partoid);
		ls.a_endpoint = get_attnum(partoid, "endpoint");
		ls.a_expires = get_attnum(partoid, "expires_at");
		if (ls.a_endpoint == InvalidAttrNumber || ls.a_expires == InvalidAttrNumber)
			elog(ERROR, "partition %u of idempotency.keys lacks endpoint or expires_at",
				 partoid);
		n += IdemScanRowVersions(partoid, IdemHorizonLearnRow, &ls);
	}

	/*
	 * Known only when nothing that passes no trigger began meanwhile: no
	 * DDL made the database unknown since it was read (IdemHorizonForget,
	 * from the DDL guard, under the lock of its command), and none is
	 * running or has disabled the trigger now.
	 */
	complete = IdemLearnedTreeComplete(parts, "keys_horizon");
	LWLockAcquire(horizon_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&status, learned);
	while ((le = hash_seq_search(&status)) != NULL)
		IdemHorizonRaiseLocked(relid, le->ephash, le->horizon, le->dflt);
	IdemHorizonKey(&key, relid, 0);
	db = hash_search(horizon_hash, &key, HASH_FIND, NULL);
	if (db != NULL && complete && db->forgets == forgets)
		db->known = true;
	LWLockRelease(horizon_shared->lock);
	hash_destroy(learned);
	list_free(parts);
	return n;
}

/*
 * Whether the partition relid of the table of keys root is no dated one
 * (horizon.h), for the trigger: the last answer is remembered until the
 * next relcache invalidation, since a statement writes many rows into few
 * partitions.
 */
static Oid	trigger_dated_relid = InvalidOid;
static bool trigger_dated_default = true;

static void
IdemHorizonRelcacheCallback(Datum arg, Oid relid)
{
	trigger_dated_relid = InvalidOid;
}

static bool
IdemHorizonInDefault(Oid root, Oid relid)
{
	static bool registered = false;

	if (!registered)
	{
		IdemRegisterRelcacheCallback(IdemHorizonRelcacheCallback);
		registered = true;
	}
	if (relid != trigger_dated_relid)
	{
		trigger_dated_relid = InvalidOid;
		trigger_dated_default = !IdemDatedPartition(root, relid);
		trigger_dated_relid = relid;
	}
	return trigger_dated_default;
}

PG_FUNCTION_INFO_V1(idem_keys_horizon_trigger);

/*
 * idem_keys_horizon_trigger() RETURNS trigger: BEFORE INSERT OR UPDATE FOR
 * EACH ROW of idempotency.keys (the trigger keys_horizon): raises the
 * horizon of the new row's endpoint.  The extension's own writes do not
 * pass through the executor and raise it themselves.
 */
Datum
idem_keys_horizon_trigger(PG_FUNCTION_ARGS)
{
	Relation	rel;
	HeapTuple	tuple = IdemBeforeRowTriggerTuple(fcinfo, "idem_keys_horizon_trigger",
												  "keys", &rel);
	TupleDesc	desc = RelationGetDescr(rel);
	Oid			relid;
	int			a_endpoint;
	int			a_expires;
	bool		isnull;
	Datum		endpoint;
	TimestampTz expires;

	if (horizon_hash == NULL)
		return PointerGetDatum(tuple);	/* no horizon is kept */
	a_endpoint = IdemTriggerColumn(rel, "endpoint", TEXTOID, false,
								   "idem_keys_horizon_trigger");
	a_expires = IdemTriggerColumn(rel, "expires_at", TIMESTAMPTZOID, false,
								  "idem_keys_horizon_trigger");
	/* horizons are kept for the top of the tree, as writers name it */
	relid = IdemPartitionRoot(rel);
	if (a_endpoint > 0 && a_expires > 0)
	{
		endpoint = heap_getattr(tuple, a_endpoint, desc, &isnull);
		if (!isnull)
		{
			expires = DatumGetTimestampTz(heap_getattr(tuple, a_expires, desc, &isnull));
			if (!isnull)
				IdemHorizonRaise(relid, DatumGetTextPP(endpoint), expires,
								 IdemHorizonJustAfter(expires),
								 IdemHorizonInDefault(relid, RelationGetRelid(rel)));
		}
	}
	return PointerGetDatum(tuple);
}
