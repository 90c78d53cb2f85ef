/*-------------------------------------------------------------------------
 *
 * sha256.c
 *	  SHA-256 as FIPS 180-4 defines it (section 6.2), written for this
 *	  extension: the hash of IdemFramedSha256 (keygen.c) and of a scope's
 *	  tombstone hash (tombstone_probe.c).  PostgreSQL's cryptohash.h goes
 *	  through OpenSSL's EVP interface, whose context creation, set-up,
 *	  finish and release cost more than the one or two compressions a
 *	  scope needs (about 6,800 instructions a hash, doc/benchmarks.md);
 *	  this one keeps its state on the stack, and a state can be copied, so
 *	  that a prefix the same for every call is absorbed once.  A block is
 *	  compressed with the CPU's SHA extensions where it has them (x86-64
 *	  SHA-NI, chosen at run time: about 200 instructions a block, and
 *	  fewer cycles), otherwise in portable C (about 3,300 instructions a
 *	  block; OpenSSL's assembly without the extensions about 2,040).
 *	  Valgrind hides the extensions from the CPU it emulates, so
 *	  callgrind counts the portable compression.  For long inputs, such
 *	  as request bodies, cryptohash.h stays the better choice.  No branch
 *	  or table lookup depends on the data.
 *
 *	  Test sha256 checks both compressions against the NIST examples and
 *	  PostgreSQL's sha256() over many lengths (every length around a block
 *	  boundary).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/builtins.h"

#include "compat.h"
#include "sha256.h"

/*
 * The compression with the CPU's SHA extensions, chosen at run time: on
 * x86-64 with a compiler that takes per-function targets (GCC, clang).
 */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#ifdef bit_SHA
#define IDEM_SHA256_NI
#endif
#endif

/* FIPS 180-4, 4.1.2; Ch and Maj in equivalent forms of three operations */
#define ROTR32(x, n)	(((x) >> (n)) | ((x) << (32 - (n))))
#define CH(x, y, z)		((z) ^ ((x) & ((y) ^ (z))))
#define MAJ(x, y, z)	(((x) & (y)) | ((z) & ((x) | (y))))
#define BSIG0(x)		(ROTR32(x, 2) ^ ROTR32(x, 13) ^ ROTR32(x, 22))
#define BSIG1(x)		(ROTR32(x, 6) ^ ROTR32(x, 11) ^ ROTR32(x, 25))
#define SSIG0(x)		(ROTR32(x, 7) ^ ROTR32(x, 18) ^ ((x) >> 3))
#define SSIG1(x)		(ROTR32(x, 17) ^ ROTR32(x, 19) ^ ((x) >> 10))

/* the first 32 bits of the fractional parts of the cube roots of the first 64 primes */
static const uint32 sha256_k[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5,
	0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
	0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc,
	0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
	0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
	0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3,
	0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5,
	0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
	0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2
};

/* the initial hash value: the square roots of the first 8 primes, likewise */
static const uint32 sha256_iv[8] = {
	0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
	0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19
};

static inline uint32
IdemLoadBE32(const uint8 *p)
{
	return ((uint32) p[0] << 24) | ((uint32) p[1] << 16) |
		((uint32) p[2] << 8) | (uint32) p[3];
}

static inline void
IdemStoreBE32(uint8 *p, uint32 v)
{
	p[0] = (uint8) (v >> 24);
	p[1] = (uint8) (v >> 16);
	p[2] = (uint8) (v >> 8);
	p[3] = (uint8) v;
}

/*
 * One round of 6.2.2 step 3 with the working variables renamed instead of
 * moved: h becomes the new a, d the new e.
 */
#define ROUND(a, b, c, d, e, f, g, h, i) \
	do { \
		uint32		t1_ = (h) + BSIG1(e) + CH(e, f, g) + sha256_k[i] + w[i]; \
		(d) += t1_; \
		(h) = t1_ + BSIG0(a) + MAJ(a, b, c); \
	} while (0)

/* one compression of the 64-byte block at p into h (FIPS 180-4, 6.2.2), portable */
static void
IdemSha256CompressPortable(uint32 h[8], const uint8 *p)
{
	uint32		w[64];
	uint32		a = h[0],
				b = h[1],
				c = h[2],
				d = h[3],
				e = h[4],
				f = h[5],
				g = h[6],
				hh = h[7];
	int			t;

	for (t = 0; t < 16; t++)
		w[t] = IdemLoadBE32(p + 4 * t);
	for (t = 16; t < 64; t++)
		w[t] = SSIG1(w[t - 2]) + w[t - 7] + SSIG0(w[t - 15]) + w[t - 16];
	for (t = 0; t < 64; t += 8)
	{
		ROUND(a, b, c, d, e, f, g, hh, t);
		ROUND(hh, a, b, c, d, e, f, g, t + 1);
		ROUND(g, hh, a, b, c, d, e, f, t + 2);
		ROUND(f, g, hh, a, b, c, d, e, t + 3);
		ROUND(e, f, g, hh, a, b, c, d, t + 4);
		ROUND(d, e, f, g, hh, a, b, c, t + 5);
		ROUND(c, d, e, f, g, hh, a, b, t + 6);
		ROUND(b, c, d, e, f, g, hh, a, t + 7);
	}
	h[0] += a;
	h[1] += b;
	h[2] += c;
	h[3] += d;
	h[4] += e;
	h[5] += f;
	h[6] += g;
	h[7] += hh;
	/* the first block of a keyed hash holds key bytes */
	explicit_bzero(w, sizeof(w));
}

