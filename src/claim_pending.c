/*-------------------------------------------------------------------------
 *
 * claim_pending.c
 *	  The claims of the current transaction that hold their scope lock:
 *	  atomic-mode claims waiting for their finish, and leased claims made
 *	  in it; and the (sub)transaction callbacks that end them, refusing to
 *	  commit a transaction with an atomic claim neither finished nor
 *	  released (IK500).
 *
 *	  The list lives in TopTransactionContext and is forgotten when the
 *	  transaction ends.  claim.c adds to it and registers the callbacks;
 *	  claim_finish.c ends its entries.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "claim_pending.h"
#include "guc.h"
#include "scope.h"
#include "util.h"

static PendingClaim *pending_claims = NULL;
static int	claims_held = 0;	/* entries in pending_claims */

/* The pending (unfinished) atomic claim of a scope, or NULL. */
PendingClaim *
IdemFindPending(const IdemScope *scope, PendingClaim ***link)
{
	PendingClaim **p;

	for (p = &pending_claims; *p != NULL; p = &(*p)->next)
	{
		if ((*p)->done_level == 0 &&
			IdemTextEqual((*p)->key, scope->key) &&
			IdemTextEqual((*p)->endpoint, scope->endpoint) &&
			IdemTextEqual((*p)->tenant, scope->tenant))
		{
			if (link)
				*link = p;
			return *p;
		}
	}
	return NULL;
}

/*
 * Remember a claim that keeps its scope lock until the transaction ends:
 * pending (atomic mode), or ended at once (leased).  Refused with IK429
 * when the transaction already holds idempotency.max_claims_per_transaction
 * of them, before the lock table of the whole server is at risk.
 */
void
IdemAddPending(const IdemScope *scope, const bytea *fingerprint,
			   const bytea *request_digest, TimestampTz created_at,
			   TimestampTz expires_at, const LOCKTAG *tag, bool leased)
{
	MemoryContext old;
	PendingClaim *pc;

	if (claims_held >= idem_max_claims_per_transaction)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_TOO_MANY_CLAIMS),
				 errmsg("too many idempotency keys claimed in one transaction"),
				 errdetail_plural("The transaction already holds %d claim, the most idempotency.max_claims_per_transaction allows.",
								  "The transaction already holds %d claims, the most idempotency.max_claims_per_transaction allows.",
								  claims_held, claims_held),
				 errhint("Each claim holds a lock until the transaction ends: claim fewer keys per transaction, or raise idempotency.max_claims_per_transaction together with max_locks_per_transaction.")));

	old = MemoryContextSwitchTo(TopTransactionContext);
	pc = palloc(sizeof(PendingClaim));
	pc->tenant = DatumGetTextPCopy(PointerGetDatum(scope->tenant));
	pc->endpoint = DatumGetTextPCopy(PointerGetDatum(scope->endpoint));
	pc->key = DatumGetTextPCopy(PointerGetDatum(scope->key));
	pc->fingerprint = DatumGetByteaPCopy(PointerGetDatum(fingerprint));
	pc->request_digest = request_digest == NULL ? NULL :
		DatumGetByteaPCopy(PointerGetDatum(request_digest));
	pc->created_at = created_at;
	pc->expires_at = expires_at;
	pc->tag = *tag;
	pc->nest_level = GetCurrentTransactionNestLevel();
	pc->done_level = leased ? pc->nest_level : 0;
	pc->next = pending_claims;
	pending_claims = pc;
	claims_held++;
	MemoryContextSwitchTo(old);
}

/* Unlink an entry (*link) and free it. */
static void
IdemForgetPending(PendingClaim **link)
{
	PendingClaim *pc = *link;

	*link = pc->next;
	claims_held--;
	pfree(pc->tenant);
	pfree(pc->endpoint);
	pfree(pc->key);
	pfree(pc->fingerprint);
	if (pc->request_digest)
		pfree(pc->request_digest);
	pfree(pc);
}

/*
 * End a pending claim (finished, failed or released).  With release_lock,
 * also give up the scope lock now, so that a waiting duplicate proceeds
 * before this transaction ends; only where the claim and its lock belong to
 * the current subtransaction, whose rollback would undo the claim anyway,
 * and the entry then goes.  Otherwise the entry stays, ended at this level,
 * to be made pending again if this subtransaction rolls back.
 */
void
IdemEndPending(PendingClaim **link, bool release_lock)
{
	PendingClaim *pc = *link;
	int			level = GetCurrentTransactionNestLevel();

	if (release_lock && pc->nest_level == level)
	{
		IdemReleaseScopeLock(&pc->tag);
		IdemForgetPending(link);
	}
	else
		pc->done_level = level;
}

/*
 * Before a commit (or PREPARE TRANSACTION), refuse a transaction that still
 * holds an atomic claim neither finished nor released; when it has ended,
 * forget the list, whose memory went with the transaction.
 */
void
IdemPendingXactCallback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PARALLEL_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			{
				PendingClaim *first = NULL;
				PendingClaim *pc;
				int			n = 0;

				for (pc = pending_claims; pc != NULL; pc = pc->next)
				{
					if (pc->done_level != 0)
						continue;
					if (first == NULL)
						first = pc;
					n++;
				}
				if (n == 0)
					break;
				pending_claims = NULL;
				claims_held = 0;
				ereport(ERROR,
						(errcode(ERRCODE_IDEM_UNFINISHED_CLAIM),
						 errmsg("transaction claimed an idempotency key but neither finished nor released it"),
						 errdetail_plural("%d key of endpoint \"%s\" (tenant \"%s\") was claimed in atomic mode and is still unfinished.",
										  "%d keys were claimed in atomic mode and are still unfinished, one of endpoint \"%s\" (tenant \"%s\").",
										  n, n, text_to_cstring(first->endpoint),
										  text_to_cstring(first->tenant)),
						 errhint("Call idem_finish, idem_fail or idem_release before COMMIT; the transaction has been rolled back.")));
			}
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			/* the memory went with TopTransactionContext */
			pending_claims = NULL;
			claims_held = 0;
			break;
	}
}

/*
 * A subtransaction that rolls back takes with it the claims it made (their
 * locks are released with it) and undoes the ends of claims it finished,
 * failed or released (their rows are gone); one that commits passes both to
 * its parent, as its locks pass to the parent's resource owner.
 */
void
IdemPendingSubXactCallback(SubXactEvent event, SubTransactionId mySubid,
						   SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();
	PendingClaim **p = &pending_claims;

	if (event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB)
		return;
	while (*p != NULL)
	{
		PendingClaim *pc = *p;

		if (event == SUBXACT_EVENT_ABORT_SUB)
		{
			if (pc->nest_level >= level)
			{
				IdemForgetPending(p);
				continue;
			}
			if (pc->done_level >= level)
				pc->done_level = 0;
		}
		else
		{
			if (pc->nest_level >= level)
				pc->nest_level = level - 1;
			if (pc->done_level >= level)
				pc->done_level = level - 1;
		}
		p = &pc->next;
	}
}
