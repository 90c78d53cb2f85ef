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
 *	  A function that runs as its caller must belong to a superuser or to
 *	  a role with the privileges of resolver_role, when it is set and at
 *	  each call: whoever may change or re-create it could otherwise run
 *	  code as resolver_role.
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
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#include "compat.h"
#include "resolver.h"
#include "schema.h"
#include "util.h"

static void IdemResolverCheckOwner(Oid resolver, Oid role, const char *endpoint);

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
	if (!IdemProcExecuteAllowed(resolver, role))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role \"%s\" may not execute resolver %s of endpoint \"%s\"",
						GetUserNameFromId(role, false), format_procedure(resolver),
						endpoint),
				 errdetail("A resolver runs as the endpoint's resolver_role, which needs EXECUTE on it."),
				 errhint("Grant EXECUTE on the function to the role, or name a resolver the role may execute.")));
	IdemResolverCheckOwner(resolver, role, endpoint);
}

/*
 * A resolver is found by its name at each call, and its owner may change
 * what it does at any time (CREATE OR REPLACE), as may whoever re-creates a
 * function of that name once it is dropped: a function that runs as its
 * caller is run as resolver_role only when its owner could act as that
 * role anyway (has its privileges) or is a superuser.  A SECURITY DEFINER
 * function runs as its owner, who gains nothing.
 */
static void
IdemResolverCheckOwner(Oid resolver, Oid role, const char *endpoint)
{
	HeapTuple	proctup = SearchSysCache1(PROCOID, ObjectIdGetDatum(resolver));
	Form_pg_proc proc;
	Oid			owner;
	bool		secdef;

	if (!HeapTupleIsValid(proctup))
		elog(ERROR, "cache lookup failed for function %u", resolver);
	proc = (Form_pg_proc) GETSTRUCT(proctup);
	owner = proc->proowner;
	secdef = proc->prosecdef;
	ReleaseSysCache(proctup);
	if (secdef || superuser_arg(owner) || has_privs_of_role(owner, role))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("resolver %s of endpoint \"%s\" may not run as role \"%s\"",
					format_procedure(resolver), endpoint,
					GetUserNameFromId(role, false)),
			 errdetail("Its owner, role \"%s\", may change what it does but has neither the privileges of role \"%s\" nor superuser rights.",
					   GetUserNameFromId(owner, false), GetUserNameFromId(role, false)),
			 errhint("Have the function owned by a role with the privileges of the resolver_role, or make it SECURITY DEFINER.")));
}

/*
 * The function a canonical resolver name names, or InvalidOid.  A number is
 * never taken for an OID: an OID is not kept by pg_upgrade, and a resolver
 * stored as one (a regprocedure of a function dropped before 0.4.0) names
 * no function.
 */
static Oid
IdemResolverLookup(const char *name)
{
	LOCAL_FCINFO(fcinfo, 1);
	Datum		d;

	if (name[0] == '\0' || (name[0] >= '0' && name[0] <= '9') ||
		strcmp(name, "-") == 0)
		return InvalidOid;
	InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = CStringGetTextDatum(name);
	fcinfo->args[0].isnull = false;
	d = to_regprocedure(fcinfo);
	return fcinfo->isnull ? InvalidOid : DatumGetObjectId(d);
}

Oid
IdemResolverRole(const char *endpoint, const char *resolver_name, Oid *resolver)
{
	Oid			argtypes[2] = {TEXTOID, TEXTOID};
	Datum		args[2] = {CStringGetTextDatum(endpoint), CStringGetTextDatum(resolver_name)};
	bool		isnull = true;
	Datum		d = (Datum) 0;
	int			rc;

	rc = SPI_execute_with_args("SELECT resolver_role::pg_catalog.oid FROM idempotency.endpoints"
							   " WHERE endpoint OPERATOR(pg_catalog.=) $1"
							   " AND resolver::pg_catalog.text OPERATOR(pg_catalog.=) $2",
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

	*resolver = IdemResolverLookup(resolver_name);
	if (!OidIsValid(*resolver))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("resolver %s of endpoint \"%s\" does not exist",
						resolver_name, endpoint),
				 errdetail("No function has that name and those argument types: it was dropped, renamed or moved to another schema since the resolver was set."),
				 errhint("Set the endpoint's resolver again.")));
	return isnull ? InvalidOid : DatumGetObjectId(d);
}

