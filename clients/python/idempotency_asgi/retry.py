"""The client rules for retrying a keyed request (issue 37): which outcomes
are retried, the full-jitter backoff, Retry-After, and the state an
operation ends in when its retries end.  The rules are those of
clients/vectors/retry.json, shared with the Node client.

``with_retry`` (async) and ``with_retry_sync`` send one operation with the
same key on every attempt, for callers sending directly rather than
through the outbox (idempotency_asgi.outbox)."""

import asyncio
import email.utils
import inspect
import random as _random
import re
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Mapping, Optional, Tuple, Union

RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
#: the state of an operation whose retries ended after an attempt of this kind
FINAL_STATE = {"success": "succeeded", "fatal": "failed", "new_key": "failed",
               "retry": "attention", "wait": "attention", "refresh": "attention"}
_SECONDS = re.compile(r"\d+")


def classify(status: Optional[int] = None, error: Optional[Union[str, BaseException]] = None) -> str:
    """The kind of an attempt's outcome: success, retry, wait, refresh,
    new_key or fatal.  ``error`` is "network", "timeout" or an exception
    raised by the attempt (a timeout or a transport error)."""
    if error is not None:
        return "retry" if error_kind(error) in ("network", "timeout") else "fatal"
    if status is None:
        raise ValueError("classify needs a status or an error")
    if 200 <= status < 300:
        return "success"
    if status in RETRY_STATUSES:
        return "retry"
    return {409: "wait", 401: "refresh", 422: "new_key"}.get(status, "fatal")


def error_kind(error: Union[str, BaseException]) -> Optional[str]:
    """"timeout", "network", or None for an error that is not about the
    transport (a bug in the caller: not retried)."""
    if isinstance(error, str):
        return error if error in ("network", "timeout") else None
    names = {c.__name__ for c in type(error).__mro__}
    if isinstance(error, (TimeoutError, asyncio.TimeoutError)) or "TimeoutException" in names:
        return "timeout"
    if isinstance(error, OSError) or names & {"TransportError", "HTTPError", "ProtocolError", "NetworkError"}:
        return "network"
    return None


def parse_retry_after(header: Optional[str], now: Union[None, float, datetime, str] = None) -> Optional[int]:
    """A Retry-After header in milliseconds (delay-seconds, or an HTTP date
    relative to ``now``: a datetime, epoch seconds, an HTTP date, or the
    current time); None when absent or not valid; 0 for a date past."""
    if header is None:
        return None
    text = header.strip()
    if _SECONDS.fullmatch(text):
        return int(text) * 1000
    if ":" not in text or "," not in text:
        return None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    delta = when.timestamp() - _epoch(now)
    return max(0, int(round(delta * 1000)))


def _epoch(now: Union[None, float, datetime, str]) -> float:
    if now is None:
        return time.time()
    if isinstance(now, datetime):
        return now.timestamp()
    if isinstance(now, str):
        return email.utils.parsedate_to_datetime(now).timestamp()
    return float(now)


def backoff_max(attempts: int, base_ms: float = 100, cap_ms: float = 10000) -> float:
    """The upper bound of the full-jitter delay after ``attempts`` attempts."""
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    return float(min(cap_ms, base_ms * 2 ** min(attempts - 1, 62)))


def backoff_delay(attempts: int, base_ms: float = 100, cap_ms: float = 10000,
                  random: Callable[[], float] = _random.random) -> float:
    """Full jitter: uniform in [0, min(cap_ms, base_ms * 2^(attempts-1))] ms."""
    return random() * backoff_max(attempts, base_ms, cap_ms)


@dataclass
class Decision:
    """What follows an attempt: ``outcome`` is "succeeded", "failed",
    "attention" (retries ended on an unknown outcome) or "retry" after
    ``delay_ms``."""
    outcome: str
    delay_ms: float = 0.0


def decide(kind: str, *, attempts: int, elapsed_ms: float, retry_after_ms: Optional[int] = None,
           max_attempts: int = 10, max_total_ms: float = 86400000.0, base_ms: float = 100,
           cap_ms: float = 10000, can_refresh: bool = False,
           random: Callable[[], float] = _random.random) -> Decision:
    """The next step after an attempt of ``kind`` (``attempts`` made so far,
    ``elapsed_ms`` since the first began).  A valid Retry-After replaces
    the backoff; retries end when the attempts are used up or the delay
    would pass the total time."""
    if kind in ("success", "fatal", "new_key") or (kind == "refresh" and not can_refresh):
        return Decision(FINAL_STATE[kind])
    if attempts >= max_attempts:
        return Decision(FINAL_STATE[kind])
    if kind == "refresh":
        delay = 0.0
    elif retry_after_ms is not None:
        delay = float(retry_after_ms)
    else:
        delay = backoff_delay(attempts, base_ms, cap_ms, random)
    if elapsed_ms + delay >= max_total_ms:
        return Decision(FINAL_STATE[kind])
    return Decision("retry", delay)


