/*-------------------------------------------------------------------------
 *
 * resolver.c
 *	  Who an endpoint's resolver runs as, and the checks that keep whoever
 *	  may edit idempotency.endpoints from running code with rights they do
 *	  not have.
 *
 *	  A resolver runs as the endpoint's resolver_role: the role that set the
 *	  resolver, or a role whose privileges that role has.  The trigger
 *	  idem_endpoints_resolver() enforces this when a row is written (and
 *	  that the function has a resolver's signature and that the role may
 *	  execute it); the maintenance pass checks the role and its EXECUTE
 *	  right again before each call, since both may have changed since.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#include "idempotency.h"
#include "resolver.h"

/* EXECUTE on a function: object_aclcheck from PostgreSQL 16 on */
static bool
IdemMayExecute(Oid func, Oid role)
{
#if PG_VERSION_NUM >= 160000
	return object_aclcheck(ProcedureRelationId, func, role, ACL_EXECUTE) == ACLCHECK_OK;
#else
	return pg_proc_aclcheck(func, role, ACL_EXECUTE) == ACLCHECK_OK;
#endif
}

void
IdemResolverCheckSignature(Oid resolver, const char *endpoint)
{
	HeapTuple	proctup = SearchSysCache1(PROCOID, ObjectIdGetDatum(resolver));
	Form_pg_proc proc;
	bool		ok;

	if (!HeapTupleIsValid(proctup))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("resolver function %u of endpoint \"%s\" does not exist",
						resolver, endpoint)));
	proc = (Form_pg_proc) GETSTRUCT(proctup);
	ok = proc->prokind == PROKIND_FUNCTION && proc->pronargs == 3 &&
		!proc->proretset &&
		proc->proargtypes.values[0] == TEXTOID &&
		proc->proargtypes.values[1] == TEXTOID &&
		proc->proargtypes.values[2] == TEXTOID &&
		proc->prorettype == JSONBOID;
	ReleaseSysCache(proctup);
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("resolver %s of endpoint \"%s\" must take (text, text, text) and return jsonb",
						format_procedure(resolver), endpoint),
				 errdetail("A resolver is a plain function (tenant text, endpoint text, key text) RETURNS jsonb.")));
}

void
IdemResolverCheckRole(Oid resolver, Oid role, const char *endpoint)
{
	if (!OidIsValid(role) ||
		!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(role)))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("the resolver of endpoint \"%s\" has no role to run as", endpoint),
				 errdetail("Its resolver_role is %u, which is not a role.", role),
				 errhint("Set the endpoint's resolver again, or name an existing resolver_role.")));
	if (!IdemMayExecute(resolver, role))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role \"%s\" may not execute resolver %s of endpoint \"%s\"",
						GetUserNameFromId(role, false), format_procedure(resolver),
						endpoint),
				 errdetail("A resolver runs as the endpoint's resolver_role, which needs EXECUTE on it."),
				 errhint("Grant EXECUTE on the function to the role, or name a resolver the role may execute.")));
}

Oid
IdemResolverRole(const char *endpoint, Oid resolver)
{
	Oid			argtypes[2] = {TEXTOID, OIDOID};
	Datum		args[2] = {CStringGetTextDatum(endpoint), ObjectIdGetDatum(resolver)};
	bool		isnull = true;
	Datum		d = (Datum) 0;
	int			rc;

	rc = SPI_execute_with_args("SELECT resolver_role::oid FROM idempotency.endpoints"
							   " WHERE endpoint = $1 AND resolver::oid = $2",
							   2, argtypes, args, NULL, true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "reading idempotency.endpoints failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 1)
		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the resolver of endpoint \"%s\" changed during the maintenance pass",
						endpoint),
				 errdetail("The next maintenance pass uses the endpoint's current policy.")));
	return isnull ? InvalidOid : DatumGetObjectId(d);
}

/* An oid-like column (regprocedure, regrole) of a row; InvalidOid for NULL. */
static Oid
IdemOidAttr(HeapTuple tup, TupleDesc desc, int attnum)
{
	bool		isnull;
	Datum		d = heap_getattr(tup, attnum, desc, &isnull);

	return isnull ? InvalidOid : DatumGetObjectId(d);
}

