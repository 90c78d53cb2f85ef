/*-------------------------------------------------------------------------
 *
 * number_format.c
 *	  ECMAScript number serialization, which RFC 8785 adopts: the shortest
 *	  decimal digits that read back as the same IEEE-754 double (the closest
 *	  of them when several have that length), laid out as Number::toString
 *	  does ("1e+21", "1e-7", "0.000001", "100").
 *
 *	  Three paths, fastest first:
 *	  - integers below 2^53 are printed as integers;
 *	  - decimal text with at most 15 significant digits and a moderate
 *		exponent is laid out from its own digits: every such decimal is the
 *		unique shortest representation of its nearest double (15 digits is
 *		DBL_DIG: distinct 15-digit decimals give distinct doubles), so no
 *		binary conversion is needed;
 *	  - everything else goes through the double and the Ryu algorithm (Ulf
 *		Adams, "Ryu: fast float-to-string conversion", PLDI 2018), written
 *		here from the paper's description.  Its tables of 125-bit powers of
 *		five are computed once per backend with a small bignum (about
 *		250,000 instructions) instead of being pasted in.
 *
 *	  PostgreSQL's own Ryu (common/shortest_dec.h, behind float8out) would
 *	  give other digits for some doubles: it is built with STRICTLY_SHORTEST
 *	  off (common/ryu_common.h), so it never picks a decimal that lies
 *	  exactly halfway to a neighbouring double.  When the double's
 *	  significand is even such a decimal still reads back as that double
 *	  (ties round to even), and Number::toString takes it when it is the
 *	  shortest.  Those doubles, and only those, get one digit or more from
 *	  core than here: 1e23 is "9.999999999999999e+22" there, 2^54 + 8 is
 *	  18014398509481992 there and 18014398509481990 here.  They are 182 of
 *	  the 100,000 vectors of test/data, about 3 in 10,000 random bit
 *	  patterns, 5% of the integers between 2^53 and 2^64; a comparison of
 *	  45 million doubles (random bit patterns, subnormals, powers of 2 and
 *	  10 with their neighbours, short decimals; PostgreSQL 15 and 18) found
 *	  no other difference (test/bench/number_digits.c, notes.md there).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>
#include <string.h>

#include "port/pg_bitutils.h"

#include "compat.h"
#include "number_format.h"

#define DOUBLE_MANTISSA_BITS	52
#define DOUBLE_EXPONENT_BITS	11
#define DOUBLE_BIAS				1023

#define POW5_INV_BITCOUNT		125
#define POW5_BITCOUNT			125
#define POW5_INV_TABLE_SIZE		342
#define POW5_TABLE_SIZE			326

/* 5^i scaled to 125 bits, and 2^(bits(5^i) - 1 + 125) / 5^i + 1, as lo/hi */
static uint64 pow5_split[POW5_TABLE_SIZE][2];
static uint64 pow5_inv_split[POW5_INV_TABLE_SIZE][2];
static bool tables_ready = false;

/* ---------- table construction (once per backend) ---------- */

#define BIG_LIMBS 32			/* 1024 bits: 5^341 has 792 */

typedef struct Big
{
	uint32		d[BIG_LIMBS];	/* little-endian limbs */
	int			n;				/* limbs in use */
} Big;

static void
IdemBigSetSmall(Big *b, uint32 v)
{
	memset(b->d, 0, sizeof(b->d));
	b->d[0] = v;
	b->n = 1;
}

static void
IdemBigMulSmall(Big *b, uint32 f)
{
	uint64		carry = 0;

	for (int i = 0; i < b->n; i++)
	{
		uint64		t = (uint64) b->d[i] * f + carry;

		b->d[i] = (uint32) t;
		carry = t >> 32;
	}
	if (carry)
		b->d[b->n++] = (uint32) carry;
}

static int
IdemBigBitlen(const Big *b)
{
	int			n = b->n;

	while (n > 0 && b->d[n - 1] == 0)
		n--;
	if (n == 0)
		return 0;
	return 32 * (n - 1) + pg_leftmost_one_pos32(b->d[n - 1]) + 1;
}

