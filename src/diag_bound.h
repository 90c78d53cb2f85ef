/*-------------------------------------------------------------------------
 *
 * diag_bound.h
 *	  The bound on what mismatch answers teach: how many diagnosed
 *	  mismatches one key may get, counted in shared memory.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_DIAG_BOUND_H
#define IDEM_DIAG_BOUND_H

#include "datatype/timestamp.h"

#include "scope.h"

/*
 * With shared_preload_libraries: its shared memory, requested and set up by
 * the extension's one request hook and one startup hook (shmem.c).
 */
extern void IdemDiagBoundShmemRequest(void);
extern void IdemDiagBoundShmemStartup(void);

/*
 * May this mismatch of scope's key, whose stored row was created at
 * created_at and expires at expires_at, name the members that differ?
 * Counts it when it may; false once idempotency.diagnostics_max_mismatches
 * mismatches of the stored request were diagnosed (logged once per key),
 * when the setting is 0, when the table of counts is full of live keys,
 * and without shared_preload_libraries.  Never raises an error.
 */
extern bool IdemDiagBoundAllow(const IdemScope *scope, TimestampTz created_at,
							   TimestampTz expires_at, TimestampTz now);

#endif							/* IDEM_DIAG_BOUND_H */
