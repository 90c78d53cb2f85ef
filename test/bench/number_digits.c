/*-------------------------------------------------------------------------
 *
 * number_digits.c
 *	  A stand-alone program, not part of the extension, that compares the
 *	  digits of src/number_format.c with those of PostgreSQL's own Ryu
 *	  (double_to_shortest_decimal_bufn, from libpgcommon), laid out the
 *	  ECMAScript way, over the vectors of test/data and a large sample of
 *	  doubles.  Wherever the two differ, an exact oracle (the double's full
 *	  decimal expansion from glibc, the shortest prefix that reads back, the
 *	  closer of two, ties to even) says which is ECMAScript's.
 *
 *	  Build and run (PostgreSQL 15 headers and libraries):
 *		gcc -O2 -I$(pg_config --includedir-server) \
 *			-I$(pg_config --includedir)/internal -o /tmp/number_digits \
 *			test/bench/number_digits.c $(pg_config --pkglibdir)/libpgcommon.a \
 *			$(pg_config --pkglibdir)/libpgport.a -lm
 *		/tmp/number_digits 20000000 test/data/es6-numbers-100k.txt
 *	  The first argument sizes the random sample; ORACLE_EVERY=N also runs
 *	  the oracle on every Nth double where the two agree.
 *
 *-------------------------------------------------------------------------
 */
#include "../../src/number_format.c"

#include <stdio.h>
#include <stdlib.h>

#include "common/shortest_dec.h"

/* glibc's own: exact for any precision */
#undef printf
#undef snprintf

/* what number_format.c refers to but never reaches here */
bool
errstart(int elevel, const char *domain)
{
	abort();
}

bool
errstart_cold(int elevel, const char *domain)
{
	abort();
}

void
errfinish(const char *filename, int lineno, const char *funcname)
{
	abort();
}

int
errcode(int sqlerrcode)
{
	return 0;
}

int
errmsg(const char *fmt,...)
{
	return 0;
}

int
errdetail(const char *fmt,...)
{
	return 0;
}

#if PG_VERSION_NUM >= 160000
void
appendBinaryStringInfo(StringInfo str, const void *data, int datalen)
#else
void
appendBinaryStringInfo(StringInfo str, const char *data, int datalen)
#endif
{
	abort();
}

void
appendStringInfoChar(StringInfo str, char ch)
{
	abort();
}

void *
palloc(Size size)
{
	abort();
}

void
pfree(void *pointer)
{
	abort();
}

/* PostgreSQL's shortest digits, laid out by number_format.c */
static void
core_form(double value, char *buf)
{
	char		s[DOUBLE_SHORTEST_DECIMAL_LEN + 1];
	int			len = double_to_shortest_decimal_bufn(value, s);
	char		digits[24];
	int			k = 0;
	int			n = 0;
	int			i = 0;
	bool		point = false;

	s[len] = '\0';
	if (value == 0)
	{
		strcpy(buf, "0");
		return;
	}
	if (s[0] == '-')
		i++;
	for (; i < len && s[i] != 'e'; i++)
	{
		if (s[i] == '.')
			point = true;
		else if (k == 0 && s[i] == '0')
			n -= point ? 1 : 0;
		else
		{
			digits[k++] = s[i];
			n += point ? 0 : 1;
		}
	}
	if (i < len)
		n += atoi(s + i + 1);
	while (digits[k - 1] == '0')
		k--;
	IdemLayoutNumber(buf, s[0] == '-', digits, k, n);
}

/*
 * ECMAScript's form by brute force: for k = 1, 2, ... the k-digit decimals
 * just below and just above the exact value; the first k where one reads
 * back, the closer one (ties: the even one).
 */
