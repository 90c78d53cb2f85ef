/*-------------------------------------------------------------------------
 *
 * siphash.c
 *	  SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input
 *	  PRF", 2012), as in its reference implementation: the keyed hash of a
 *	  scope's lock tag (scope.c).  A few dozen cycles for a scope, so that
 *	  keying costs a claim next to nothing.  Checked against the reference
 *	  implementation's vectors (key 00..0f, message 00..n-1) when written:
 *	  0x726fdb47dd0e0e31 for n = 0, 0x93f5f5799a932462 for n = 8 and
 *	  0xa129ca6149be45e5 for n = 15.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"

#include "siphash.h"

#define ROTL64(x, b)	(uint64) (((x) << (b)) | ((x) >> (64 - (b))))

#define SIPROUND \
	do { \
		v0 += v1; v1 = ROTL64(v1, 13); v1 ^= v0; v0 = ROTL64(v0, 32); \
		v2 += v3; v3 = ROTL64(v3, 16); v3 ^= v2; \
		v0 += v3; v3 = ROTL64(v3, 21); v3 ^= v0; \
		v2 += v1; v1 = ROTL64(v1, 17); v1 ^= v2; v2 = ROTL64(v2, 32); \
	} while (0)

/* 8 bytes, little-endian, whatever the machine's order */
static inline uint64
IdemLoadLE64(const uint8 *p)
{
	return (uint64) p[0] | ((uint64) p[1] << 8) | ((uint64) p[2] << 16) |
		((uint64) p[3] << 24) | ((uint64) p[4] << 32) | ((uint64) p[5] << 40) |
		((uint64) p[6] << 48) | ((uint64) p[7] << 56);
}

uint64
IdemSipHash24(const uint8 key[IDEM_SIPHASH_KEY_LEN], const void *data,
			  size_t len)
{
	const uint8 *in = (const uint8 *) data;
	const uint8 *end = in + len - (len % 8);
	uint64		k0 = IdemLoadLE64(key);
	uint64		k1 = IdemLoadLE64(key + 8);
	uint64		v0 = UINT64CONST(0x736f6d6570736575) ^ k0;
	uint64		v1 = UINT64CONST(0x646f72616e646f6d) ^ k1;
	uint64		v2 = UINT64CONST(0x6c7967656e657261) ^ k0;
	uint64		v3 = UINT64CONST(0x7465646279746573) ^ k1;
	uint64		b = ((uint64) len) << 56;
	uint64		m;
	int			left = len & 7;

	for (; in != end; in += 8)
	{
		m = IdemLoadLE64(in);
		v3 ^= m;
		SIPROUND;
		SIPROUND;
		v0 ^= m;
	}
	switch (left)
	{
		case 7:
			b |= ((uint64) in[6]) << 48;
			/* FALLTHROUGH */
		case 6:
			b |= ((uint64) in[5]) << 40;
			/* FALLTHROUGH */
		case 5:
			b |= ((uint64) in[4]) << 32;
			/* FALLTHROUGH */
		case 4:
			b |= ((uint64) in[3]) << 24;
			/* FALLTHROUGH */
		case 3:
			b |= ((uint64) in[2]) << 16;
			/* FALLTHROUGH */
		case 2:
			b |= ((uint64) in[1]) << 8;
			/* FALLTHROUGH */
		case 1:
			b |= ((uint64) in[0]);
			break;
		case 0:
			break;
	}
	v3 ^= b;
	SIPROUND;
	SIPROUND;
	v0 ^= b;
	v2 ^= 0xff;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}