/* the 32 bits of b starting at bit position pos */
static uint32
IdemBigWordAt(const Big *b, int pos)
{
	int			limb = pos / 32;
	int			sh = pos % 32;
	uint64		lo = (limb < BIG_LIMBS) ? b->d[limb] : 0;
	uint64		hi = (limb + 1 < BIG_LIMBS) ? b->d[limb + 1] : 0;

	return (uint32) (((hi << 32) | lo) >> sh);
}

/* (b >> shift) truncated to 128 bits, as lo/hi */
static void
IdemBigShr128(const Big *b, int shift, uint64 *out)
{
	out[0] = (uint64) IdemBigWordAt(b, shift) |
		((uint64) IdemBigWordAt(b, shift + 32) << 32);
	out[1] = (uint64) IdemBigWordAt(b, shift + 64) |
		((uint64) IdemBigWordAt(b, shift + 96) << 32);
}

/* b = floor(b / f) */
static void
IdemBigDivSmall(Big *b, uint32 f)
{
	uint64		rem = 0;

	for (int i = b->n - 1; i >= 0; i--)
	{
		uint64		t = (rem << 32) | b->d[i];

		b->d[i] = (uint32) (t / f);
		rem = t % f;
	}
}

static void
IdemBuildTables(void)
{
	Big			p5;
	Big			inv;

	/*
	 * p5 is 5^i; inv is floor(2^1023 / 5^i), kept by dividing by 5 at each
	 * step (floor(floor(x / a) / b) is floor(x / ab)), so that shifting it
	 * right gives floor(2^k / 5^i) for any k up to 1023.
	 */
	IdemBigSetSmall(&p5, 1);
	memset(&inv, 0, sizeof(inv));
	inv.d[BIG_LIMBS - 1] = (uint32) 1 << 31;
	inv.n = BIG_LIMBS;
	for (int i = 0; i < POW5_INV_TABLE_SIZE; i++)
	{
		int			bits = IdemBigBitlen(&p5);
		uint64	   *q = pow5_inv_split[i];

		if (i < POW5_TABLE_SIZE)
		{
			if (bits <= POW5_BITCOUNT)
			{
				/* 5^i < 2^125: shift left; it fits in 128 bits */
				uint64		v[2];
				int			sh = POW5_BITCOUNT - bits;

				IdemBigShr128(&p5, 0, v);
				if (sh >= 64)
				{
					v[1] = v[0] << (sh - 64);
					v[0] = 0;
				}
				else if (sh > 0)
				{
					v[1] = (v[1] << sh) | (v[0] >> (64 - sh));
					v[0] <<= sh;
				}
				pow5_split[i][0] = v[0];
				pow5_split[i][1] = v[1];
			}
			else
				IdemBigShr128(&p5, bits - POW5_BITCOUNT, pow5_split[i]);
		}

		/* floor(2^(bits - 1 + 125) / 5^i) + 1; no carry out: it is <= 2^125 */
		IdemBigShr128(&inv, 32 * BIG_LIMBS - 1 - (bits - 1 + POW5_INV_BITCOUNT), q);
		if (++q[0] == 0)
			q[1]++;

		IdemBigDivSmall(&inv, 5);
		IdemBigMulSmall(&p5, 5);
	}
	tables_ready = true;
}

/* ---------- Ryu ---------- */

/* ceil(log2(5^e)) for 1 <= e <= 3528, and 1 for e = 0 */
static inline int
IdemPow5bits(int e)
{
	return (int) ((((uint32) e) * 1217359) >> 19) + 1;
}

/* floor(log10(2^e)) for 0 <= e <= 1650 */
static inline int
IdemLog10Pow2(int e)
{
	return (int) ((((uint32) e) * 78913) >> 18);
}

/* floor(log10(5^e)) for 0 <= e <= 2620 */
static inline int
IdemLog10Pow5(int e)
{
	return (int) ((((uint32) e) * 732923) >> 20);
}

static inline int
IdemPow5Factor(uint64 v)
{
	int			count = 0;

	while (v % 5 == 0)
	{
		v /= 5;
		count++;
	}
	return count;
}

static inline bool
IdemMultipleOfPow5(uint64 v, int p)
{
	return IdemPow5Factor(v) >= p;
}

static inline bool
IdemMultipleOfPow2(uint64 v, int p)
{
	return (v & ((UINT64CONST(1) << p) - 1)) == 0;
}

