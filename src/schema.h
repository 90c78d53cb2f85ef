/*-------------------------------------------------------------------------
 *
 * schema.h
 *	  The version of the extension's SQL objects installed in the database
 *	  (pg_extension.extversion), which may be older than the library until
 *	  ALTER EXTENSION idempotency UPDATE, and what each version brought that
 *	  the library branches on.  Every such branch names its feature here.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_SCHEMA_H
#define IDEM_SCHEMA_H

#include "postgres.h"

/* the versions of the install scripts, in order */
typedef enum IdemSchema
{
	IDEM_SCHEMA_0_1 = 1,
	IDEM_SCHEMA_0_2,
	IDEM_SCHEMA_0_3,
	IDEM_SCHEMA_0_4
} IdemSchema;

/* the version this library's own install script makes */
#define IDEM_SCHEMA_LIBRARY			IDEM_SCHEMA_0_4

/*
 * What the library branches on, by the version that brought it.
 *
 * 0.3.0: tombstones (the table idempotency.tombstones, the columns
 *		  tombstone_ttl and on_expired_reuse of endpoints); mismatch
 *		  diagnostics (the column keys.request_digest, the table
 *		  diagnostics_secret, the column endpoints.diagnostics).
 * 0.4.0: endpoints.resolver is text (regprocedure before); the column
 *		  endpoints.diagnostics_redact; the column tombstones.tenant, by
 *		  which the Citus mode distributes tombstones; the outbox (the
 *		  tables idempotency.outbox and outbox_attempts).
 */
#define IDEM_SCHEMA_TOMBSTONES		IDEM_SCHEMA_0_3
#define IDEM_SCHEMA_DIAGNOSTICS		IDEM_SCHEMA_0_3
#define IDEM_SCHEMA_RESOLVER_TEXT	IDEM_SCHEMA_0_4
#define IDEM_SCHEMA_REDACTION		IDEM_SCHEMA_0_4
#define IDEM_SCHEMA_HORIZONS		IDEM_SCHEMA_0_4
#define IDEM_SCHEMA_CITUS_TOMBSTONES	IDEM_SCHEMA_0_4
#define IDEM_SCHEMA_OUTBOX			IDEM_SCHEMA_0_4

/*
 * The installed version, read from pg_extension once per backend and again
 * after a relcache invalidation (see schema.c).
 */
extern IdemSchema IdemSchemaVersion(void);

/* whether the installed schema has what version v brought */
static inline bool
IdemSchemaHas(IdemSchema v)
{
	return IdemSchemaVersion() >= v;
}

#endif							/* IDEM_SCHEMA_H */
