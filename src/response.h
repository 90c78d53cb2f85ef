/*-------------------------------------------------------------------------
 *
 * response.h
 *	  Stored responses: what is kept of a response at finish (size cap,
 *	  sensitive headers, store_response = false, encryption) and how it is
 *	  given back on replay.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_RESPONSE_H
#define IDEM_RESPONSE_H

#include "utils/jsonb.h"

#include "endpoint.h"

/* keys.body_kind */
typedef enum IdemBodyKind
{
	IDEM_BODY_NONE,				/* NULL: no body */
	IDEM_BODY_JSON,				/* 'json': body holds the UTF-8 JSON text */
	IDEM_BODY_BYTES,			/* 'bytes': body holds raw bytes */
	IDEM_BODY_REF,				/* 'ref': body_ref points to object storage */
	IDEM_BODY_OMITTED			/* 'omitted': the endpoint keeps no bodies */
} IdemBodyKind;

typedef struct IdemResponse
{
	int32		status;
	Jsonb	   *headers;		/* NULL when none */
	IdemBodyKind body_kind;
	bytea	   *body;			/* NULL unless JSON or BYTES */
	text	   *body_ref;		/* NULL unless REF */
	bool		encrypted;		/* body is encrypted */
} IdemResponse;

/*
 * Turn a response given to idem_finish or idem_resolve into what is stored:
 * drop sensitive headers, enforce the size cap, omit the body where the
 * endpoint keeps none, encrypt.  Raises an error, before anything is
 * written, when the response cannot be stored.
 */
extern void IdemResponseForStorage(const IdemEndpointPolicy *policy,
								   IdemResponse *resp);

/* A stored body as a replay reads it (decrypted when marked encrypted). */
extern bytea *IdemResponsePlainBody(bytea *body, bool encrypted);

/*
 * Check a response written as a stored row (idem_import_keys) as a finish
 * would check it: its columns agree with its body_kind, an encrypted body
 * decrypts with this database's key, a JSON body is JSON, the size cap,
 * the header rules.  Sensitive headers are dropped and the body omitted
 * where the endpoint keeps none, as a finish does, and a plain body kept is
 * encrypted when idempotency.encryption_key is set, as a finish encrypts it.
 * *field is left naming the column whose check raised an error.
 */
extern void IdemResponseCheckStored(const IdemEndpointPolicy *policy,
									IdemResponse *resp, const char **field);

/* A status is an HTTP status, 100 to 599 (22023 otherwise). */
extern void IdemCheckResponseStatus(int32 status);

/* Turn a stored response back into what a replay returns (decrypt). */
extern void IdemResponseForReplay(IdemResponse *resp);

extern const char *IdemBodyKindName(IdemBodyKind kind);
extern IdemBodyKind IdemBodyKindFromName(const char *name);

#endif							/* IDEM_RESPONSE_H */
