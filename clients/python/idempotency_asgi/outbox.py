"""The outbox sender (issue 37): sends the operations that
idempotency.idem_outbox_add enqueued, each with its own Idempotency-Key on
every attempt, by the client retry rules (idempotency_asgi.retry), and
records every attempt with idem_outbox_record.

    await run_outbox(pool, concurrency=4)          # until stop_event is set
    python3 -m idempotency_asgi.outbox --database URL [--concurrency N]

The loop: lease due operations (a short transaction of their own), send
each (a fresh X-Request-Id per attempt, never derived from the key), then
record its outcome: succeeded, failed (a definite refusal, never
retried), attention (retries ended on an unknown outcome: an operator
decides) or retry at a time (Retry-After, else full-jitter backoff).
Stopping leases nothing more, lets the sends under way finish (bounded),
and gives back what was leased and not sent.  A sender killed at any
moment leaves leases that lapse: the next sender sends them again with
the same key.  Raw keys are never logged.  Needs httpx (the [outbox]
extra) unless a client is given."""

import argparse
import asyncio
import inspect
import json
import logging
import re
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Set, Union

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from .middleware import interval_seconds
from .retry import Decision, classify, decide, parse_retry_after

LOG = logging.getLogger("idempotency_asgi.outbox")
SQL_LEASE = """SELECT id, key, method, url, body, headers, attempts, lease_token, created_at, first_attempt_at,
       pg_catalog.now() AS db_now
  FROM idempotency.idem_outbox_lease(%s, %s::interval)"""
# retry_at from the server's clock: NULL unless the outcome is retry
SQL_RECORD = """SELECT idempotency.idem_outbox_record(%s, %s, %s, %s, %s,
       pg_catalog.clock_timestamp() + %s::float8 * interval '1 millisecond', %s::jsonb, %s)"""
SQL_RELEASE = "SELECT idempotency.idem_outbox_release(%s, %s)"
NOT_STORED = {"set-cookie", "authorization", "proxy-authenticate", "www-authenticate"}
#: credentials(refresh) -> headers to add to every request; called with
#: refresh=True after a 401, before the same key is sent again
Credentials = Callable[[bool], Union[Mapping[str, str], Awaitable[Mapping[str, str]]]]


@dataclass
class Options:
    concurrency: int = 4
    lease: float = 60.0
    max_attempts: int = 10
    max_total: float = 86400.0
    timeout: float = 30.0
    base_ms: float = 500.0
    cap_ms: float = 60000.0
    max_body: int = 65536
    idle: float = 1.0
    grace: Optional[float] = None

    def check(self) -> "Options":
        if self.concurrency < 1 or self.max_attempts < 1:
            raise ValueError("concurrency and max_attempts must be at least 1")
        if self.lease <= self.timeout:
            raise ValueError("the lease must outlast an attempt's timeout (another sender takes over a lapsed lease)")
        return self