def new_key() -> str:
    """A key for a new operation: a random UUID (122 bits from the
    operating system's cryptographic source)."""
    return str(uuid.uuid4())


@dataclass
class RetryOutcome:
    """How a with_retry call ended: ``state`` is succeeded, failed or
    attention; ``kind`` that of the last attempt; ``response`` its answer
    (None after an error, which is in ``error``)."""
    state: str
    kind: str
    attempts: int
    key: str
    response: Any = None
    error: Optional[BaseException] = None


def _status_and_retry_after(response: Any) -> Tuple[int, Optional[int]]:
    status = getattr(response, "status_code", None)
    if status is None:
        status = getattr(response, "status")
    headers: Mapping[str, str] = getattr(response, "headers", {}) or {}
    return int(status), parse_retry_after(headers.get("retry-after") or headers.get("Retry-After"))


@dataclass
class _Policy:
    max_attempts: int
    max_total_ms: float
    base_ms: float
    cap_ms: float
    random: Callable[[], float]
    can_refresh: bool

    def after(self, response: Any, error: Optional[BaseException], attempts: int,
              elapsed_ms: float) -> Tuple[str, Decision]:
        if error is not None:
            if error_kind(error) is None:
                raise error
            kind, retry_after = "retry", None
        else:
            status, retry_after = _status_and_retry_after(response)
            kind = classify(status)
        return kind, decide(kind, attempts=attempts, elapsed_ms=elapsed_ms, retry_after_ms=retry_after,
                            max_attempts=self.max_attempts, max_total_ms=self.max_total_ms,
                            base_ms=self.base_ms, cap_ms=self.cap_ms, can_refresh=self.can_refresh,
                            random=self.random)


def _policy(max_attempts: int, max_total: float, base_ms: float, cap_ms: float,
            random: Callable[[], float], refresh: Any) -> _Policy:
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    return _Policy(max_attempts, max_total * 1000.0, base_ms, cap_ms, random, refresh is not None)


async def with_retry(send: Callable[[str, int], Awaitable[Any]], *, key: Optional[str] = None,
                     max_attempts: int = 10, max_total: float = 60.0, base_ms: float = 100,
                     cap_ms: float = 10000, refresh: Optional[Callable[[], Any]] = None,
                     sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                     clock: Callable[[], float] = time.monotonic,
                     random: Callable[[], float] = _random.random) -> RetryOutcome:
    """Calls ``await send(key, attempt)`` (attempt counts from 1) with the
    same key until a definite answer, retrying by the rules: ``send``
    returns a response (``status_code`` or ``status``, ``headers``) or
    raises a timeout or transport error.  ``max_total`` is in seconds;
    ``refresh`` (sync or async) renews credentials after a 401."""
    key = key or new_key()
    policy = _policy(max_attempts, max_total, base_ms, cap_ms, random, refresh)
    start, attempt = clock(), 0
    while True:
        attempt += 1
        response, error = None, None
        try:
            response = await send(key, attempt)
        except Exception as err:  # classified below; anything else is raised again
            error = err
        kind, step = policy.after(response, error, attempt, (clock() - start) * 1000.0)
        if step.outcome != "retry":
            return RetryOutcome(step.outcome, kind, attempt, key, response, error)
        if kind == "refresh" and refresh is not None:
            res = refresh()
            if inspect.isawaitable(res):
                await res
        await sleep(step.delay_ms / 1000.0)


def with_retry_sync(send: Callable[[str, int], Any], *, key: Optional[str] = None,
                    max_attempts: int = 10, max_total: float = 60.0, base_ms: float = 100,
                    cap_ms: float = 10000, refresh: Optional[Callable[[], Any]] = None,
                    sleep: Callable[[float], Any] = time.sleep,
                    clock: Callable[[], float] = time.monotonic,
                    random: Callable[[], float] = _random.random) -> RetryOutcome:
    """with_retry for a blocking ``send(key, attempt)`` (requests, urllib3,
    httpx.Client)."""
    key = key or new_key()
    policy = _policy(max_attempts, max_total, base_ms, cap_ms, random, refresh)
    start, attempt = clock(), 0
    while True:
        attempt += 1
        response, error = None, None
        try:
            response = send(key, attempt)
        except Exception as err:  # classified below; anything else is raised again
            error = err
        kind, step = policy.after(response, error, attempt, (clock() - start) * 1000.0)
        if step.outcome != "retry":
            return RetryOutcome(step.outcome, kind, attempt, key, response, error)
        if kind == "refresh" and refresh is not None:
            refresh()
        sleep(step.delay_ms / 1000.0)
