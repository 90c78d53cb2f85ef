"""The end-to-end test's API: a small FastAPI app on the middleware (IETF
profile), which injects faults itself when FAULT_RATE > 0 and reports each
one on stdout ("FAULT kind") before injecting it."""

import asyncio
import itertools
import logging
import os
import random
import signal
import sys

import psycopg
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool

from idempotency_asgi import Context, IdempotencyMiddleware, idempotency

RATE = float(os.environ.get("FAULT_RATE", "0"))
KINDS = ["lost_response", "crash_before_commit", "slow_handler", "killed_backend", "serialization_failure"]
CONNINFO = psycopg.conninfo.make_conninfo(
    host=os.environ.get("IDEM_TEST_PGHOST", "127.0.0.1"), port=os.environ["IDEM_TEST_PGPORT"],
    user=os.environ["IDEM_TEST_PGUSER"], dbname=os.environ["IDEM_TEST_PGDATABASE"],
    # a frozen or killed instance must not hold a claim for ever
    options="-c idle_in_transaction_session_timeout=20s")
POOLS = {}
# killed backends are expected here: the pool's warnings about them are noise
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
SEQ = itertools.count(1)


def fault(kind):
    sys.stdout.write(f"FAULT {kind}\n")
    sys.stdout.flush()


api = FastAPI()
api.add_middleware(IdempotencyMiddleware, pool=lambda: POOLS["app"], tenant="acme", profile="ietf",
                   exclude=["/metadata/request_ts"], wait="5 seconds")


@api.on_event("startup")
async def open_pools():
    POOLS["app"] = AsyncConnectionPool(CONNINFO, min_size=2, max_size=30, open=False)
    POOLS["admin"] = AsyncConnectionPool(CONNINFO, min_size=1, max_size=2, open=False)
    await POOLS["app"].open()
    await POOLS["admin"].open()


# the route opts in: the dependency claims the key, the endpoint is its template
@api.post("/v1/orders")
async def create_order(request: Request, ctx: Context = Depends(idempotency)):
    body = await request.json()
    seq = next(SEQ)
    oid = f"ord_{ctx.key}_{os.getpid()}_{seq}"
    await ctx.conn.execute("INSERT INTO orders (id, idem_key, amount) VALUES (%s, %s, %s)", (oid, ctx.key, body["amount"]))
    f = request.scope.pop("fault", None)  # once per request, not on the middleware's own retries
    if f == "crash_before_commit":
        fault(f)
        os.kill(os.getpid(), signal.SIGKILL)
        await asyncio.sleep(10)
    if f == "slow_handler":
        fault(f)
        await asyncio.sleep(3)
    if f == "killed_backend":
        fault(f)
        async with POOLS["admin"].connection() as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (ctx.conn.info.backend_pid,))
        await ctx.conn.execute("SELECT 1")
    if f == "serialization_failure":
        fault(f)
        await ctx.conn.execute("DO $$BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END$$")
    return JSONResponse({"id": oid, "amount": body["amount"]}, status_code=201,
                        headers={"Request-Id": f"req_{os.getpid()}_{seq}"})


async def app(scope, receive, send):
    """Outside everything: decides the request's fault; a lost response is
    sent half and then the connection dropped, after the commit."""
    if scope["type"] == "http" and RATE > 0 and random.random() < RATE:
        scope["fault"] = random.choice(KINDS)
    if scope.get("fault") != "lost_response":
        return await api(scope, receive, send)

    async def lossy(message):
        if message["type"] == "http.response.body":
            fault("lost_response")
            body = message.get("body", b"")
            await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
            raise ConnectionAbortedError("injected lost response")
        await send(message)
    await api(scope, receive, lossy)