/* (m * mul) >> j, mul a 128-bit lo/hi pair, 64 <= j */
static inline uint64
IdemMulShift64(uint64 m, const uint64 *mul, int j)
{
#ifdef HAVE_INT128
	uint128		b0 = (uint128) m * mul[0];
	uint128		b2 = (uint128) m * mul[1];

	return (uint64) (((b0 >> 64) + b2) >> (j - 64));
#else
	/* portable 64x128 multiply, keeping the bits above 2^64 */
	uint64		a_lo = (uint32) m,
				a_hi = m >> 32;
	uint64		parts[2][2];	/* [word of mul][hi,lo of product] */
	uint64		lo,
				mid;

	for (int w = 0; w < 2; w++)
	{
		uint64		b_lo = (uint32) mul[w],
					b_hi = mul[w] >> 32;
		uint64		ll = a_lo * b_lo,
					lh = a_lo * b_hi,
					hl = a_hi * b_lo,
					hh = a_hi * b_hi;
		uint64		cross = (ll >> 32) + (uint32) lh + (uint32) hl;

		parts[w][1] = (cross << 32) | (uint32) ll;
		parts[w][0] = hh + (lh >> 32) + (hl >> 32) + (cross >> 32);
	}
	/* product = parts[0] + parts[1] << 64; we want bits from 64 upward */
	lo = parts[0][0] + parts[1][1];
	mid = parts[1][0] + (lo < parts[0][0]);
	if (j - 64 >= 64)
		return mid >> (j - 128);
	if (j == 64)
		return lo;
	return (lo >> (j - 64)) | (mid << (128 - j));
#endif
}

static inline int
IdemDecimalLength(uint64 v)
{
	int			n = 1;
	uint64		p = 10;

	/* v < 10^17 here */
	while (n < 20 && v >= p)
	{
		n++;
		p *= 10;
	}
	return n;
}

/*
 * Shortest (and closest) decimal for a positive finite double given by its
 * IEEE fields: returns the digits as an integer, and *exp10 such that the
 * value is digits * 10^exp10.
 */
