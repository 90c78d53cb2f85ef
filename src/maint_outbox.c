/*-------------------------------------------------------------------------
 *
 * maint_outbox.c
 *	  The step of a maintenance pass that removes finished operations of
 *	  the outbox (sql/parts/80_outbox.sql, doc/calling.md): those that
 *	  succeeded or failed longer than idempotency.outbox_retention before
 *	  the pass's as_of leave idempotency.outbox, and their attempts
 *	  leave idempotency.outbox_attempts (ON DELETE CASCADE).  Operations
 *	  that need attention, are pending or in flight are never removed.
 *
 *	  The rows go in statements of at most IDEM_OUTBOX_BATCH operations,
 *	  each a step of its own (a transaction of its own for the worker), so
 *	  that no statement holds many row locks or runs long; rows locked by
 *	  another transaction are skipped until the next pass.  Every name is
 *	  qualified: the step runs as the extension's owner.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/timestamp.h"

#include "guc.h"
#include "util.h"
#include "maint_outbox.h"
#include "schema.h"

/* operations one statement removes at most */
#define IDEM_OUTBOX_BATCH	1000

/* the statements' common condition, $1 being the cut-off time */
#define IDEM_OUTBOX_FINISHED \
	"o.state OPERATOR(pg_catalog.=) ANY ('{succeeded,failed}'::pg_catalog.text[])" \
	" AND o.finished_at OPERATOR(pg_catalog.<) $1"

void
IdemMaintOutbox(IdemMaintPass *p)
{
	TimestampTz cutoff;
	Oid			argtypes[1] = {TIMESTAMPTZOID};
	Datum		args[1];
	int64		total = 0;

	cutoff = p->as_of - (TimestampTz) idem_outbox_retention * USECS_PER_SEC;
	args[0] = TimestampTzGetDatum(cutoff);

	/* in the step: the schema's version is read from the catalog */
	IdemMaintStepBegin(p);
	if (!IdemSchemaHas(IDEM_SCHEMA_OUTBOX))
	{
		IdemMaintStepEnd(p);
		return;
	}
	if (p->preview)
	{
		bool		isnull;

		if (SPI_execute_with_args("SELECT pg_catalog.count(*) FROM idempotency.outbox o"
								  " WHERE " IDEM_OUTBOX_FINISHED,
								  1, argtypes, args, NULL, true, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not count the finished operations of the outbox");
		total = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											SPI_tuptable->tupdesc, 1, &isnull));
	}
	else
	{
		uint64		n;

		for (;;)
		{
			n = IdemSpiExec("DELETE FROM idempotency.outbox d"
							" WHERE d.id OPERATOR(pg_catalog.=) ANY (ARRAY("
							"SELECT o.id FROM idempotency.outbox o"
							" WHERE " IDEM_OUTBOX_FINISHED
							" ORDER BY o.finished_at"
							" LIMIT " CppAsString2(IDEM_OUTBOX_BATCH)
							" FOR UPDATE SKIP LOCKED))",
							1, argtypes, args, NULL, false, SPI_OK_DELETE);
			total += (int64) n;
			if (n < IDEM_OUTBOX_BATCH)
				break;
			/* the next batch in a statement (and a transaction) of its own */
			IdemMaintStepEnd(p);
			IdemMaintStepBegin(p);
		}
	}
	if (total > 0)
		IdemMaintReport(p, IDEM_MAINT_PURGE, IDEM_MAINT_OUTBOX_OBJECT, total);
	IdemMaintStepEnd(p);
}
