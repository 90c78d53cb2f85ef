/*-------------------------------------------------------------------------
 *
 * guc.c
 *	  Definition of every idempotency.* configuration setting, and what
 *	  keeps idempotency.encryption_key out of the server log.
 *
 *	  The key is never the value the GUC machinery holds: its check hook
 *	  moves the key into the setting's "extra" and leaves an empty string
 *	  as the value.  The value is what a reload compares before logging
 *	  "parameter ... changed to ..." (with the text of the file), so that
 *	  line is never written for the key; SHOW and current_setting() show
 *	  only whether a key is set.  The check hook accepts every value, so no
 *	  "invalid value" error can quote it, but for where it comes from: a
 *	  database's, a role's or a function's setting (ALTER DATABASE/ROLE ...
 *	  SET, CREATE/ALTER FUNCTION ... SET) is refused, because those are
 *	  stored in catalogs every role reads (pg_db_role_setting,
 *	  pg_proc.proconfig); its error names neither the value nor the
 *	  statement.  The key is set only where the superuser's configuration
 *	  is: postgresql.conf, ALTER SYSTEM, or SET in a superuser's session.
 *	  Statements that name the setting, and the bind parameters of those
 *	  that call set_config(), are kept out of the log too (see
 *	  IdemHideKeyStatements).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "miscadmin.h"
#include "tcop/tcopprot.h"
#include "utils/elog.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "compat.h"
#include "guc.h"

int			idem_default_ttl = 24 * 60 * 60;
int			idem_max_ttl = 7 * 24 * 60 * 60;
int			idem_claim_wait = 0;
int			idem_partition_interval = 24 * 60 * 60;
int			idem_max_claims_per_transaction = 1000;

bool		idem_enable_worker = true;
int			idem_maintenance_interval = 60;
int			idem_resolver_timeout = 2000;
bool		idem_ddl_guard_on = true;

int			idem_stats_max_endpoints = 1000;
bool		idem_log_transitions = false;
bool		idem_audit = false;
int			idem_max_response_bytes = 256 * 1024;
char	   *idem_extra_sensitive_headers = NULL;
char	   *idem_encryption_key = "";
uint64		idem_encryption_key_generation = 1;
int			idem_diagnostics_max_bytes = 1024;
int			idem_diagnostics_max_mismatches = 3;
int			idem_diagnostics_tracked_keys = 10000;
int			idem_diagnostics_tracked_keys_per_database = 2500;
int			idem_tombstone_ttl = 30 * 24 * 60 * 60;
int			idem_tombstone_partition_interval = 7 * 24 * 60 * 60;
int			idem_tombstone_filter_memory = 32 * 1024;
int			idem_tombstone_filter_entries = 8192;
int			idem_horizon_entries = 4096;
int			idem_outbox_retention = 7 * 24 * 60 * 60;

/* the value the GUC machinery holds for idempotency.encryption_key: "" */
static char *idem_encryption_key_setting = NULL;

/* what SHOW answers for a key that is set */
#define IDEM_KEY_SHOWN		"(set)"

/* a statement that names this is never written to the server log */
#define IDEM_KEY_SETTING	"encryption_key"

static emit_log_hook_type prev_emit_log_hook = NULL;

/*
 * Check hook of idempotency.encryption_key: the key goes to *extra, the
 * value kept by the GUC machinery becomes "".  Every value is accepted but
 * from a database's, a role's or a function's setting: PGC_S_TEST is the
 * check of ALTER DATABASE/ROLE ... SET and of a function's SET clause
 * before it is stored, the others are such a setting stored earlier (or
 * while the library was not loaded) as a session starts.  ALTER SYSTEM and
 * postgresql.conf check with PGC_S_FILE, SET with PGC_S_SESSION.
 */
