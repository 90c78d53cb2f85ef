/*-------------------------------------------------------------------------
 *
 * tombstone_row.c
 *	  The rows of idempotency.tombstones (tombstone_row.h): the bucket of a
 *	  hash, and the hashes a row stands for, which the filters
 *	  (tombstone_filter.c) and the tombstones' reader and writer
 *	  (tombstone_probe.c, tombstone_write.c) share.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "compat.h"
#include "tombstone_row.h"

int
IdemTombRowBucket(const uint8 *hash, int bits, uint8 *out)
{
	int			nbytes = (bits + 7) / 8;

	Assert(bits >= IDEM_TOMBROW_MIN_BITS && bits <= IDEM_TOMBROW_MAX_BITS);
	out[0] = (uint8) bits;
	memcpy(out + 1, hash, nbytes);
	if (bits % 8 != 0)
		out[nbytes] &= (uint8) (0xFF << (8 - bits % 8));
	return 1 + nbytes;
}

/* Whether a row with this scope_hash and fingerprint is a run. */
static bool
IdemTombRowIsRun(const uint8 *h, int hlen, int fplen)
{
	int			bits;

	if (hlen < 2 || hlen >= IDEM_TOMBSTONE_HASH_LEN)
		return false;
	bits = h[0];
	return bits >= IDEM_TOMBROW_MIN_BITS && bits <= IDEM_TOMBROW_MAX_BITS &&
		bits % IDEM_TOMBROW_MIN_BITS == 0 &&
		hlen == 1 + (bits + 7) / 8 &&
		fplen > 0 && fplen % IDEM_TOMBSTONE_RUN_ENTRY == 0;
}

int
IdemTombRowHashes(bytea *scope_hash, bytea *fingerprint,
				  const uint8 **first, int *stride)
{
	int			hlen = VARSIZE_ANY_EXHDR(scope_hash);

	if (hlen >= IDEM_TOMBSTONE_HASH_LEN)
	{
		*first = (const uint8 *) VARDATA_ANY(scope_hash);
		*stride = 0;
		return 1;
	}
	if (fingerprint != NULL &&
		IdemTombRowIsRun((const uint8 *) VARDATA_ANY(scope_hash), hlen,
						 VARSIZE_ANY_EXHDR(fingerprint)))
	{
		*first = (const uint8 *) VARDATA_ANY(fingerprint);
		*stride = IDEM_TOMBSTONE_RUN_ENTRY;
		return VARSIZE_ANY_EXHDR(fingerprint) / IDEM_TOMBSTONE_RUN_ENTRY;
	}
	return 0;
}
