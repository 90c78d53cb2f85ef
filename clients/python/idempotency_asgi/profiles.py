"""What each outcome answers, per convention: 'stripe' (Stripe's API and
what stripe-node understands) and 'ietf' (draft-ietf-httpapi-idempotency-key-header,
errors as RFC 9457 problem details).  The same table as the Node client."""

IETF_TYPE = "https://datatracker.ietf.org/doc/draft-ietf-httpapi-idempotency-key-header/"

# outcome -> (stripe status, stripe error type, Stripe-Should-Retry, ietf status, title)
OUTCOMES = {
    "key_missing": (400, "invalid_request_error", "false", 400, "Idempotency-Key is missing"),
    "key_invalid": (400, "invalid_request_error", "false", 400, "Idempotency-Key is malformed"),
    "body_invalid": (400, "invalid_request_error", "false", 400, "The request body cannot be read"),
    "in_progress": (409, "idempotency_error", "true", 409,
                    "A request with this Idempotency-Key is being processed"),
    "mismatch": (400, "idempotency_error", "false", 422,
                 "This Idempotency-Key was used with a different request"),
    "pending": (409, "idempotency_error", "false", 409,
                "The outcome of the request with this Idempotency-Key is being resolved"),
    "expired": (409, "idempotency_error", "false", 409,
                "This Idempotency-Key has expired; send the request with a new key to repeat it"),
    "unavailable": (503, "api_error", "true", 503,
                    "The request could not be completed; retry it with the same Idempotency-Key"),
}

ACTION_OUTCOME = {"in_progress": "in_progress", "mismatch": "mismatch", "pending": "pending",
                  "expired": "expired"}


def answer(profile, outcome, message=None, code=None, retry_after=None):
    """(status, headers dict, body as a JSON value)."""
    o = OUTCOMES[outcome]
    headers = {}
    if retry_after:
        headers["Retry-After"] = str(retry_after)
    if profile == "stripe":
        headers["Stripe-Should-Retry"] = o[2]
        headers["Content-Type"] = "application/json"
        error = {"type": o[1], "message": message or o[4]}
        if code:
            error["code"] = code
        return o[0], headers, {"error": error}
    headers["Content-Type"] = "application/problem+json"
    body = {"type": IETF_TYPE, "title": o[4], "status": o[3]}
    if message:
        body["detail"] = message
    if code:
        body["code"] = code
    return o[3], headers, body
