/*-------------------------------------------------------------------------
 *
 * audit.c
 *	  State changes of keys: the structured log line
 *	  (idempotency.log_transitions) and the audit trail in
 *	  idempotency.events (idempotency.audit), and the trigger that keeps
 *	  that table append-only.
 *
 *	  Neither ever shows a key: they show its hash within its scope (see
 *	  IdemKeyHash), since logs and audit trails are read by many more
 *	  people than the keys table, and a key may be a bearer of the request.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "audit.h"
#include "compat.h"
#include "guc.h"
#include "keygen.h"
#include "util.h"

/* bytes of the fingerprint shown, as hex */
#define IDEM_FINGERPRINT_PREFIX_BYTES	4

#define EVENTS_NARGS	11

static SPIPlanPtr events_plan = NULL;

static void
IdemJsonField(StringInfo buf, const char *name, const char *value)
{
	appendStringInfoChar(buf, ',');
	escape_json(buf, name);
	appendStringInfoChar(buf, ':');
	if (value == NULL)
		appendStringInfoString(buf, "null");
	else
		escape_json(buf, value);
}

static void
IdemLogTransition(const IdemTransition *t, const char *key_hash,
				  const char *fp_prefix, int64 elapsed_ms)
{
	StringInfoData buf;

	initStringInfo(&buf);
	appendStringInfoString(&buf, "{\"event\":\"idempotency.transition\"");
	IdemJsonField(&buf, "tenant", t->tenant);
	IdemJsonField(&buf, "endpoint", t->endpoint);
	IdemJsonField(&buf, "key_hash", key_hash);
	IdemJsonField(&buf, "fingerprint_prefix", fp_prefix);
	IdemJsonField(&buf, "from", t->from_state);
	IdemJsonField(&buf, "to", t->to_state);
	appendStringInfo(&buf, ",\"replayed\":%s", t->replayed ? "true" : "false");
	if (t->response_status >= 0)
		appendStringInfo(&buf, ",\"response_status\":%d", t->response_status);
	else
		appendStringInfoString(&buf, ",\"response_status\":null");
	if (elapsed_ms >= 0)
		appendStringInfo(&buf, ",\"elapsed_ms\":" INT64_FORMAT, elapsed_ms);
	else
		appendStringInfoString(&buf, ",\"elapsed_ms\":null");
	appendStringInfoChar(&buf, '}');

	/*
	 * The statement and the context may hold the raw key (as a literal in
	 * the query text): leave both out of this line.
	 */
	ereport(LOG,
			(errmsg("idempotency transition %s", buf.data),
			 errhidestmt(true),
			 errhidecontext(true)));
	pfree(buf.data);
}

/* the owner of idempotency.events; InvalidOid when it does not exist */
static Oid
IdemEventsOwner(void)
{
	Oid			nsp = get_namespace_oid("idempotency", true);
	Oid			relid;
	HeapTuple	tuple;
	Oid			owner;

	if (!OidIsValid(nsp))
		return InvalidOid;
	relid = get_relname_relid("events", nsp);
	if (!OidIsValid(relid))
		return InvalidOid;
	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tuple))
		return InvalidOid;
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	return owner;
}

/*
 * Append the event to idempotency.events, in the caller's transaction, as
 * the table's owner: whoever changed the key needs no privilege on the
 * table, and nobody else may write it.
 */
