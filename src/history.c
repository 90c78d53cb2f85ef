/*-------------------------------------------------------------------------
 *
 * history.c
 *	  Whether an idempotency key was used before, and with which
 *	  fingerprint: the latest expired key of a scope, as a row of
 *	  idempotency.keys not yet dropped (which the key store reads with the
 *	  live row) or as a tombstone (tombstone_probe.c), whichever expired last.
 *
 *	  The tombstone is read after the rows, with a later snapshot, so that
 *	  a maintenance pass turning rows into tombstones meanwhile is seen on
 *	  one side or the other.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "history.h"
#include "keystore.h"
#include "scope.h"
#include "tombstone_probe.h"

IdemKeyHistory
IdemKeyHistoryFind(const IdemScope *scope, const IdemKeyRow *row,
				   bool tombstones, TimestampTz now, MemoryContext cxt)
{
	IdemKeyHistory h = {0};
	bytea	   *tomb_fingerprint;
	TimestampTz tomb_expired_at;

	if (!tombstones)
		return h;
	if (row->expired_fingerprint != NULL)
	{
		h.used = true;
		h.fingerprint = row->expired_fingerprint;
		h.expired_at = row->expired_at;
		h.source = IDEM_HISTORY_EXPIRED_ROW;
	}
	if (IdemTombstoneFind(scope, now, &tomb_fingerprint, &tomb_expired_at, cxt) &&
		(!h.used || tomb_expired_at > h.expired_at))
	{
		h.used = true;
		h.fingerprint = tomb_fingerprint;
		h.expired_at = tomb_expired_at;
		h.source = IDEM_HISTORY_TOMBSTONE;
	}
	return h;
}
