/*-------------------------------------------------------------------------
 *
 * diag_bound.c
 *	  The bound on what mismatch answers teach.  A client holding a key can
 *	  claim it again and again with guessed requests and read from each
 *	  mismatch answer whether one member is still reported as changed: a
 *	  4-digit member falls in a few thousand claims.  So each key gets at
 *	  most idempotency.diagnostics_max_mismatches diagnosed mismatches;
 *	  later ones are answered without member names (mismatch NULL),
 *	  counted (stats: diagnoses_withheld), and the first of them is
 *	  logged, with the key's hash, never the key.
 *
 *	  The counts live in shared memory, not in the key's row: a mismatch
 *	  answer writes nothing (in atomic mode it happens outside any
 *	  business write, and a client could roll its transaction back to
 *	  undo a count kept in a row), and counting never touches a row that
 *	  another session may be finishing.  One entry per key that had a
 *	  diagnosed mismatch, found by its database and idem_key_hash of its
 *	  scope, remembers the stored row's created_at and its expires_at (an
 *	  entry of an expired key makes room for another).  A newer row of the
 *	  key in the same database (after an expiry or a release) is another
 *	  stored request and starts at 0; a row with an older created_at
 *	  changes nothing (fail closed).  The database is part of the entry's
 *	  key, so a row of the same scope in another database never resets
 *	  it: alternating between two databases does not get past the bound.
 *
 *	  Capacity: idempotency.diagnostics_tracked_keys entries for the whole
 *	  server (server start only), of which one database may hold at most
 *	  idempotency.diagnostics_tracked_keys_per_database (reload), so that
 *	  one database's clients cannot take every entry and switch diagnoses
 *	  off in the others.  When full (the table, or the database's share,
 *	  holds live keys only), a mismatch of a key without an entry is
 *	  answered without names: the bound fails closed, it never discloses
 *	  more.  After a restart every count starts again at 0.  After its
 *	  database is dropped its entries stay until they expire or the table
 *	  is full: then the next key that finds no room (at most once a second
 *	  per backend) looks up the databases holding entries and frees those
 *	  of dropped databases.  Without shared_preload_libraries there is no
 *	  table and mismatches name nothing.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "diag_bound.h"
#include "guc.h"
#include "keygen.h"
#include "stats.h"
#include "util.h"

#define IDEM_DIAG_BOUND_TRANCHE	"idempotency_diag_bound"

/* at most one attempt a second per backend to free dropped databases' */
#define IDEM_DIAG_RECLAIM_INTERVAL_MS	1000

typedef struct DiagBoundKey
{
	Oid			dbid;
	char		key_hash[IDEM_KEY_HASH_LEN + 1];	/* zero-padded */
} DiagBoundKey;

typedef struct DiagBoundEntry
{
	DiagBoundKey key;			/* hash key, must be first */
	TimestampTz created_at;		/* of the stored row counted */
	TimestampTz expires_at;
	int32		diagnosed;		/* mismatches of it that were diagnosed */
	bool		logged;			/* the bound's log line was written */
} DiagBoundEntry;

/* how many entries a database holds */
typedef struct DiagBoundDatabase
{
	Oid			dbid;			/* hash key, must be first */
	int32		nentries;
} DiagBoundDatabase;

static LWLock *diag_bound_lock = NULL;
static HTAB *diag_bound_hash = NULL;
static HTAB *diag_bound_dbs = NULL;
static TimestampTz diag_last_reclaim = 0;

/* its part of the shared memory, from shmem.c's request hook */
void
IdemDiagBoundShmemRequest(void)
{
	RequestAddinShmemSpace(hash_estimate_size(idem_diagnostics_tracked_keys,
											  sizeof(DiagBoundEntry)));
	/* a database holding no entry has none here: never more than entries */
	RequestAddinShmemSpace(hash_estimate_size(idem_diagnostics_tracked_keys,
											  sizeof(DiagBoundDatabase)));
	RequestNamedLWLockTranche(IDEM_DIAG_BOUND_TRANCHE, 1);
}

