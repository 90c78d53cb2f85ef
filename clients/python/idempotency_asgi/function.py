"""Idempotent functions for workers and queue consumers (issue 37): the
decorator ``idempotent_function`` claims a key taken from the message, runs
the function inside the claim's transaction with its connection, stores its
JSON result, and replays that result when the message is delivered again
(as AWS Powertools' idempotent_function).

Sync functions take a psycopg_pool.ConnectionPool, async ones an
AsyncConnectionPool.  In lease mode (``lease='30 seconds'``), for work
outside the database, the claim commits first, a heartbeat keeps the lease
while the function runs, and the finish presents the lease token."""

import asyncio
import functools
import inspect
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple, Type, Union

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from .middleware import interval_seconds

# the tenant: the one given, else the session's bound tenant, else 'default'
SQL_CLAIM = """SELECT c.action, c.http_status, c.error_code, c.retry_after, c.response_json,
       c.lease_token, c.mismatch, t.tenant
  FROM (SELECT coalesce(%(tenant)s, nullif(pg_catalog.current_setting('idempotency.tenant', true), ''),
                        'default') AS tenant) t,
       idempotency.idem_claim(t.tenant, %(endpoint)s, %(key)s,
           idempotency.idem_fingerprint('FUNCTION', %(endpoint)s, %(payload)s::jsonb),
           %(ttl)s::interval, %(lease)s::interval, %(wait)s::interval,
           idempotency.idem_request_digest(t.tenant, %(endpoint)s, %(key)s, %(payload)s::jsonb,
                                           'FUNCTION', %(endpoint)s)) c"""
SQL_FINISH = "SELECT idempotency.idem_finish(%s, %s, %s, 200, %s::jsonb, NULL, %s::bigint)"
SQL_HEARTBEAT = "SELECT idempotency.idem_heartbeat(%s, %s, %s, %s::bigint, %s::interval)"
SQL_RELEASE = "SELECT idempotency.idem_release(%s, %s, %s, %s::bigint)"
SQL_FAIL = "SELECT idempotency.idem_fail(%s, %s, %s, 'unknown', %s, %s::bigint)"


class IdempotencyError(Exception):
    """A claim that does not let the function run nor replay: ``claim``
    holds the claim's answer (action, http_status, error_code,
    retry_after, mismatch)."""

    def __init__(self, message: str, key: str, endpoint: str, claim: Dict[str, Any]) -> None:
        super().__init__(message)
        self.key, self.endpoint, self.claim = key, endpoint, claim


class IdempotencyKeyReuseError(IdempotencyError):
    """The key was used for a message with another payload (the claim
    answered mismatch): a new operation needs a new key.  Not retryable."""


class IdempotencyInProgressError(IdempotencyError):
    """Another delivery of the message is still running (the claim answered
    in_progress after its wait).  Retryable: deliver it again after
    ``retry_after`` seconds."""

    @property
    def retry_after(self) -> int:
        return int(self.claim.get("retry_after") or 1)


class IdempotencyOutcomePendingError(IdempotencyError):
    """An earlier run's outcome is unknown or failed (pending), or the key
    expired: an operator or the endpoint's resolver decides.  Not
    retryable by itself."""


def _message_id(msg: Any) -> Any:
    return msg["id"]


@dataclass
class _Spec:
    pool: Any
    endpoint: str
    key: Callable[[Any], Any]
    payload: Optional[Callable[[Any], Any]]
    tenant: Union[None, str, Callable[[Any], str]]
    ttl: Any
    lease: Any
    wait: Any
    release_on: Tuple[Type[BaseException], ...]

    def get_pool(self) -> Any:
        return self.pool() if callable(self.pool) and not hasattr(self.pool, "connection") else self.pool

    def params(self, msg: Any) -> Dict[str, Any]:
        key = self.key(msg)
        if not isinstance(key, (str, int)) or isinstance(key, bool) or str(key) == "":
            raise ValueError(f"the message key must be a non-empty str (got {type(key).__name__})")
        tenant = self.tenant(msg) if callable(self.tenant) else self.tenant
        payload = self.payload(msg) if self.payload else msg
        return {"tenant": tenant, "endpoint": self.endpoint, "key": str(key), "payload": Jsonb(payload),
                "ttl": self.ttl, "lease": self.lease, "wait": self.wait}

    def beat_seconds(self) -> float:
        return max(0.2, interval_seconds(self.lease) / 3.0)


