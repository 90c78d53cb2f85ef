"""Every answer of the middleware carries a code (Stripe's error.code, the
problem's code), and each problem its own type URI; the options are checked
when the middleware is built (an interval PostgreSQL cannot read is
refused there, not at every request); a pool never opened is a
configuration error (500 idempotency_not_configured, logged with the fix),
not a 503.  Needs no database."""

import unittest
import uuid
from typing import Any, Dict, List, Optional

import httpx
from fastapi import Depends, FastAPI
from psycopg_pool import AsyncConnectionPool

from idempotency_asgi import Context, IdempotencyMiddleware, answer, idempotency
from idempotency_asgi import profiles
from idempotency_asgi.profiles import OUTCOMES

PROBLEM_TYPE_BASE = getattr(profiles, "PROBLEM_TYPE_BASE", "(none)")


def build(pool: AsyncConnectionPool, **options: Any) -> FastAPI:
    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, pool=pool, tenant="t", **options)

    @app.post("/v1/orders")
    async def create(ctx: Context = Depends(idempotency)) -> Dict[str, Any]:
        return {"key": ctx.key}

    return app


class Answers(unittest.IsolatedAsyncioTestCase):
    def test_every_outcome_has_a_code_and_its_own_type(self) -> None:
        types = set()
        for outcome in OUTCOMES:
            _, _, stripe = answer("stripe", outcome)
            self.assertTrue(stripe["error"].get("code"), outcome)
            _, _, problem = answer("ietf", outcome)
            self.assertEqual(problem["code"], stripe["error"]["code"], outcome)
            self.assertEqual(problem["type"], PROBLEM_TYPE_BASE + problem["code"])
            types.add(problem["type"])
        self.assertEqual(len(types), len(OUTCOMES))
        # a code named by the caller: the problem's type follows it
        _, _, p = answer("ietf", "unavailable", code="handler_timeout")
        self.assertEqual((p["code"], p["type"]), ("handler_timeout", PROBLEM_TYPE_BASE + "handler_timeout"))
        _, _, p = answer("ietf", "key_missing", type_base="https://api.example.com/problems/")
        self.assertEqual(p["type"], "https://api.example.com/problems/idempotency_key_missing")

    async def test_refusals_carry_a_code(self) -> None:
        pool = AsyncConnectionPool("", open=False)  # never used: refused before the claim
        for profile in ("stripe", "ietf"):
            app = build(pool, profile=profile, required=True, limit=10)
            async with httpx.AsyncClient(app=app, base_url="http://test") as c:
                cases = [({}, {}, "idempotency_key_missing"),
                         ({"Idempotency-Key": "a b"}, {}, "idempotency_key_invalid"),
                         ({"Idempotency-Key": "k1"}, {"pad": "x" * 50}, "request_body_too_large")]
                for headers, body, code in cases:
                    r = await c.post("/v1/orders", json=body, headers=headers)
                    self.assertEqual(r.status_code, 400, (profile, code))
                    got = r.json()["error"]["code"] if profile == "stripe" else r.json()["code"]
                    self.assertEqual(got, code, profile)
                r = await c.post("/v1/orders", content=b"{not json", headers={"Idempotency-Key": "k2",
                                                                            "Content-Type": "application/json"})
                self.assertEqual(r.status_code, 400)
                got = r.json()["error"]["code"] if profile == "stripe" else r.json()["code"]
                self.assertEqual(got, "request_body_invalid")

    def test_intervals_checked_when_built(self) -> None:
        pool = AsyncConnectionPool("", open=False)
        for name in ("ttl", "lease", "wait"):
            for bad in ("soon", "thirty seconds", "", "1 fortnight"):
                with self.assertRaises(ValueError, msg=(name, bad)) as cm:
                    IdempotencyMiddleware(build(pool), pool=pool, tenant="t", **{name: bad})
                self.assertIn(name, str(cm.exception))
        for good in ("30 seconds", "30s", "500 ms", "1 day", "P1D", "PT30S", "24h", "1 day 02:00:00", "1.5 hours",
                     "2 mins", "1 week", 30, 0.5):
            IdempotencyMiddleware(build(pool), pool=pool, tenant="t", ttl=good, lease=good, wait=good)

    async def test_pool_never_opened_is_a_configuration_error(self) -> None:
        pool = AsyncConnectionPool("", open=False)
        lines: List[str] = []

        def log(message: str, err: Optional[BaseException] = None) -> None:
            lines.append(message)

        app = build(pool, profile="ietf", retries=3, log=log)
        async with httpx.AsyncClient(app=app, base_url="http://test") as c:
            r = await c.post("/v1/orders", json={}, headers={"Idempotency-Key": f"py-{uuid.uuid4().hex}"})
        self.assertEqual(r.status_code, 500, r.text)
        self.assertEqual(r.json()["code"], "idempotency_not_configured")
        self.assertTrue(any(m.startswith("idempotency_not_configured: ") and "never opened" in m for m in lines),
                        lines)


if __name__ == "__main__":
    unittest.main()
