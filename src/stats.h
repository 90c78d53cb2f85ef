/*-------------------------------------------------------------------------
 *
 * stats.h
 *	  Shared-memory counters of the idempotency extension.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_STATS_H
#define IDEM_STATS_H

extern void IdemStatsInit(void);

#endif							/* IDEM_STATS_H */
