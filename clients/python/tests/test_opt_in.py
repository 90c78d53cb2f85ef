"""Routes that opt in (IdempotencyMiddleware(opt_in=True) and the FastAPI
dependency idempotency): the endpoint is the route template FastAPI
matched, behind a mounted sub-application's path; a route that does not
opt in takes no connection.  Needs IDEM_TEST_PGPORT (clients/test.sh sets
it); skipped without it."""

import os
import unittest
import uuid
from typing import Any, Dict

import httpx
import psycopg
from fastapi import Depends, FastAPI
from psycopg_pool import AsyncConnectionPool

from idempotency_asgi import Context, IdempotencyMiddleware, idempotency

CONNINFO = psycopg.conninfo.make_conninfo(
    host=os.environ.get("IDEM_TEST_PGHOST", "127.0.0.1"), port=os.environ.get("IDEM_TEST_PGPORT"),
    user=os.environ.get("IDEM_TEST_PGUSER"), dbname=os.environ.get("IDEM_TEST_PGDATABASE"))


def build(pool: AsyncConnectionPool, runs: Dict[str, int]) -> FastAPI:
    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, pool=pool, tenant="t", opt_in=True)

    @app.post("/v1/orders/{oid}/capture")
    async def capture(oid: str, ctx: Context = Depends(idempotency)) -> Dict[str, Any]:
        runs[str(ctx.key)] = runs.get(str(ctx.key), 0) + 1
        await ctx.conn.execute("SELECT 1")
        return {"endpoint": ctx.endpoint, "run": runs[str(ctx.key)]}

    @app.post("/v1/search")
    async def search() -> Dict[str, Any]:
        return {"results": []}

    sub = FastAPI()

    @sub.post("/orders/{oid}")
    async def sub_order(oid: str, ctx: Context = Depends(idempotency)) -> Dict[str, Any]:
        return {"endpoint": ctx.endpoint}

    app.mount("/v2", sub)
    return app


@unittest.skipUnless(os.environ.get("IDEM_TEST_PGPORT"), "IDEM_TEST_PGPORT not set")
class OptIn(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.pool = AsyncConnectionPool(CONNINFO, min_size=1, max_size=4, open=False)
        await self.pool.open()
        self.runs: Dict[str, int] = {}
        self.client = httpx.AsyncClient(app=build(self.pool, self.runs), base_url="http://test")

    async def asyncTearDown(self) -> None:
        await self.client.aclose()
        await self.pool.close()

    async def test_route_template_and_replay(self) -> None:
        key = f"py-{uuid.uuid4().hex}"
        r1 = await self.client.post("/v1/orders/o1/capture", json={"a": 1}, headers={"Idempotency-Key": key})
        self.assertEqual(r1.status_code, 200)
        self.assertEqual(r1.json()["endpoint"], "POST /v1/orders/{oid}/capture")
        r2 = await self.client.post("/v1/orders/o1/capture", json={"a": 1}, headers={"Idempotency-Key": key})
        self.assertEqual(r2.headers.get("idempotent-replayed"), "true")
        self.assertEqual(r2.content, r1.content)
        r3 = await self.client.post("/v1/orders/o2/capture", json={"a": 1}, headers={"Idempotency-Key": key})
        self.assertEqual(r3.status_code, 400)  # one endpoint: the other order's path is a mismatch
        self.assertEqual(self.runs[key], 1)

    async def test_mounted_sub_application(self) -> None:
        r = await self.client.post("/v2/orders/o9", json={}, headers={"Idempotency-Key": f"py-{uuid.uuid4().hex}"})
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.json()["endpoint"], "POST /v2/orders/{oid}")

    async def test_route_without_opt_in_takes_no_connection(self) -> None:
        dead = AsyncConnectionPool(CONNINFO + " port=1", min_size=0, max_size=1, timeout=1, open=False)
        await dead.open()
        try:
            async with httpx.AsyncClient(app=build(dead, {}), base_url="http://test") as c:
                r = await c.post("/v1/search", json={}, headers={"Idempotency-Key": f"py-{uuid.uuid4().hex}"})
                self.assertEqual(r.status_code, 200)
                self.assertEqual(r.json(), {"results": []})
                r = await c.post("/v1/orders/o1/capture", json={},
                                 headers={"Idempotency-Key": f"py-{uuid.uuid4().hex}"})
                self.assertEqual(r.status_code, 503)
        finally:
            await dead.close()
