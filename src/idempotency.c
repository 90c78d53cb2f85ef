/*-------------------------------------------------------------------------
 *
 * idempotency.c
 *	  Entry point of the idempotency extension: module magic and _PG_init,
 *	  which only hands over to each module's initialisation function.  The
 *	  helpers every module shares are in util.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"

#include "idempotency.h"
#include "claim.h"
#include "diag_bound.h"
#include "guc.h"
#include "horizon.h"
#include "scope.h"
#include "stats.h"
#include "tenant.h"
#include "tombfilter.h"
#include "worker.h"

PG_MODULE_MAGIC;

bool		IdemPreloaded = false;

void		_PG_init(void);

void
_PG_init(void)
{
	IdemPreloaded = process_shared_preload_libraries_in_progress;

	IdemGucInit();
	IdemDefineTenantSetting();
	IdemGucReservePrefix();
	IdemStatsInit();
	IdemHorizonInit();
	IdemTombFilterInit();
	IdemDiagBoundInit();
	IdemScopeInit();
	IdemClaimInit();
	IdemWorkerInit();
}
