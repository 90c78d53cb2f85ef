"""HTTP idempotency keys for ASGI applications (Starlette, FastAPI) on the
idempotency PostgreSQL extension."""

from .body import BodyError, form_to_json, fingerprint_body
from .header import IdempotencyKeyError, KeyError_, apply_key_policy, parse_key_header
from .middleware import Context, IdempotencyMiddleware, claim, idempotency, interval_seconds
from .function import (IdempotencyError, IdempotencyInProgressError, IdempotencyKeyReuseError,
                       IdempotencyOutcomePendingError, idempotent_function)
from .profiles import answer
from .outbox import run_outbox
from .retry import RetryOutcome, backoff_delay, classify, new_key, parse_retry_after, with_retry, with_retry_sync

__all__ = ["IdempotencyMiddleware", "Context", "claim", "idempotency", "parse_key_header", "apply_key_policy", "form_to_json",
           "fingerprint_body", "answer", "interval_seconds", "IdempotencyKeyError", "BodyError",
           "idempotent_function", "IdempotencyError", "IdempotencyKeyReuseError", "IdempotencyInProgressError",
           "IdempotencyOutcomePendingError", "classify", "parse_retry_after", "backoff_delay", "with_retry",
           "with_retry_sync", "RetryOutcome", "new_key", "run_outbox"]
