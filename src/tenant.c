/*-------------------------------------------------------------------------
 *
 * tenant.c
 *	  Binding a session to one tenant: the setting idempotency.tenant, and
 *	  the check every function that takes a tenant makes against it; the
 *	  bound tenant itself for the outbox's functions, which take none
 *	  (idem_outbox_tenant).
 *
 *	  The setting is PGC_SUSET, so that only superusers and roles granted
 *	  SET on it can give it a value: by ALTER ROLE / ALTER DATABASE ... SET,
 *	  in a connection's startup packet, or with SET.  A role without that
 *	  right can neither set nor reset it, and cannot override its own
 *	  role-level value in its startup packet.
 *
 *	  On top of that, the first non-empty value a session takes binds it for
 *	  the rest of its life ("set once"): a later SET, set_config() or
 *	  function SET clause naming another tenant is refused, whoever runs it,
 *	  and what RESET, RESET ALL, DISCARD ALL or the rollback of a
 *	  (sub)transaction would bring back is ignored, because the binding is
 *	  kept here and not read back from the setting.  So a pooler whose login
 *	  role may set the tenant can bind each server connection once, and the
 *	  application code that runs on it afterwards, even as that same role,
 *	  cannot move it to another tenant.
 *
 *	  Without shared_preload_libraries the setting is defined only when a
 *	  function of the extension first loads the library; until then it is a
 *	  placeholder.  PostgreSQL then applies again what the placeholder held,
 *	  with the rights of whoever set it, but a value a role put in its own
 *	  startup packet has already replaced the role-level one, and is then
 *	  refused: the session would end up bound to nothing.  So a session that
 *	  did not preload the library and is not bound when it first checks a
 *	  tenant reads the role-level and database-level settings itself.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/pg_db_role_setting.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/rel.h"

#include "idempotency.h"
#include "keys.h"
#include "tenant.h"

/* the setting's own value, as guc.c keeps it */
static char *idem_tenant_setting = NULL;

/*
 * The tenant this session is bound to, once bound.  Not a copy of the
 * setting: it never changes again, whatever the setting later goes back to.
 * A value longer than a tenant can be still binds (and then no tenant
 * matches), so that a misconfigured binding refuses everything rather than
 * nothing.
 */
static bool idem_tenant_bound = false;
static char idem_bound_tenant[IDEM_SCOPE_MAX_LEN + 2];
static int	idem_bound_tenant_len = 0;

/* whether the role-level settings have been read (library not preloaded) */
static bool idem_tenant_settings_read = false;

static bool
IdemTenantCheckHook(char **newval, void **extra, GucSource source)
{
	const char *value = *newval != NULL ? *newval : "";
	size_t		len = strlen(value);

	/* ALTER ROLE / ALTER DATABASE ... SET only validate a value */
	if (source == PGC_S_TEST || !idem_tenant_bound)
		return true;
	if (len == (size_t) idem_bound_tenant_len &&
		memcmp(value, idem_bound_tenant, len) == 0)
		return true;

	GUC_check_errcode(ERRCODE_CANT_CHANGE_RUNTIME_PARAM);
	GUC_check_errmsg("parameter \"idempotency.tenant\" cannot be changed once it has bound the session");
	GUC_check_errdetail("This session is bound to tenant \"%s\" until it ends.",
						idem_bound_tenant);
	GUC_check_errhint("Open another connection to act for another tenant.");
	return false;
}

static void
IdemTenantAssignHook(const char *newval, void *extra)
{
	size_t		len;

	if (idem_tenant_bound || newval == NULL || newval[0] == '\0')
		return;
	len = strlen(newval);
	/* too long for a tenant: keep one byte more, so that none matches */
	if (len > IDEM_SCOPE_MAX_LEN)
		len = IDEM_SCOPE_MAX_LEN + 1;
	memcpy(idem_bound_tenant, newval, len);
	idem_bound_tenant[len] = '\0';
	idem_bound_tenant_len = (int) len;
	idem_tenant_bound = true;
}

static const char *
IdemTenantShowHook(void)
{
	if (idem_tenant_bound)
		return idem_bound_tenant;
	return idem_tenant_setting != NULL ? idem_tenant_setting : "";
}

void
IdemDefineTenantSetting(void)
{
	DefineCustomStringVariable("idempotency.tenant",
							   "Tenant to which this session is bound; functions refuse any other tenant.",
							   "Empty: not bound. The first value a session takes binds it until it ends.",
							   &idem_tenant_setting,
							   "",
							   PGC_SUSET, 0,
							   IdemTenantCheckHook,
							   IdemTenantAssignHook,
							   IdemTenantShowHook);
}

