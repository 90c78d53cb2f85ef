"""HTTP idempotency keys for ASGI applications (Starlette, FastAPI) on the
idempotency PostgreSQL extension."""

from typing import TYPE_CHECKING, Any

from .body import BodyError, form_to_json, fingerprint_body
from .header import IdempotencyKeyError, KeyError_, apply_key_policy, parse_key_header
from .middleware import Context, IdempotencyMiddleware, claim, idempotency, interval_seconds
from .function import (IdempotencyError, IdempotencyInProgressError, IdempotencyKeyReuseError,
                       IdempotencyOutcomePendingError, idempotent_function)
from .profiles import answer
from .retry import RetryOutcome, backoff_delay, classify, new_key, parse_retry_after, with_retry, with_retry_sync

__all__ = ["IdempotencyMiddleware", "Context", "claim", "idempotency", "parse_key_header", "apply_key_policy", "form_to_json",
           "fingerprint_body", "answer", "interval_seconds", "IdempotencyKeyError", "BodyError",
           "idempotent_function", "IdempotencyError", "IdempotencyKeyReuseError", "IdempotencyInProgressError",
           "IdempotencyOutcomePendingError", "classify", "parse_retry_after", "backoff_delay", "with_retry",
           "with_retry_sync", "RetryOutcome", "new_key", "run_outbox"]

if TYPE_CHECKING:
    from .outbox import run_outbox


def __getattr__(name: str) -> Any:
    """run_outbox is imported on first use: `python3 -m idempotency_asgi.outbox`
    runs that module as __main__, which must not be imported before."""
    if name == "run_outbox":
        from .outbox import run_outbox
        return run_outbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
