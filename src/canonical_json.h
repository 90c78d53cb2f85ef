/*-------------------------------------------------------------------------
 *
 * canonical_json.h
 *	  RFC 8785 (JSON Canonicalization Scheme) serialization of jsonb values
 *	  (canonical_json.c) and of raw JSON text (canonical_text.c), with
 *	  members dropped by JSON Pointer (RFC 6901); raw JSON text turned into
 *	  jsonb directly (json_build.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef CANONICAL_JSON_H
#define CANONICAL_JSON_H

#include "postgres.h"

#include "common/cryptohash.h"
#include "lib/stringinfo.h"
#include "utils/array.h"
#include "utils/jsonb.h"

/* parsed list of JSON Pointers naming what to leave out */
typedef struct IdemExclusions IdemExclusions;

/*
 * Parse a text[] of JSON Pointers; NULL when the array is NULL or empty.
 * "*" as a whole reference token matches every member or element at its
 * level.  Malformed pointers, the empty pointer (the whole document) and
 * NULL elements are errors.
 */
extern IdemExclusions *IdemParseExclusions(ArrayType *pointers);

/*
 * The same into *ex, but false where IdemParseExclusions would raise an
 * error: callers that must report the body's errors first use this.
 */
extern bool IdemTryParseExclusions(ArrayType *pointers, IdemExclusions **ex);

/*
 * Append the canonical UTF-8 form of jb to out.  When sink is not NULL the
 * bytes are fed to that (initialized) hash context as they are produced,
 * in chunks, and out is used only as a buffer: it is empty on return.
 */
extern void IdemCanonicalizeJsonb(StringInfo out, Jsonb *jb,
								  const IdemExclusions *ex,
								  pg_cryptohash_ctx *sink);

/*
 * The fast path for raw JSON text: append its canonical form to out (or,
 * with a sink, hash it and leave out empty), reading the text directly,
 * and return true; the bytes are those IdemJsonTextToJsonbUnique and
 * IdemCanonicalizeJsonb would give.  Returns false, with out as it was and
 * nothing hashed, for any text it leaves to that path (which then raises
 * the errors): invalid JSON, duplicate names, \u0000, numbers beyond a
 * double, deep nesting, very long text, a database not in UTF-8.  It raises
 * no errors of its own.
 */
extern bool IdemTryCanonicalizeJsonText(StringInfo out, text *json,
										const IdemExclusions *ex,
										pg_cryptohash_ctx *sink);

/*
 * The JSON escape whose backslash is at *pp, unescaped onto buf; *pp is
 * left on its last byte.  False for an escape JSON does not allow.
 */
extern bool IdemJsonUnescape(const char **pp, const char *end, StringInfo buf);

/*
 * Raw JSON text (len bytes at s, UTF-8) as jsonb, built directly: the same
 * datum jsonb_in gives, byte for byte.  NULL, raising no errors of its
 * own, for any text it leaves to jsonb_in: invalid JSON, \u0000 or lone
 * surrogates, invalid UTF-8, numbers beyond the bounds of the fast path,
 * deep nesting, very long text, a database not in UTF-8.
 */
extern Jsonb *IdemTryJsonTextToJsonb(const char *s, int len);

/*
 * Parse raw JSON text into jsonb after checking that no object has two
 * members with the same name (error 22030 otherwise).
 */
extern Jsonb *IdemJsonTextToJsonbUnique(text *json);

/*
 * Convert canonical UTF-8 bytes to a text datum in the database encoding.
 */
extern text *IdemCanonicalToText(const char *utf8, int len);

/*
 * In a SQL_ASCII database, raise unless s is ASCII (its other bytes have no
 * known UTF-8 form); elsewhere do nothing.
 */
extern void IdemRequireAsciiInSqlAscii(const char *s, int len);

#endif							/* CANONICAL_JSON_H */
