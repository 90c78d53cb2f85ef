"""What each outcome answers, per convention: 'stripe' (Stripe's API and
what stripe-node understands) and 'ietf' (draft-ietf-httpapi-idempotency-key-header,
errors as RFC 9457 problem details).  The same table as the Node client."""

from typing import Any, Dict, List, Mapping, Optional, Tuple

#: the problem types' URIs (ietf) are this base and the answer's code, one
#: per problem: each code has its anchor in doc/http.md ("Problem codes")
PROBLEM_TYPE_BASE = "https://pgxn.org/dist/idempotency/doc/http.html#"

# outcome -> (stripe status, stripe error type, Stripe-Should-Retry, ietf status, title)
OUTCOMES: Dict[str, Tuple[int, str, str, int, str]] = {
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
    "not_configured": (500, "api_error", "false", 500, "The idempotency layer of this API is not configured"),
    "too_large": (500, "api_error", "false", 500, "The response is too large to be stored for replay"),
    "unavailable": (503, "api_error", "true", 503,
                    "The request could not be completed; retry it with the same Idempotency-Key"),
}

# outcome -> the code its answer carries when the caller names none (every
# answer has a code: Stripe's error.code, the problem's code and type)
DEFAULT_CODE: Dict[str, str] = {
    "key_missing": "idempotency_key_missing",
    "key_invalid": "idempotency_key_invalid",
    "body_invalid": "request_body_invalid",
    "in_progress": "request_in_progress",
    "mismatch": "idempotency_key_reuse",
    "pending": "outcome_pending",
    "expired": "key_expired",
    "not_configured": "idempotency_not_configured",
    "too_large": "response_too_large",
    "unavailable": "request_not_completed",
}

ACTION_OUTCOME: Dict[str, str] = {"in_progress": "in_progress", "mismatch": "mismatch", "pending": "pending",
                  "expired": "expired"}


def mismatch_message(m: Mapping[str, Any]) -> Optional[str]:
    """What a mismatch's diagnostics say, in one sentence: the members (JSON
    Pointers into the body) that differ, never their values."""
    def names(xs: List[str]) -> str:
        return ", ".join("the whole body" if p == "" else p for p in xs)
    parts: List[str] = []
    if m.get("method"):
        parts.append("the method differs")
    if m.get("path"):
        parts.append("the path differs")
    for what in ("changed", "added", "removed"):
        if m.get(what):
            parts.append(f"{what}: {names(m[what])}")
    if not parts:
        return None
    return (f"{OUTCOMES['mismatch'][4]} ({'; '.join(parts)}"
            f"{'; within the members named' if m.get('truncated') else ''}).")


def answer(profile: str, outcome: str, message: Optional[str] = None, code: Optional[str] = None,
           retry_after: Optional[int] = None,
           mismatch: Optional[Mapping[str, Any]] = None,
           type_base: Optional[str] = None) -> Tuple[int, Dict[str, str], Dict[str, Any]]:
    """(status, headers dict, body as a JSON value).  code: the outcome's
    own by default; the ietf problem's type is type_base (PROBLEM_TYPE_BASE
    by default) followed by the code."""
    o = OUTCOMES[outcome]
    code = code or DEFAULT_CODE[outcome]
    if mismatch and not message:
        message = mismatch_message(mismatch)
    headers: Dict[str, str] = {}
    if retry_after:
        headers["Retry-After"] = str(retry_after)
    if profile == "stripe":
        headers["Stripe-Should-Retry"] = o[2]
        headers["Content-Type"] = "application/json"
        error: Dict[str, Any] = {"type": o[1], "message": message or o[4], "code": code}
        if mismatch:
            error["mismatch"] = mismatch
        return o[0], headers, {"error": error}
    headers["Content-Type"] = "application/problem+json"
    body: Dict[str, Any] = {"type": (type_base or PROBLEM_TYPE_BASE) + code, "title": o[4], "status": o[3]}
    if message:
        body["detail"] = message
    body["code"] = code
    if mismatch:
        body["mismatch"] = mismatch
    return o[3], headers, body
