/*-------------------------------------------------------------------------
 *
 * resolver.h
 *	  Who an endpoint's resolver runs as, and the checks made when it is set
 *	  and before each call.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_RESOLVER_H
#define IDEM_RESOLVER_H

/* Raise unless resolver is a function (text, text, text) RETURNS jsonb. */
extern void IdemResolverCheckSignature(Oid resolver, const char *endpoint);

/*
 * Raise unless role exists and may execute resolver, and the function runs
 * as its owner (SECURITY DEFINER) or its owner is a superuser or has the
 * privileges of role (who may change the function may act as role anyway).
 */
extern void IdemResolverCheckRole(Oid resolver, Oid role, const char *endpoint);

/*
 * The resolver_role of the endpoint whose resolver is resolver_name (its
 * canonical name), read with SPI (connected by the caller); InvalidOid when
 * it has none.  Sets *resolver to the function the name names now.  Raises
 * when the endpoint no longer names that resolver, or the name no function.
 */
extern Oid	IdemResolverRole(const char *endpoint, const char *resolver_name,
							 Oid *resolver);

#endif							/* IDEM_RESOLVER_H */
