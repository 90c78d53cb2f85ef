/*-------------------------------------------------------------------------
 *
 * response.c
 *	  Stored responses: what is kept at finish and given back on replay.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "response.h"

static const char *const body_kind_names[] = {
	[IDEM_BODY_NONE] = NULL,
	[IDEM_BODY_JSON] = "json",
	[IDEM_BODY_BYTES] = "bytes",
	[IDEM_BODY_REF] = "ref",
	[IDEM_BODY_OMITTED] = "omitted",
};

const char *
IdemBodyKindName(IdemBodyKind kind)
{
	return body_kind_names[kind];
}

IdemBodyKind
IdemBodyKindFromName(const char *name)
{
	int			i;

	if (name == NULL)
		return IDEM_BODY_NONE;
	for (i = IDEM_BODY_JSON; i <= IDEM_BODY_OMITTED; i++)
		if (strcmp(name, body_kind_names[i]) == 0)
			return (IdemBodyKind) i;
	elog(ERROR, "unrecognized body kind \"%s\"", name);
	return IDEM_BODY_NONE;		/* keep compiler quiet */
}

/*
 * Prepare a response for storage.  Header filtering, the size cap and
 * encryption are not written yet; the response is stored as given.
 */
void
IdemResponseForStorage(const IdemEndpointPolicy *policy, IdemResponse *resp)
{
	(void) policy;
	(void) resp;
}

/* Prepare a stored response for replay. */
void
IdemResponseForReplay(IdemResponse *resp)
{
	(void) resp;
}