@dataclass
class Attempt:
    kind: str
    status: Optional[int] = None
    headers: Optional[Dict[str, str]] = None
    body: Optional[str] = None
    error: Optional[str] = None
    retry_after_ms: Optional[int] = None


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@dataclass
class _Sender:
    pool: Any
    opts: Options
    client: Any
    credentials: Optional[Credentials]
    stop: asyncio.Event
    tasks: Set["asyncio.Future[None]"] = field(default_factory=set)
    stats: Dict[str, int] = field(default_factory=dict)

    def count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    async def lease(self, n: int) -> List[Dict[str, Any]]:
        try:
            async with self.pool.connection() as conn:
                cur = await conn.cursor(row_factory=dict_row).execute(SQL_LEASE, (n, f"{self.opts.lease} seconds"))
                rows: List[Dict[str, Any]] = await cur.fetchall()
        except Exception as err:  # the database is away: try again after the idle pause
            LOG.warning("outbox: could not lease operations: %s", err)
            self.count("lease_errors")
            return []
        for row in rows:
            row["leased_at"] = time.monotonic()
        return rows

    async def run(self) -> Dict[str, int]:
        stopping = asyncio.ensure_future(self.stop.wait())
        try:
            while not self.stop.is_set():
                free = self.opts.concurrency - len(self.tasks)
                leased = await self.lease(free) if free > 0 else []
                for op in leased:
                    task = asyncio.ensure_future(self.one(op))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                full = free > 0 and len(leased) == free
                if not full or self.tasks:
                    await asyncio.wait(self.tasks | {stopping}, return_when=asyncio.FIRST_COMPLETED,
                                       timeout=None if full else self.opts.idle)
        finally:
            stopping.cancel()
            await self.drain()
        return self.stats

    async def drain(self) -> None:
        """Lets the sends under way finish (at most grace seconds); those
        cut off leave their lease to lapse (sent or not: unknown)."""
        if not self.tasks:
            return
        grace = self.opts.grace if self.opts.grace is not None else self.opts.timeout + 5.0
        done, pending = await asyncio.wait(set(self.tasks), timeout=grace)
        for task in pending:
            task.cancel()
            self.count("cut_off")
        if pending:
            await asyncio.wait(pending)

    async def one(self, op: Dict[str, Any]) -> None:
        if self.stop.is_set():
            await self.release(op)
            return
        try:
            attempt = await self.attempt(op)
            decision = self.decide(op, attempt)
            if attempt.kind == "refresh" and decision.outcome == "retry" and self.credentials:
                await _maybe_await(self.credentials(True))
            await self.record(op, attempt, decision)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: the lease lapses and the operation is sent again with its key
            LOG.exception("outbox: operation %s: the sender failed", op["id"])
            self.count("errors")

    async def headers(self, op: Dict[str, Any]) -> Dict[str, str]:
        headers = {str(k): str(v) for k, v in (op["headers"] or {}).items()}
        if self.credentials is not None:
            headers.update(await _maybe_await(self.credentials(False)))
        if op["body"] is not None and not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
        headers["Idempotency-Key"] = op["key"]
        headers["X-Request-Id"] = str(uuid.uuid4())  # per attempt; never derived from the key
        return headers

    async def attempt(self, op: Dict[str, Any]) -> Attempt:
        headers = await self.headers(op)
        content = None if op["body"] is None else json.dumps(op["body"]).encode()
        self.count("attempts")
        try:
            return await asyncio.wait_for(self.send(op, headers, content), self.opts.timeout)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            kind = classify(error=err)
            what = "timeout" if isinstance(err, asyncio.TimeoutError) or "Timeout" in type(err).__name__ \
                else type(err).__name__
            return Attempt(kind, error=f"{what}: {err}"[:500] if str(err) else what)

    async def send(self, op: Dict[str, Any], headers: Dict[str, str], content: Optional[bytes]) -> Attempt:
        request = self.client.build_request(op["method"], op["url"], headers=headers, content=content)
        response = await self.client.send(request, stream=True)
        try:
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size >= self.opts.max_body:
                    break
        finally:
            await response.aclose()
        body = b"".join(chunks)[: self.opts.max_body].decode("utf-8", "replace")
        kept = {k: v for k, v in response.headers.items() if k.lower() not in NOT_STORED}
        return Attempt(classify(status=response.status_code), response.status_code, kept, body,
                       retry_after_ms=parse_retry_after(response.headers.get("retry-after")))

    def decide(self, op: Dict[str, Any], attempt: Attempt) -> Decision:
        first = op["first_attempt_at"] or op["db_now"]
        elapsed = (op["db_now"] - first).total_seconds() + time.monotonic() - op["leased_at"]
        retry_after = attempt.retry_after_ms if attempt.kind in ("retry", "wait") else None
        o = self.opts
        return decide(attempt.kind, attempts=op["attempts"], elapsed_ms=elapsed * 1000.0,
                      retry_after_ms=retry_after, max_attempts=o.max_attempts, max_total_ms=o.max_total * 1000.0,
                      base_ms=o.base_ms, cap_ms=o.cap_ms, can_refresh=self.credentials is not None)

    async def record(self, op: Dict[str, Any], attempt: Attempt, decision: Decision) -> None:
        delay = decision.delay_ms if decision.outcome == "retry" else None
        headers = Jsonb(attempt.headers) if attempt.headers is not None else None
        args = (op["id"], op["lease_token"], decision.outcome, attempt.status, attempt.error, delay, headers,
                attempt.body)
        for tries in range(3):
            try:
                async with self.pool.connection() as conn:
                    cur = await conn.execute(SQL_RECORD, args)
                    row = await cur.fetchone()
                break
            except Exception as err:
                LOG.warning("outbox: operation %s: could not record the attempt: %s", op["id"], err)
                if tries == 2:  # the lease lapses: the next sender sends it again with its key
                    self.count("unrecorded")
                    return
                await asyncio.sleep(0.2 * (tries + 1))
        if row is None or not row[0]:
            LOG.warning("outbox: operation %s: the lease was lost (another sender took it over)", op["id"])
            self.count("lease_lost")
            return
        self.count(decision.outcome)
        LOG.info("outbox: operation %s attempt %s: %s -> %s", op["id"], op["attempts"],
                 attempt.status or attempt.error, decision.outcome)

    async def release(self, op: Dict[str, Any]) -> None:
        try:
            async with self.pool.connection() as conn:
                await conn.execute(SQL_RELEASE, (op["id"], op["lease_token"]))
            self.count("released")
        except Exception as err:  # the lease lapses instead
            LOG.warning("outbox: operation %s: could not release the lease: %s", op["id"], err)