/*
 * The canonical name of a resolver, as stored in idempotency.endpoints:
 * schema-qualified, with its argument types (the text form of regprocedure
 * whatever the search_path), so that it names the same function after a
 * dump and restore or pg_upgrade, which do not keep function OIDs.
 */
static char *
IdemResolverName(Oid resolver)
{
	HeapTuple	proctup = SearchSysCache1(PROCOID, ObjectIdGetDatum(resolver));
	Form_pg_proc proc;
	StringInfoData buf;
	char	   *nspname;

	if (!HeapTupleIsValid(proctup))
		elog(ERROR, "cache lookup failed for function %u", resolver);
	proc = (Form_pg_proc) GETSTRUCT(proctup);
	nspname = get_namespace_name(proc->pronamespace);
	initStringInfo(&buf);
	appendStringInfo(&buf, "%s(",
					 quote_qualified_identifier(nspname, NameStr(proc->proname)));
	for (int i = 0; i < proc->pronargs; i++)
	{
		if (i > 0)
			appendStringInfoChar(&buf, ',');
		appendStringInfoString(&buf, format_type_be(proc->proargtypes.values[i]));
	}
	appendStringInfoChar(&buf, ')');
	ReleaseSysCache(proctup);
	return buf.data;
}

/* An oid-like column (regrole) of a row; InvalidOid for NULL. */
static Oid
IdemOidAttr(HeapTuple tup, TupleDesc desc, int attnum)
{
	bool		isnull;
	Datum		d = heap_getattr(tup, attnum, desc, &isnull);

	return isnull ? InvalidOid : DatumGetObjectId(d);
}

PG_FUNCTION_INFO_V1(idem_endpoints_resolver);

/*
 * The resolver column of a row as a string; NULL for NULL.  The column is
 * text from 0.4.0 on (IDEM_SCHEMA_RESOLVER_TEXT), regprocedure in a schema
 * not yet updated from 0.3.0.
 */
static char *
IdemResolverAttr(HeapTuple tup, TupleDesc desc, int attnum, bool as_text)
{
	bool		isnull;
	Datum		d = heap_getattr(tup, attnum, desc, &isnull);

	if (isnull)
		return NULL;
	if (!as_text)
		return DatumGetCString(DirectFunctionCall1(regprocedureout, d));
	return TextDatumGetCString(d);
}

/* The row idem_endpoints_resolver is given, and its columns. */
typedef struct ResolverRow
{
	Relation	rel;
	TupleDesc	desc;
	HeapTuple	newtup;
	HeapTuple	oldtup;			/* the row before an UPDATE; NULL */
	bool		as_text;		/* resolver is text (0.4.0 on), not regprocedure */
	int			resolver_att;
	int			role_att;
	int			endpoint_att;
} ResolverRow;

/* The trigger's checks of how it was fired, and the row's columns. */
static void
IdemResolverReadRow(FunctionCallInfo fcinfo, ResolverRow *row)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	row->newtup = IdemBeforeRowTriggerTuple(fcinfo, "idem_endpoints_resolver",
											"endpoints", &row->rel);
	row->oldtup = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ?
		trigdata->tg_trigtuple : NULL;
	row->desc = row->rel->rd_att;
	row->as_text = IdemSchemaHas(IDEM_SCHEMA_RESOLVER_TEXT);
	row->resolver_att = IdemTriggerColumn(row->rel, "resolver",
										  row->as_text ? TEXTOID : REGPROCEDUREOID,
										  true, "idem_endpoints_resolver");
	row->role_att = IdemTriggerColumn(row->rel, "resolver_role",
									  REGROLEOID, true, "idem_endpoints_resolver");
	row->endpoint_att = IdemTriggerColumn(row->rel, "endpoint",
										  TEXTOID, true, "idem_endpoints_resolver");
}