static void
oracle(double d, char *out)
{
	static char exact[1200];
	int			e10;

	snprintf(exact, sizeof(exact), "%.780e", fabs(d));
	e10 = atoi(strchr(exact, 'e') + 1);
	for (int k = 1; k <= 17; k++)
	{
		char		down[20];
		char		up[20];
		char		text[40];
		int			up_e10 = e10;
		int			j = 0;
		const char *p = exact;
		int			half = -1;	/* the rest compared with one half */
		bool		rest_zero = true;
		bool		ok_down;
		bool		ok_up;
		const char *pick;
		int			pick_e10;

		for (; j < k; p++)
			if (*p != '.')
				down[j++] = *p;
		down[k] = '\0';
		for (bool first = true; *p != 'e'; p++)
		{
			if (*p == '.')
				continue;
			if (first)
				half = *p > '5' ? 1 : *p < '5' ? -1 : 0;
			else if (*p != '0' && half == 0)
				half = 1;
			if (*p != '0')
				rest_zero = false;
			first = false;
		}
		strcpy(up, down);
		for (j = k - 1; j >= 0 && up[j] == '9'; j--)
			up[j] = '0';
		if (j >= 0)
			up[j]++;
		else
		{
			memmove(up + 1, up, k);
			up[0] = '1';
			up[k] = '\0';
			up_e10++;
		}
		snprintf(text, sizeof(text), "%c.%se%d", down[0], down + 1, e10);
		ok_down = strtod(text, NULL) == fabs(d);
		snprintf(text, sizeof(text), "%c.%se%d", up[0], up + 1, up_e10);
		ok_up = !rest_zero && strtod(text, NULL) == fabs(d);
		if (!ok_down && !ok_up)
			continue;
		if (ok_down && ok_up)
			ok_down = half < 0 || (half == 0 && (down[k - 1] - '0') % 2 == 0);
		pick = ok_down ? down : up;
		pick_e10 = ok_down ? e10 : up_e10;
		while (k > 1 && pick[k - 1] == '0')
			k--;
		IdemLayoutNumber(out, d < 0, pick, k, pick_e10 + 1);
		return;
	}
	strcpy(out, "?");
}

/* significant digits of a form */
static int
significant_digits(const char *s)
{
	int			k = 0;
	int			last = 0;

	for (; *s && *s != 'e'; s++)
	{
		if (*s < '0' || *s > '9' || (k == 0 && *s == '0'))
			continue;
		k++;
		if (*s != '0')
			last = k;
	}
	return last;
}

static uint64 rng_state = UINT64CONST(88172645463325252);

static uint64
rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static double
from_bits(uint64 bits)
{
	double		d;

	memcpy(&d, &bits, sizeof(d));
	return d;
}

enum
{
	POW2, POW10, EDGES, BIGINT, SHORTDEC, SUBNORMAL, RANDOM, FEWBITS, NCLASSES
};
static const char *const class_names[] = {
	"powers of 2", "powers of 10", "edges", "integers 2^53..2^64",
	"short decimals", "subnormals", "random bits", "few significand bits"
};
static long checked[NCLASSES];
static long differ[NCLASSES];
static long core_longer;
static long odd_significand;
static long oracle_runs;
static long private_wrong;
static long core_wrong;
static long oracle_every;

static void
check(double d, int class)
{
	char		mine[40];
	char		core[40];
	char		truth[40];
	uint64		bits;
	bool		same;

	if (isnan(d) || isinf(d))
		return;
	memcpy(&bits, &d, sizeof(bits));
	IdemFormatDouble(d, mine);
	core_form(d, core);
	checked[class]++;
	same = strcmp(mine, core) == 0;
	if (!same)
	{
		differ[class]++;
		core_longer += significant_digits(core) > significant_digits(mine);
		odd_significand += bits & 1;
	}
	if (same && (oracle_every == 0 || checked[class] % oracle_every != 0))
		return;
	oracle(d, truth);
	oracle_runs++;
	private_wrong += strcmp(mine, truth) != 0;
	core_wrong += strcmp(core, truth) != 0;
	if (strcmp(mine, truth) != 0 || (!same && differ[class] <= 3))
		printf("%016llx: number_format.c %s, core %s, ECMAScript %s\n",
			   (unsigned long long) bits, mine, core, truth);
}