static void
IdemAuditTransition(const IdemTransition *t, const char *key_hash,
					const char *fp_prefix, int64 elapsed_ms)
{
	Oid			owner = IdemEventsOwner();
	IdemOwnerSection section;
	Datum		values[EVENTS_NARGS];
	char		nulls[EVENTS_NARGS];
	char	   *actor;
	int			rc;

	if (!OidIsValid(owner))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("idempotency.audit is on but table idempotency.events does not exist")));

	memset(nulls, ' ', sizeof(nulls));
	actor = GetUserNameFromId(GetOuterUserId(), true);
	values[0] = TimestampTzGetDatum(GetCurrentTimestamp());
	if (actor != NULL)
		values[1] = CStringGetTextDatum(actor);
	else
		nulls[1] = 'n';
	values[2] = CStringGetTextDatum(t->tenant);
	values[3] = CStringGetTextDatum(t->endpoint);
	values[4] = CStringGetTextDatum(key_hash);
	if (fp_prefix != NULL)
		values[5] = CStringGetTextDatum(fp_prefix);
	else
		nulls[5] = 'n';
	if (t->from_state != NULL)
		values[6] = CStringGetTextDatum(t->from_state);
	else
		nulls[6] = 'n';
	if (t->to_state != NULL)
		values[7] = CStringGetTextDatum(t->to_state);
	else
		nulls[7] = 'n';
	values[8] = BoolGetDatum(t->replayed);
	if (t->response_status >= 0)
		values[9] = Int32GetDatum(t->response_status);
	else
		nulls[9] = 'n';
	if (elapsed_ms >= 0)
		values[10] = Int64GetDatum(elapsed_ms);
	else
		nulls[10] = 'n';

	IdemBeginOwnerSection(&section, owner, SECURITY_RESTRICTED_OPERATION);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (events_plan == NULL)
	{
		Oid			types[EVENTS_NARGS] = {
			TIMESTAMPTZOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID,
			TEXTOID, TEXTOID, BOOLOID, INT4OID, INT8OID
		};
		SPIPlanPtr	plan;

		plan = SPI_prepare("INSERT INTO idempotency.events "
						   "(at, actor, tenant, endpoint, key_hash, fingerprint_prefix, "
						   "from_state, to_state, replayed, response_status, elapsed_ms) "
						   "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
						   EVENTS_NARGS, types);
		if (plan == NULL)
			elog(ERROR, "could not prepare the insert into idempotency.events: %s",
				 SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "could not keep the plan of the insert into idempotency.events");
		events_plan = plan;
	}
	rc = SPI_execute_plan(events_plan, values, nulls, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "could not insert into idempotency.events: %s",
			 SPI_result_code_string(rc));
	SPI_finish();

	IdemEndOwnerSection(&section);
}

void
IdemReportTransition(const IdemTransition *t)
{
	char		key_hash[IDEM_KEY_HASH_LEN + 1];
	char		fp_prefix[IDEM_FINGERPRINT_PREFIX_BYTES * 2 + 1];
	bool		has_fp = false;
	int64		elapsed_ms = -1;

	if (!idem_log_transitions && !idem_audit)
		return;

	IdemKeyHash(t->tenant, strlen(t->tenant),
				t->endpoint, strlen(t->endpoint),
				t->key, strlen(t->key), key_hash);
	if (t->fingerprint != NULL &&
		VARSIZE_ANY_EXHDR(t->fingerprint) >= IDEM_FINGERPRINT_PREFIX_BYTES)
	{
		hex_encode(VARDATA_ANY(t->fingerprint), IDEM_FINGERPRINT_PREFIX_BYTES,
				   fp_prefix);
		fp_prefix[IDEM_FINGERPRINT_PREFIX_BYTES * 2] = '\0';
		has_fp = true;
	}
	if (t->started != 0)
	{
		elapsed_ms = (GetCurrentTimestamp() - t->started) / 1000;
		if (elapsed_ms < 0)
			elapsed_ms = 0;
	}

	if (idem_log_transitions)
		IdemLogTransition(t, key_hash, has_fp ? fp_prefix : NULL, elapsed_ms);
	if (idem_audit)
		IdemAuditTransition(t, key_hash, has_fp ? fp_prefix : NULL, elapsed_ms);
}

PG_FUNCTION_INFO_V1(idem_events_guard);

/*
 * Trigger of idempotency.events, before UPDATE, DELETE (per row) and
 * TRUNCATE: refuses unless the current user owns the table (superusers do).
 * Privileges already keep everybody else out; this stops a role that was
 * granted UPDATE or DELETE by mistake.
 */
Datum
idem_events_guard(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	IdemRequireTriggerCall(fcinfo, "idem_events_guard", "events");

	if (!IdemRelationOwnerCheck(RelationGetRelid(trigdata->tg_relation), GetUserId()))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("idempotency.events is append-only"),
				 errdetail("Only the owner of the table may update, delete or truncate its rows."),
				 errhint("Retention of the audit trail is done by the owner of the table.")));

	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
		return PointerGetDatum(trigdata->tg_newtuple);
	if (TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
		return PointerGetDatum(trigdata->tg_trigtuple);
	return PointerGetDatum(NULL);
}
