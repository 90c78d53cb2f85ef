"""End-to-end test of the outbox sender (issue 37): operations enqueued
with idem_outbox_add in transactions (some rolled back with their business
write) are sent by `python3 -m idempotency_asgi.outbox`, killed with
SIGKILL and restarted (and at the end two at once), to a test server (the
package's middleware under uvicorn, enforcing keys with the extension)
that injects faults chosen per operation: 500 before its commit, 500 after
it, 503, 429 and 409 with Retry-After, 422 (the key used before with
another body), 400, a connection reset and a timeout after the commit.

Checks, from the database: each committed operation reaches a definite
state by the rules and executes exactly once when it succeeded (never when
it did not); none rolled back is ever sent; 422 and 400 are sent once;
the attempt after a Retry-After begins at least that long after the
answer; every request carries its operation's key and a request id of its
own, never derived from the key; senders stopped with SIGTERM exit 0.

Run by clients/test.sh (suite python_outbox); the server side is
make_server() (uvicorn --factory)."""

import os
import signal
import socket
import subprocess
import sys
import time

import psycopg
from psycopg.types.json import Jsonb

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(os.path.dirname(HERE))
CONNINFO = psycopg.conninfo.make_conninfo(
    host=os.environ.get("IDEM_TEST_PGHOST", "127.0.0.1"), port=os.environ.get("IDEM_TEST_PGPORT"),
    user=os.environ.get("IDEM_TEST_PGUSER"), dbname=os.environ.get("IDEM_TEST_PGDATABASE"))
TIME_BUDGET = 40.0
# faults of successive requests of one key -> the state its operation ends in
SCENARIOS = {
    "plain": ([], "succeeded"),
    "500_before": (["500_before"], "succeeded"),
    "500_after": (["500_after"], "succeeded"),
    "503": (["503", "503"], "succeeded"),
    "429": (["429"], "succeeded"),
    "409": (["409", "409"], "succeeded"),
    "reset": (["reset"], "succeeded"),
    "timeout": (["timeout"], "succeeded"),
    "mixed": (["503", "500_after", "reset", "429"], "succeeded"),
    "400": (["400"] * 50, "failed"),  # every request: a sender killed before it recorded the first 400 sends again
    "down": (["503"] * 50, "attention"),
}
SENDER = ["--concurrency", "4", "--lease", "3 seconds", "--timeout", "1 second", "--max-attempts", "8",
          "--base-ms", "50", "--cap-ms", "400", "--idle", "0.1", "--log-level", "WARNING"]


def make_server():
    """The test server: the middleware (IETF profile: a reused key is 422) on a
    FastAPI route that writes an order, inside an ASGI wrapper that logs
    each request (table seen) and injects the fault of its attempt
    (?faults=a,b: one per attempt)."""
    import asyncio
    pools, counts = {}, {}
    api = _api(pools)

    def fault_of(scope):
        headers = dict(scope["headers"])
        key = headers.get(b"idempotency-key", b"").decode()
        rid = headers.get(b"x-request-id", b"").decode()
        query = dict(p.split("=", 1) for p in scope.get("query_string", b"").decode().split("&") if "=" in p)
        faults = [f for f in query.get("faults", "").split(",") if f]
        n = counts[key] = counts.get(key, 0) + 1
        return key, rid, n, (faults[n - 1] if n <= len(faults) else None)

    async def reply(send, status, headers=()):
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")] + list(headers)})
        await send({"type": "http.response.body", "body": b'{"error": "injected"}'})

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return await api(scope, receive, send)
        key, rid, n, fault = fault_of(scope)
        async with pools["log"].connection() as c:
            await c.execute("INSERT INTO seen (idem_key, request_id, n, fault) VALUES (%s, %s, %s, %s)",
                            (key, rid, n, fault))
        if fault in ("503", "429", "409"):
            return await reply(send, int(fault), [(b"retry-after", b"1")] if fault != "503" else [])
        scope["fault"] = fault

        async def faulty(message):
            if fault == "500_after" and message["type"] == "http.response.start":
                message = dict(message, status=500)  # after the commit: the retry replays
            if fault == "timeout" and message["type"] == "http.response.start":
                await asyncio.sleep(2.5)
            if fault == "reset" and message["type"] == "http.response.body":
                await send({"type": "http.response.body", "body": message.get("body", b"")[:3], "more_body": True})
                raise ConnectionResetError("injected reset")
            await send(message)
        await api(scope, receive, faulty)
    return app


