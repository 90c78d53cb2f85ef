"""ASGI middleware (Starlette, FastAPI): HTTP idempotency keys on the
idempotency PostgreSQL extension.  It claims the key on a pooled psycopg
connection inside a transaction, hands that connection to the application
(request.state.idempotency.conn), captures the response, finishes the key
and commits before the first byte is sent, and answers replays, conflicts
and mismatches per the chosen profile."""

import asyncio
import importlib
import json
import logging
import random
import re
import warnings
import zlib
from collections import deque
from typing import (Any, AsyncIterator, Awaitable, Callable, Deque, Dict, Iterable, List, MutableMapping, Optional,
                    Sequence, Set, Tuple, Union)

import psycopg
from psycopg.rows import dict_row
from starlette.requests import Request
from psycopg_pool import AsyncConnectionPool, PoolClosed

from .body import BodyError, fingerprint_body
from .header import IdempotencyKeyError, apply_key_policy, parse_key_header
from .profiles import ACTION_OUTCOME, answer

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: an interval as PostgreSQL reads it ('30 seconds', '1 day', 'P1D', '24h'), or seconds
Interval = Union[str, int, float]
Logger = Callable[[str, Optional[BaseException]], None]
AsyncConn = psycopg.AsyncConnection[Any]

RETRY_SQLSTATES = {"40001", "40P01"}
LOST_SQLSTATES = {"57P01", "57P02", "57P03", "08000", "08003", "08006"}
NOT_STORED = {"connection", "keep-alive", "transfer-encoding", "date", "content-length", "upgrade",
              "proxy-connection", "trailer", "idempotent-replayed", "idempotency-key"}

# the request's digest (mismatch diagnostics) goes with the claim: a reused
# key with another body is answered with the members that differ
SQL_CLAIM = """SELECT action, error_code, retry_after, response_status, response_headers,
       response_body, lease_token, mismatch
  FROM idempotency.idem_claim(%(tenant)s, %(endpoint)s, %(key)s,
       idempotency.idem_fingerprint(%(method)s, %(path)s, %(json)s::jsonb, %(exclude)s::text[]),
       %(ttl)s::interval, %(lease)s::interval, %(wait)s::interval,
       idempotency.idem_request_digest(%(tenant)s, %(endpoint)s, %(key)s, %(json)s::jsonb,
                                       %(method)s, %(path)s, %(exclude)s::text[]))"""
SQL_FINISH = "SELECT idempotency.idem_finish_bytes(%s, %s, %s, %s, %s::bytea, %s::jsonb, %s::bigint)"
SQL_HEARTBEAT = "SELECT idempotency.idem_heartbeat(%s, %s, %s, %s::bigint, %s::interval)"
SQL_FAIL = "SELECT idempotency.idem_fail(%s, %s, %s, 'unknown', %s, %s::bigint)"
SQL_RELEASE = "SELECT idempotency.idem_release(%s, %s, %s, %s::bigint)"
SQL_DOWNSTREAM = "SELECT idempotency.idem_downstream_key(%s, %s, %s, %s)"

_INTERVAL = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|secs?|seconds?|min|mins|minutes?)?\s*",
                       re.IGNORECASE)


def interval_seconds(value: Interval) -> float:
    """'30 seconds', '30s', '500 ms', '2 min', or a number of seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    m = _INTERVAL.fullmatch(str(value))
    if not m:
        raise ValueError(f"cannot read {value!r} as an interval (use e.g. '30 seconds')")
    unit = (m.group(2) or "s").lower()
    factor = 0.001 if unit.startswith(("ms", "milli")) else 60.0 if unit.startswith("min") else 1.0
    return float(m.group(1)) * factor


# The words PostgreSQL's interval input knows (compared on their first 10
# characters, as it does): units, their abbreviations and plurals, and '@',
# 'ago', 'infinity'.
_INTERVAL_WORDS = frozenset("""
    microsecon us usec usecs usecond useconds millisecon ms msec msecs msecond mseconds s sec secs second
    seconds m min mins minute minutes h hr hrs hour hours d day days w week weeks mon mons month months
    qtr quarter y yr yrs year years dec decs decade decades c cent century centuries mil mils millennia
    millennium ago infinity""".split())
_ISO_INTERVAL = re.compile(r"P(?:[-+]?[\d.,]+[YMWD])*(?:T(?:[-+]?[\d.,]+[HMS])*)?|P[\d.:T-]+")


def _interval_syntax_ok(text: str) -> bool:
    """Whether text can be an interval PostgreSQL reads, as far as a local
    look tells ('soon', 'thirty seconds' cannot): ISO 8601 ('P1D',
    'PT30S'), or numbers, times (02:00:00) and the words it knows.  The
    server has the last word at the first claim."""
    text = text.strip()
    if _ISO_INTERVAL.fullmatch(text):
        return True
    words = re.findall(r"[A-Za-z_]+", text)
    if any(w.lower()[:10] not in _INTERVAL_WORDS for w in words):
        return False
    if re.search(r"[^\w\s@.:+,-]", text):
        return False
    return bool(re.search(r"\d", text)) or any(w.lower() == "infinity" for w in words)


def _pg_interval(value: Optional[Interval], name: str = "interval") -> Optional[str]:
    """An option's interval as PostgreSQL reads it: a str as it is ('1 day',
    'P1D', '24h'), a number as seconds.  A str that cannot be an interval is
    refused here, when the middleware is built."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"{name}: {value!r} is not an interval")
    if isinstance(value, str):
        if not _interval_syntax_ok(value):
            raise ValueError(f"{name}: {value!r} is not an interval PostgreSQL reads (use e.g. '30 seconds', "
                             "'1 day', 'P1D', or a number of seconds)")
        return value
    return f"{value} seconds"


SQL_CHECK = ("SELECT %s::interval, %s::interval, %s::interval, "
             "extract(epoch FROM %s::interval)::float8")
# errors of set-up, answered 500 idempotency_not_configured: the extension or
# its functions missing (3F000, 42883, 42P01), no privilege (42501)
CONFIG_SQLSTATES = {"3F000", "42883", "42P01", "42501"}
CONFIG_FIX = ("install the extension in this database (CREATE EXTENSION idempotency CASCADE), grant its client "
              "role to the application's role (GRANT idempotency_client TO ...) and check the options")
TOO_LARGE_FIX = ("the response is larger than idempotency.max_response_bytes (or the endpoint's "
                 "max_response_bytes) and cannot be stored for replay; its work was rolled back. Answer a smaller "
                 "body, raise the limit, or set store_response = false for the endpoint")


LOGGER = logging.getLogger("idempotency_asgi")