/* its part of the shared memory, from shmem.c's startup hook */
void
IdemDiagBoundShmemStartup(void)
{
	HASHCTL		info;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	diag_bound_lock = &(GetNamedLWLockTranche(IDEM_DIAG_BOUND_TRANCHE))->lock;
	info.keysize = sizeof(DiagBoundKey);
	info.entrysize = sizeof(DiagBoundEntry);
	diag_bound_hash = ShmemInitHash("idempotency diagnosed mismatches by key",
									idem_diagnostics_tracked_keys,
									idem_diagnostics_tracked_keys,
									&info,
									HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	info.keysize = sizeof(Oid);
	info.entrysize = sizeof(DiagBoundDatabase);
	diag_bound_dbs = ShmemInitHash("idempotency diagnosed mismatches by database",
								   idem_diagnostics_tracked_keys,
								   idem_diagnostics_tracked_keys,
								   &info,
								   HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

/* Remove an entry (the one just returned by a scan may be), under the lock. */
static void
IdemDiagBoundRemove(DiagBoundEntry *e)
{
	DiagBoundDatabase *db;
	Oid			dbid = e->key.dbid;

	(void) hash_search(diag_bound_hash, &e->key, HASH_REMOVE, NULL);
	db = hash_search(diag_bound_dbs, &dbid, HASH_FIND, NULL);
	if (db != NULL && --db->nentries <= 0)
		(void) hash_search(diag_bound_dbs, &dbid, HASH_REMOVE, NULL);
}

/* Remove the entries of keys expired at now; how many. */
static int
IdemDiagBoundEvict(TimestampTz now)
{
	HASH_SEQ_STATUS seq;
	DiagBoundEntry *e;
	int			n = 0;

	hash_seq_init(&seq, diag_bound_hash);
	while ((e = hash_seq_search(&seq)) != NULL)
		if (e->expires_at <= now)
		{
			IdemDiagBoundRemove(e);
			n++;
		}
	return n;
}

/*
 * The table had no room: free the entries of dropped databases, at most
 * once a second in this backend.  Called without the lock; true when it
 * freed any.
 */
static bool
IdemDiagBoundReclaim(void)
{
	TimestampTz now = GetCurrentTimestamp();
	HASH_SEQ_STATUS seq;
	DiagBoundDatabase *db;
	DiagBoundEntry *e;
	Oid		   *dbs;
	int			ndbs = 0;
	int			ngone = 0;
	int			i;
	bool		freed = false;

	if (!IsTransactionState() ||
		!TimestampDifferenceExceeds(diag_last_reclaim, now,
									IDEM_DIAG_RECLAIM_INTERVAL_MS))
		return false;
	diag_last_reclaim = now;

	dbs = palloc(sizeof(Oid) * idem_diagnostics_tracked_keys);
	LWLockAcquire(diag_bound_lock, LW_SHARED);
	hash_seq_init(&seq, diag_bound_dbs);
	while ((db = hash_seq_search(&seq)) != NULL)
		if (ndbs < idem_diagnostics_tracked_keys)
			dbs[ndbs++] = db->dbid;
	LWLockRelease(diag_bound_lock);

	/* looked up without the lock */
	for (i = 0; i < ndbs; i++)
		if (IdemDatabaseDropped(dbs[i]))
			dbs[ngone++] = dbs[i];

	if (ngone > 0)
	{
		LWLockAcquire(diag_bound_lock, LW_EXCLUSIVE);
		hash_seq_init(&seq, diag_bound_hash);
		while ((e = hash_seq_search(&seq)) != NULL)
			for (i = 0; i < ngone; i++)
				if (e->key.dbid == dbs[i])
				{
					IdemDiagBoundRemove(e);
					freed = true;
					break;
				}
		LWLockRelease(diag_bound_lock);
	}
	pfree(dbs);
	return freed;
}

/*
 * The entry of key, made when missing and there is room for it (in the
 * table, and in the database's share); NULL otherwise.  Under the lock.
 */
static DiagBoundEntry *
IdemDiagBoundEnter(const DiagBoundKey *key, bool *found)
{
	DiagBoundEntry *e;
	DiagBoundDatabase *db;
	bool		db_found;

	e = hash_search(diag_bound_hash, key, HASH_FIND, NULL);
	*found = e != NULL;
	if (e != NULL)
		return e;
	db = hash_search(diag_bound_dbs, &key->dbid, HASH_FIND, NULL);
	if (db != NULL &&
		db->nentries >= Min(idem_diagnostics_tracked_keys_per_database,
							idem_diagnostics_tracked_keys))
		return NULL;			/* the database's share is full */
	/* HASH_ENTER_NULL: NULL instead of an error when the table is full */
	e = hash_search(diag_bound_hash, key, HASH_ENTER_NULL, found);
	if (e == NULL)
		return NULL;
	/* never more databases than entries: room for it */
	db = hash_search(diag_bound_dbs, &key->dbid, HASH_ENTER_NULL, &db_found);
	if (db == NULL)
	{
		(void) hash_search(diag_bound_hash, key, HASH_REMOVE, NULL);
		return NULL;
	}
	if (!db_found)
		db->nentries = 0;
	db->nentries++;
	e->created_at = DT_NOBEGIN;
	e->expires_at = DT_NOBEGIN;
	e->diagnosed = 0;
	e->logged = false;
	return e;
}

/*
 * Count a diagnosed mismatch of key's stored request under the lock; sets
 * *allow, and *log_it and *diagnosed for the bound's one log line.  False
 * when there was no room for its entry.
 */
static bool
IdemDiagBoundCount(const DiagBoundKey *key, TimestampTz created_at,
				   TimestampTz expires_at, TimestampTz now,
				   bool *allow, bool *log_it, int *diagnosed)
{
	DiagBoundEntry *e;
	bool		found;

	e = IdemDiagBoundEnter(key, &found);
	if (e == NULL && IdemDiagBoundEvict(now) > 0)
		e = IdemDiagBoundEnter(key, &found);
	if (e == NULL)
		return false;
	if (!found || created_at > e->created_at)
	{
		/* a stored request not counted yet: the first, or a newer row */
		e->created_at = created_at;
		e->diagnosed = 0;
		e->logged = false;
	}
	e->expires_at = Max(e->expires_at, expires_at);
	*allow = e->diagnosed < idem_diagnostics_max_mismatches;
	if (*allow)
		e->diagnosed++;
	else if (!e->logged)
	{
		e->logged = true;
		*log_it = true;
		*diagnosed = e->diagnosed;
	}
	return true;
}

bool
IdemDiagBoundAllow(const IdemScope *scope, TimestampTz created_at,
				   TimestampTz expires_at, TimestampTz now)
{
	DiagBoundKey key;
	bool		allow = false;
	bool		log_it = false;
	int			diagnosed = 0;

	memset(&key, 0, sizeof(key));
	key.dbid = MyDatabaseId;
	IdemKeyHash(VARDATA_ANY(scope->tenant), VARSIZE_ANY_EXHDR(scope->tenant),
				VARDATA_ANY(scope->endpoint), VARSIZE_ANY_EXHDR(scope->endpoint),
				VARDATA_ANY(scope->key), VARSIZE_ANY_EXHDR(scope->key),
				key.key_hash);

	if (idem_diagnostics_max_mismatches > 0 &&
		diag_bound_hash != NULL && diag_bound_lock != NULL)
	{
		bool		counted;

		LWLockAcquire(diag_bound_lock, LW_EXCLUSIVE);
		counted = IdemDiagBoundCount(&key, created_at, expires_at, now,
									 &allow, &log_it, &diagnosed);
		LWLockRelease(diag_bound_lock);
		if (!counted && IdemDiagBoundReclaim())
		{
			LWLockAcquire(diag_bound_lock, LW_EXCLUSIVE);
			(void) IdemDiagBoundCount(&key, created_at, expires_at, now,
									  &allow, &log_it, &diagnosed);
			LWLockRelease(diag_bound_lock);
		}
		/* still no room: allow stays false, the bound fails closed */
	}

	if (!allow)
		IdemStatsCount(scope->endpoint_str, IDEM_COUNT_DIAGNOSES_WITHHELD);
	if (log_it)
		ereport(LOG,
				(errmsg("idempotency mismatch diagnostics withheld: tenant \"%s\", endpoint \"%s\", key hash %s",
						text_to_cstring(scope->tenant), scope->endpoint_str, key.key_hash),
				 errdetail_plural("The stored request of the key was compared in %d diagnosed mismatch, the most idempotency.diagnostics_max_mismatches allows; its later mismatches are answered without member names.",
								  "The stored request of the key was compared in %d diagnosed mismatches, the most idempotency.diagnostics_max_mismatches allows; its later mismatches are answered without member names.",
								  diagnosed, diagnosed)));
	return allow;
}
