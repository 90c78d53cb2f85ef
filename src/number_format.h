/*-------------------------------------------------------------------------
 *
 * number_format.h
 *	  ECMAScript number serialization (as adopted by RFC 8785) of IEEE-754
 *	  doubles and of JSON number text.
 *
 *-------------------------------------------------------------------------
 */
#ifndef NUMBER_FORMAT_H
#define NUMBER_FORMAT_H

#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/numeric.h"

/* enough for "-1.2345678901234567e-308" and a terminating NUL */
#define IDEM_NUMBER_BUFLEN 32

/*
 * Write the ECMAScript Number::toString form of a finite double into buf
 * (NUL-terminated, at least IDEM_NUMBER_BUFLEN bytes); return its length.
 * Negative zero gives "0".  The caller rejects NaN and infinities.
 */
extern int	IdemFormatDouble(double value, char *buf);

/*
 * Append the canonical form of a JSON number given as text (the JSON number
 * grammar, which numeric_out's output also follows): the number is taken
 * through the nearest double, as ECMAScript does.  Raises 22003 when the
 * value is beyond the range of a double (including non-zero values that
 * would underflow to zero), and 22P02 when the text is not a number.
 */
extern void IdemAppendCanonicalNumber(StringInfo out, const char *num, int len);

/*
 * The same, but false (with nothing appended) where it would raise an
 * error, for callers that have a slower path to fall back on.
 */
extern bool IdemTryAppendCanonicalNumber(StringInfo out, const char *num,
										 int len);

/* the same for a numeric (jsonb's numbers), read without numeric_out */
extern void IdemAppendCanonicalNumeric(StringInfo out, Numeric num);

#endif							/* NUMBER_FORMAT_H */
