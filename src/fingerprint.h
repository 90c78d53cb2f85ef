/*-------------------------------------------------------------------------
 *
 * fingerprint.h
 *	  Request fingerprints: SHA-256 over a versioned framing of the HTTP
 *	  method, the path and the RFC 8785 canonical body.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FINGERPRINT_H
#define FINGERPRINT_H

#include "postgres.h"

#include "canonical_json.h"

#define IDEM_FINGERPRINT_LEN 32

/* first line of the framing; a new layout gets a new version */
#define IDEM_FINGERPRINT_MAGIC "idem-fingerprint-v1\n"

/*
 * SHA-256 of IDEM_FINGERPRINT_MAGIC, METHOD (upper-cased), "\n", path, "\n"
 * and the canonical body (nothing when body is NULL) into digest.  The
 * method must be an HTTP token and the path free of control characters
 * (error IK400 otherwise).
 */
extern void IdemFingerprint(const char *method, const char *path, Jsonb *body,
							const IdemExclusions *ex, uint8 *digest);

#endif							/* FINGERPRINT_H */