PG_FUNCTION_INFO_V1(idem_endpoints_resolver);

/*
 * BEFORE INSERT OR UPDATE row trigger on idempotency.endpoints.  When a row
 * names a resolver that is new (an INSERT, a changed resolver) or a new
 * resolver_role: resolver_role defaults to the current user, who must have
 * the privileges of the role named and EXECUTE on the function, and so
 * must the role; the function must have a resolver's signature.  Without a
 * resolver, resolver_role is NULL.
 */
Datum
idem_endpoints_resolver(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleDesc	desc;
	HeapTuple	newtup;
	HeapTuple	oldtup = NULL;
	int			resolver_att;
	int			role_att;
	int			endpoint_att;
	bool		isnull;
	Oid			resolver;
	Oid			role;
	Oid			old_resolver = InvalidOid;
	Oid			old_role = InvalidOid;
	char	   *endpoint;
	Oid			me = GetUserId();
	int			cols[1];
	Datum		values[1];
	bool		nulls[1];

	IdemRequireTriggerCall(fcinfo, "idem_endpoints_resolver");
	if (!TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function %s must be fired BEFORE INSERT OR UPDATE FOR EACH ROW",
						"idem_endpoints_resolver")));

	desc = trigdata->tg_relation->rd_att;
	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
	{
		newtup = trigdata->tg_newtuple;
		oldtup = trigdata->tg_trigtuple;
	}
	else
		newtup = trigdata->tg_trigtuple;

	resolver_att = SPI_fnumber(desc, "resolver");
	role_att = SPI_fnumber(desc, "resolver_role");
	endpoint_att = SPI_fnumber(desc, "endpoint");
	if (resolver_att <= 0 || role_att <= 0 || endpoint_att <= 0)
		elog(ERROR, "idem_endpoints_resolver: table %s lacks a column it needs",
			 RelationGetRelationName(trigdata->tg_relation));

	resolver = IdemOidAttr(newtup, desc, resolver_att);
	role = IdemOidAttr(newtup, desc, role_att);
	if (oldtup != NULL)
	{
		old_resolver = IdemOidAttr(oldtup, desc, resolver_att);
		old_role = IdemOidAttr(oldtup, desc, role_att);
	}

	cols[0] = role_att;
	nulls[0] = false;
	if (!OidIsValid(resolver))
	{
		/* no resolver, no role */
		if (!OidIsValid(role))
			return PointerGetDatum(newtup);
		nulls[0] = true;
		values[0] = (Datum) 0;
		return PointerGetDatum(heap_modify_tuple_by_cols(newtup, desc, 1, cols, values, nulls));
	}

	/* an unchanged resolver run by an unchanged role was checked before */
	if (oldtup != NULL && resolver == old_resolver && role == old_role)
		return PointerGetDatum(newtup);

	/* a new resolver without a new role runs as whoever set it */
	if (!OidIsValid(role) || (oldtup != NULL && role == old_role))
		role = me;

	endpoint = TextDatumGetCString(heap_getattr(newtup, endpoint_att, desc, &isnull));
	IdemResolverCheckSignature(resolver, endpoint);
	if (!IdemMayExecute(resolver, me))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to name %s as the resolver of endpoint \"%s\"",
						format_procedure(resolver), endpoint),
				 errdetail("The role that sets a resolver must have EXECUTE on the function.")));
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(role)))
		IdemResolverCheckRole(resolver, role, endpoint);	/* raises */
	if (!has_privs_of_role(me, role))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to run the resolver of endpoint \"%s\" as role \"%s\"",
						endpoint, GetUserNameFromId(role, false)),
				 errdetail("Only a role that has the privileges of a role may name it as resolver_role.")));
	IdemResolverCheckRole(resolver, role, endpoint);

	values[0] = ObjectIdGetDatum(role);
	return PointerGetDatum(heap_modify_tuple_by_cols(newtup, desc, 1, cols, values, nulls));
}
