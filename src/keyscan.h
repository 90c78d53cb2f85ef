/*-------------------------------------------------------------------------
 *
 * keyscan.h
 *	  Reading the rows of one (tenant, endpoint, key) scope straight from
 *	  the unique index of every partition of idempotency.keys.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEYSCAN_H
#define IDEM_KEYSCAN_H

#include "executor/tuptable.h"
#include "utils/snapshot.h"

/* Called for every row of the scope, with the row in the parent's layout. */
typedef void (*IdemScopeRowCallback) (TupleTableSlot *slot, void *arg);

extern void IdemScanScope(const text *tenant, const text *endpoint,
						  const text *key, Snapshot snapshot,
						  IdemScopeRowCallback callback, void *arg);

/* Attribute number of a column of idempotency.keys (the parent). */
extern AttrNumber IdemKeysAttnum(const char *column);

#endif							/* IDEM_KEYSCAN_H */
