/*-------------------------------------------------------------------------
 *
 * endpoint.h
 *	  Per-endpoint policy (idempotency.endpoints), cached per backend.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_ENDPOINT_H
#define IDEM_ENDPOINT_H

#include "datatype/timestamp.h"

/*
 * Longest resolver name kept: the trigger stores a schema-qualified name
 * with its argument types, at most two quoted identifiers of NAMEDATALEN
 * and "(text,text,text)".
 */
#define IDEM_RESOLVER_NAME_MAX 1023

/*
 * JSON Pointers of members that mismatch answers never name
 * (idempotency.endpoints.diagnostics_redact): RFC 6901 text in UTF-8, "*"
 * as a whole token for any member or element.
 */
typedef struct IdemDiagRedaction
{
	int			n;
	char	  **pointers;
} IdemDiagRedaction;

typedef struct IdemEndpointPolicy
{
	bool		found;			/* a row exists for the endpoint */
	bool		has_ttl;
	Interval	ttl;
	bool		has_lease;
	Interval	lease;
	bool		resolve_on_expiry;	/* on_lease_expiry = 'resolve' */
	bool		has_resolver;	/* the row names a resolver */
	/* its canonical name (regprocedure text), found again at each call */
	char		resolver_name[IDEM_RESOLVER_NAME_MAX + 1];
	int			max_response_bytes; /* -1: the setting applies */
	bool		store_response;
	bool		diagnostics;	/* keeps request digests (default true) */
	bool		has_tombstone_ttl;	/* tombstone_ttl is set */
	bool		tombstones_on;	/* tombstone_ttl > 0 */
	bool		expired_conflict;	/* on_expired_reuse = 'conflict' */
	IdemDiagRedaction *diagnostics_redact;	/* NULL: none */
} IdemEndpointPolicy;

/*
 * A copy of an endpoint's redacted pointers in the current memory context
 * (the policy cache may be emptied while a claim runs); NULL for none.
 * Members at or under them are never named: see IdemDiagnose.
 */
extern IdemDiagRedaction *IdemDiagRedactionCopy(const IdemDiagRedaction *r);

/*
 * The policy of an endpoint; the defaults (found = false) when it has no
 * row.  The result points into a cache and stays valid until the next call.
 */
extern const IdemEndpointPolicy *IdemGetEndpointPolicy(const char *endpoint);

#endif							/* IDEM_ENDPOINT_H */