/*
 * The value idempotency.tenant has in one row of pg_db_role_setting, or NULL.
 */
static char *
IdemTenantSettingOf(Relation rel, Oid databaseid, Oid roleid)
{
	ScanKeyData keys[2];
	SysScanDesc scan;
	HeapTuple	tup;
	char	   *result = NULL;

	ScanKeyInit(&keys[0], Anum_pg_db_role_setting_setdatabase,
				BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(databaseid));
	ScanKeyInit(&keys[1], Anum_pg_db_role_setting_setrole,
				BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(roleid));
	scan = systable_beginscan(rel, DbRoleSettingDatidRolidIndexId, true,
							  NULL, 2, keys);
	while (result == NULL && HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		isnull;
		Datum		datum;
		Datum	   *items;
		int			nitems;
		int			i;

		datum = heap_getattr(tup, Anum_pg_db_role_setting_setconfig,
							 RelationGetDescr(rel), &isnull);
		if (isnull)
			continue;
		deconstruct_array(DatumGetArrayTypeP(datum), TEXTOID, -1, false,
						  TYPALIGN_INT, &items, NULL, &nitems);
		for (i = 0; i < nitems && result == NULL; i++)
		{
			char	   *name;
			char	   *value;

			ParseLongOption(TextDatumGetCString(items[i]), &name, &value);
			if (value != NULL && pg_strcasecmp(name, "idempotency.tenant") == 0)
				result = value;
		}
	}
	systable_endscan(scan);
	return result;
}

/*
 * Bind the session as its login role's settings say, in the order in which
 * PostgreSQL applies them at login: the role in this database, the role,
 * this database, every database.  Only for a library that was not preloaded
 * and a session not bound yet, once.
 */
static void
IdemTenantFromRoleSettings(void)
{
	Oid			roleid = GetSessionUserId();
	Relation	rel;
	char	   *value;

	idem_tenant_settings_read = true;
	rel = table_open(DbRoleSettingRelationId, AccessShareLock);
	value = IdemTenantSettingOf(rel, MyDatabaseId, roleid);
	if (value == NULL)
		value = IdemTenantSettingOf(rel, InvalidOid, roleid);
	if (value == NULL)
		value = IdemTenantSettingOf(rel, MyDatabaseId, InvalidOid);
	if (value == NULL)
		value = IdemTenantSettingOf(rel, InvalidOid, InvalidOid);
	table_close(rel, AccessShareLock);
	if (value != NULL)
		IdemTenantAssignHook(value, NULL);
}

void
IdemCheckTenant(const text *tenant)
{
	if (!idem_tenant_bound && !IdemPreloaded && !idem_tenant_settings_read)
		IdemTenantFromRoleSettings();
	if (!idem_tenant_bound)
		return;
	if (VARSIZE_ANY_EXHDR(tenant) == (Size) idem_bound_tenant_len &&
		memcmp(VARDATA_ANY(tenant), idem_bound_tenant, idem_bound_tenant_len) == 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_WRONG_TENANT),
			 errmsg("this session may not act for tenant \"%s\"",
					text_to_cstring(tenant)),
			 errdetail("The setting idempotency.tenant binds this session to tenant \"%s\".",
					   idem_bound_tenant),
			 errhint("Pass the session's own tenant, or connect as a role bound to the other tenant.")));
}

/*
 * The tenant this session is bound to, or NULL when it is bound to none;
 * read as IdemCheckTenant reads it (the role-level settings included, for
 * a library that was not preloaded).
 */
text *
IdemBoundTenant(void)
{
	if (!idem_tenant_bound && !IdemPreloaded && !idem_tenant_settings_read)
		IdemTenantFromRoleSettings();
	if (!idem_tenant_bound)
		return NULL;
	return cstring_to_text_with_len(idem_bound_tenant, idem_bound_tenant_len);
}

PG_FUNCTION_INFO_V1(idem_outbox_tenant);

/*
 * idem_outbox_tenant() RETURNS text
 *		The session's bound tenant, NULL when unbound: the tenant under which
 *		the outbox's functions add, and whose operations alone they lease,
 *		record and release (sql/parts/80_outbox.sql).
 */
Datum
idem_outbox_tenant(PG_FUNCTION_ARGS)
{
	text	   *tenant = IdemBoundTenant();

	if (tenant == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(tenant);
}