#: seconds a cancel request, and the end of the query it cancels, are waited for
CANCEL_TIMEOUT = 5.0
DISCONNECTED_IN_CLAIM = ("the client disconnected before the application ran, while its claim waited (the claim's "
                         "query was cancelled)")

#: the application's deadline in seconds when the options give none: past it
#: a hung application gives its claim and its connection back
DEFAULT_DEADLINE = 60.0


def _default_log(message: str, err: Optional[BaseException] = None) -> None:
    """The default log: the standard logging module, logger "idempotency_asgi"."""
    LOGGER.error("idempotency: %s", message, exc_info=err)


def _default_warn(message: str, err: Optional[BaseException] = None) -> None:
    """The default log of a warning: logger "idempotency_asgi", level WARNING."""
    LOGGER.warning("idempotency: %s", message, exc_info=err)


def _header_bytes(value: str) -> bytes:
    """A stored header value as bytes: Latin-1 when it fits (what HTTP/1.1
    carries), otherwise its UTF-8 bytes (a value idem_finish, idem_resolve or
    a resolver stored with other characters), never an error at replay."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8")


# A stored body encoded (Content-Encoding: a GZipMiddleware inside this
# middleware compressed it for the first client) is decoded for a client
# whose Accept-Encoding does not take that encoding, the header dropped:
# gzip and deflate always, br when the brotli module is installed; another
# encoding is sent as stored.
def _gunzip(body: bytes) -> bytes:
    return zlib.decompress(body, 16 + zlib.MAX_WBITS)


def _inflate(body: bytes) -> bytes:
    try:
        return zlib.decompress(body)
    except zlib.error:  # raw deflate, without the zlib wrapper
        return zlib.decompress(body, -zlib.MAX_WBITS)


_DECODERS: Dict[str, Callable[[bytes], bytes]] = {"gzip": _gunzip, "x-gzip": _gunzip, "deflate": _inflate}
try:
    _DECODERS["br"] = importlib.import_module("brotli").decompress
except ImportError:  # optional
    pass


def _accepts(accept_encoding: Optional[str], coding: str) -> bool:
    """Whether Accept-Encoding takes this content coding (q above 0)."""
    if not accept_encoding:
        return False
    star: Optional[bool] = None
    for part in accept_encoding.split(","):
        name, *params = [p.strip() for p in part.strip().lower().split(";")]
        q = next((p for p in params if p.startswith("q=")), None)
        try:
            ok = q is None or float(q[2:]) > 0
        except ValueError:
            ok = False
        if name == coding or (coding == "x-gzip" and name == "gzip"):
            return ok
        if name == "*":
            star = ok
    return star is True


def _decode_for_client(accept_encoding: Optional[str], headers: Dict[str, Any], body: bytes) -> bytes:
    """The stored body as this client can read it (headers updated)."""
    name = next((k for k in headers if k.lower() == "content-encoding"), None)
    if name is None or not body:
        return body
    value = headers[name]
    codings = [c.strip().lower() for c in (",".join(value) if isinstance(value, list) else str(value)).split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if all(_accepts(accept_encoding, c) for c in codings):
        return body
    out = body
    try:
        for c in reversed(codings):
            decode = _DECODERS.get(c)
            if decode is None:
                return body  # an encoding this middleware cannot undo: sent as stored
            out = decode(out)
    except (zlib.error, OSError, ValueError):
        return body
    del headers[name]
    return out


def _sqlstate(err: BaseException) -> Optional[str]:
    return getattr(err, "sqlstate", None)


def _is_retryable(err: BaseException) -> bool:
    return _sqlstate(err) in RETRY_SQLSTATES


def _is_connection_loss(err: BaseException, conn: Optional[AsyncConn]) -> bool:
    if _sqlstate(err) in LOST_SQLSTATES:
        return True
    return isinstance(err, psycopg.OperationalError) and conn is not None and conn.broken


class _Retry(Exception):
    pass


POOL_NOT_OPENED = ("the pool was never opened: open it when the application starts (`async with pool:` in the "
                   "application's lifespan; FastAPI before 0.93 ignores FastAPI(lifespan=...): set "
                   "app.router.lifespan_context = lifespan)")


def _never_opened(pool: Any, err: BaseException) -> bool:
    """Whether getconn() failed because the pool was never opened (a
    set-up mistake), not closed after use or out of connections."""
    if not isinstance(err, PoolClosed):
        return False
    opened = getattr(pool, "_opened", None)  # psycopg_pool's own record
    return opened is False or (opened is None and "not open yet" in str(err))


class _NotConfigured(Exception):
    """The extension, a privilege or an option is missing or wrong."""


class _Answered(Exception):
    """The claim's answer is not execute: replay, conflict, mismatch."""

    def __init__(self, claim: Dict[str, Any]) -> None:
        super().__init__(claim.get("action"))
        self.claim = claim


_CLAIM = "idempotency_claim"


async def claim(request: Any, endpoint: Optional[str] = None) -> "Context":
    """The claim of a request, for a route that opts in (Starlette endpoints;
    FastAPI routes use the dependency idempotency): reads the key and the
    body, takes the connection, claims the key, and returns the Context (also
    request.state.idempotency).  endpoint: by default the method and the
    template of the route the request matched, behind the templates of the
    mounts it went through."""
    scope = request.scope
    claim_now = scope.get("state", {}).get(_CLAIM)
    if claim_now is None:
        ctx = scope.get("state", {}).get("idempotency")
        if ctx is not None:  # the middleware claimed at once (opt_in=False)
            return ctx  # type: ignore[no-any-return]
        raise RuntimeError("idempotency: no IdempotencyMiddleware covers this request (its method, or the app)")
    return await claim_now(endpoint)  # type: ignore[no-any-return]


def _is_validation_error(err: BaseException) -> bool:
    """FastAPI's RequestValidationError (by name: FastAPI is optional)."""
    return any(c.__name__ == "RequestValidationError" and c.__module__.startswith("fastapi.")
               for c in type(err).__mro__)


async def idempotency(request: Request) -> AsyncIterator["Context"]:
    """FastAPI dependency: ctx: Context = Depends(idempotency).  The route
    opts in; its template names the endpoint.

    FastAPI resolves the dependencies (this claim among them) before it
    reports the request's validation errors; the RequestValidationError it
    then raises goes through this dependency, and its 422 is not stored:
    the claim is released, so that the corrected request with the same key
    executes (the handler never began)."""
    ctx = await claim(request)
    try:
        yield ctx
    except Exception as err:
        if _is_validation_error(err):
            ctx._refused_before_handler()
        raise


