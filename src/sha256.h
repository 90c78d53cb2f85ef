/*-------------------------------------------------------------------------
 *
 * sha256.h
 *	  SHA-256 (FIPS 180-4) of the extension's own, for the short framed
 *	  hashes of a claim's path (the tombstone hash of a scope, the key
 *	  hash): no digest context to create, initialise and free, and a state
 *	  that can be copied, so that a prefix the same for every call (a label
 *	  and a key) is absorbed once and its state reused.  The same output as
 *	  PostgreSQL's sha256() for every input (test sha256).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_SHA256_H
#define IDEM_SHA256_H

#define IDEM_SHA256_LEN			32
#define IDEM_SHA256_BLOCK_LEN	64

typedef struct IdemSha256
{
	uint32		h[8];			/* the chaining value */
	uint64		len;			/* bytes absorbed, with those in buf */
	uint8		buf[IDEM_SHA256_BLOCK_LEN]; /* a block not yet compressed */
} IdemSha256;

extern void IdemSha256Init(IdemSha256 *s);
extern void IdemSha256Update(IdemSha256 *s, const void *data, size_t len);

/* the digest into out; the state is zeroed (it may hold a key) */
extern void IdemSha256Final(IdemSha256 *s, uint8 out[IDEM_SHA256_LEN]);

/* the 4-byte big-endian length then the bytes: one part of a framed input */
extern void IdemSha256UpdateFramed(IdemSha256 *s, const void *data, uint32 len);

#endif							/* IDEM_SHA256_H */
