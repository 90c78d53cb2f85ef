/*-------------------------------------------------------------------------
 *
 * siphash.h
 *	  SipHash-2-4, a fast keyed hash (a pseudorandom function of 64 bits
 *	  under a 128-bit key): whoever does not hold the key cannot compute
 *	  it, nor learn the key from its outputs.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_SIPHASH_H
#define IDEM_SIPHASH_H

#define IDEM_SIPHASH_KEY_LEN	16

/* SipHash-2-4 of the len bytes at data under key */
extern uint64 IdemSipHash24(const uint8 key[IDEM_SIPHASH_KEY_LEN],
							const void *data, size_t len);

#endif							/* IDEM_SIPHASH_H */