static bool
IdemEncryptionKeyCheck(char **newval, void **extra, GucSource source)
{
	size_t		len = *newval ? strlen(*newval) : 0;
	char	   *key = NULL;
	char	   *empty;

	if (len > 0 &&
		(source == PGC_S_TEST || source == PGC_S_GLOBAL ||
		 source == PGC_S_DATABASE || source == PGC_S_USER ||
		 source == PGC_S_DATABASE_USER))
	{
		/* the error must not quote the value: give a message of our own */
		memset(*newval, 0, len);
		GUC_check_errcode(ERRCODE_CANT_CHANGE_RUNTIME_PARAM);
		GUC_check_errmsg("idempotency.encryption_key cannot be a database's, a role's or a function's setting");
		GUC_check_errdetail("Those settings are stored in catalogs that every role can read.");
		GUC_check_errhint("Set the key in postgresql.conf or with ALTER SYSTEM, then reload the configuration.");
		return false;
	}
	if (len > 0)
	{
		key = IdemGucAlloc(len + 1);
		if (key == NULL)
			return false;
		memcpy(key, *newval, len + 1);
	}
	empty = IdemGucAlloc(1);
	if (empty == NULL)
	{
		if (key)
			IdemGucFree(key);
		return false;
	}
	empty[0] = '\0';
	if (*newval)
	{
		/* wipe the key's copy that the GUC machinery would keep */
		memset(*newval, 0, len);
		IdemGucFree(*newval);
	}
	*newval = empty;
	*extra = key;
	return true;
}

static void
IdemEncryptionKeyAssign(const char *newval, void *extra)
{
	idem_encryption_key = extra ? (char *) extra : "";
	idem_encryption_key_generation++;
}

static const char *
IdemEncryptionKeyShow(void)
{
	return idem_encryption_key[0] != '\0' ? IDEM_KEY_SHOWN : "";
}

/* Does s name the key's setting?  (ASCII, without regard to case) */
static bool
IdemNamesKeySetting(const char *s)
{
	size_t		n = strlen(IDEM_KEY_SETTING);

	for (; s != NULL && *s != '\0'; s++)
		if (pg_strncasecmp(s, IDEM_KEY_SETTING, n) == 0)
			return true;
	return false;
}

/* Does s name set_config?  (ASCII, without regard to case) */
static bool
IdemNamesSetConfig(const char *s)
{
	for (; s != NULL && *s != '\0'; s++)
		if (pg_strncasecmp(s, "set_config", 10) == 0)
			return true;
	return false;
}

/*
 * Does s hold the bind parameters of a statement?  PostgreSQL writes them
 * as "$1 = '...', $2 = ..." after a label that differs between versions
 * and languages ("parameters: ", "Parameters: ", "unnamed portal with
 * parameters: ").
 */
static bool
IdemHoldsParameters(const char *s)
{
	return s != NULL && strstr(s, "$1 = ") != NULL;
}

/*
 * emit_log_hook: a statement that names idempotency.encryption_key may
 * carry a key (SET, ALTER SYSTEM, set_config(), a refused value).  The
 * STATEMENT line of its messages is left out, and a message that quotes
 * the statement itself (log_statement, log_min_duration_statement) is
 * written without it and without its parameters.  A statement that calls
 * set_config() may take the setting's name and the key as bind parameters
 * (set_config($1, $2)), which log_statement, log_min_duration_statement
 * and log_parameter_max_length_on_error would write in a DETAIL or CONTEXT
 * line "parameters: $1 = '...'": those lines are left out, and so is the
 * STATEMENT line of its messages.
 */
static void
IdemHideKeyStatements(ErrorData *edata)
{
	if (edata->output_to_server && debug_query_string != NULL &&
		IdemNamesSetConfig(debug_query_string))
	{
		edata->hide_stmt = true;
		if (IdemHoldsParameters(edata->detail))
			edata->detail = NULL;
		if (IdemHoldsParameters(edata->detail_log))
			edata->detail_log = NULL;
		if (IdemHoldsParameters(edata->context))
			edata->context = NULL;
	}
	if (edata->output_to_server && debug_query_string != NULL &&
		IdemNamesKeySetting(debug_query_string))
	{
		edata->hide_stmt = true;
		if (edata->message && strstr(edata->message, debug_query_string))
		{
			edata->message = pstrdup("statement not logged: it names idempotency.encryption_key");
			edata->detail = NULL;
			edata->detail_log = NULL;
			edata->context = NULL;
		}
	}
	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
}