def _api(pools):
    """The application: one route that claims the key and writes an order."""
    from fastapi import Depends, FastAPI, Request
    from fastapi.responses import JSONResponse
    from psycopg_pool import AsyncConnectionPool

    from idempotency_asgi import Context, IdempotencyMiddleware, idempotency
    api = FastAPI()
    api.add_middleware(IdempotencyMiddleware, pool=lambda: pools["app"], tenant="acme", profile="ietf",
                       wait="5 seconds")

    @api.on_event("startup")
    async def open_pools():
        pools["app"] = AsyncConnectionPool(CONNINFO, min_size=2, max_size=12, open=False)
        pools["log"] = AsyncConnectionPool(CONNINFO, min_size=1, max_size=4, open=False)
        await pools["app"].open()
        await pools["log"].open()

    @api.post("/v1/orders")
    async def create_order(request: Request, ctx: Context = Depends(idempotency)):
        body = await request.json()
        if request.scope.get("fault") == "400":  # a refusal: nothing written, the answer stored
            return JSONResponse({"error": "bad request"}, status_code=400)
        await ctx.conn.execute("INSERT INTO orders (idem_key, op) VALUES (%s, %s)", (ctx.key, body.get("op")))
        if request.scope.get("fault") == "500_before":
            return JSONResponse({"error": "injected"}, status_code=500)  # rolled back, not stored
        return JSONResponse({"order": ctx.key[:8], "op": body.get("op")}, status_code=201)
    return api


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port):
    env = dict(os.environ, PYTHONPATH=PKG)
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", "tests.e2e.outbox_run:make_server",
                             "--host", "127.0.0.1", "--port", str(port), "--log-level", "critical",
                             "--no-access-log"], cwd=PKG, env=env)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the test server did not start")


def start_sender(log, name="outbox-sender"):
    """A sender whose connections carry the application_name name."""
    env = dict(os.environ, PYTHONPATH=PKG)
    conninfo = psycopg.conninfo.make_conninfo(CONNINFO, application_name=name)
    return subprocess.Popen([sys.executable, "-m", "idempotency_asgi.outbox", "--database", conninfo] + SENDER,
                            env=env, stderr=log, stdout=log)


def wait_connected(conn, name, budget=60.0):
    """Until a sender named name has connected: it installs its SIGTERM
    handler before it opens its pool, so a SIGTERM sent after that is its
    own to handle (one sent while Python still imports kills it)."""
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        if conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                        (name,)).fetchone()[0] > 0:
            return
        time.sleep(0.1)


def prepare(conn, base):
    """Tables, a key used before with another body (its operation gets
    422), and the operations: committed ones, and rolled-back ones."""
    conn.execute("CREATE TABLE orders (idem_key text, op text, at timestamptz DEFAULT clock_timestamp())")
    conn.execute("CREATE TABLE seen (idem_key text, request_id text, n int, fault text,"
                 " at timestamptz DEFAULT clock_timestamp())")
    conn.execute("CREATE TABLE client_orders (op text, outbox_key text)")
    import httpx
    used = "reused-" + os.urandom(8).hex()
    r = httpx.post(f"{base}/v1/orders", json={"op": "direct"}, headers={"Idempotency-Key": used})
    assert r.status_code == 201, r.text
    ops = {"reuse": (used, "failed")}
    enqueue(conn, "reuse", base, [], key=used)
    for copy in range(3):
        for name, (faults, state) in SCENARIOS.items():
            ops[f"{name}#{copy}"] = (enqueue(conn, f"{name}#{copy}", base, faults), state)
    rolled = [enqueue(conn, f"rolled#{i}", base, [], commit=False) for i in range(6)]
    return ops, rolled


def enqueue(conn, op, base, faults, key=None, commit=True):
    """The business write and its call, in one transaction."""
    with conn.transaction(force_rollback=not commit):
        key = conn.execute("SELECT idempotency.idem_outbox_add('POST', %s, %s, '{}', %s)",
                           (f"{base}/v1/orders?faults={','.join(faults)}", Jsonb({"op": op}), key)).fetchone()[0]
        conn.execute("INSERT INTO client_orders VALUES (%s, %s)", (op, key))
    return key


def all_final(conn):
    return conn.execute("SELECT count(*) FROM idempotency.outbox WHERE state IN ('pending', 'in_flight')"
                        ).fetchone()[0] == 0


def run_senders(conn, log):
    """Senders killed with SIGKILL and restarted, then two at once until
    every operation is final; stopped with SIGTERM.  Returns the kills and
    the exit codes of the stopped ones."""
    kills, codes = 0, []
    start = time.monotonic()
    sender = start_sender(log, "outbox-sender-0")
    for pause in (0.8, 1.3, 0.6, 1.7):
        time.sleep(pause)
        sender.send_signal(signal.SIGKILL)
        sender.wait()
        kills += 1
        sender = start_sender(log, f"outbox-sender-{kills}")
    senders = [sender, start_sender(log, "outbox-sender-last")]
    while not all_final(conn) and time.monotonic() - start < TIME_BUDGET:
        time.sleep(0.2)
    wait_connected(conn, f"outbox-sender-{kills}")
    wait_connected(conn, "outbox-sender-last")
    for s in senders:
        s.send_signal(signal.SIGTERM)
    for s in senders:
        codes.append(s.wait(30))
    return kills, codes