class _Refused(Exception):
    """The request is refused before its claim: its key or its body."""

    def __init__(self, outcome: str, message: str, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message
        self.code = code


def _route_template(routes: Any, scope: Scope, prefix: str = "") -> Optional[str]:
    """The template of the route Starlette's router gives this request: the
    first route that matches it fully; a mount (Mount, Host) adds its own
    template and is searched in turn with the scope it makes.  None when no
    route matches (or only for another method)."""
    from starlette.routing import Host, Match, Mount
    for route in routes or []:
        match, child = route.matches(scope)
        if match != Match.FULL:
            continue
        if isinstance(route, (Mount, Host)):
            # a Mount's path_format ends with the {path} it hands on
            own = route.path_format if isinstance(route, Mount) else ""
            own = own[:-len("/{path}")] if own.endswith("/{path}") else own
            return _route_template(route.routes, {**scope, **child}, prefix + own)
        template = getattr(route, "path_format", None) or getattr(route, "path", None)
        return prefix + template if isinstance(template, str) else None
    return None


class _Disconnected(Exception):
    """The client disconnected before the response was sent."""


class _Deadline(Exception):
    """The application did not answer within the deadline."""


class _TooLarge(Exception):
    """The response is above the size cap for stored responses (IK413)."""


class _BodyRefused(Exception):
    """The fingerprint refused the body (SQLSTATE class 22: a number beyond
    a double, \\u0000): the client's fault, a 400."""


class _RequestBody:
    """The request's body between the server and the application.

    The application reads it as the server gives it, chunk by chunk: the
    middleware buffers nothing of a request it does not claim.  A request
    with an Idempotency-Key header has a copy of what goes by kept (up to
    limit bytes; past it the copy is dropped), so that a claim can
    fingerprint the body: the claim reads what the application has not read
    yet (bounded by limit), keeps it for the application and fingerprints
    the whole.  The kept copy is also what a run after a retryable failure
    gets again.

    Once the body was given whole, the server's next message (the client's
    http.disconnect) is shared: the middleware's watch and the application's
    own receive() get the same message, neither takes it from the other."""

    def __init__(self, receive: Receive, limit: int, keep: bool) -> None:
        self._receive = receive
        self.limit = limit
        self.keep = keep
        self.kept: List[bytes] = []
        self.size = 0
        self.over = False  # the kept copy passed limit and was dropped
        self.pending: Deque[Message] = deque()  # read by the claim, not yet by the application
        self.read_any = False
        self.disconnected = False
        self.complete = asyncio.Event()  # the last body message, or a disconnect, came from the server
        self._after: Optional["asyncio.Future[Message]"] = None

    def _note(self, message: Message) -> None:
        self.read_any = True
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            if self.keep and not self.over:
                self.size += len(chunk)
                if self.size > self.limit:
                    self.over = True
                    self.kept = []
                elif chunk:
                    self.kept.append(chunk)
            if not message.get("more_body", False):
                self.complete.set()
        elif message["type"] == "http.disconnect":
            self.disconnected = True
            self.complete.set()

    async def _next_after_body(self) -> Message:
        """The server's next message once the body was given whole, one
        receive() shared by whoever waits for it."""
        if self._after is None:
            self._after = asyncio.ensure_future(self._receive())
        return await asyncio.shield(self._after)

    async def _app_after_body(self) -> Message:
        message = await self._next_after_body()
        if message["type"] != "http.disconnect":
            self._after = None  # the application took it: the next is another
        return message

    async def streaming(self) -> Message:
        """receive() for the application's first run: the body as it comes
        (what a claim read first), then the shared next message."""
        if self.pending:
            return self.pending.popleft()
        if self.complete.is_set():
            return await self._app_after_body()
        message = await self._receive()
        self._note(message)
        return message

    def receive_for(self, attempt: int) -> Optional[Receive]:
        """receive() for a run of the application: the first streams; a
        later one gets the body again, from the kept copy or as it comes if
        nothing was read yet; None when it cannot (a body given to the
        application as it came, not kept)."""
        if attempt == 0 or not self.read_any:
            return self.streaming
        if not (self.keep and not self.over and self.complete.is_set() and not self.disconnected):
            return None
        self.pending.clear()
        body = b"".join(self.kept)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await self._app_after_body()
        return replay

    async def read_whole(self) -> Optional[bytes]:
        """The body for the fingerprint: the rest read from the server (kept
        for the application), bounded by limit; None above it."""
        while not self.complete.is_set() and not self.over:
            message = await self._receive()
            self._note(message)
            self.pending.append(message)
        if self.disconnected:
            raise _Disconnected("the client disconnected while its body was read")
        if self.over:
            return None
        return b"".join(self.kept)

    async def watch(self) -> bool:
        """True when the server reports the client gone; False (watching
        stops) when it gives anything else.  Starts once the body was given
        whole (to the application, or to a claim), the only time the
        server's receive() has nothing but a disconnect to give."""
        await self.complete.wait()
        if self.disconnected:
            return True
        message = await self._next_after_body()
        return bool(message["type"] == "http.disconnect")

    def close(self) -> None:
        if self._after is not None and not self._after.done():
            self._after.cancel()


class Context:
    """What the application gets as request.state.idempotency."""

    def __init__(self, conn: AsyncConn, key: Optional[str], tenant: str, endpoint: str,
                 state: Dict[str, Any]) -> None:
        self.conn = conn
        self.key = key
        self.tenant = tenant
        self.endpoint = endpoint
        self.lease_token: Optional[int] = state["lease_token"]
        self._state = state
        self._attempt: Dict[str, Any] = {}  # this run's: the middleware gives its own

    def _refused_before_handler(self) -> None:
        """The framework answered before the handler began (FastAPI's
        validation error): the answer is sent, nothing is stored."""
        self._attempt["before_handler"] = True

    def no_side_effect(self) -> None:
        """Lease mode: nothing happened outside the database yet, so a failure
        releases the key instead of marking it unknown."""
        self._state["no_side_effect"] = True

    async def downstream_key(self, step: str) -> str:
        """idem_downstream_key: the key to send a downstream service for this step."""
        cur = await self.conn.execute(SQL_DOWNSTREAM, (self.tenant, self.endpoint, self.key, step))
        row = await cur.fetchone()
        assert row is not None
        return str(row[0])


class IdempotencyMiddleware:
    """app.add_middleware(IdempotencyMiddleware, pool=..., tenant=...).

    pool: a psycopg_pool.AsyncConnectionPool (or a callable returning one);
    tenant: a str or a callable(scope) -> str (may be async);
    endpoint: None (method and route template), a str, or callable(scope);
    profile: 'stripe' or 'ietf'; key_policy: 'refuse' or 'hash';
    exclude: JSON Pointers left out of the fingerprint; lease, wait, ttl:
    intervals ('30 seconds'); required: refuse keyless requests;
    methods: the methods it applies to; opt_in (default True): only the
    routes that ask for it claim a key (FastAPI: Depends(idempotency);
    Starlette: await claim(request)), the others take no connection and are
    never refused; False (deprecated) claims every request of methods before
    the application runs; retries: runs again after a
    serialization failure, deadlock or lost connection; deadline: seconds
    after which an application that has not answered is given up (its
    transaction rolled back, its connection closed, 503 handler_timeout;
    60 by default, 0 or None for none)."""

    def __init__(self, app: ASGIApp,
                 pool: Union[AsyncConnectionPool, Callable[[], AsyncConnectionPool]],
                 tenant: Union[str, Callable[[Scope], Union[str, Awaitable[str]]]],
                 endpoint: Union[None, str, Callable[[Scope], Union[str, Awaitable[str]]]] = None,
                 profile: str = "stripe", key_policy: str = "refuse",
                 exclude: Optional[Iterable[str]] = None, lease: Optional[Interval] = None,
                 wait: Optional[Interval] = None, ttl: Optional[Interval] = None, required: bool = False,
                 methods: Sequence[str] = ("POST", "PUT", "PATCH", "DELETE"), retries: int = 3,
                 limit: int = 1024 * 1024, isolation: Optional[str] = None, heartbeat: Optional[float] = None,
                 store_status: Callable[[int], bool] = lambda status: status < 500,
                 deadline: Optional[float] = DEFAULT_DEADLINE, opt_in: bool = True,
                 log: Optional[Logger] = None, problem_type_base: Optional[str] = None) -> None:
        if profile not in ("stripe", "ietf"):
            raise ValueError("profile is 'stripe' or 'ietf'")
        if key_policy not in ("refuse", "hash"):
            raise ValueError("key_policy is 'refuse' or 'hash'")
        if isolation and isolation.upper() not in ("READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"):
            raise ValueError("isolation is READ COMMITTED, REPEATABLE READ or SERIALIZABLE")
        self.app = app
        self._pool = pool
        self.tenant = tenant
        self.endpoint = endpoint
        self.profile = profile
        self.key_policy = key_policy
        self.exclude = list(exclude) if exclude else None
        self.lease = _pg_interval(lease, "lease")
        self.wait = _pg_interval(wait, "wait")
        self.ttl = _pg_interval(ttl, "ttl")
        self.problem_type_base = problem_type_base
        self.heartbeat = heartbeat  # lease mode; by default a third of the lease as the server reads it
        self._checked = False
        self.required = required
        self.methods = {m.upper() for m in methods}
        self.retries = retries
        self.limit = limit
        self.isolation = isolation
        self.store_status = store_status
        # 0 or None: no deadline
        if deadline is not None and (isinstance(deadline, bool) or not deadline >= 0 or deadline == float("inf")):
            raise ValueError("deadline is a number of seconds above 0, or 0 for none")
        self.deadline = deadline or None
        self.opt_in = opt_in
        if not opt_in:
            message = ("IdempotencyMiddleware(opt_in=False) is deprecated and will be removed: it claims a key and "
                       "takes a pool connection for every request of `methods`, before the application runs. "
                       "Let the routes that need it opt in (FastAPI: Depends(idempotency); Starlette: "
                       "await claim(request)) and drop opt_in=False")
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            LOGGER.warning("idempotency: %s", message)
        self.log: Logger = log or _default_log
        self.warn: Logger = log or _default_warn
        self._unclaimed_warned: Set[str] = set()  # the routes logged as answering keyed requests unclaimed

    @property
    def pool(self) -> AsyncConnectionPool:
        return self._pool() if callable(self._pool) else self._pool

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The request path, in named steps: the requests it covers (its
        methods), _prepare (read the key, the body's fingerprint, the
        tenant: at once, or when an opt_in route claims), _run (the attempts,
        503 when they run out), _Attempt.run (claim, run the application,
        store or release, send; see _Attempt).  Every answer of the
        middleware itself is built by _send_answer, a replay by
        _answer_claim."""
        if scope["type"] != "http" or scope["method"].upper() not in self.methods:
            return await self.app(scope, receive, send)
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        # the body goes to the application as it comes; only a request with
        # a key has a copy kept (up to limit) for the fingerprint of a claim
        keyed = any(k == "idempotency-key" for k, _ in headers)
        body = _RequestBody(receive, self.limit, keep=keyed)
        path = scope.get("root_path", "") + scope["path"]
        if scope.get("query_string"):
            path += "?" + scope["query_string"].decode("latin-1")
        # the route tree as the application at this middleware sees it, for
        # the route template (routing changes the scope as it goes)
        entry = {**scope}
        request = {"headers": headers, "body": body, "path": path, "method": scope["method"], "entry": entry}
        box: Dict[str, Any] = {"req": None, "request": request}
        try:
            if not self.opt_in:
                endpoint = await self._endpoint(entry)
                if endpoint is None:  # no route matches: nothing to protect
                    return await self.app(scope, receive, send)
                try:
                    box["req"] = await self._prepare(scope, request, endpoint)
                except _Refused as r:
                    return await self._send_answer(send, r.outcome, message=r.message, code=r.code)
                except _Disconnected:
                    return None
            await self._run(scope, send, body, box)
        finally:
            body.close()
        return None

    async def _run(self, scope: Scope, send: Send, body: _RequestBody, box: Dict[str, Any]) -> None:
        state: Dict[str, Any] = {"lease_token": None, "no_side_effect": False, "connect_failed": False}
        for attempt in range(self.retries + 1):
            app_receive = body.receive_for(attempt)
            if app_receive is None:
                self.log("the request is not run again: its body went to the application as it came and was not "
                         "kept (a request without an Idempotency-Key, or one above limit)", None)
                break
            try:
                return await self._attempt(scope, app_receive, send, body, box, state)
            except _Retry:
                await asyncio.sleep((0.005 + random.random() * 0.02) * 2 ** attempt)
        if state["lease_token"] is not None:
            await self._settle_lease(box["req"], state, "retries exhausted")
        if state["connect_failed"]:
            self.log("database_unavailable: no connection from the pool; check its connection settings (host, port, "
                     "user, password), that it was opened, and that the server runs and accepts connections", None)
            await self._send_answer(send, "unavailable", retry_after=1, code="database_unavailable")
            return
        await self._send_answer(send, "unavailable", retry_after=1)

    async def _prepare(self, scope: Scope, request: Dict[str, Any], endpoint: str) -> Dict[str, Any]:
        """The request as the claim needs it: its key, fingerprinted body and
        tenant.  At once, or (opt_in) when the route claims, so that a route
        that does not is never refused for its key or its body."""
        headers = request["headers"]
        try:
            key_values = [v for k, v in headers if k == "idempotency-key"]
            parsed = parse_key_header(key_values)
            # replays echo the header as the client sent it
            raw_key = None if parsed is None else key_values[0].strip()
            key = None if parsed is None else apply_key_policy(parsed, self.key_policy)
        except IdempotencyKeyError as err:
            raise _Refused("key_invalid", str(err)) from err
        if key is None and self.required:
            raise _Refused("key_missing", "this request needs an Idempotency-Key header")
        body_json: Optional[str] = None
        if key is not None:
            # only a keyed claim reads the body (what the application has
            # not read yet, kept for it), bounded by limit: its fingerprint
            raw = await request["body"].read_whole()
            if raw is None:
                raise _Refused("body_invalid", "request body too large", code="request_body_too_large")
            content_type = next((v for k, v in headers if k == "content-type"), "")
            try:
                body_json, _ = fingerprint_body(content_type, raw)
            except BodyError as err:
                raise _Refused("body_invalid", str(err)) from err
        tenant = self.tenant(scope) if callable(self.tenant) else self.tenant
        if asyncio.iscoroutine(tenant):
            tenant = await tenant
        accept_encoding = ", ".join(v for k, v in headers if k == "accept-encoding") or None
        return {"tenant": tenant, "endpoint": endpoint, "key": key, "raw_key": raw_key,
                "method": request["method"], "path": request["path"], "json": body_json,
                "accept_encoding": accept_encoding}

    async def _route_endpoint(self, scope: Scope, entry: Scope) -> str:
        """opt_in: the endpoint option, or the method and the template of the
        route the request matched, mounts included."""
        e = await self._endpoint(entry, scope)
        if e is None:
            raise _NotConfigured("the route this request matched has no template the middleware can read (a mount "
                                 "whose application has no routes, or the middleware added to a mounted "
                                 "application): give the endpoint, claim(request, endpoint='POST /v1/orders'), or "
                                 "add the middleware to the outermost application")
        return e

    async def _endpoint(self, entry: Scope, scope: Optional[Scope] = None) -> Optional[str]:
        """The endpoint option, or the method and the route template: the
        routes of the application the middleware wraps, matched as its
        router matches them, through mounted sub-applications (each mount's
        own template, parameters included: /accounts/{acct}/orders/{oid})."""
        if self.endpoint is not None:
            e = self.endpoint(scope or entry) if callable(self.endpoint) else self.endpoint
            return (await e) if isinstance(e, Awaitable) else e
        method = entry["method"]
        template = _route_template(getattr(entry.get("app"), "routes", None), entry)
        if template is not None:
            return f"{method} {entry.get('root_path', '')}{template}"
        if getattr(entry.get("app"), "routes", None) is None:
            # not a Starlette application: its concrete path
            return f"{method} {entry.get('root_path', '')}{entry['path']}"
        return None

    @staticmethod
    async def _cancel(conn: AsyncConn) -> None:
        """Cancels the query conn runs (PostgreSQL's cancel request, on a
        connection of its own), without blocking the event loop: psycopg's
        cancel_safe() (3.2 and later), or its cancel() in a thread.  Raises
        what the request met (the server gone, CANCEL_TIMEOUT passed)."""
        cancel_safe = getattr(conn, "cancel_safe", None)
        if cancel_safe is not None:
            await cancel_safe(timeout=CANCEL_TIMEOUT)
        else:
            cancel = conn.pgconn.get_cancel()
            await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, cancel.cancel),
                                   CANCEL_TIMEOUT)

    async def _cancel_query(self, conn: AsyncConn) -> None:
        """The claim query of a client that disconnected, cancelled."""
        try:
            await self._cancel(conn)
        except Exception as err:  # its connection is closed after: its backend ends when the query does
            self.log("could not cancel the claim of a client that disconnected; its connection is closed", err)

    @classmethod
    async def _give_up(cls, conn: AsyncConn) -> None:
        """The connection of a run given up: the query the application may
        still be running in it cancelled (the server would finish it before
        noticing a closed socket, holding the claim), then closed, which
        rolls the transaction back.  The cancel request does not block the
        event loop (other requests go on while it is sent)."""
        try:
            await cls._cancel(conn)
        except Exception:  # nothing to cancel, or the server is gone
            pass
        await conn.close()

    def _warn_unclaimed(self, request: Dict[str, Any], status: int) -> None:
        """opt_in: a request with an Idempotency-Key answered by a route that
        did not claim ran unprotected (a route of 0.3.0's days, before routes
        opted in): logged once per route.  An error answer (a route that
        claims, refused by the framework before its claim; no route at all)
        is not such a route."""
        if not self.opt_in or status >= 400 or not any(k == "idempotency-key" for k, _ in request["headers"]):
            return
        entry = request["entry"]
        template = _route_template(getattr(entry.get("app"), "routes", None), entry)
        if template is None:
            return
        route = f"{entry['method']} {entry.get('root_path', '')}{template}"
        if route in self._unclaimed_warned:
            return
        self._unclaimed_warned.add(route)
        self.warn(f"route_without_claim: {route} answered a request with an Idempotency-Key without claiming "
                  "it, so the request ran unprotected (routes opt in). Add Depends(idempotency) to the route "
                  "(Starlette: await claim(request)), or ignore this if it needs no protection; logged once per "
                  "route", None)

    async def _send_answer(self, send: Send, outcome: str, **kw: Any) -> None:
        status, headers, body = answer(self.profile, outcome, type_base=self.problem_type_base, **kw)
        await self._send(send, status, headers, json.dumps(body).encode())

    @staticmethod
    async def _send(send: Send, status: int, headers: Dict[str, Any], body: Optional[bytes],
                    head: bool = False) -> None:
        """Sends an answer or a replay.  A HEAD answer keeps the stored
        Content-Length (that of the body it did not send) and has no body."""
        out: List[Tuple[bytes, bytes]] = []
        for name, value in headers.items():
            for v in value if isinstance(value, list) else [value]:
                out.append((name.lower().encode("latin-1"), _header_bytes(str(v))))
        length = next((v for k, v in out if k == b"content-length"), None) if head else None
        out = [h for h in out if h[0] != b"content-length"]
        out.append((b"content-length", length if length is not None else str(len(body or b"")).encode()))
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": b"" if head else body or b"", "more_body": False})

    async def _settle_lease(self, req: Dict[str, Any], state: Dict[str, Any], reason: str,
                            release: bool = False) -> None:
        args = (req["tenant"], req["endpoint"], req["key"])
        try:
            async with self.pool.connection() as c:
                if release or state["no_side_effect"]:
                    await c.execute(SQL_RELEASE, args + (state["lease_token"],))
                else:
                    await c.execute(SQL_FAIL, args + (reason, state["lease_token"]))
        except Exception as err:  # maintenance marks it unknown when the lease runs out
            self.log("could not settle the lease", err)
        state["lease_token"] = None

    async def _heartbeat(self, req: Dict[str, Any], state: Dict[str, Any]) -> None:
        while True:
            await asyncio.sleep(self.heartbeat or 1.0)
            try:
                async with self.pool.connection() as c:
                    await c.execute(SQL_HEARTBEAT, (req["tenant"], req["endpoint"], req["key"],
                                                    state["lease_token"], self.lease))
            except Exception as err:
                self.log("heartbeat failed", err)

    async def _check_options(self, conn: AsyncConn) -> None:
        """The options' intervals read by the server, once; the heartbeat's
        period from the lease."""
        if self._checked:
            return
        try:
            cur = await conn.execute(SQL_CHECK, (self.ttl, self.lease, self.wait, self.lease))
            row = await cur.fetchone()
        except psycopg.DataError as err:
            await conn.rollback()
            raise _NotConfigured(f"the options ttl, lease and wait must be intervals PostgreSQL reads ({err})") from err
        await conn.rollback()
        if self.lease and not self.heartbeat and row is not None:
            self.heartbeat = max(0.1, float(row[3]) / 3)
        self._checked = True

    async def _claim(self, conn: AsyncConn, req: Dict[str, Any]) -> Dict[str, Any]:
        cur = conn.cursor(row_factory=dict_row)
        try:
            await cur.execute(SQL_CLAIM, {"tenant": req["tenant"], "endpoint": req["endpoint"], "key": req["key"],
                                          "method": req["method"], "path": req["path"], "json": req["json"],
                                          "exclude": self.exclude, "ttl": self.ttl, "lease": self.lease,
                                          "wait": self.wait})
        except psycopg.DataError as err:
            if (_sqlstate(err) or "").startswith("22"):
                raise _BodyRefused(str(err)) from err
            raise
        except psycopg.Error as err:
            if _sqlstate(err) in CONFIG_SQLSTATES:
                raise _NotConfigured(CONFIG_FIX) from err
            raise
        row = await cur.fetchone()
        assert row is not None
        return row

    async def _answer_claim(self, send: Send, req: Dict[str, Any], c: Dict[str, Any]) -> None:
        if c["action"] == "replay":
            headers = {k: v for k, v in (c["response_headers"] or {}).items() if k.lower() != "idempotency-key"}
            headers["Idempotency-Key"] = req["raw_key"]
            body = _decode_for_client(req["accept_encoding"], headers, bytes(c["response_body"] or b""))
            await self._send(send, c["response_status"], headers, body, head=req["method"] == "HEAD")
            return
        outcome = ACTION_OUTCOME.get(c["action"])
        if outcome is None:
            raise RuntimeError(f"unexpected claim action {c['action']}")
        await self._send_answer(send, outcome, code=c["error_code"], retry_after=c["retry_after"],
                                mismatch=c.get("mismatch"))

    async def _attempt(self, scope: Scope, receive: Receive, send: Send, body: _RequestBody,
                       box: Dict[str, Any], state: Dict[str, Any]) -> None:
        """One run of the request; raises _Retry when it should run again.
        box["req"] is the prepared request (None until an opt_in route
        claims)."""
        await _Attempt(self, scope, receive, send, body, box, state).run()


class _Attempt:
    """One run of a request on one pool connection, in named steps:

        run: claim_now (at once, or when an opt_in route asks) -> run_app
             (capture: the response held back) -> complete (store_or_release,
             then send_captured), or failed(err) for every other end.

    Every answer of the middleware is built by IdempotencyMiddleware's
    _send_answer (a replay by _answer_claim)."""

    def __init__(self, mw: IdempotencyMiddleware, scope: Scope, receive: Receive, send: Send,
                 body: _RequestBody, box: Dict[str, Any], state: Dict[str, Any]) -> None:
        self.mw, self.scope, self.receive, self.send, self.body = mw, scope, receive, send, body
        self.box, self.state = box, state
        self.conn: Optional[AsyncConn] = None
        self.heartbeat: Optional["asyncio.Future[None]"] = None
        self.released = False
        self.claimed: Dict[str, Any] = {"ctx": None, "token": None, "started": False, "failed": False,
                                        "gone": False, "before_handler": False}
        self.watchers: List["asyncio.Future[Any]"] = []
        self.captured: Dict[str, Any] = {"status": None, "headers": [], "body": []}
        self.sent = False
        self.sent_event = asyncio.Event()

    async def run(self) -> None:
        try:
            if self.mw.opt_in:
                self.scope.setdefault("state", {})[_CLAIM] = self.claim_now
            else:
                await self.claim_now(self.box["req"]["endpoint"])
            await self.run_app()
        except _Retry:
            raise
        except Exception as err:
            await self.failed(err)
        finally:
            for w in self.watchers:
                w.cancel()
            self.scope.get("state", {}).pop("idempotency", None)
            self.scope.get("state", {}).pop(_CLAIM, None)
            await self.give_back()

    async def give_back(self) -> None:
        """The connection back to the pool, once, and the heartbeat stopped:
        before a lease is settled, which takes a pool connection of its own
        (with a pool of one it would wait for this one)."""
        if self.heartbeat is not None:
            self.heartbeat.cancel()
            self.heartbeat = None
        conn = self.conn
        if conn is None or self.released:
            return
        self.released = True
        if not conn.broken and not conn.closed and conn.autocommit:  # a lease claim that failed
            try:
                await conn.set_autocommit(False)
            except psycopg.Error:
                pass
        await self.mw.pool.putconn(conn)

    # -- the claim ---------------------------------------------------------

    async def claim_now(self, endpoint: Optional[str]) -> Context:
        """The claim: a pool connection, the key claimed, the transaction the
        application writes in.  At once, or (opt_in) when the route asks for
        it through idempotency()/claim(), with the route's template."""
        claimed = self.claimed
        if claimed["ctx"] is not None:
            ctx: Context = claimed["ctx"]
            return ctx
        claimed["started"] = True
        if claimed["gone"]:
            claimed["failed"] = True
            raise _Disconnected("the client disconnected before the application claimed")
        try:
            ctx = await self.claim_steps(endpoint)
            if claimed["gone"]:
                # gone during the claim (its wait): the application does
                # not run; nothing happened, so a lease is released
                self.state["no_side_effect"] = True
                raise _Disconnected("the client disconnected before the application ran")
            return ctx
        except BaseException:
            # what the application sends after this (a mounted
            # application's own error page for the exception on its way
            # out) is dropped: the exception is answered here
            claimed["failed"] = True
            raise

    async def claim_steps(self, endpoint: Optional[str]) -> Context:
        """The request read (key, body, tenant), a connection taken, the key
        claimed; the Context the application gets."""
        mw, state = self.mw, self.state
        req: Optional[Dict[str, Any]] = self.box["req"]
        if req is None:
            request = self.box["request"]
            e = endpoint if endpoint is not None else await mw._route_endpoint(self.scope, request["entry"])
            req = self.box["req"] = await mw._prepare(self.scope, request, e)
        conn = await self.connect()
        await mw._check_options(conn)
        await self.claim_key(conn, req)
        ctx = Context(conn, req["key"], req["tenant"], req["endpoint"], state)
        ctx._attempt = self.claimed
        self.scope.setdefault("state", {})["idempotency"] = ctx
        self.claimed["ctx"] = ctx
        return ctx

    async def connect(self) -> AsyncConn:
        """A pool connection (self.conn); _Retry when none comes."""
        mw = self.mw
        try:
            self.conn = await mw.pool.getconn()
        except Exception as err:
            if _never_opened(mw.pool, err):
                raise _NotConfigured(POOL_NOT_OPENED) from err
            mw.log("no database connection", err)
            self.state["connect_failed"] = True
            raise _Retry() from err
        self.state["connect_failed"] = False
        return self.conn

    async def claim_key(self, conn: AsyncConn, req: Dict[str, Any]) -> None:
        """The key claimed (_Answered when the claim is not execute) and the
        transaction begun.  In lease mode the claim commits on its own
        before the transaction; otherwise it is inside it."""
        mw, state = self.mw, self.state
        key = req["key"]
        if key is not None and mw.lease and state["lease_token"] is None:
            await conn.set_autocommit(True)
            c = await self.claim_watched(conn, req)
            await conn.set_autocommit(False)
            if c["action"] != "execute":
                raise _Answered(c)
            state["lease_token"] = c["lease_token"]
        if state["lease_token"] is not None:
            self.heartbeat = asyncio.ensure_future(mw._heartbeat(req, state))
        if mw.isolation:
            await conn.execute(f"SET TRANSACTION ISOLATION LEVEL {mw.isolation.upper()}")
        # an endpoint whose policy has a lease answers even this claim with
        # a token: it is finished with it in this same transaction
        if key is not None and not mw.lease:
            c = await self.claim_watched(conn, req)
            if c["action"] != "execute":
                await conn.rollback()
                raise _Answered(c)
            self.claimed["token"] = c["lease_token"]
        else:
            await conn.execute("SELECT 1")  # opens the transaction the application writes in

    async def claim_watched(self, conn: AsyncConn, req: Dict[str, Any]) -> Dict[str, Any]:
        """The claim's query, watched for the client's disconnect: the claim
        may wait up to `wait` for a duplicate that runs, and the server
        would go on waiting for a client that is gone.  The body was read
        whole by then (the fingerprint), so the server's receive() has
        nothing but a disconnect to give: on one, the query is cancelled
        (PostgreSQL's cancel request) and the application does not run; the
        connection is then closed (_give_up), not given back as it is."""
        claimed = self.claimed
        query = asyncio.ensure_future(self.mw._claim(conn, req))
        gone_wait = asyncio.ensure_future(self.body.watch())
        try:
            await asyncio.wait({query, gone_wait}, return_when=asyncio.FIRST_COMPLETED)
            if gone_wait.done() and not gone_wait.cancelled() and gone_wait.exception() is None \
                    and gone_wait.result():
                claimed["gone"] = True
                if not query.done():
                    await self.mw._cancel_query(conn)
                    await asyncio.wait({query}, timeout=CANCEL_TIMEOUT)
                if not query.done():  # the cancel did not end it: its connection is closed
                    query.cancel()
            await asyncio.wait({query})  # its end (a message other than a disconnect ends the watch)
            if query.cancelled():
                raise _Disconnected(DISCONNECTED_IN_CLAIM)
            try:
                c = query.result()
            except psycopg.errors.QueryCanceled as err:
                if claimed["gone"]:
                    raise _Disconnected(DISCONNECTED_IN_CLAIM) from err
                raise
            if claimed["gone"] and c["action"] != "execute":
                # answered meanwhile (a replay, a conflict): nobody to answer
                raise _Disconnected(DISCONNECTED_IN_CLAIM)
            # executed before the cancel reached it: claim_now gives it up
            return c
        finally:
            gone_wait.cancel()
            if not query.done():  # this run is given up (its deadline)
                query.cancel()
                await asyncio.wait({query})
            if query.done() and not query.cancelled():
                query.exception()  # retrieved: asyncio does not log it as never retrieved

    # -- the application's run ---------------------------------------------

    async def run_app(self) -> None:
        """The application run, its response captured, until it is sent
        (complete) or the run ends otherwise."""
        app_task = asyncio.ensure_future(self.mw.app(self.scope, self.receive, self.capture))
        await self.watch_app(app_task)
        try:
            await app_task
        except Exception as err:
            if self.sent:
                self.mw.log("a background task failed after the commit and the response", err)
                return
            raise
        if not self.sent:
            await self.complete()

    async def watch_app(self, app_task: "asyncio.Future[None]") -> None:
        """Until the response is sent (not over the background tasks after
        it): the deadline, and the client's disconnect once the body was
        given whole (the server's receive() has nothing else to give then;
        the application waiting on it gets the same message)."""
        sent_wait = asyncio.ensure_future(self.sent_event.wait())
        gone_wait = asyncio.ensure_future(self.body.watch())
        self.watchers.append(gone_wait)
        waits: Set["asyncio.Future[Any]"] = {app_task, sent_wait, gone_wait}
        loop = asyncio.get_running_loop()
        deadline = self.mw.deadline
        until = loop.time() + deadline if deadline else None
        try:
            while True:
                finished, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED,
                                                 timeout=None if until is None else max(0.0, until - loop.time()))
                if not finished:
                    app_task.cancel()
                    raise _Deadline(f"the application did not answer within {deadline} s")
                if app_task in finished or sent_wait in finished:
                    return
                waits -= finished
                if not all(f.result() for f in finished):
                    continue  # not a disconnect: no more watching
                # the client went away while the application runs: a
                # claim made is given up, one not made yet is refused
                self.claimed["gone"] = True
                if self.claimed["ctx"] is not None and not self.sent:
                    app_task.cancel()
                    raise _Disconnected("the client disconnected while the application ran")
        finally:
            sent_wait.cancel()

    async def capture(self, message: Message) -> None:
        """The application's send(): a claimed run's response held back
        until complete(); an unclaimed one's passed through."""
        claimed, captured = self.claimed, self.captured
        if self.sent or claimed["failed"]:
            return
        if not claimed["started"]:
            # opt_in: a route that did not ask for the claim passes
            # through untouched, without a connection
            if message["type"] == "http.response.start":
                self.mw._warn_unclaimed(self.box["request"], message["status"])
            await self.send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.sent = True
                self.sent_event.set()
            return
        if message["type"] == "http.response.start":
            captured["status"] = message["status"]
            captured["headers"] = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            captured["body"].append(message.get("body", b""))
            if not message.get("more_body", False):
                await self.complete()

    # -- the response: stored or released, then sent ------------------------

    async def complete(self) -> None:
        """The response is stored and committed, and sent, as soon as the
        application has sent its last byte: what the application does after
        that (Starlette's and FastAPI's background tasks) runs after the
        commit and after the response, and cannot change them."""
        captured = self.captured
        if captured["status"] is None or self.conn is None:
            raise RuntimeError("the application sent no response")
        body = b"".join(captured["body"])
        status = captured["status"]
        head = self.scope["method"].upper() == "HEAD"
        # a HEAD answer: the Content-Length of the body a GET gets (the
        # application's, or that of what it sent), no body
        length = str(len(body)).encode()
        if head:
            length = next((v for k, v in captured["headers"] if k.lower() == b"content-length"), length)
            body = b""
        await self.store_or_release(status, body, length if head else None)
        await self.send_captured(status, body, length)

    async def store_or_release(self, status: int, body: bytes, head_length: Optional[bytes]) -> None:
        """Stored under the key and committed; or (before the handler began,
        or store_status false: a 5xx by default) rolled back, a lease
        released so that a retry runs again."""
        conn, state, req = self.conn, self.state, self.box["req"]
        assert conn is not None
        if self.claimed["before_handler"] or not self.mw.store_status(status):
            await conn.rollback()
            if state["lease_token"] is not None:
                # a 5xx is the handler's own failure: not stored, the key
                # given back so that a retry runs again (lease mode too)
                await self.give_back()
                await self.mw._settle_lease(req, state, f"the handler answered {status}", release=True)
            return
        if req["key"] is not None:
            stored = self.stored_headers(head_length)
            try:
                await conn.execute(SQL_FINISH, (req["tenant"], req["endpoint"], req["key"], status, body,
                                                json.dumps(stored), state["lease_token"] or self.claimed["token"]))
            except psycopg.Error as err:
                if _sqlstate(err) == "IK413":
                    raise _TooLarge() from err
                if _sqlstate(err) in CONFIG_SQLSTATES:
                    raise _NotConfigured(CONFIG_FIX) from err
                raise
        await conn.commit()
        state["lease_token"] = None

    def stored_headers(self, head_length: Optional[bytes]) -> Dict[str, Any]:
        """The captured headers as stored: those of one transmission left
        out, a repeated name as a list; a HEAD answer's Content-Length kept."""
        stored: Dict[str, Any] = {}
        for name, value in self.captured["headers"]:
            name = name.decode("latin-1").lower()
            if name in NOT_STORED and not (head_length is not None and name == "content-length"):
                continue
            value = value.decode("latin-1")
            if name in stored:
                prev = stored[name]
                stored[name] = (prev if isinstance(prev, list) else [prev]) + [value]
            else:
                stored[name] = value
        if head_length is not None:
            stored["content-length"] = head_length.decode("latin-1")
        return stored

    async def send_captured(self, status: int, body: bytes, length: bytes) -> None:
        headers = [(k, v) for k, v in self.captured["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", length))
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": body, "more_body": False})
        self.sent = True
        self.sent_event.set()
        await self.give_back()

    # -- every other end of the run -----------------------------------------

    async def failed(self, err: Exception) -> None:
        """What an end of the run other than a sent response answers."""
        mw, send, req = self.mw, self.send, self.box["req"]
        if isinstance(err, _Answered):
            await mw._answer_claim(send, req, err.claim)
        elif isinstance(err, _Refused):
            await mw._send_answer(send, err.outcome, message=err.message, code=err.code)
        elif isinstance(err, _BodyRefused):
            if self.conn is not None:
                await self.conn.rollback()
            await mw._send_answer(send, "body_invalid", message=str(err))
        elif isinstance(err, _Disconnected):
            await self.disconnected(err)
        elif isinstance(err, _Deadline):
            await self.timed_out(err)
        elif isinstance(err, (_NotConfigured, _TooLarge)):
            await self.not_stored(err)
        else:
            await self.unexpected(err)

    async def disconnected(self, err: _Disconnected) -> None:
        """Nothing can be sent any more; the application may still hold the
        connection inside a query: closed, not rolled back (the server rolls
        back and frees the claim).  Lease mode: marked unknown, or released
        after no_side_effect(), as after a raise."""
        if self.conn is not None:
            await self.mw._give_up(self.conn)
        self.mw.log(f"client_disconnected: {err}; the transaction was rolled back and its connection closed", None)
        await self.settle(str(err))

    async def timed_out(self, err: _Deadline) -> None:
        """The application may still hold the connection inside a query:
        closed, not rolled back (the server rolls back and frees the claim)."""
        mw = self.mw
        if self.conn is not None:
            await mw._give_up(self.conn)
        mw.log(f"handler_timeout: the application did not answer within deadline ({mw.deadline} s); the "
               "transaction was rolled back and its connection closed. Find what it waits for, or raise "
               "deadline", err)
        await self.settle(str(err))
        await mw._send_answer(self.send, "unavailable", retry_after=1, code="handler_timeout")

    async def not_stored(self, err: Exception) -> None:
        """The response cannot be stored (too large) or the middleware is
        not configured: rolled back, a lease released, 500."""
        mw = self.mw
        if self.conn is not None and not self.conn.broken:
            await self.conn.rollback()
        await self.settle("not stored", release=True)
        if isinstance(err, _TooLarge):
            mw.log(f"response_too_large: {TOO_LARGE_FIX}", err.__cause__)
            await mw._send_answer(self.send, "too_large", code="response_too_large")
        else:
            mw.log(f"idempotency_not_configured: {err}", err.__cause__)
            await mw._send_answer(self.send, "not_configured", code="idempotency_not_configured")

    async def unexpected(self, err: Exception) -> None:
        """Rolled back; run again after a serialization failure, deadlock or
        lost connection (_Retry), otherwise a lease marked unknown and the
        error raised on to the server."""
        conn = self.conn
        if conn is not None and not conn.broken:
            try:
                await conn.rollback()
            except Exception:
                pass
        if _is_retryable(err) or _is_connection_loss(err, conn):
            self.mw.log("request will be run again", err)
            raise _Retry() from err
        await self.settle(f"the handler failed: {err}")
        raise err

    async def settle(self, reason: str, release: bool = False) -> None:
        """Lease mode: the connection given back first (settling takes a pool
        connection of its own), then the key released or marked unknown."""
        if self.state["lease_token"] is None:
            return
        await self.give_back()
        await self.mw._settle_lease(self.box["req"], self.state, reason, release=release)
