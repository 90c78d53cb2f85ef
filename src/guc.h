/*-------------------------------------------------------------------------
 *
 * guc.h
 *	  Configuration settings (idempotency.*) of the idempotency extension.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_GUC_H
#define IDEM_GUC_H

/* core: claims and key lifetime (seconds / milliseconds) */
extern int	idem_default_ttl;
extern int	idem_max_ttl;
extern int	idem_claim_wait;
extern int	idem_partition_interval;
extern int	idem_max_claims_per_transaction;

/* tombstones of expired keys (seconds) */
extern int	idem_tombstone_ttl;
extern int	idem_tombstone_partition_interval;
extern int	idem_tombstone_filter_memory;
extern int	idem_tombstone_filter_entries;

/* the longest idempotency.tombstone_ttl and endpoints.tombstone_ttl: 10 years */
#define IDEM_TOMBSTONE_TTL_MAX	(10 * 365 * 24 * 60 * 60)

/* entries of the shared table of key horizons (src/horizon.c) */
extern int	idem_horizon_entries;

/* maintenance */
extern bool idem_enable_worker;
extern int	idem_outbox_retention;	/* seconds (src/maint_outbox.c) */
extern int	idem_maintenance_interval;
extern int	idem_resolver_timeout;

/* the DDL guard of the extension's tables (src/ddl_guard.c) */
extern bool idem_ddl_guard_on;

/* observability and response storage */
extern int	idem_stats_max_endpoints;
extern bool idem_log_transitions;
extern bool idem_audit;
extern int	idem_max_response_bytes;
extern char *idem_extra_sensitive_headers;
extern char *idem_encryption_key;

/*
 * Changes whenever idempotency.encryption_key is assigned: what a backend
 * derived from the key (tombstone_probe.c) is derived again.
 */
extern uint64 idem_encryption_key_generation;
extern int	idem_diagnostics_max_bytes;
extern int	idem_diagnostics_max_mismatches;
extern int	idem_diagnostics_tracked_keys;
extern int	idem_diagnostics_tracked_keys_per_database;

extern void IdemGucInit(void);
extern void IdemGucReservePrefix(void);
extern void IdemGucReservePrefix(void);

#endif							/* IDEM_GUC_H */
