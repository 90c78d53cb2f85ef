/*-------------------------------------------------------------------------
 *
 * maint_outbox.h
 *	  The step of a maintenance pass that removes finished operations of
 *	  the outbox (idempotency.outbox) after idempotency.outbox_retention.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_MAINT_OUTBOX_H
#define IDEM_MAINT_OUTBOX_H

#include "maint_pass.h"

/*
 * Remove the operations that succeeded or failed longer than
 * idempotency.outbox_retention before the pass's as_of, with their
 * attempts (or count them, in a preview); in statements of a bounded
 * number of rows, each a step of its own.
 */
extern void IdemMaintOutbox(IdemMaintPass *p);

#endif							/* IDEM_MAINT_OUTBOX_H */