def _check(spec: _Spec, params: Dict[str, Any], row: Dict[str, Any]) -> bool:
    """True to execute, False to replay; raises for the other answers."""
    action = row["action"]
    if action == "execute":
        return True
    if action == "replay":
        return False
    answer = {k: row[k] for k in ("action", "http_status", "error_code", "retry_after", "mismatch")}
    where = f"endpoint {spec.endpoint!r}"  # never the key itself: it may be a secret
    if action == "mismatch":
        raise IdempotencyKeyReuseError(
            f"idempotency key reused with another payload ({where}): a new operation needs a new key",
            params["key"], spec.endpoint, answer)
    if action == "in_progress":
        raise IdempotencyInProgressError(
            f"another delivery of this message is still running ({where}); retry after "
            f"{answer['retry_after'] or 1} s", params["key"], spec.endpoint, answer)
    raise IdempotencyOutcomePendingError(
        f"an earlier run of this message has no known outcome ({where}, claim answered {action}): "
        "an operator or a resolver must decide", params["key"], spec.endpoint, answer)


def _finish_args(row: Dict[str, Any], params: Dict[str, Any], result: Any, token: Any) -> Tuple[Any, ...]:
    return (row["tenant"], params["endpoint"], params["key"], Jsonb(result), token)


def _run_sync(spec: _Spec, fn: Callable[..., Any], msg: Any, args: Any, kwargs: Any) -> Any:
    params = spec.params(msg)
    pool = spec.get_pool()
    if spec.lease is not None:
        return _run_sync_lease(spec, pool, fn, msg, params, args, kwargs)
    with pool.connection() as conn:
        with conn.transaction():
            row = conn.cursor(row_factory=dict_row).execute(SQL_CLAIM, params).fetchone()
            if not _check(spec, params, row):
                return row["response_json"]
            result = fn(msg, conn, *args, **kwargs)
            conn.execute(SQL_FINISH, _finish_args(row, params, result, None))
            return result


def _beat_sync(pool: Any, args: Tuple[Any, ...], every: float, stop: threading.Event) -> None:
    while not stop.wait(every):
        try:
            with pool.connection() as c:
                c.execute(SQL_HEARTBEAT, args)
        except Exception:  # the next beat tries again; a lapsed lease stops the finish
            pass


def _settle_sync(pool: Any, spec: _Spec, args: Tuple[Any, ...], err: BaseException) -> None:
    try:
        with pool.connection() as c:
            if isinstance(err, spec.release_on):
                c.execute(SQL_RELEASE, args)
            else:
                c.execute(SQL_FAIL, args[:3] + (type(err).__name__, args[3]))
    except Exception:  # maintenance marks the key unknown when the lease runs out
        pass


def _run_sync_lease(spec: _Spec, pool: Any, fn: Callable[..., Any], msg: Any, params: Dict[str, Any],
                    args: Any, kwargs: Any) -> Any:
    with pool.connection() as conn:
        with conn.transaction():
            row = conn.cursor(row_factory=dict_row).execute(SQL_CLAIM, params).fetchone()
        if not _check(spec, params, row):
            return row["response_json"]
        key_args = (row["tenant"], params["endpoint"], params["key"], row["lease_token"])
        stop = threading.Event()
        beat = threading.Thread(target=_beat_sync, daemon=True,
                                args=(pool, key_args + (spec.lease,), spec.beat_seconds(), stop))
        beat.start()
        try:
            with conn.transaction():
                result = fn(msg, conn, *args, **kwargs)
                conn.execute(SQL_FINISH, _finish_args(row, params, result, row["lease_token"]))
            return result
        except BaseException as err:
            stop.set()
            _settle_sync(pool, spec, key_args, err)
            raise
        finally:
            stop.set()
            beat.join()


