"""A keyed request through the ASGI middleware (Starlette) against a
database reached through PgBouncer in transaction pooling mode, for
test/t/057_pgbouncer.pl: the first request executes, its retry replays.

    python3 client.py CONNINFO    (IDEM_CLIENTS_DIR: the project's clients/)

The pool's connections prepare no statement on the server
(prepare_threshold=None): behind a PgBouncer older than 1.21 a statement
psycopg prepared on one server connection is missing on the next.
Prints "first STATUS BODY", "retry STATUS BODY" and "runs N"."""
import asyncio
import os
import sys

sys.path.insert(0, os.path.join(os.environ["IDEM_CLIENTS_DIR"], "python"))

import httpx  # noqa: E402
from psycopg_pool import AsyncConnectionPool  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from idempotency_asgi import IdempotencyMiddleware, claim  # noqa: E402


async def main(conninfo: str) -> None:
    runs = 0
    pool = AsyncConnectionPool(conninfo, min_size=1, max_size=2, open=False,
                               kwargs={"prepare_threshold": None})

    async def order(request: Request) -> JSONResponse:
        nonlocal runs
        ctx = await claim(request)
        runs += 1
        body = await request.json()
        cur = await ctx.conn.execute("INSERT INTO orders (amount) VALUES (%s) RETURNING id", (body["amount"],))
        row = await cur.fetchone()
        return JSONResponse({"id": row[0] if row else None}, status_code=201)

    app = Starlette(routes=[Route("/v1/orders", order, methods=["POST"])])
    app.add_middleware(IdempotencyMiddleware, pool=pool, tenant="acme")
    async with pool:
        async with httpx.AsyncClient(app=app, base_url="http://test") as client:
            for label in ("first", "retry"):
                r = await client.post("/v1/orders", json={"amount": 7}, headers={"Idempotency-Key": "py-1"})
                print(label, r.status_code, r.text, flush=True)
    print("runs", runs)


asyncio.run(main(sys.argv[1]))
