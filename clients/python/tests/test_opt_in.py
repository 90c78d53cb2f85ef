"""Routes opt in (the default; IdempotencyMiddleware(opt_in=False) is
deprecated): FastAPI routes with the dependency idempotency, Starlette
endpoints with claim(request).  The endpoint is the route template the
request matched, behind the templates of the mounts it went through
(parameters included); a route that does not opt in takes no connection and
is never refused for its key or its body.  Needs IDEM_TEST_PGPORT
(clients/test.sh sets it); skipped without it."""

import uuid
import warnings
from typing import Any, Dict

import httpx
from fastapi import Depends, FastAPI
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from idempotency_asgi import Context, IdempotencyMiddleware, claim, idempotency

from .support import DEAD_CONNINFO, DatabaseCase, needs_db, new_pool


def build(pool: AsyncConnectionPool, runs: Dict[str, int], **options: Any) -> FastAPI:
    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, pool=pool, tenant="t", **options)

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

    # a sub-application mounted at a path with a parameter
    accounts = FastAPI()

    @accounts.post("/charges")
    async def charge(ctx: Context = Depends(idempotency)) -> Dict[str, Any]:
        runs[str(ctx.key)] = runs.get(str(ctx.key), 0) + 1
        return {"endpoint": ctx.endpoint}

    app.mount("/accounts/{acct}", accounts)

    # plain Starlette, mounted: claim(request) without naming the endpoint
    async def refund(request: Request) -> JSONResponse:
        ctx = await claim(request)
        return JSONResponse({"endpoint": ctx.endpoint})

    app.mount("/legacy", Starlette(routes=[Mount("/shops/{shop}", routes=[Route("/refunds/{rid:int}", refund,
                                                                                 methods=["POST"])])]))
    return app


@needs_db
class OptIn(DatabaseCase):
    with_admin = False

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.runs: Dict[str, int] = {}
        self.client = httpx.AsyncClient(app=build(self.pool, self.runs), base_url="http://test")

    async def asyncTearDown(self) -> None:
        await self.client.aclose()
        await super().asyncTearDown()

    def key(self) -> str:
        return f"py-{uuid.uuid4().hex}"

    async def test_route_template_and_replay(self) -> None:
        key = self.key()
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
        r = await self.client.post("/v2/orders/o9", json={}, headers={"Idempotency-Key": self.key()})
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.json()["endpoint"], "POST /v2/orders/{oid}")

    async def test_mounted_at_a_path_with_a_parameter(self) -> None:
        # one endpoint for every account: the same key on another account is a mismatch
        key = self.key()
        r1 = await self.client.post("/accounts/a1/charges", json={}, headers={"Idempotency-Key": key})
        self.assertEqual(r1.status_code, 200)
        self.assertEqual(r1.json()["endpoint"], "POST /accounts/{acct}/charges")
        # a replay out of a mounted FastAPI application (its own error middleware sees the claim's answer)
        r = await self.client.post("/accounts/a1/charges", json={}, headers={"Idempotency-Key": key})
        self.assertEqual((r.status_code, r.headers.get("idempotent-replayed"), r.content), (200, "true", r1.content))
        r2 = await self.client.post("/accounts/a2/charges", json={}, headers={"Idempotency-Key": key})
        self.assertEqual(r2.status_code, 400)
        self.assertEqual(r2.json()["error"]["code"], "idempotency_key_reuse")
        self.assertEqual(self.runs[key], 1)

    async def test_starlette_mounts_without_naming_the_endpoint(self) -> None:
        r = await self.client.post("/legacy/shops/s1/refunds/7", json={}, headers={"Idempotency-Key": self.key()})
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.json()["endpoint"], "POST /legacy/shops/{shop}/refunds/{rid}")

    async def test_route_without_opt_in_takes_no_connection(self) -> None:
        dead = new_pool(1, DEAD_CONNINFO, min_size=0, timeout=1)
        await dead.open()
        try:
            async with httpx.AsyncClient(app=build(dead, {}, required=True, limit=100, retries=0), base_url="http://test") as c:
                r = await c.post("/v1/search", json={}, headers={"Idempotency-Key": self.key()})
                self.assertEqual(r.status_code, 200)
                self.assertEqual(r.json(), {"results": []})
                # nor refused for its key (missing with required, malformed) or its body (above limit)
                for h in ({}, {"Idempotency-Key": "a b c"}, {"Idempotency-Key": '"unterminated'}):
                    r = await c.post("/v1/search", json={}, headers=h)
                    self.assertEqual(r.status_code, 200, h)
                r = await c.post("/v1/search", json={"pad": "x" * 500}, headers={"Idempotency-Key": self.key()})
                self.assertEqual(r.status_code, 200)
                # a route that opts in is refused, and only then needs the database
                r = await c.post("/v1/orders/o1/capture", json={})
                self.assertEqual(r.status_code, 400)
                r = await c.post("/v1/orders/o1/capture", json={}, headers={"Idempotency-Key": self.key()})
                self.assertEqual(r.status_code, 503)
            self.assertEqual(dead.get_stats().get("requests_num", 0), 1)
        finally:
            await dead.close()

    async def test_opt_in_false_is_deprecated_and_resolves_mounts(self) -> None:
        runs: Dict[str, int] = {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with self.assertLogs("idempotency_asgi", level="WARNING"):
                IdempotencyMiddleware(build(self.pool, runs), pool=self.pool, tenant="t", opt_in=False)
        self.assertTrue(any(issubclass(w.category, DeprecationWarning) and "opt_in=False" in str(w.message)
                            for w in caught), [str(w.message) for w in caught])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            async with httpx.AsyncClient(app=build(self.pool, runs, opt_in=False), base_url="http://test") as c:
                key = self.key()
                r = await c.post("/accounts/a1/charges", json={}, headers={"Idempotency-Key": key})
                self.assertEqual(r.status_code, 200)
                self.assertEqual(r.json()["endpoint"], "POST /accounts/{acct}/charges")
                r = await c.post("/v2/orders/o1", json={}, headers={"Idempotency-Key": key})
                self.assertEqual(r.json()["endpoint"], "POST /v2/orders/{oid}")

    def test_default_deadline(self) -> None:
        m = IdempotencyMiddleware(build(self.pool, {}), pool=self.pool, tenant="t")
        self.assertEqual(m.deadline, 60.0)
        self.assertIsNone(IdempotencyMiddleware(build(self.pool, {}), pool=self.pool, tenant="t", deadline=0).deadline)
        with self.assertRaises(ValueError):
            IdempotencyMiddleware(build(self.pool, {}), pool=self.pool, tenant="t", deadline=-1)