_LONG = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(h|hours?|d|days?)\s*", re.IGNORECASE)


def _interval(value: Union[str, int, float]) -> float:
    """Seconds, or an interval: '500 ms', '30 seconds', '2 min', '6 hours', '1 day'."""
    m = _LONG.fullmatch(value) if isinstance(value, str) else None
    if m:
        return float(m.group(1)) * (86400.0 if m.group(2).lower().startswith("d") else 3600.0)
    return interval_seconds(value)


async def run_outbox(pool: Any, *, concurrency: int = 4, lease: Union[str, float] = 60.0,
                     max_attempts: int = 10, max_total: Union[str, float] = 86400.0,
                     timeout: Union[str, float] = 30.0, client: Any = None,
                     credentials: Optional[Credentials] = None, stop_event: Optional[asyncio.Event] = None,
                     base_ms: float = 500.0, cap_ms: float = 60000.0, max_body: int = 65536,
                     idle: float = 1.0, grace: Optional[float] = None) -> Dict[str, int]:
    """Runs the outbox loop on ``pool`` (a psycopg_pool AsyncConnectionPool
    on a role with idempotency_client) until ``stop_event`` is set; returns
    counts (attempts, succeeded, failed, attention, retry, released...).

    lease, max_total, timeout: seconds or an interval ('30 seconds');
    max_attempts, max_total bound an operation's retries (then attention);
    client: an httpx.AsyncClient (one is made otherwise); credentials: a
    hook (see Credentials); max_body: the bytes of a response body kept."""
    opts = Options(concurrency, _interval(lease), max_attempts, _interval(max_total), _interval(timeout),
                   base_ms, cap_ms, max_body, idle, grace).check()
    own = client is None
    if own:
        import httpx  # the [outbox] extra
        client = httpx.AsyncClient(follow_redirects=False, timeout=opts.timeout,
                                   limits=httpx.Limits(max_connections=opts.concurrency * 2))
    try:
        return await _Sender(pool, opts, client, credentials, stop_event or asyncio.Event()).run()
    finally:
        if own:
            await client.aclose()


def _arguments(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m idempotency_asgi.outbox",
                                description="Sends the operations of the idempotency outbox until SIGTERM or SIGINT.")
    p.add_argument("--database", required=True, help="a libpq connection string or URL")
    p.add_argument("--concurrency", type=int, default=4, help="operations sent at once (4)")
    p.add_argument("--lease", default="60 seconds", help="how long a leased operation is ours (60 seconds)")
    p.add_argument("--timeout", default="30 seconds", help="an attempt's timeout (30 seconds)")
    p.add_argument("--max-attempts", type=int, default=10, help="attempts before attention (10)")
    p.add_argument("--max-total", default="1 day", help="time since the first attempt before attention (1 day)")
    p.add_argument("--base-ms", type=float, default=500.0, help="backoff base in milliseconds (500)")
    p.add_argument("--cap-ms", type=float, default=60000.0, help="backoff cap in milliseconds (60000)")
    p.add_argument("--idle", type=float, default=1.0, help="seconds between polls when nothing is due (1)")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


async def _serve(args: argparse.Namespace) -> Dict[str, int]:
    from psycopg_pool import AsyncConnectionPool
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with AsyncConnectionPool(args.database, min_size=1, max_size=args.concurrency + 2, open=False) as pool:
        return await run_outbox(pool, concurrency=args.concurrency, lease=args.lease, timeout=args.timeout,
                                max_attempts=args.max_attempts, max_total=args.max_total, base_ms=args.base_ms,
                                cap_ms=args.cap_ms, idle=args.idle, stop_event=stop)


def main(argv: Optional[List[str]] = None) -> int:
    args = _arguments(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    stats = asyncio.run(_serve(args))
    print("outbox sender stopped: " + " ".join(f"{k}={v}" for k, v in sorted(stats.items())), file=sys.stderr,
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