static uint64
IdemRyuShortest(uint64 ieee_mantissa, uint32 ieee_exponent, int *exp10)
{
	int			e2;
	uint64		m2;
	bool		even,
				accept_bounds;
	uint64		mv;
	uint32		mm_shift;
	uint64		vr,
				vp,
				vm;
	int			e10;
	bool		vm_trailing_zeros = false;
	bool		vr_trailing_zeros = false;
	int			removed = 0;
	uint8		last_removed = 0;
	uint64		output;

	if (ieee_exponent == 0)
	{
		e2 = 1 - DOUBLE_BIAS - DOUBLE_MANTISSA_BITS - 2;
		m2 = ieee_mantissa;
	}
	else
	{
		e2 = (int) ieee_exponent - DOUBLE_BIAS - DOUBLE_MANTISSA_BITS - 2;
		m2 = (UINT64CONST(1) << DOUBLE_MANTISSA_BITS) | ieee_mantissa;
	}
	even = (m2 & 1) == 0;
	accept_bounds = even;

	/* the value is mv * 2^e2; its neighbours' midpoints are mp and mm */
	mv = 4 * m2;
	mm_shift = (ieee_mantissa != 0 || ieee_exponent <= 1) ? 1 : 0;

	if (e2 >= 0)
	{
		int			q = IdemLog10Pow2(e2) - (e2 > 3);
		int			k = POW5_INV_BITCOUNT + IdemPow5bits(q) - 1;
		int			i = -e2 + q + k;

		e10 = q;
		vr = IdemMulShift64(4 * m2, pow5_inv_split[q], i);
		vp = IdemMulShift64(4 * m2 + 2, pow5_inv_split[q], i);
		vm = IdemMulShift64(4 * m2 - 1 - mm_shift, pow5_inv_split[q], i);
		if (q <= 21)
		{
			/* at most one of mv, mp, mm is a multiple of 5 */
			if (mv % 5 == 0)
				vr_trailing_zeros = IdemMultipleOfPow5(mv, q);
			else if (accept_bounds)
				vm_trailing_zeros = IdemMultipleOfPow5(mv - 1 - mm_shift, q);
			else
				vp -= IdemMultipleOfPow5(mv + 2, q);
		}
	}
	else
	{
		int			q = IdemLog10Pow5(-e2) - (-e2 > 1);
		int			i = -e2 - q;
		int			k = IdemPow5bits(i) - POW5_BITCOUNT;
		int			j = q - k;

		e10 = q + e2;
		vr = IdemMulShift64(4 * m2, pow5_split[i], j);
		vp = IdemMulShift64(4 * m2 + 2, pow5_split[i], j);
		vm = IdemMulShift64(4 * m2 - 1 - mm_shift, pow5_split[i], j);
		if (q <= 1)
		{
			/* mv has at least two trailing zero bits, so vr is exact */
			vr_trailing_zeros = true;
			if (accept_bounds)
				vm_trailing_zeros = mm_shift == 1;
			else
				--vp;
		}
		else if (q < 63)
			vr_trailing_zeros = IdemMultipleOfPow2(mv, q);
	}

	if (vm_trailing_zeros || vr_trailing_zeros)
	{
		/* general case: exact bounds or exact value, rare */
		for (;;)
		{
			uint64		vp10 = vp / 10;
			uint64		vm10 = vm / 10;
			uint8		vm_mod;
			uint8		vr_mod;

			if (vp10 <= vm10)
				break;
			vm_mod = (uint8) (vm % 10);
			vr_mod = (uint8) (vr % 10);
			vm_trailing_zeros &= vm_mod == 0;
			vr_trailing_zeros &= last_removed == 0;
			last_removed = vr_mod;
			vr /= 10;
			vp = vp10;
			vm = vm10;
			removed++;
		}
		if (vm_trailing_zeros)
		{
			while (vm % 10 == 0)
			{
				uint8		vr_mod = (uint8) (vr % 10);

				vr_trailing_zeros &= last_removed == 0;
				last_removed = vr_mod;
				vr /= 10;
				vp /= 10;
				vm /= 10;
				removed++;
			}
		}
		if (vr_trailing_zeros && last_removed == 5 && vr % 2 == 0)
			last_removed = 4;	/* exact tie: round half to even */
		output = vr +
			((vr == vm && (!accept_bounds || !vm_trailing_zeros)) ||
			 last_removed >= 5);
	}
	else
	{
		bool		round_up = false;

		if (vp / 100 > vm / 100)
		{
			round_up = (vr % 100) >= 50;
			vr /= 100;
			vp /= 100;
			vm /= 100;
			removed += 2;
		}
		for (;;)
		{
			uint64		vp10 = vp / 10;
			uint64		vm10 = vm / 10;

			if (vp10 <= vm10)
				break;
			round_up = (vr % 10) >= 5;
			vr /= 10;
			vp = vp10;
			vm = vm10;
			removed++;
		}
		output = vr + (vr == vm || round_up);
	}

	*exp10 = e10 + removed;
	return output;
}

/* ---------- layout ---------- */

/*
 * Lay out k significant digits (no leading or trailing zeros) whose value
 * is 0.DIGITS * 10^n the way Number::toString does; return the length.
 */
static int
IdemLayoutNumber(char *buf, bool negative, const char *digits, int k, int n)
{
	char	   *p = buf;

	if (negative)
		*p++ = '-';
	if (k <= n && n <= 21)
	{
		memcpy(p, digits, k);
		p += k;
		memset(p, '0', n - k);
		p += n - k;
	}
	else if (0 < n && n <= 21)
	{
		memcpy(p, digits, n);
		p += n;
		*p++ = '.';
		memcpy(p, digits + n, k - n);
		p += k - n;
	}
	else if (-6 < n && n <= 0)
	{
		*p++ = '0';
		*p++ = '.';
		memset(p, '0', -n);
		p += -n;
		memcpy(p, digits, k);
		p += k;
	}
	else
	{
		int			e = n - 1;
		char		ebuf[12];
		int			elen = 0;

		*p++ = digits[0];
		if (k > 1)
		{
			*p++ = '.';
			memcpy(p, digits + 1, k - 1);
			p += k - 1;
		}
		*p++ = 'e';
		*p++ = e < 0 ? '-' : '+';
		if (e < 0)
			e = -e;
		do
		{
			ebuf[elen++] = (char) ('0' + e % 10);
			e /= 10;
		} while (e > 0);
		while (elen > 0)
			*p++ = ebuf[--elen];
	}
	*p = '\0';
	return (int) (p - buf);
}

