/*-------------------------------------------------------------------------
 *
 * idempotency.c
 *	  Entry point of the idempotency extension: module magic and _PG_init,
 *	  which only hands over to each module's initialisation function.  No
 *	  module depends on this file.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"

#include "claim.h"
#include "guc.h"
#include "shmem.h"
#include "tenant.h"
#include "util.h"
#include "worker.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	IdemUtilInit();
	IdemGucInit();
	IdemDefineTenantSetting();
	IdemGucReservePrefix();
	IdemShmemInit();
	IdemClaimInit();
	IdemWorkerInit();
}
