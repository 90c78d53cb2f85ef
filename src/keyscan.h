/*-------------------------------------------------------------------------
 *
 * keyscan.h
 *	  Direct access to idempotency.keys on the hot paths: reading one scope's
 *	  rows from each partition's unique index, inserting a row.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEYSCAN_H
#define IDEM_KEYSCAN_H

#include "executor/tuptable.h"
#include "datatype/timestamp.h"
#include "utils/snapshot.h"

/*
 * Called for every row of the scope, with the row in the parent's layout
 * (tts_tableOid and tts_tid say where it is); returns true to stop the scan.
 */
typedef bool (*IdemScopeRowCallback) (TupleTableSlot *slot, void *arg);

extern void IdemScanScope(const text *tenant, const text *endpoint,
						  const text *key, TimestampTz now, TimestampTz hint,
						  IdemScopeRowCallback callback, void *arg);

/* Insert one row (in the parent's layout) into the partition that covers it. */
extern void IdemInsertKeyRow(Datum *values, bool *nulls, bool leased);

/* Attribute number of a column of idempotency.keys (the parent). */
extern AttrNumber IdemKeysAttnum(const char *column);
extern void IdemKeysAttnums(const char *const *names, int n,
							AttrNumber *attnums, uint64 *generation);
extern int	IdemKeysNatts(void);
extern Oid	IdemKeysOwner(void);
extern void IdemLockKeys(void);

#endif							/* IDEM_KEYSCAN_H */
