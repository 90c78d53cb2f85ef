"""Nothing is stored for an answer given before the handler began (Stripe's
rule: results are saved only once the endpoint began executing): FastAPI's
own RequestValidationError (it resolves the dependencies, the claim
included, before it reports the body's validation errors) releases the
claim, in atomic and in lease mode, so that the corrected request with the
same key executes; nor for a refusal of the middleware itself (before the
claim).  A keyed request that reaches a route that does not claim is
logged once per route.  Needs IDEM_TEST_PGPORT (clients/test.sh
sets it); skipped without it."""

import unittest
import uuid
from typing import Any, Dict, List

import httpx
from fastapi import Depends, FastAPI
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from idempotency_asgi import Context, IdempotencyMiddleware, idempotency

from .support import DatabaseCase, needs_db


class Order(BaseModel):
    amount: int
    currency: str


def build(pool: AsyncConnectionPool, runs: Dict[str, int], **options: Any) -> FastAPI:
    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, pool=pool, tenant="t", **options)

    @app.post("/v1/orders", status_code=201)
    async def create(order: Order, ctx: Context = Depends(idempotency)) -> Dict[str, Any]:
        runs[str(ctx.key)] = runs.get(str(ctx.key), 0) + 1
        return {"amount": order.amount, "run": runs[str(ctx.key)]}

    @app.post("/v1/items/{item_id}", dependencies=[Depends(idempotency)])
    async def item(item_id: int) -> Dict[str, Any]:
        runs[str(item_id)] = runs.get(str(item_id), 0) + 1
        return {"item": item_id}

    @app.post("/v1/search")
    async def search() -> Dict[str, Any]:
        return {"results": []}

    @app.post("/v1/quotes")
    async def quotes() -> Dict[str, Any]:
        return {"quotes": []}

    return app


@needs_db
class BeforeHandler(DatabaseCase):
    def key(self) -> str:
        return f"py-{uuid.uuid4().hex}"

    async def validation_error_then_corrected(self, **options: Any) -> None:
        runs: Dict[str, int] = {}
        async with httpx.AsyncClient(app=build(self.pool, runs, **options), base_url="http://test") as c:
            key = self.key()
            bad = await c.post("/v1/orders", json={"amount": "lots"}, headers={"Idempotency-Key": key})
            self.assertEqual(bad.status_code, 422)
            self.assertIn("detail", bad.json())  # FastAPI's own answer, not the middleware's
            self.assertIsNone(await self.key_state(key), "the validation error was stored under the key")
            # the same bad request again is validated again, not replayed
            again = await c.post("/v1/orders", json={"amount": "lots"}, headers={"Idempotency-Key": key})
            self.assertEqual(again.status_code, 422)
            self.assertIsNone(again.headers.get("idempotent-replayed"))
            # the corrected request with the same key executes, then replays
            good = await c.post("/v1/orders", json={"amount": 5, "currency": "EUR"}, headers={"Idempotency-Key": key})
            self.assertEqual(good.status_code, 201, good.text)
            self.assertEqual(good.json(), {"amount": 5, "run": 1})
            replay = await c.post("/v1/orders", json={"amount": 5, "currency": "EUR"},
                                  headers={"Idempotency-Key": key})
            self.assertEqual((replay.status_code, replay.headers.get("idempotent-replayed")), (201, "true"))
            self.assertEqual(runs[key], 1)
            self.assertEqual(await self.key_state(key), "completed")
            # a path parameter FastAPI refuses (not an int): not stored either
            key2 = self.key()
            r = await c.post("/v1/items/abc", json={}, headers={"Idempotency-Key": key2})
            self.assertEqual(r.status_code, 422)
            self.assertIsNone(await self.key_state(key2))

    async def test_validation_error_not_stored(self) -> None:
        await self.validation_error_then_corrected()

    async def test_validation_error_not_stored_lease_mode(self) -> None:
        await self.validation_error_then_corrected(lease="30 seconds")

    async def test_refusal_of_the_middleware_not_stored(self) -> None:
        # refused before the claim (a body above limit; a route without a body
        # parameter, whose malformed body the claim's fingerprint refuses)
        runs: Dict[str, int] = {}
        async with httpx.AsyncClient(app=build(self.pool, runs, limit=100), base_url="http://test") as c:
            key = self.key()
            r = await c.post("/v1/orders", json={"amount": 5, "currency": "x" * 200}, headers={"Idempotency-Key": key})
            self.assertEqual((r.status_code, r.json()["error"].get("code")), (400, "request_body_too_large"))
            self.assertIsNone(await self.key_state(key))
            r = await c.post("/v1/orders", json={"amount": 5, "currency": "EUR"}, headers={"Idempotency-Key": key})
            self.assertEqual((r.status_code, r.json()), (201, {"amount": 5, "run": 1}))
            key = self.key()
            r = await c.post("/v1/items/7", content=b"{not json", headers={"Idempotency-Key": key,
                                                                          "Content-Type": "application/json"})
            self.assertEqual(r.status_code, 400)
            self.assertIsNone(await self.key_state(key))
            r = await c.post("/v1/items/7", json={}, headers={"Idempotency-Key": key})
            self.assertEqual((r.status_code, r.json()), (200, {"item": 7}))

    async def test_route_without_claim_warns_once_per_route(self) -> None:
        lines: List[str] = []
        app = build(self.pool, {}, log=lambda message, err=None: lines.append(message))
        async with httpx.AsyncClient(app=app, base_url="http://test") as c:
            for _ in range(3):
                r = await c.post("/v1/search", json={}, headers={"Idempotency-Key": self.key()})
                self.assertEqual(r.status_code, 200)
            r = await c.post("/v1/search", json={})  # no key: nothing to warn about
            await c.post("/v1/quotes", json={}, headers={"Idempotency-Key": self.key()})
            await c.post("/v1/quotes", json={}, headers={"Idempotency-Key": self.key()})
            # a route that claims, refused by FastAPI before its handler: not a route without a claim
            await c.post("/v1/orders", json={"amount": "x"}, headers={"Idempotency-Key": self.key()})
            await c.post("/v1/nowhere", json={}, headers={"Idempotency-Key": self.key()})  # no route: 404
        warned = [m for m in lines if m.startswith("route_without_claim: ")]
        self.assertEqual(len(warned), 2, lines)
        self.assertIn("POST /v1/search", warned[0])
        self.assertIn("POST /v1/quotes", warned[1])

    async def test_route_without_claim_warns_through_logging_by_default(self) -> None:
        async with httpx.AsyncClient(app=build(self.pool, {}), base_url="http://test") as c:
            with self.assertLogs("idempotency_asgi", level="WARNING") as logs:
                await c.post("/v1/search", json={}, headers={"Idempotency-Key": self.key()})
                await c.post("/v1/search", json={}, headers={"Idempotency-Key": self.key()})
        self.assertEqual(len(logs.records), 1, logs.output)
        self.assertEqual(logs.records[0].levelname, "WARNING")


if __name__ == "__main__":
    unittest.main()
