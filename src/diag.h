/*-------------------------------------------------------------------------
 *
 * diag.h
 *	  Mismatch diagnostics: a keyed structural digest of a request, kept
 *	  with its key, and the comparison that names the members in which a
 *	  reused key's request differs, without any value being stored.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_DIAG_H
#define IDEM_DIAG_H

#include "utils/jsonb.h"

#include "endpoint.h"
#include "scope.h"

/* the longest digest a claim accepts: the largest the setting allows */
#define IDEM_DIAG_HARD_MAX_BYTES	65536

/*
 * Check a digest given to a claim: its structure, and that it was made for
 * this scope under the current secret.  Raises IK400 otherwise.
 */
extern void IdemDiagnosticsCheck(const IdemScope *scope, const bytea *digest);

/*
 * What differs between the digest stored with a key and the digest of a
 * reused key's request, as a jsonb object {"changed": [...], "added":
 * [...], "removed": [...], "method": bool, "path": bool, "truncated":
 * bool}; NULL when the two cannot be compared (made for another scope or
 * under another secret).  Members at or under a pointer of redact are
 * never named, and a member above one is not named for a difference its
 * digests cannot place outside the redacted member.
 */
extern Jsonb *IdemDiagnose(const bytea *stored, const bytea *given,
						   const IdemDiagRedaction *redact);

#endif							/* IDEM_DIAG_H */
