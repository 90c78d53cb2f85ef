/*-------------------------------------------------------------------------
 *
 * schema.c
 *	  The version of the extension's schema installed in this database.
 *
 *	  A library of one version runs under the SQL objects of an older one
 *	  between the installation of its package and ALTER EXTENSION
 *	  idempotency UPDATE: claims must keep working there.  The version is
 *	  read from pg_extension.extversion, and the code branches on the
 *	  features schema.h names, never on the presence of a table or column.
 *
 *	  The answer is cached per backend and forgotten at every relcache
 *	  invalidation: no version of the schema differs from the one before
 *	  without a change of a table or composite type, whose invalidation
 *	  reaches every backend when the update commits (and this one at the
 *	  update's next command).  Other invalidations cost one index probe of
 *	  pg_extension at the next use, never one per claim.
 *
 *	  While an extension script runs (CREATE or ALTER EXTENSION), nothing is
 *	  cached: pg_extension names the version the script makes before its
 *	  statements have made it, so C functions the script calls or whose
 *	  triggers it fires must not depend on what it is about to create.  A
 *	  version this library does not know (a newer one, or none: the
 *	  extension is being dropped) reads as the library's own.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"

#include "schema.h"
#include "util.h"

#define IDEM_EXTENSION_NAME		"idempotency"

static IdemSchema schema_version = IDEM_SCHEMA_LIBRARY;
static bool schema_version_valid = false;
static bool schema_callback_registered = false;

/* Any relcache invalidation: read the version again at the next use. */
static void
IdemSchemaInvalidate(Datum arg, Oid relid)
{
	schema_version_valid = false;
}

/* the version named by extversion; the library's own for one it does not know */
static IdemSchema
IdemSchemaFromName(const char *name)
{
	static const struct
	{
		const char *name;
		IdemSchema	version;
	}			known[] = {
		{"0.1.0", IDEM_SCHEMA_0_1},
		{"0.2.0", IDEM_SCHEMA_0_2},
		{"0.3.0", IDEM_SCHEMA_0_3},
		{"0.4.0", IDEM_SCHEMA_0_4},
	};

	for (int i = 0; i < (int) lengthof(known); i++)
		if (strcmp(name, known[i].name) == 0)
			return known[i].version;
	return IDEM_SCHEMA_LIBRARY;
}

/* pg_extension.extversion of the extension; false when it has no row */
static bool
IdemSchemaRead(IdemSchema *version)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	bool		found = false;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber,
				F_NAMEEQ, CStringGetDatum(IDEM_EXTENSION_NAME));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, Anum_pg_extension_extversion,
									 RelationGetDescr(rel), &isnull);

		if (!isnull)
		{
			*version = IdemSchemaFromName(TextDatumGetCString(d));
			found = true;
		}
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}

IdemSchema
IdemSchemaVersion(void)
{
	IdemSchema	version;

	if (schema_version_valid)
		return schema_version;

	/*
	 * The catalog is read in a transaction only: outside one (a background
	 * worker between two transactions) there is no resource owner to hold
	 * the relation.  A caller there is a bug, raised rather than crashing.
	 */
	if (!IsTransactionState())
		elog(ERROR, "idempotency: the schema's version was asked for outside a transaction");
	if (!schema_callback_registered)
	{
		IdemRegisterRelcacheCallback(IdemSchemaInvalidate);
		schema_callback_registered = true;
	}
	if (!IdemSchemaRead(&version))
		return IDEM_SCHEMA_LIBRARY;
	if (creating_extension)
		return version;
	schema_version = version;
	schema_version_valid = true;
	return version;
}