/* decimal digits of v (v > 0) into buf, without terminator; return count */
static int
IdemUint64Digits(uint64 v, char *buf)
{
	int			len = IdemDecimalLength(v);

	for (int i = len - 1; i >= 0; i--)
	{
		buf[i] = (char) ('0' + v % 10);
		v /= 10;
	}
	return len;
}

int
IdemFormatDouble(double value, char *buf)
{
	uint64		bits;
	bool		negative;
	uint64		mantissa;
	uint32		exponent;
	uint64		out;
	int			exp10;
	char		digits[24];
	int			k;

	Assert(!isnan(value) && !isinf(value));

	if (value == 0)
	{
		/* both zeros */
		buf[0] = '0';
		buf[1] = '\0';
		return 1;
	}

	/* integers below 2^53 are their own shortest form */
	if (value > -9007199254740992.0 && value < 9007199254740992.0 &&
		value == (double) (int64) value)
	{
		int64		iv = (int64) value;
		char	   *p = buf;

		if (iv < 0)
		{
			*p++ = '-';
			iv = -iv;
		}
		p += IdemUint64Digits((uint64) iv, p);
		*p = '\0';
		return (int) (p - buf);
	}

	memcpy(&bits, &value, sizeof(bits));
	negative = (bits >> 63) != 0;
	mantissa = bits & ((UINT64CONST(1) << DOUBLE_MANTISSA_BITS) - 1);
	exponent = (uint32) ((bits >> DOUBLE_MANTISSA_BITS) &
						 ((1u << DOUBLE_EXPONENT_BITS) - 1));

	if (!tables_ready)
		IdemBuildTables();
	out = IdemRyuShortest(mantissa, exponent, &exp10);

	/* Ryu leaves no trailing zeros except for values it did not shorten */
	while (out % 10 == 0)
	{
		out /= 10;
		exp10++;
	}
	k = IdemUint64Digits(out, digits);
	return IdemLayoutNumber(buf, negative, digits, k, k + exp10);
}

/* ---------- decimal input ---------- */

static const char digit_pairs[201] =
"00010203040506070809101112131415161718192021222324252627282930313233343536373839"
"40414243444546474849505152535455565758596061626364656667686970717273747576777879"
"8081828384858687888990919293949596979899";

static void
IdemOutOfRange(const char *what, int len)
{
	ereport(ERROR,
			(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
			 errmsg("JSON number %.*s%s is out of range for canonicalization",
					Min(len, 40), what, len > 40 ? "..." : ""),
			 errdetail("RFC 8785 represents numbers as IEEE-754 double precision values, whose magnitude lies between about 4.9e-324 and 1.8e308.")));
}

/*
 * strtod a NUL-terminated decimal, check the range, append its form.  Out
 * of range is an error, or (soft) a false return with nothing appended.
 */
static bool
IdemAppendViaDouble(StringInfo out, const char *s, int len, bool soft)
{
	char		buf[IDEM_NUMBER_BUFLEN];
	double		d;

	d = strtod(s, NULL);
	/* a non-zero number that becomes 0 or infinite is out of range */
	if (isinf(d) || d == 0)
	{
		if (soft)
			return false;
		IdemOutOfRange(s, len);
	}
	appendBinaryStringInfo(out, buf, IdemFormatDouble(d, buf));
	return true;
}

/*
 * Append the canonical form of (-1)^negative * 0.DIGITS * 10^n, with k >= 1
 * significant digits of which the last is not zero.  When fallback is not
 * NULL it is the same number as NUL-terminated text, for strtod.  Soft:
 * false instead of the out-of-range error.
 */
