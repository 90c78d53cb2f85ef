/*-------------------------------------------------------------------------
 *
 * diag_int.h
 *	  The format of a request digest, shared by the files of mismatch
 *	  diagnostics (diag.c makes and reads digests, diag_secret.c
 *	  keys them, diag_compare.c compares two); not used elsewhere.
 *
 *	  Format (version 1):
 *		byte 0		version (1)
 *		bytes 1-8	scope tag: HMAC-SHA256(scope key, "scope"), first 8 bytes
 *		byte 9		flags: 1 method, 2 path, 4 body, 8 summarised
 *		[8 bytes]	method hash, [8 bytes] path hash, when flagged
 *		entries, when the body is flagged, in preorder:
 *			depth (1 byte, 0 for the root), entry flags (1 byte: 1 members
 *			listed, 2 array element, 4 object, 8 array), the name (member
 *			of an object only: its length in 1 byte below 128, else 2 bytes
 *			with the top bit set, then the canonical name without quotes),
 *			the hash (8 bytes)
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_DIAG_INT_H
#define IDEM_DIAG_INT_H

#include "postgres.h"

#include "common/sha2.h"

#include "scope.h"

#define IDEM_DIAG_VERSION		1
#define IDEM_DIAG_MAC_LEN		8
#define IDEM_DIAG_HEADER_LEN	10
#define IDEM_DIAG_MAX_DEPTH		8
#define IDEM_DIAG_MAX_MEMBERS	256
#define IDEM_DIAG_MAX_NAME		32767

/* header flags */
#define DIAG_HAS_METHOD		0x01
#define DIAG_HAS_PATH		0x02
#define DIAG_HAS_BODY		0x04
#define DIAG_SUMMARISED		0x08

/* entry flags */
#define DIAG_LISTED			0x01
#define DIAG_ELEMENT		0x02
#define DIAG_OBJECT			0x04
#define DIAG_ARRAY			0x08
#define DIAG_KIND(f)		((f) & (DIAG_OBJECT | DIAG_ARRAY))

/* an entry of a digest read, linked to its first child and next sibling */
typedef struct DiagEntry
{
	int			depth;
	uint8		flags;
	const char *name;
	int			namelen;
	const uint8 *mac;
	int			first_child;	/* -1: none */
	int			next_sibling;	/* -1: none */
	int			nchildren;
} DiagEntry;

typedef struct DiagParsed
{
	const uint8 *tag;
	uint8		flags;
	const uint8 *method_mac;
	const uint8 *path_mac;
	DiagEntry  *e;
	int			n;
} DiagParsed;

/* Read a digest into p (pointing into it); false when it is malformed. */
extern bool IdemDiagRead(const bytea *digest, DiagParsed *p);

/*
 * The key of a scope under the database's secret, and the tag that says
 * which scope (and secret) a digest was made for (diag_secret.c).
 */
extern void IdemDiagScopeKey(const IdemScope *scope,
							 uint8 key[PG_SHA256_DIGEST_LENGTH],
							 uint8 tag[IDEM_DIAG_MAC_LEN]);

#endif							/* IDEM_DIAG_INT_H */
