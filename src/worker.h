/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  The maintenance background worker: a launcher, and a short-lived
 *	  worker per database that runs one maintenance pass.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_WORKER_H
#define IDEM_WORKER_H

#include "postgres.h"

/* Register the launcher; does nothing unless preloaded. */
extern void IdemWorkerInit(void);

extern PGDLLEXPORT void IdemLauncherMain(Datum main_arg);
extern PGDLLEXPORT void IdemDatabaseWorkerMain(Datum main_arg);

#endif							/* IDEM_WORKER_H */
