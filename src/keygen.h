/*-------------------------------------------------------------------------
 *
 * keygen.h
 *	  Key helpers: keys minted server-side (UUIDv7, ULID, random token),
 *	  keys derived for downstream calls, and the hash under which a key
 *	  appears in logs and in the audit trail.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEYGEN_H
#define IDEM_KEYGEN_H

#include "common/sha2.h"

/* hex characters of a key hash (the first 8 bytes of the scope's SHA-256) */
#define IDEM_KEY_HASH_LEN	16

/*
 * SHA-256 over a label and nparts strings, each preceded by its length as
 * 4 bytes big-endian, so that no two different lists of strings give the
 * same input.  Raises an error only when the hash library fails.
 */
extern void IdemFramedSha256(const char *label, int nparts,
							 const char *const *parts, const int *lens,
							 uint8 out[PG_SHA256_DIGEST_LENGTH]);

/*
 * The hash of a key within its scope, as IDEM_KEY_HASH_LEN hex characters
 * and a terminating zero written to out: what logs and idempotency.events
 * show instead of the key.
 */
extern void IdemKeyHash(const char *tenant, int tenant_len,
						const char *endpoint, int endpoint_len,
						const char *key, int key_len,
						char out[IDEM_KEY_HASH_LEN + 1]);

#endif							/* IDEM_KEYGEN_H */