static void
check_vectors(const char *path)
{
	FILE	   *f = fopen(path, "r");
	char		line[200];
	long		n = 0;
	long		mine_wrong = 0;
	long		core_off = 0;

	if (f == NULL)
	{
		perror(path);
		exit(1);
	}
	while (fgets(line, sizeof(line), f))
	{
		char	   *want = strchr(line, ',');
		char		mine[40];
		char		core[40];
		double		d;

		*want++ = '\0';
		want[strcspn(want, "\r\n")] = '\0';
		d = from_bits(strtoull(line, NULL, 16));
		IdemFormatDouble(d, mine);
		core_form(d, core);
		n++;
		mine_wrong += strcmp(mine, want) != 0;
		core_off += strcmp(core, want) != 0;
	}
	fclose(f);
	printf("%s: %ld vectors, number_format.c differs on %ld, core on %ld\n",
		   path, n, mine_wrong, core_off);
}

int
main(int argc, char **argv)
{
	long		nrandom = argc > 1 ? atol(argv[1]) : 1000000;
	static const uint64 edges[] = {
		1, 2, 3, UINT64CONST(0x000fffffffffffff), UINT64CONST(0x0010000000000000),
		UINT64CONST(0x0010000000000001), UINT64CONST(0x7fefffffffffffff),
		UINT64CONST(0x7feffffffffffffe), UINT64CONST(0x4340000000000000),
		UINT64CONST(0x433fffffffffffff), UINT64CONST(0x4340000000000001),
		UINT64CONST(0x444b1ae4d6e2ef50), UINT64CONST(0x3eb0c6f7a0b5ed8d),
		UINT64CONST(0x3eb0c6f7a0b5ed8c), UINT64CONST(0x3ff0000000000000)
	};

	if (getenv("ORACLE_EVERY"))
		oracle_every = atol(getenv("ORACLE_EVERY"));
	if (argc > 2)
		check_vectors(argv[2]);

	for (int e = 0; e < 2047; e++)
		for (int delta = -3; delta <= 3; delta++)
			if (e > 0 || delta >= 0)
				check(from_bits(((uint64) e << 52) + delta), POW2);
	for (int e = -330; e <= 310; e++)
	{
		char		text[20];
		double		d;
		uint64		bits;

		snprintf(text, sizeof(text), "1e%d", e);
		d = strtod(text, NULL);
		memcpy(&bits, &d, sizeof(bits));
		for (int delta = -3; delta <= 3; delta++)
			check(from_bits(bits + delta), POW10);
	}
	for (size_t i = 0; i < lengthof(edges); i++)
	{
		check(from_bits(edges[i]), EDGES);
		check(-from_bits(edges[i]), EDGES);
	}
	for (long i = 0; i < 200000; i++)
		check((double) ((rng() >> (rng() % 12)) | (UINT64CONST(1) << 53)), BIGINT);
	for (long i = 0; i < nrandom / 2; i++)
	{
		char		text[40];
		int			k = 1 + rng() % 17;
		uint64		m = rng() % UINT64CONST(100000000000000000);
		uint64		p10 = 1;

		for (int j = 0; j < k; j++)
			p10 *= 10;
		snprintf(text, sizeof(text), "%llue%d", (unsigned long long) (m % p10),
				 (int) (rng() % 640) - 330);
		check(strtod(text, NULL), SHORTDEC);
	}
	for (long i = 0; i < nrandom / 4; i++)
		check(from_bits(rng() & (UINT64CONST(0x000fffffffffffff) >> (rng() % 52))), SUBNORMAL);
	for (long i = 0; i < nrandom; i++)
		check(from_bits(rng()), RANDOM);
	for (long i = 0; i < nrandom / 2; i++)
	{
		uint64		e = 1 + rng() % 2046;
		uint64		m = rng() & UINT64CONST(0x000fffffffffffff) &
			~((UINT64CONST(1) << (rng() % 53)) - 1);

		check(from_bits((e << 52) | m), FEWBITS);
	}

	for (int c = 0; c < NCLASSES; c++)
		printf("%-22s %10ld doubles, core differs on %8ld\n",
			   class_names[c], checked[c], differ[c]);
	printf("where core differs: it has more digits %ld times, the significand is odd %ld times\n",
		   core_longer, odd_significand);
	printf("oracle: %ld runs, number_format.c wrong %ld times, core %ld times\n",
		   oracle_runs, private_wrong, core_wrong);
	return private_wrong == 0 ? 0 : 1;
}
