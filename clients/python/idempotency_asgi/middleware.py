"""ASGI middleware (Starlette, FastAPI): HTTP idempotency keys on the
idempotency PostgreSQL extension.  It claims the key on a pooled psycopg
connection inside a transaction, hands that connection to the application
(request.state.idempotency.conn), captures the response, finishes the key
and commits before the first byte is sent, and answers replays, conflicts
and mismatches per the chosen profile."""

import asyncio
import json
import random
import re

import psycopg
from psycopg.rows import dict_row

from .body import BodyError, fingerprint_body
from .header import KeyError_, apply_key_policy, parse_key_header
from .profiles import ACTION_OUTCOME, answer

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


def interval_seconds(value):
    """'30 seconds', '30s', '500 ms', '2 min', or a number of seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    m = _INTERVAL.fullmatch(str(value))
    if not m:
        raise ValueError(f"cannot read {value!r} as an interval (use e.g. '30 seconds')")
    unit = (m.group(2) or "s").lower()
    factor = 0.001 if unit.startswith(("ms", "milli")) else 60.0 if unit.startswith("min") else 1.0
    return float(m.group(1)) * factor


def _pg_interval(value):
    return None if value is None else f"{interval_seconds(value) * 1000:g} milliseconds"


def _sqlstate(err):
    return getattr(err, "sqlstate", None)


def _is_retryable(err):
    return _sqlstate(err) in RETRY_SQLSTATES


def _is_connection_loss(err, conn):
    if _sqlstate(err) in LOST_SQLSTATES:
        return True
    return isinstance(err, psycopg.OperationalError) and conn is not None and conn.broken


class _Retry(Exception):
    pass


class _BodyRefused(Exception):
    """The fingerprint refused the body (SQLSTATE class 22: a number beyond
    a double, \\u0000): the client's fault, a 400."""


class Context:
    """What the application gets as request.state.idempotency."""

    def __init__(self, conn, key, tenant, endpoint, state):
        self.conn = conn
        self.key = key
        self.tenant = tenant
        self.endpoint = endpoint
        self.lease_token = state["lease_token"]
        self._state = state

    def no_side_effect(self):
        """Lease mode: nothing happened outside the database yet, so a failure
        releases the key instead of marking it unknown."""
        self._state["no_side_effect"] = True

    async def downstream_key(self, step):
        cur = await self.conn.execute(SQL_DOWNSTREAM, (self.tenant, self.endpoint, self.key, step))
        return (await cur.fetchone())[0]