#ifdef IDEM_SHA256_NI

/*
 * Rounds 4i to 4i + 3, the message words W[t..t+3] (t = 4i) made first
 * from W[t-16..t-13], W[t-15..t-12], W[t-7..t-4] and W[t-2..t-1] (in w,
 * four words an element, as a ring) once past the block's own.
 */
#define NI_STEP(i) \
	do { \
		__m128i		m_; \
		if ((i) < 4) \
			w[(i) & 3] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *) (p + 16 * (i))), bswap); \
		else \
		{ \
			m_ = _mm_sha256msg1_epu32(w[(i) & 3], w[((i) + 1) & 3]); \
			m_ = _mm_add_epi32(m_, _mm_alignr_epi8(w[((i) + 3) & 3], w[((i) + 2) & 3], 4)); \
			w[(i) & 3] = _mm_sha256msg2_epu32(m_, w[((i) + 3) & 3]); \
		} \
		m_ = _mm_add_epi32(w[(i) & 3], _mm_loadu_si128((const __m128i *) &sha256_k[4 * (i)])); \
		st1 = _mm_sha256rnds2_epu32(st1, st0, m_); \
		st0 = _mm_sha256rnds2_epu32(st0, st1, _mm_shuffle_epi32(m_, 0x0E)); \
	} while (0)

/*
 * One compression with the CPU's SHA extensions (x86-64: SHA-NI, with
 * SSSE3 and SSE4.1), four rounds a step: the same function as the
 * portable one, in a few hundred cycles instead of some three thousand
 * instructions.  The state goes in as the two halves the instructions
 * take (ABEF, CDGH) and comes back as h.
 */
__attribute__((target("sha,sse4.1,ssse3")))
static void
IdemSha256CompressNI(uint32 h[8], const uint8 *p)
{
	const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
	__m128i		w[4];
	__m128i		tmp = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *) &h[0]), 0xB1);
	__m128i		st1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *) &h[4]), 0x1B);
	__m128i		st0 = _mm_alignr_epi8(tmp, st1, 8); /* ABEF */
	__m128i		abef;
	__m128i		cdgh;

	st1 = _mm_blend_epi16(st1, tmp, 0xF0);	/* CDGH */
	abef = st0;
	cdgh = st1;
	NI_STEP(0);
	NI_STEP(1);
	NI_STEP(2);
	NI_STEP(3);
	NI_STEP(4);
	NI_STEP(5);
	NI_STEP(6);
	NI_STEP(7);
	NI_STEP(8);
	NI_STEP(9);
	NI_STEP(10);
	NI_STEP(11);
	NI_STEP(12);
	NI_STEP(13);
	NI_STEP(14);
	NI_STEP(15);
	st0 = _mm_add_epi32(st0, abef);
	st1 = _mm_add_epi32(st1, cdgh);
	tmp = _mm_shuffle_epi32(st0, 0x1B); /* ABEF to FEBA */
	st1 = _mm_shuffle_epi32(st1, 0xB1); /* CDGH to DCHG */
	_mm_storeu_si128((__m128i *) &h[0], _mm_blend_epi16(tmp, st1, 0xF0));
	_mm_storeu_si128((__m128i *) &h[4], _mm_alignr_epi8(st1, tmp, 8));
	/* the first block of a keyed hash holds key bytes */
	explicit_bzero(w, sizeof(w));
}

/* whether the CPU has the SHA extensions (and SSSE3, SSE4.1): -1 unknown */
static int	sha256_ni = -1;

static bool
IdemSha256HasNI(void)
{
	if (sha256_ni < 0)
	{
		unsigned int eax,
					ebx,
					ecx,
					edx;
		bool		sse = __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
			(ecx & bit_SSSE3) != 0 && (ecx & bit_SSE4_1) != 0;

		sha256_ni = 0;
		if (sse && __get_cpuid_max(0, NULL) >= 7)
		{
			__cpuid_count(7, 0, eax, ebx, ecx, edx);
			sha256_ni = (ebx & bit_SHA) != 0;
		}
	}
	return sha256_ni > 0;
}
#endif							/* IDEM_SHA256_NI */

/* for test sha256: the portable compression even where the CPU has SHA */
static bool sha256_force_portable = false;