void
IdemGucInit(void)
{
	DefineCustomIntVariable("idempotency.default_ttl",
							"Time a key is kept when neither the claim nor its endpoint names one.",
							NULL,
							&idem_default_ttl,
							24 * 60 * 60, 1, INT_MAX,
							PGC_USERSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_ttl",
							"Longest time a key may be kept.",
							"Partitions are made in advance to cover this much time.",
							&idem_max_ttl,
							7 * 24 * 60 * 60, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.claim_wait",
							"Time a claim waits for a concurrent duplicate to finish when the claim names no wait.",
							NULL,
							&idem_claim_wait,
							0, 0, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_claims_per_transaction",
							"Most keys one transaction may hold claimed at once.",
							"Each claim holds a lock until its transaction ends; the limit keeps one transaction from filling the lock table that every session shares.",
							&idem_max_claims_per_transaction,
							1000, 1, INT_MAX,
							PGC_SUSET, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.partition_interval",
							"Width of one partition of idempotency.keys, by expiry time.",
							NULL,
							&idem_partition_interval,
							24 * 60 * 60, 60, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.tombstone_ttl",
							"Time a tombstone of an expired key is kept, when the key's endpoint names none.",
							"A claim of an expired key with another fingerprint answers 422 while its tombstone lives. 0 keeps no tombstones.",
							&idem_tombstone_ttl,
							30 * 24 * 60 * 60, 0, IDEM_TOMBSTONE_TTL_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.tombstone_partition_interval",
							"Width of one partition of idempotency.tombstones, by expiry time.",
							"A claim of a new key opens the tombstone partitions whose filter may hold its key: wider partitions, fewer filters to ask.",
							&idem_tombstone_partition_interval,
							7 * 24 * 60 * 60, 60, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("idempotency.enable_worker",
							 "Runs the maintenance background worker.",
							 NULL,
							 &idem_enable_worker,
							 true,
							 PGC_SIGHUP, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.maintenance_interval",
							"Time between two maintenance passes of the background worker.",
							NULL,
							&idem_maintenance_interval,
							60, 1, INT_MAX / 1000,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.resolver_timeout",
							"Longest time a maintenance pass waits for one call of an endpoint's resolver.",
							"A resolver that has not answered by then is cancelled; its key stays in_progress until the next pass. 0 waits without limit.",
							&idem_resolver_timeout,
							2000, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	/*
	 * A setting that only takes effect at server start can only be defined
	 * while the library is preloaded.
	 */
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("idempotency.tombstone_filter_memory",
								"Shared memory for the membership filters of tombstone partitions.",
								"A claim opens a tombstone partition only when its filter says the key may be there; a filter takes about 16 bits a tombstone. 0 keeps no filter: every partition is probed.",
								&idem_tombstone_filter_memory,
								32 * 1024, 0, 1024 * 1024,
								PGC_POSTMASTER, GUC_UNIT_KB,
								NULL, NULL, NULL);
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("idempotency.tombstone_filter_entries",
								"Entries of the shared table of tombstone filters: one per tombstone partition that holds tombstones, and one per database.",
								"A partition that finds no entry is probed by every claim until maintenance has room to learn it again from its rows.",
								&idem_tombstone_filter_entries,
								8192, 1, 1000000,
								PGC_POSTMASTER, 0,
								NULL, NULL, NULL);
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("idempotency.horizon_entries",
								"Entries of the shared table of key horizons: one per endpoint that has keys, and one per database.",
								"The endpoints of a database that find no entry share its own horizon; a database that finds none has its horizons unknown, and every partition of keys is probed.",
								&idem_horizon_entries,
								4096, 1, 1000000,
								PGC_POSTMASTER, 0,
								NULL, NULL, NULL);
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("idempotency.stats_max_endpoints",
								"Number of endpoints whose counters are kept in shared memory.",
								NULL,
								&idem_stats_max_endpoints,
								1000, 1, 1000000,
								PGC_POSTMASTER, 0,
								NULL, NULL, NULL);
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("idempotency.diagnostics_tracked_keys",
								"Number of keys whose diagnosed mismatches are counted in shared memory.",
								"When every entry holds a live key, mismatches of other keys are answered without member names.",
								&idem_diagnostics_tracked_keys,
								10000, 1, 10000000,
								PGC_POSTMASTER, 0,
								NULL, NULL, NULL);
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("idempotency.diagnostics_tracked_keys_per_database",
								"Number of entries of idempotency.diagnostics_tracked_keys that one database may hold.",
								"When a database holds that many live keys, mismatches of its other keys are answered without member names; other databases keep their room.",
								&idem_diagnostics_tracked_keys_per_database,
								2500, 1, 10000000,
								PGC_SIGHUP, 0,
								NULL, NULL, NULL);

	DefineCustomBoolVariable("idempotency.ddl_guard",
							 "Refuses DDL that would make claims wrong on the tables of keys and tombstones.",
							 "Off lets a superuser repair the tables by hand; see doc/operations.md.",
							 &idem_ddl_guard_on,
							 true,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	DefineCustomBoolVariable("idempotency.log_transitions",
							 "Logs one JSON line per state change of a key.",
							 NULL,
							 &idem_log_transitions,
							 false,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	DefineCustomBoolVariable("idempotency.audit",
							 "Appends every state change of a key to idempotency.events.",
							 NULL,
							 &idem_audit,
							 false,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_response_bytes",
							"Largest response body that is stored for replay.",
							"An endpoint may set its own limit.",
							&idem_max_response_bytes,
							256 * 1024, 0, MaxAllocSize / 2,
							PGC_SUSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomStringVariable("idempotency.extra_sensitive_headers",
							   "Response headers, besides Set-Cookie, Authorization and Proxy-Authorization, that are never stored or replayed.",
							   "A comma-separated list of header names; case does not matter.",
							   &idem_extra_sensitive_headers,
							   "",
							   PGC_SUSET, GUC_LIST_INPUT,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("idempotency.encryption_key",
							   "Key with which stored response bodies are encrypted.",
							   "Empty means that bodies are stored unencrypted.",
							   &idem_encryption_key_setting,
							   "",
							   PGC_SUSET,
							   GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE,
							   IdemEncryptionKeyCheck, IdemEncryptionKeyAssign,
							   IdemEncryptionKeyShow);

	DefineCustomIntVariable("idempotency.diagnostics_max_bytes",
							"Largest request digest kept with a key for mismatch diagnostics.",
							"A larger request is summarised at a coarser level until its digest fits.",
							&idem_diagnostics_max_bytes,
							1024, 64, 65536,
							PGC_SUSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.diagnostics_max_mismatches",
							"Diagnosed mismatches one key gets before its mismatch answers name no members.",
							"0 means that mismatch answers never name members.",
							&idem_diagnostics_max_mismatches,
							3, 0, 1000,
							PGC_SUSET, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.outbox_retention",
							"Time a finished operation of idempotency.outbox is kept.",
							"Maintenance removes operations that succeeded or failed longer ago, with their attempts; operations that need attention stay.",
							&idem_outbox_retention,
							7 * 24 * 60 * 60, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = IdemHideKeyStatements;

}

/*
 * Reserve the prefix idempotency: called by _PG_init once every setting is
 * defined, idempotency.tenant (tenant.c) included, since reserving it
 * throws away the value a role setting gave a placeholder not defined yet.
 */
void
IdemGucReservePrefix(void)
{
	MarkGUCPrefixReserved("idempotency");
}