class IdempotencyMiddleware:
    """app.add_middleware(IdempotencyMiddleware, pool=..., tenant=...).

    pool: a psycopg_pool.AsyncConnectionPool (or a callable returning one);
    tenant: a str or a callable(scope) -> str (may be async);
    endpoint: None (method and route template), a str, or callable(scope);
    profile: 'stripe' or 'ietf'; key_policy: 'refuse' or 'hash';
    exclude: JSON Pointers left out of the fingerprint; lease, wait, ttl:
    intervals ('30 seconds'); required: refuse keyless requests;
    methods: the methods it applies to; retries: runs again after a
    serialization failure, deadlock or lost connection."""

    def __init__(self, app, pool, tenant, endpoint=None, profile="stripe", key_policy="refuse",
                 exclude=None, lease=None, wait=None, ttl=None, required=False,
                 methods=("POST", "PUT", "PATCH", "DELETE"), retries=3, limit=1024 * 1024,
                 isolation=None, heartbeat=None, store_status=lambda status: status < 500, log=None):
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
        self.lease = _pg_interval(lease)
        self.wait = _pg_interval(wait)
        self.ttl = _pg_interval(ttl)
        self.heartbeat = heartbeat or (max(0.1, interval_seconds(lease) / 3) if lease else None)
        self.required = required
        self.methods = {m.upper() for m in methods}
        self.retries = retries
        self.limit = limit
        self.isolation = isolation
        self.store_status = store_status
        self.log = log or (lambda message, err=None: None)

    @property
    def pool(self):
        return self._pool() if callable(self._pool) else self._pool

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"].upper() not in self.methods:
            return await self.app(scope, receive, send)
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        try:
            raw_key = parse_key_header([v for k, v in headers if k == "idempotency-key"])
            key = None if raw_key is None else apply_key_policy(raw_key, self.key_policy)
        except KeyError_ as err:
            return await self._send_answer(send, "key_invalid", message=str(err))
        if key is None and self.required:
            return await self._send_answer(send, "key_missing",
                                           message="this request needs an Idempotency-Key header")
        raw, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            raw += message.get("body", b"")
            more = message.get("more_body", False)
            if len(raw) > self.limit:
                return await self._send_answer(send, "body_invalid", message="request body too large")
        content_type = next((v for k, v in headers if k == "content-type"), "")
        try:
            body_json, _ = fingerprint_body(content_type, raw)
        except BodyError as err:
            return await self._send_answer(send, "body_invalid", message=str(err))
        endpoint = await self._endpoint(scope)
        if endpoint is None:  # no route matches: nothing to protect
            return await self.app(scope, self._replaying(raw, receive), send)
        tenant = self.tenant(scope) if callable(self.tenant) else self.tenant
        if asyncio.iscoroutine(tenant):
            tenant = await tenant
        path = scope.get("root_path", "") + scope["path"]
        if scope.get("query_string"):
            path += "?" + scope["query_string"].decode("latin-1")
        req = {"tenant": tenant, "endpoint": endpoint, "key": key, "raw_key": raw_key,
               "method": scope["method"], "path": path, "json": body_json}
        state = {"lease_token": None, "no_side_effect": False}
        for attempt in range(self.retries + 1):
            try:
                return await self._attempt(scope, receive, send, raw, req, state)
            except _Retry:
                await asyncio.sleep((0.005 + random.random() * 0.02) * 2 ** attempt)
        if state["lease_token"] is not None:
            await self._settle_lease(req, state, "retries exhausted")
        await self._send_answer(send, "unavailable", retry_after=1)

    async def _endpoint(self, scope):
        if self.endpoint is not None:
            e = self.endpoint(scope) if callable(self.endpoint) else self.endpoint
            return (await e) if asyncio.iscoroutine(e) else e
        app = scope.get("app")
        router = getattr(app, "router", None)
        if router is None:
            return f"{scope['method']} {scope['path']}"
        from starlette.routing import Match
        for route in router.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return f"{scope['method']} {scope.get('root_path', '')}{route.path}"
        return None

    @staticmethod
    def _replaying(raw, receive):
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()
        return replay

    async def _send_answer(self, send, outcome, **kw):
        status, headers, body = answer(self.profile, outcome, **kw)
        await self._send(send, status, headers, json.dumps(body).encode())

    @staticmethod
    async def _send(send, status, headers, body):
        out = []
        for name, value in headers.items():
            for v in value if isinstance(value, list) else [value]:
                out.append((name.lower().encode("latin-1"), str(v).encode("latin-1")))
        out = [h for h in out if h[0] != b"content-length"]
        out.append((b"content-length", str(len(body or b"")).encode()))
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": body or b"", "more_body": False})

    async def _settle_lease(self, req, state, reason):
        args = (req["tenant"], req["endpoint"], req["key"])
        try:
            async with self.pool.connection() as c:
                if state["no_side_effect"]:
                    await c.execute(SQL_RELEASE, args + (state["lease_token"],))
                else:
                    await c.execute(SQL_FAIL, args + (reason, state["lease_token"]))
        except Exception as err:  # maintenance marks it unknown when the lease runs out
            self.log("could not settle the lease", err)
        state["lease_token"] = None

    async def _heartbeat(self, req, state):
        while True:
            await asyncio.sleep(self.heartbeat)
            try:
                async with self.pool.connection() as c:
                    await c.execute(SQL_HEARTBEAT, (req["tenant"], req["endpoint"], req["key"],
                                                    state["lease_token"], self.lease))
            except Exception as err:
                self.log("heartbeat failed", err)

    async def _claim(self, conn, req):
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
        return await cur.fetchone()

    async def _answer_claim(self, send, req, c):
        if c["action"] == "replay":
            headers = {k: v for k, v in (c["response_headers"] or {}).items() if k.lower() != "idempotency-key"}
            headers["Idempotency-Key"] = req["raw_key"]
            await self._send(send, c["response_status"], headers, bytes(c["response_body"] or b""))
            return
        outcome = ACTION_OUTCOME.get(c["action"])
        if outcome is None:
            raise RuntimeError(f"unexpected claim action {c['action']}")
        await self._send_answer(send, outcome, code=c["error_code"], retry_after=c["retry_after"],
                                mismatch=c.get("mismatch"))

    async def _attempt(self, scope, receive, send, raw, req, state):
        """One run of the request; raises _Retry when it should run again."""
        try:
            conn = await self.pool.getconn()
        except Exception as err:
            self.log("no database connection", err)
            raise _Retry() from err
        heartbeat = None
        try:
            key = req["key"]
            if key is not None and self.lease and state["lease_token"] is None:
                await conn.set_autocommit(True)
                c = await self._claim(conn, req)
                await conn.set_autocommit(False)
                if c["action"] != "execute":
                    return await self._answer_claim(send, req, c)
                state["lease_token"] = c["lease_token"]
            if state["lease_token"] is not None:
                heartbeat = asyncio.ensure_future(self._heartbeat(req, state))
            if self.isolation:
                await conn.execute(f"SET TRANSACTION ISOLATION LEVEL {self.isolation.upper()}")
            # an endpoint whose policy has a lease answers even this claim with
            # a token: it is finished with it in this same transaction
            claim_token = None
            if key is not None and not self.lease:
                c = await self._claim(conn, req)
                if c["action"] != "execute":
                    await conn.rollback()
                    return await self._answer_claim(send, req, c)
                claim_token = c["lease_token"]
            else:
                await conn.execute("SELECT 1")  # opens the transaction the application writes in
            scope.setdefault("state", {})["idempotency"] = Context(conn, key, req["tenant"], req["endpoint"], state)
            captured = {"status": None, "headers": [], "body": []}

            async def capture(message):
                if message["type"] == "http.response.start":
                    captured["status"] = message["status"]
                    captured["headers"] = list(message.get("headers", []))
                elif message["type"] == "http.response.body":
                    captured["body"].append(message.get("body", b""))

            await self.app(scope, self._replaying(raw, receive), capture)
            if captured["status"] is None:
                raise RuntimeError("the application sent no response")
            body = b"".join(captured["body"])
            status = captured["status"]
            if not self.store_status(status):
                await conn.rollback()
                if state["lease_token"] is not None:
                    await self._settle_lease(req, state, f"the handler answered {status}")
            else:
                if key is not None:
                    stored = {}
                    for name, value in captured["headers"]:
                        name = name.decode("latin-1").lower()
                        if name in NOT_STORED:
                            continue
                        value = value.decode("latin-1")
                        if name in stored:
                            prev = stored[name]
                            stored[name] = (prev if isinstance(prev, list) else [prev]) + [value]
                        else:
                            stored[name] = value
                    await conn.execute(SQL_FINISH, (req["tenant"], req["endpoint"], key, status, body,
                                                    json.dumps(stored),
                                                    state["lease_token"] or claim_token))
                await conn.commit()
                state["lease_token"] = None
            headers = [(k, v) for k, v in captured["headers"] if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
        except _Retry:
            raise
        except _BodyRefused as err:
            await conn.rollback()
            await self._send_answer(send, "body_invalid", message=str(err))
        except Exception as err:
            if not conn.broken:
                try:
                    await conn.rollback()
                except Exception:
                    pass
            if _is_retryable(err) or _is_connection_loss(err, conn):
                self.log("request will be run again", err)
                raise _Retry() from err
            if state["lease_token"] is not None:
                await self._settle_lease(req, state, f"the handler failed: {err}")
            raise
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
            scope.get("state", {}).pop("idempotency", None)
            if not conn.broken and conn.autocommit:  # a lease claim that failed
                try:
                    await conn.set_autocommit(False)
                except psycopg.Error:
                    pass
            await self.pool.putconn(conn)