static inline void
IdemSha256Compress(uint32 h[8], const uint8 *p)
{
#ifdef IDEM_SHA256_NI
	if (!sha256_force_portable && IdemSha256HasNI())
	{
		IdemSha256CompressNI(h, p);
		return;
	}
#endif
	IdemSha256CompressPortable(h, p);
}

void
IdemSha256Init(IdemSha256 *s)
{
	memcpy(s->h, sha256_iv, sizeof(s->h));
	s->len = 0;
}

void
IdemSha256Update(IdemSha256 *s, const void *data, size_t len)
{
	const uint8 *p = (const uint8 *) data;
	size_t		used = (size_t) (s->len % IDEM_SHA256_BLOCK_LEN);

	s->len += len;
	if (used > 0)
	{
		size_t		take = Min(len, IDEM_SHA256_BLOCK_LEN - used);

		memcpy(s->buf + used, p, take);
		p += take;
		len -= take;
		if (used + take < IDEM_SHA256_BLOCK_LEN)
			return;
		IdemSha256Compress(s->h, s->buf);
	}
	while (len >= IDEM_SHA256_BLOCK_LEN)
	{
		IdemSha256Compress(s->h, p);
		p += IDEM_SHA256_BLOCK_LEN;
		len -= IDEM_SHA256_BLOCK_LEN;
	}
	if (len > 0)
		memcpy(s->buf, p, len);
}

void
IdemSha256UpdateFramed(IdemSha256 *s, const void *data, uint32 len)
{
	uint8		framed[4];

	IdemStoreBE32(framed, len);
	IdemSha256Update(s, framed, 4);
	if (len > 0)
		IdemSha256Update(s, data, len);
}

void
IdemSha256Final(IdemSha256 *s, uint8 out[IDEM_SHA256_LEN])
{
	uint64		bits = s->len * 8;
	size_t		used = (size_t) (s->len % IDEM_SHA256_BLOCK_LEN);
	int			i;

	/* a 1 bit, zeros to 56 bytes of a block, the length in bits (5.1.1) */
	s->buf[used++] = 0x80;
	if (used > IDEM_SHA256_BLOCK_LEN - 8)
	{
		memset(s->buf + used, 0, IDEM_SHA256_BLOCK_LEN - used);
		IdemSha256Compress(s->h, s->buf);
		used = 0;
	}
	memset(s->buf + used, 0, IDEM_SHA256_BLOCK_LEN - 8 - used);
	IdemStoreBE32(s->buf + 56, (uint32) (bits >> 32));
	IdemStoreBE32(s->buf + 60, (uint32) bits);
	IdemSha256Compress(s->h, s->buf);
	for (i = 0; i < 8; i++)
		IdemStoreBE32(out + 4 * i, s->h[i]);
	explicit_bzero(s, sizeof(*s));
}

/*
 * The digest of this SHA-256 for test sha256, the input absorbed in pieces
 * of uneven sizes, so that the buffering of Update is tested too.
 */
static bytea *
IdemSha256TestDigest(bytea *in)
{
	const uint8 *p = (const uint8 *) VARDATA_ANY(in);
	size_t		len = VARSIZE_ANY_EXHDR(in);
	size_t		piece = 1;
	bytea	   *out = palloc(VARHDRSZ + IDEM_SHA256_LEN);
	IdemSha256	s;

	IdemSha256Init(&s);
	while (len > 0)
	{
		size_t		n = Min(piece, len);

		IdemSha256Update(&s, p, n);
		p += n;
		len -= n;
		piece = piece * 3 + 1;
	}
	SET_VARSIZE(out, VARHDRSZ + IDEM_SHA256_LEN);
	IdemSha256Final(&s, (uint8 *) VARDATA(out));
	return out;
}

PG_FUNCTION_INFO_V1(idem_sha256_test);

/*
 * idem_sha256_test(bytea) RETURNS bytea: the digest of this SHA-256, with
 * the CPU's SHA extensions where it has them, for test sha256 only (it
 * declares the function in pg_temp; no SQL object of the extension names
 * it).
 */
Datum
idem_sha256_test(PG_FUNCTION_ARGS)
{
	PG_RETURN_BYTEA_P(IdemSha256TestDigest(PG_GETARG_BYTEA_PP(0)));
}

PG_FUNCTION_INFO_V1(idem_sha256_test_portable);

/*
 * idem_sha256_test_portable(bytea) RETURNS bytea: the same with the
 * portable compression, whatever the CPU has (test sha256 only).
 */
Datum
idem_sha256_test_portable(PG_FUNCTION_ARGS)
{
	bytea	   *in = PG_GETARG_BYTEA_PP(0);
	bytea	   *out;

	/* an error in between would leave only a slower path of the same output */
	sha256_force_portable = true;
	out = IdemSha256TestDigest(in);
	sha256_force_portable = false;
	PG_RETURN_BYTEA_P(out);
}