def check(conn, ops, rolled, kills, codes):
    """Returns the failures found."""
    bad = []
    state = dict(conn.execute("SELECT key, state FROM idempotency.outbox").fetchall())
    runs = dict(conn.execute("SELECT idem_key, count(*) FROM orders WHERE op <> 'direct' GROUP BY 1").fetchall())
    sends = dict(conn.execute("SELECT idem_key, count(*) FROM seen WHERE request_id <> '' GROUP BY 1").fetchall())
    for name, (key, want) in sorted(ops.items()):
        if state.get(key) != want:
            bad.append(f"{name}: state {state.get(key)}, expected {want}")
        if runs.get(key, 0) != (1 if want == "succeeded" else 0):
            bad.append(f"{name}: executed {runs.get(key, 0)} times on the server ({state.get(key)})")
        if name.startswith(("reuse", "400")):
            bad += check_never_retried(conn, name, key, sends.get(key, 0))
    for key in rolled:
        if key in state or key in sends:
            bad.append("an operation whose enqueue rolled back is in the outbox or was sent")
    bad += check_requests(conn, ops)
    bad += check_retry_after(conn)
    if kills < 3 or codes != [0, 0]:
        bad.append(f"senders: {kills} killed, exit codes on SIGTERM {codes}")
    return bad


def check_never_retried(conn, name, key, sends):
    """A 422 or 400 ends the operation at the attempt that got it.  A
    sender killed between the answer and its record leaves a lease that
    lapses: the next sender sends again (with the key), recorded as a
    lapsed attempt; nothing else may resend."""
    rows = conn.execute("""SELECT a.status, a.outcome FROM idempotency.outbox_attempts a
                             JOIN idempotency.outbox o ON o.id = a.outbox_id
                            WHERE o.key = %s ORDER BY a.attempt""", (key,)).fetchall()
    recorded = [r for r in rows if r[1] != "lapsed"]
    want = 422 if name.startswith("reuse") else 400
    if recorded != [(want, "failed")] or sends < 1 or sends > 1 + len(rows) - len(recorded):
        return [f"{name}: sent {sends} times, attempts {rows} (a {want} is never retried)"]
    return []


def check_requests(conn, ops):
    bad = []
    keys = {key for key, _ in ops.values()}
    rows = conn.execute("SELECT idem_key, request_id FROM seen WHERE request_id <> ''").fetchall()
    ids = [rid for _, rid in rows]
    if len(set(ids)) != len(ids):
        bad.append("a request id was sent twice")
    for key, rid in rows:
        if key not in keys:
            bad.append("a request carried a key that is no committed operation's")
        if key in rid or rid in key:
            bad.append("a request id is derived from the key")
    return bad


def check_retry_after(conn):
    """The request after a 429 or 409 with Retry-After: 1 reaches the server
    at least 1 s after that answer (the server's own log, one clock: the
    answer left after its row was written); and in outbox_attempts each
    attempt after such an answer begins after that attempt was recorded."""
    rows = conn.execute("""
        SELECT a.fault, extract(epoch FROM b.at - a.at)
          FROM seen a JOIN seen b ON b.idem_key = a.idem_key AND b.n = a.n + 1
         WHERE a.fault IN ('409', '429')""").fetchall()
    bad = [f"a request {float(gap):.3f} s after a {fault} with Retry-After: 1"
           for fault, gap in rows if float(gap) < 1.0]
    if len(rows) < 12:
        bad.append(f"only {len(rows)} requests after a Retry-After")
    rows = conn.execute("""
        SELECT a.status, b.started_at > a.ended_at
          FROM idempotency.outbox_attempts a
          JOIN idempotency.outbox_attempts b ON b.outbox_id = a.outbox_id AND b.attempt = a.attempt + 1
         WHERE a.status IN (409, 429) AND a.outcome = 'retry'""").fetchall()
    bad += [f"outbox_attempts: an attempt began before the {status} before it was recorded"
            for status, after in rows if not after]
    if len(rows) < 6:
        bad.append(f"only {len(rows)} recorded attempts after a Retry-After")
    return bad


def main():
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server(port)
    log = open(os.path.join(os.environ.get("OUTBOX_LOG_DIR", "/tmp"), f"outbox-senders-{os.getpid()}.log"), "w")
    try:
        with psycopg.connect(CONNINFO, autocommit=True) as conn:
            ops, rolled = prepare(conn, base)
            kills, codes = run_senders(conn, log)
            bad = check(conn, ops, rolled, kills, codes)
            stats = conn.execute("SELECT state, count(*), sum(attempts) FROM idempotency.outbox GROUP BY 1 ORDER BY 1"
                                 ).fetchall()
            faults = conn.execute("SELECT fault, count(*) FROM seen WHERE fault IS NOT NULL GROUP BY 1 ORDER BY 1"
                                  ).fetchall()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(20)
        log.close()
    print(f"operations by state (count, attempts): {stats}")
    print(f"faults injected: {faults}; senders killed: {kills}; exit codes on SIGTERM: {codes}")
    for b in bad:
        print(f"FAILED: {b}")
    print(f"RESULT {'ok' if not bad else 'FAILED'}: {len(ops)} operations, {len(rolled)} rolled back, "
          f"{len(bad)} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
