/*-------------------------------------------------------------------------
 *
 * shmem.c
 *	  The extension's shared memory, as pg_stat_statements does it: one
 *	  shmem_request_hook and one shmem_startup_hook in the server's chains,
 *	  each calling the function of every module that keeps a part of it
 *	  (the counters, the key horizons, the tombstone filters, the bound on
 *	  diagnosed mismatches, the secret of the scope locks), in that order.
 *	  Each module requests and sets up its own part; only the library
 *	  loaded through shared_preload_libraries installs the hooks.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"

#include "diag_bound.h"
#include "horizon.h"
#include "scope.h"
#include "shmem.h"
#include "stats.h"
#include "tombstone_filter.h"

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
IdemShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	IdemStatsShmemRequest();
	IdemHorizonShmemRequest();
	IdemTombFilterShmemRequest();
	IdemDiagBoundShmemRequest();
	IdemScopeShmemRequest();
}

static void
IdemShmemStartup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	IdemStatsShmemStartup();
	IdemHorizonShmemStartup();
	IdemTombFilterShmemStartup();
	IdemDiagBoundShmemStartup();
	IdemScopeShmemStartup();
}

void
IdemShmemInit(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = IdemShmemRequest;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = IdemShmemStartup;
}
