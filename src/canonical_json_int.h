/*-------------------------------------------------------------------------
 *
 * canonical_json_int.h
 *	  What the files of canonical JSON share, and nothing else uses: the
 *	  state of one serialization and its output helpers (canonical_json.c),
 *	  used by the scan of raw JSON text (canonical_text.c); the scan's state
 *	  and primitives, used by the build of jsonb from text (json_build.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CANONICAL_INT_H
#define IDEM_CANONICAL_INT_H

#include "postgres.h"

#include "common/cryptohash.h"
#include "lib/stringinfo.h"
#include "utils/jsonb.h"

#include "canonical_json.h"

/* objects with at most this many members reuse the previous one's order */
#define ORDER_CACHE_MAX 32

typedef struct CanonState
{
	StringInfo	out;
	pg_cryptohash_ctx *sink;
	const IdemExclusions *ex;
	bool		convert;		/* database encoding is not UTF-8 */
	bool		ascii_only;		/* SQL_ASCII: bytes above 0x7F are refused */

	/*
	 * Member names (in jsonb order) of the last object sorted, and their
	 * sorted order: arrays of similar objects sort only once.
	 */
	int			cache_n;
	const char *cache_key[ORDER_CACHE_MAX];
	int			cache_len[ORDER_CACHE_MAX];
	uint8		cache_order[ORDER_CACHE_MAX];

	/*
	 * Member arrays, one per nesting depth, reused by sibling objects: no
	 * allocation per object, and small stack frames for deep documents.
	 */
	struct Member **level_buf;
	int		   *level_cap;
	int			nlevels;
} CanonState;

/* a child of a jsonb container, located */
typedef struct ChildRef
{
	JEntry		entry;
	const char *base;			/* the container's data area */
	uint32		start;			/* offsets of its bytes in that area; */
	uint32		end;			/* numerics and containers are aligned */
} ChildRef;

typedef struct Member
{
	const char *key;			/* UTF-8 */
	int			keylen;
	ChildRef	value;			/* jsonb: the value */
	int			out_start;		/* text: "name":value in the output, */
	int			out_end;		/* out_start -1 when excluded */
	int		   *active;			/* pointers still matching below it */
	int			nactive;
} Member;

/* canonical_json.c: a serialization's state, its output */
extern void IdemCanonInit(CanonState *st, StringInfo out,
						  const IdemExclusions *ex, pg_cryptohash_ctx *sink);
extern void IdemCanonFree(CanonState *st);
/* the pointers active at the root container: all of them */
extern int *IdemRootActive(const IdemExclusions *ex, int *nactive);
/* hand the buffered bytes to the hash sink */
extern void IdemFeedSink(CanonState *st);
/* a string (UTF-8, len bytes) as JSON.stringify writes it */
extern void IdemEmitString(CanonState *st, const char *s, int len);
/* which bytes stand for themselves in a string, in the text and the output */
extern void IdemPlainBytes(bool plain[256]);
/*
 * Whether the member key (or the element at index, key NULL) is dropped by
 * a pointer active at depth; child gets the pointers still matching below.
 */
extern bool IdemMatchPointers(const IdemExclusions *ex, int depth,
							  const int *active, int nactive,
							  const char *key, int keylen, int index,
							  int *child, int *nchild);
/* the RFC 8785 order of members (qsort), and of at most ORDER_CACHE_MAX */
extern int	IdemMemberCmp(const void *x, const void *y);
extern void IdemOrderMembers(CanonState *st, const Member *members, int n,
							 uint8 *order);
/* room for n members at depth, reused by siblings */
extern Member *IdemLevelMembers(CanonState *st, int depth, int n);

/* ---------- the scan of raw JSON text (canonical_text.c) ---------- */

/*
 * Bounds of the fast path.  Past them the text goes through jsonb, whose
 * own limits (256 MB containers, numeric's range of scales and weights,
 * the stack check) raise the errors: 4 MB of text stays far from the
 * first, and numbers of at most 512 characters with exponents below 1000
 * from the second.
 */
#define TEXT_MAX_LEN		(4 * 1024 * 1024)
#define TEXT_MAX_DEPTH		64
#define TEXT_MAX_NUMBER		512
#define TEXT_MAX_EXPONENT	999

typedef struct TextScan
{
	CanonState	st;
	const char *p;				/* next byte of the text */
	const char *end;
	StringInfoData scratch;		/* a string with escapes, unescaped */
	StringInfoData tmp;			/* an object's members, being reordered */
} TextScan;

/* the JSON white space jsonb's parser skips */
static inline void
IdemSkipSpace(TextScan *ts)
{
	while (ts->p < ts->end && (unsigned char) *ts->p <= ' ' &&
		   (*ts->p == ' ' || *ts->p == '\n' || *ts->p == '\r' || *ts->p == '\t'))
		ts->p++;
}

/* the literal word at ts->p, skipped */
static inline bool
IdemTextWord(TextScan *ts, const char *word, int len)
{
	if (ts->end - ts->p < len || memcmp(ts->p, word, len) != 0)
		return false;
	ts->p += len;
	return true;
}

/* "," to go on (true) or the closing byte (false, *ok) after a child */
static inline bool
IdemTextNext(TextScan *ts, char close, bool *ok)
{
	IdemSkipSpace(ts);
	*ok = false;
	if (ts->p < ts->end && *ts->p == ',')
	{
		ts->p++;
		IdemSkipSpace(ts);
		return true;
	}
	if (ts->p < ts->end && *ts->p == close)
	{
		ts->p++;
		*ok = true;
	}
	return false;
}

/* once per backend before a scan: the table of plain bytes */
extern void IdemTextScanReady(void);
/* the end of the JSON number at p, within the fast path's bounds; or NULL */
extern const char *IdemScanNumber(const char *p, const char *end);
/* the string whose opening quote is at ts->p (see canonical_text.c) */
extern bool IdemTextString(TextScan *ts, const char **s, int *len,
						   bool *escaped);

#endif							/* IDEM_CANONICAL_INT_H */