async def _run_async(spec: _Spec, fn: Callable[..., Any], msg: Any, args: Any, kwargs: Any) -> Any:
    params = spec.params(msg)
    pool = spec.get_pool()
    if spec.lease is not None:
        return await _run_async_lease(spec, pool, fn, msg, params, args, kwargs)
    async with pool.connection() as conn:
        async with conn.transaction():
            cur = await conn.cursor(row_factory=dict_row).execute(SQL_CLAIM, params)
            row = await cur.fetchone()
            if not _check(spec, params, row):
                return row["response_json"]
            result = await fn(msg, conn, *args, **kwargs)
            await conn.execute(SQL_FINISH, _finish_args(row, params, result, None))
            return result


async def _beat_async(pool: Any, args: Tuple[Any, ...], every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            async with pool.connection() as c:
                await c.execute(SQL_HEARTBEAT, args)
        except Exception:  # the next beat tries again; a lapsed lease stops the finish
            pass


async def _settle_async(pool: Any, spec: _Spec, args: Tuple[Any, ...], err: BaseException) -> None:
    try:
        async with pool.connection() as c:
            if isinstance(err, spec.release_on):
                await c.execute(SQL_RELEASE, args)
            else:
                await c.execute(SQL_FAIL, args[:3] + (type(err).__name__, args[3]))
    except Exception:  # maintenance marks the key unknown when the lease runs out
        pass


async def _run_async_lease(spec: _Spec, pool: Any, fn: Callable[..., Any], msg: Any, params: Dict[str, Any],
                           args: Any, kwargs: Any) -> Any:
    async with pool.connection() as conn:
        async with conn.transaction():
            cur = await conn.cursor(row_factory=dict_row).execute(SQL_CLAIM, params)
            row = await cur.fetchone()
        if not _check(spec, params, row):
            return row["response_json"]
        key_args = (row["tenant"], params["endpoint"], params["key"], row["lease_token"])
        beat = asyncio.ensure_future(_beat_async(pool, key_args + (spec.lease,), spec.beat_seconds()))
        try:
            async with conn.transaction():
                result = await fn(msg, conn, *args, **kwargs)
                await conn.execute(SQL_FINISH, _finish_args(row, params, result, row["lease_token"]))
            return result
        except BaseException as err:
            beat.cancel()
            await _settle_async(pool, spec, key_args, err)
            raise
        finally:
            beat.cancel()


def idempotent_function(pool: Any, endpoint: str, key: Callable[[Any], Any] = _message_id,
                        payload: Optional[Callable[[Any], Any]] = None,
                        tenant: Union[None, str, Callable[[Any], str]] = None, ttl: Any = None,
                        lease: Any = None, wait: Any = None,
                        release_on: Tuple[Type[BaseException], ...] = ()) -> Callable[[Callable[..., Any]], Any]:
    """A decorator: ``fn(msg, conn, ...)`` runs once per key.

    pool: a psycopg_pool ConnectionPool (sync fn) or AsyncConnectionPool
    (async fn), or a callable returning it; endpoint: the scope of the
    keys (e.g. "worker:send-invoice"); key(msg): the message's own id
    (``msg["id"]`` by default, never a hash of its body); payload(msg):
    what a redelivery must repeat (the whole message by default; JSON);
    tenant: a str, callable(msg), or None for the session's bound tenant
    (idempotency.tenant) or 'default'; ttl, lease, wait: intervals passed
    to idem_claim (None: the endpoint's or the server's defaults).  The
    result must be JSON; it is stored and returned to every redelivery.
    In lease mode an exception from fn marks the key unknown (an operator
    decides), or releases it when it is an instance of ``release_on``."""
    spec = _Spec(pool, endpoint, key, payload, tenant, ttl, lease, wait, tuple(release_on))

    def decorate(fn: Callable[..., Any]) -> Any:
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run_async(msg: Any, *args: Any, **kwargs: Any) -> Any:
                return await _run_async(spec, fn, msg, args, kwargs)
            return run_async

        @functools.wraps(fn)
        def run(msg: Any, *args: Any, **kwargs: Any) -> Any:
            return _run_sync(spec, fn, msg, args, kwargs)
        return run
    return decorate
