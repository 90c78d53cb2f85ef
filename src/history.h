/*-------------------------------------------------------------------------
 *
 * history.h
 *	  Whether an idempotency key was used before, and with which
 *	  fingerprint (history.c): the one answer a claim that finds no live
 *	  row gets about the key's expired row or tombstone.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_HISTORY_H
#define IDEM_HISTORY_H

#include "datatype/timestamp.h"

#include "keystore.h"
#include "scope.h"

/* Where an earlier use of a key was seen. */
typedef enum IdemHistorySource
{
	IDEM_HISTORY_NONE,			/* nowhere: the key was not used before */
	IDEM_HISTORY_EXPIRED_ROW,	/* an expired row not yet dropped */
	IDEM_HISTORY_TOMBSTONE		/* a tombstone (idempotency.tombstones) */
} IdemHistorySource;

/* The latest earlier use of a key. */
typedef struct IdemKeyHistory
{
	bool		used;			/* the key was used before */
	bytea	   *fingerprint;	/* with this fingerprint */
	TimestampTz expired_at;		/* and expired then */
	IdemHistorySource source;	/* as seen there */
} IdemKeyHistory;

/*
 * The latest earlier use of the scope's key, for a claim that holds the
 * scope lock and found no live row in row (read by
 * IdemKeystoreReadWithExpired when tombstones is true, the endpoint keeping
 * tombstones; otherwise the key has no history).  Anything read is in cxt.
 */
extern IdemKeyHistory IdemKeyHistoryFind(const IdemScope *scope,
										 const IdemKeyRow *row,
										 bool tombstones, TimestampTz now,
										 MemoryContext cxt);

#endif							/* IDEM_HISTORY_H */