static bool
IdemAppendDecimal(StringInfo out, bool negative, const char *digits, int k,
				  long n, const char *fallback, int fallback_len, bool soft)
{
	/*
	 * At most 15 digits (DBL_DIG) and well inside the normal range: the
	 * digits are already the shortest form of the nearest double.
	 */
	if (k <= 15 && n >= -290 && n <= 300)
	{
		char		buf[IDEM_NUMBER_BUFLEN];

		appendBinaryStringInfo(out, buf,
							   IdemLayoutNumber(buf, negative, digits, k, (int) n));
		return true;
	}
	if (fallback)
		return IdemAppendViaDouble(out, fallback, fallback_len, soft);
	else
	{
		/* "-D.DIGITSe-NNNNNNNNNN" */
		int			cap = k + 32;
		char		sbuf[96];
		char	   *s = cap <= (int) sizeof(sbuf) ? sbuf : palloc(cap);
		int			len;
		bool		ok;

		char	   *p = s;
		char		ebuf[24];
		int			elen = 0;
		long		e = n - 1;
		unsigned long en = e < 0 ? -(unsigned long) e : (unsigned long) e;

		/* scientific notation, which also reads well in the error */
		if (negative)
			*p++ = '-';
		*p++ = digits[0];
		if (k > 1)
		{
			*p++ = '.';
			memcpy(p, digits + 1, k - 1);
			p += k - 1;
		}
		*p++ = 'e';
		if (e < 0)
			*p++ = '-';
		do
		{
			ebuf[elen++] = (char) ('0' + en % 10);
			en /= 10;
		} while (en > 0);
		while (elen > 0)
			*p++ = ebuf[--elen];
		*p = '\0';
		len = (int) (p - s);
		ok = IdemAppendViaDouble(out, s, len, soft);
		if (s != sbuf)
			pfree(s);
		return ok;
	}
}

/* ---------- JSON number text ---------- */

static bool
IdemBadNumber(const char *num, int len, bool soft)
{
	if (!soft)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TEXT_REPRESENTATION),
				 errmsg("invalid JSON number \"%.*s\"", Min(len, 40), num)));
	return false;
}

/* IdemAppendCanonicalNumber, or (soft) false where it would raise an error */
static bool
IdemAppendNumber(StringInfo out, const char *num, int len, bool soft)
{
	const char *p = num;
	const char *end = num + len;
	bool		negative = false;
	char		digits[16];		/* first significant digits */
	int			nd = 0;			/* significant digits seen */
	int			last_nonzero = 0;	/* count up to the last non-zero one */
	long		n = 0;			/* decimal point position */
	bool		any_digit = false;

	if (p < end && *p == '-')
	{
		negative = true;
		p++;
	}
	/* integer part */
	for (; p < end && *p >= '0' && *p <= '9'; p++)
	{
		any_digit = true;
		if (nd == 0 && *p == '0')
			continue;
		if (nd < (int) sizeof(digits))
			digits[nd] = *p;
		nd++;
		if (*p != '0')
			last_nonzero = nd;
	}
	n = nd;
	/* fraction */
	if (p < end && *p == '.')
	{
		p++;
		for (; p < end && *p >= '0' && *p <= '9'; p++)
		{
			any_digit = true;
			if (nd == 0 && *p == '0')
			{
				n--;
				continue;
			}
			if (nd < (int) sizeof(digits))
				digits[nd] = *p;
			nd++;
			if (*p != '0')
				last_nonzero = nd;
		}
	}
	if (!any_digit)
		return IdemBadNumber(num, len, soft);
	/* exponent */
	if (p < end && (*p == 'e' || *p == 'E'))
	{
		bool		eneg = false;
		long		e = 0;
		bool		any_exp = false;

		p++;
		if (p < end && (*p == '+' || *p == '-'))
			eneg = (*p++ == '-');
		for (; p < end && *p >= '0' && *p <= '9'; p++)
		{
			any_exp = true;
			if (e < 100000000)
				e = e * 10 + (*p - '0');
		}
		if (!any_exp)
			return IdemBadNumber(num, len, soft);
		n += eneg ? -e : e;
	}
	if (p != end)
		return IdemBadNumber(num, len, soft);

	if (last_nonzero == 0)
	{
		/* zero, whatever its sign and exponent */
		appendStringInfoChar(out, '0');
		return true;
	}
	if (last_nonzero <= 15)
		return IdemAppendDecimal(out, negative, digits, last_nonzero, n,
								 NULL, 0, soft);
	else
	{
		char		sbuf[64];
		char	   *s = len < (int) sizeof(sbuf) ? sbuf : palloc(len + 1);
		bool		ok;

		memcpy(s, num, len);
		s[len] = '\0';
		ok = IdemAppendDecimal(out, negative, digits, last_nonzero, n,
							   s, len, soft);
		if (s != sbuf)
			pfree(s);
		return ok;
	}
}