/* The endpoint of a row with a resolver: it must have one. */
static char *
IdemResolverEndpoint(const ResolverRow *row)
{
	bool		isnull;
	Datum		d = heap_getattr(row->newtup, row->endpoint_att, row->desc, &isnull);

	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NOT_NULL_VIOLATION),
				 errmsg("an endpoint with a resolver must have a name"),
				 errdetail("Column \"endpoint\" of table %s is NULL.",
						   RelationGetRelationName(row->rel))));
	return TextDatumGetCString(d);
}

/*
 * The function a resolver's name names: a name with its argument types, as
 * regprocedure reads it; never an OID.
 */
static Oid
IdemResolverFind(const char *name, const char *endpoint)
{
	Oid			resolver;

	if (name[0] >= '0' && name[0] <= '9')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("resolver \"%s\" of endpoint \"%s\" is not a function name",
						name, endpoint),
				 errdetail("A resolver is named by its name and argument types, such as \"my_resolver(text,text,text)\", not by an OID.")));
	resolver = DatumGetObjectId(DirectFunctionCall1(regprocedurein,
													CStringGetDatum(name)));
	if (!OidIsValid(resolver))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("resolver \"%s\" of endpoint \"%s\" names no function",
						name, endpoint)));
	return resolver;
}

/*
 * Whether me, who writes the row, may have resolver run as role: the
 * function's signature, me's EXECUTE on it, me's privileges of role, and
 * role's own checks (IdemResolverCheckRole).
 */
static void
IdemResolverCheckSetter(Oid resolver, Oid role, Oid me, const char *endpoint)
{
	IdemResolverCheckSignature(resolver, endpoint);
	if (!IdemProcExecuteAllowed(resolver, me))
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
}

/*
 * BEFORE INSERT OR UPDATE row trigger on idempotency.endpoints.  When a row
 * names a resolver that is new (an INSERT, a changed resolver) or a new
 * resolver_role: the name must name a function, which must have a
 * resolver's signature; resolver_role defaults to the current user, who
 * must have the privileges of the role named and EXECUTE on the function,
 * and so must the role.  The resolver is stored by its canonical name
 * (IdemResolverName), found again at each call.  Without a resolver,
 * resolver_role is NULL.
 */
Datum
idem_endpoints_resolver(PG_FUNCTION_ARGS)
{
	ResolverRow row;
	char	   *name;
	char	   *old_name = NULL;
	Oid			resolver;
	Oid			role;
	Oid			old_role = InvalidOid;
	char	   *endpoint;
	int			cols[2];
	Datum		values[2];
	bool		nulls[2] = {false, false};

	IdemResolverReadRow(fcinfo, &row);
	name = IdemResolverAttr(row.newtup, row.desc, row.resolver_att, row.as_text);
	role = IdemOidAttr(row.newtup, row.desc, row.role_att);
	if (row.oldtup != NULL)
	{
		old_name = IdemResolverAttr(row.oldtup, row.desc, row.resolver_att, row.as_text);
		old_role = IdemOidAttr(row.oldtup, row.desc, row.role_att);
	}

	cols[0] = row.role_att;
	if (name == NULL)
	{
		/* no resolver, no role */
		if (!OidIsValid(role))
			return PointerGetDatum(row.newtup);
		nulls[0] = true;
		values[0] = (Datum) 0;
		return PointerGetDatum(heap_modify_tuple_by_cols(row.newtup, row.desc, 1,
														 cols, values, nulls));
	}

	/* an unchanged resolver run by an unchanged role was checked before */
	if (row.oldtup != NULL && old_name != NULL && strcmp(name, old_name) == 0 &&
		role == old_role)
		return PointerGetDatum(row.newtup);

	/* a new resolver without a new role runs as whoever set it */
	if (!OidIsValid(role) || (row.oldtup != NULL && role == old_role))
		role = GetUserId();

	endpoint = IdemResolverEndpoint(&row);
	resolver = IdemResolverFind(name, endpoint);
	IdemResolverCheckSetter(resolver, role, GetUserId(), endpoint);

	values[0] = ObjectIdGetDatum(role);
	cols[1] = row.resolver_att;
	values[1] = row.as_text ?
		CStringGetTextDatum(IdemResolverName(resolver)) :
		ObjectIdGetDatum(resolver);
	return PointerGetDatum(heap_modify_tuple_by_cols(row.newtup, row.desc, 2,
													 cols, values, nulls));
}
