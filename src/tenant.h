/*-------------------------------------------------------------------------
 *
 * tenant.h
 *	  Binding a session to one tenant (the setting idempotency.tenant).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TENANT_H
#define IDEM_TENANT_H

#include "postgres.h"

/* defines idempotency.tenant; called from _PG_init after IdemGucInit */
extern void IdemDefineTenantSetting(void);

/*
 * Raise IK401 unless the session is unbound or bound to this tenant; the
 * tenant must already have passed IdemCheckScope.
 */
extern void IdemCheckTenant(const text *tenant);

/* The tenant this session is bound to (palloc'd), NULL when unbound. */
extern text *IdemBoundTenant(void);

#endif							/* IDEM_TENANT_H */