void
IdemAppendCanonicalNumber(StringInfo out, const char *num, int len)
{
	(void) IdemAppendNumber(out, num, len, false);
}

bool
IdemTryAppendCanonicalNumber(StringInfo out, const char *num, int len)
{
	return IdemAppendNumber(out, num, len, true);
}



/* ---------- numeric ---------- */

/*
 * The on-disk layout of numeric (src/backend/utils/adt/numeric.c), which
 * pg_upgrade keeps stable: a 2-byte header in the short format (sign, display
 * scale, 7-bit weight) or 2 + 2 bytes in the long one, then base-10000
 * digits without leading or trailing zeros; the value is the sum of
 * digit[i] * 10000^(weight - i).  Reading it directly spares numeric_out's
 * string and its parsing.
 */
#define NUM_SIGN_MASK		0xC000
#define NUM_NEG				0x4000
#define NUM_SHORT			0x8000
#define NUM_SPECIAL			0xC000
#define NUM_SHORT_SIGN_MASK	0x2000
#define NUM_SHORT_WEIGHT_SIGN_MASK 0x0040
#define NUM_SHORT_WEIGHT_MASK 0x003F

void
IdemAppendCanonicalNumeric(StringInfo out, Numeric num)
{
	const char *data = VARDATA_ANY(num);
	int			size = VARSIZE_ANY_EXHDR(num);
	uint16		header;
	bool		negative;
	int			weight;
	const int16 *ndig;
	int			ndigits;
	char		dbuf[72];
	char	   *digits;
	int			k = 0;
	long		n = 0;

	memcpy(&header, data, sizeof(uint16));
	if ((header & NUM_SIGN_MASK) == NUM_SPECIAL)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("NaN and infinity have no JSON representation")));
	if ((header & NUM_SIGN_MASK) == NUM_SHORT)
	{
		negative = (header & NUM_SHORT_SIGN_MASK) != 0;
		weight = (header & NUM_SHORT_WEIGHT_MASK) |
			((header & NUM_SHORT_WEIGHT_SIGN_MASK) ? ~NUM_SHORT_WEIGHT_MASK : 0);
		ndig = (const int16 *) (data + sizeof(uint16));
		ndigits = (size - (int) sizeof(uint16)) / (int) sizeof(int16);
	}
	else
	{
		int16		w;

		negative = (header & NUM_SIGN_MASK) == NUM_NEG;
		memcpy(&w, data + sizeof(uint16), sizeof(int16));
		weight = w;
		ndig = (const int16 *) (data + 2 * sizeof(uint16));
		ndigits = (size - 2 * (int) sizeof(uint16)) / (int) sizeof(int16);
	}
	/* numeric strips leading zero digits; do not rely on it */
	while (ndigits > 0 && ndig[0] == 0)
	{
		ndig++;
		ndigits--;
		weight--;
	}
	if (ndigits == 0)
	{
		appendStringInfoChar(out, '0');
		return;
	}

	digits = (ndigits * 4 <= (int) sizeof(dbuf)) ? dbuf : palloc(ndigits * 4);
	{
		/* the first base-10000 digit without its leading zeros */
		int			d = ndig[0];
		int			len = d >= 1000 ? 4 : d >= 100 ? 3 : d >= 10 ? 2 : 1;
		char		four[4];

		memcpy(four, digit_pairs + 2 * (d / 100), 2);
		memcpy(four + 2, digit_pairs + 2 * (d % 100), 2);
		memcpy(digits, four + 4 - len, len);
		k = len;
		n = (long) weight * 4 + len;
	}
	for (int i = 1; i < ndigits; i++)
	{
		int			d = ndig[i];

		memcpy(digits + k, digit_pairs + 2 * (d / 100), 2);
		memcpy(digits + k + 2, digit_pairs + 2 * (d % 100), 2);
		k += 4;
	}
	while (k > 0 && digits[k - 1] == '0')
		k--;
	if (k == 0)
		appendStringInfoChar(out, '0');
	else
		(void) IdemAppendDecimal(out, negative, digits, k, n, NULL, 0, false);
	if (digits != dbuf)
		pfree(digits);
}
