/*-------------------------------------------------------------------------
 *
 * guc.c
 *	  Definition of every idempotency.* configuration setting.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "guc.h"

int			idem_default_ttl = 24 * 60 * 60;
int			idem_max_ttl = 7 * 24 * 60 * 60;
int			idem_claim_wait = 0;
int			idem_partition_interval = 24 * 60 * 60;
int			idem_max_claims_per_transaction = 1000;

bool		idem_enable_worker = true;
int			idem_maintenance_interval = 60;
int			idem_resolver_timeout = 2000;

int			idem_stats_max_endpoints = 1000;
bool		idem_log_transitions = false;
bool		idem_audit = false;
int			idem_max_response_bytes = 256 * 1024;
char	   *idem_extra_sensitive_headers = NULL;
char	   *idem_encryption_key = NULL;

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
		DefineCustomIntVariable("idempotency.stats_max_endpoints",
								"Number of endpoints whose counters are kept in shared memory.",
								NULL,
								&idem_stats_max_endpoints,
								1000, 1, 1000000,
								PGC_POSTMASTER, 0,
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
							   &idem_encryption_key,
							   "",
							   PGC_SUSET,
							   GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE,
							   NULL, NULL, NULL);

	MarkGUCPrefixReserved("idempotency");
}
