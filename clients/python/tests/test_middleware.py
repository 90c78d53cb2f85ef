"""The middleware against the extension: a FastAPI app driven in-process by
httpx, the outcome read back from the database.  Needs IDEM_TEST_PGPORT
(clients/test.sh sets it); skipped without it."""

import asyncio
import unittest
import uuid

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from idempotency_asgi import IdempotencyMiddleware, idempotency

from .support import DatabaseCase, needs_db, open_pool


def build_app(pool, hooks, runs, admin, **options):
    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, **{"pool": pool, "tenant": lambda scope: "acme", "wait": "10 seconds",
                                                 **options})

    async def handler(request: Request):
        key = request.headers.get("idempotency-key", f"none-{uuid.uuid4()}")
        runs[key] = runs.get(key, 0) + 1
        ctx = request.state.idempotency
        form = request.headers.get("content-type", "").startswith("application/x-www-form")
        body = dict(await request.form()) if form else await request.json()
        cid = f"ch_{runs[key]}_{key}"[:60]
        await ctx.conn.execute("INSERT INTO charges (id, idem_key, amount) VALUES (%s, %s, %s)",
                               (cid, ctx.key, int(body.get("amount", 0))))
        if key in hooks:
            r = await hooks[key](request, runs[key])
            if r is not None:
                return r
        return JSONResponse({"id": cid, "amount": int(body.get("amount", 0))}, headers={"Request-Id": f"req_{runs[key]}"})

    # the routes opt in with the dependency: the claim is made before the handler runs
    for path in ("/v1/charges", "/v1/charges/{cid}/capture", "/v1/policy", "/v1/expiring"):
        app.post(path, dependencies=[Depends(idempotency)])(handler)
    return app


@needs_db
class Middleware(DatabaseCase):
    pool_size = 10
    setup_sql = ("CREATE TABLE IF NOT EXISTS charges (id text PRIMARY KEY, idem_key text, amount int)",)

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.hooks, self.runs = {}, {}
        self.clients = {}

    async def asyncTearDown(self):
        for c in self.clients.values():
            await c.aclose()
        await super().asyncTearDown()

    def client(self, **options):
        name = repr(sorted(options.items()))
        if name not in self.clients:
            app = build_app(self.pool, self.hooks, self.runs, self.admin, **options)
            self.clients[name] = httpx.AsyncClient(app=app, base_url="http://test")
        return self.clients[name]

    async def rows(self, key):
        cur = await self.admin.execute("SELECT id FROM charges WHERE idem_key = %s ORDER BY id", (key,))
        return [r[0] for r in await cur.fetchall()]

    def key(self):
        # unique across tests: each test is a new instance, which may get the
        # address of the one before it, and the database keeps their keys
        return f"py-{uuid.uuid4().hex}"

    async def test_execute_then_replay(self):
        c, key = self.client(exclude=["/metadata/request_ts"]), self.key()
        r1 = await c.post("/v1/charges", json={"amount": 1000}, headers={"Idempotency-Key": key})
        self.assertEqual(r1.status_code, 200)
        self.assertIsNone(r1.headers.get("idempotent-replayed"))
        r2 = await c.post("/v1/charges", content=b'{ "amount" : 1000.0 }',
                          headers={"Idempotency-Key": key, "Content-Type": "application/json"})
        self.assertEqual(r2.status_code, 200)
        self.assertEqual(r2.content, r1.content)
        self.assertEqual(r2.headers["idempotent-replayed"], "true")
        self.assertEqual(r2.headers["request-id"], "req_1")
        self.assertEqual(await self.rows(key), [r1.json()["id"]])

    async def test_mismatch_per_profile(self):
        key = self.key()
        c = self.client()
        self.assertEqual((await c.post("/v1/charges", json={"amount": 1}, headers={"Idempotency-Key": key})).status_code, 200)
        r = await c.post("/v1/charges", json={"amount": 2}, headers={"Idempotency-Key": key})
        self.assertEqual(r.status_code, 400)
        self.assertEqual(r.json()["error"]["type"], "idempotency_error")
        # mismatch diagnostics: the member that differs is named, its values never
        self.assertEqual(r.json()["error"]["mismatch"]["changed"], ["/amount"])
        self.assertIn("changed: /amount", r.json()["error"]["message"])
        self.assertNotRegex(r.text, r'"amount":|: ?[12][,}]')
        ci, k2 = self.client(profile="ietf"), self.key()
        self.assertEqual((await ci.post("/v1/charges", json={"amount": 1, "note": "a"},
                                        headers={"Idempotency-Key": f'"{k2}"'})).status_code, 200)
        r = await ci.post("/v1/charges", json={"amount": 1, "items": [1]}, headers={"Idempotency-Key": k2})
        self.assertEqual(r.status_code, 422)
        self.assertEqual(r.headers["content-type"], "application/problem+json")
        self.assertEqual(r.json()["mismatch"]["added"], ["/items"])
        self.assertEqual(r.json()["mismatch"]["removed"], ["/note"])
        self.assertEqual(self.runs[key], 1)

    async def test_form_bodies_and_exclusions(self):
        c, key = self.client(exclude=["/metadata/request_ts"]), self.key()
        h = {"Idempotency-Key": key, "Content-Type": "application/x-www-form-urlencoded"}
        self.assertEqual((await c.post("/v1/charges", content=b"amount=500&currency=usd&metadata[request_ts]=1", headers=h)).status_code, 200)
        r = await c.post("/v1/charges", content=b"currency=usd&metadata[request_ts]=2&amount=500", headers=h)
        self.assertEqual(r.headers.get("idempotent-replayed"), "true")
        r = await c.post("/v1/charges", content=b"amount=501&currency=usd&metadata[request_ts]=1", headers=h)
        self.assertEqual(r.status_code, 400)
        self.assertEqual(self.runs[key], 1)

    async def test_endpoint_policy_lease_without_the_option(self):
        await self.admin.execute("INSERT INTO idempotency.endpoints (endpoint, lease) "
                                 "VALUES ('POST /v1/policy', '30 seconds') ON CONFLICT DO NOTHING")
        c, key = self.client(), self.key()
        self.assertEqual((await c.post("/v1/policy", json={"amount": 11}, headers={"Idempotency-Key": key})).status_code, 200)
        r = await c.post("/v1/policy", json={"amount": 11}, headers={"Idempotency-Key": key})
        self.assertEqual(r.headers.get("idempotent-replayed"), "true")
        self.assertEqual(self.runs[key], 1)

    async def test_body_refused_by_fingerprint_is_400(self):
        c, key = self.client(), self.key()
        r = await c.post("/v1/charges", content=b'{"amount": 1e400}',
                         headers={"Idempotency-Key": key, "Content-Type": "application/json"})
        self.assertEqual(r.status_code, 400)
        self.assertEqual(r.json()["error"]["type"], "invalid_request_error")
        self.assertNotIn(key, self.runs)

    async def test_lease_claim_refused_leaves_the_connection_transactional(self):
        # one pooled connection: the lease claim fails in autocommit, the next request is atomic
        await self.pool.close()
        self.pool = await open_pool(1)
        lease, atomic = self.client(lease="5 seconds", exclude=["/x"]), self.client(exclude=["/y"])
        r = await lease.post("/v1/charges", content=b'{"amount": 1e400}',
                             headers={"Idempotency-Key": self.key(), "Content-Type": "application/json"})
        self.assertEqual(r.status_code, 400)
        key = self.key()
        r = await atomic.post("/v1/charges", json={"amount": 2}, headers={"Idempotency-Key": key})
        self.assertEqual(r.status_code, 200)
        r = await atomic.post("/v1/charges", json={"amount": 2}, headers={"Idempotency-Key": key})
        self.assertEqual(r.headers.get("idempotent-replayed"), "true")

    async def test_route_template_and_concrete_path(self):
        c, key = self.client(), self.key()
        h = {"Idempotency-Key": key}
        self.assertEqual((await c.post("/v1/charges/ch_1/capture", json={"amount": 1}, headers=h)).status_code, 200)
        self.assertEqual((await c.post("/v1/charges/ch_2/capture", json={"amount": 1}, headers=h)).status_code, 400)
        cur = await self.admin.execute(
            "SELECT state FROM idempotency.idem_lookup('acme', 'POST /v1/charges/{cid}/capture', %s)", (key,))
        self.assertEqual((await cur.fetchone())[0], "completed")

    async def test_duplicate_waits_or_conflicts(self):
        for options, expect in (({}, 200), ({"wait": "0 s"}, 409)):
            c, key = self.client(**options), self.key()
            gate, started = asyncio.Event(), asyncio.Event()

            async def hold(request, run):
                started.set()
                await gate.wait()
            self.hooks[key] = hold
            h = {"Idempotency-Key": key}
            first = asyncio.ensure_future(c.post("/v1/charges", json={"amount": 7}, headers=h))
            await started.wait()
            second = asyncio.ensure_future(c.post("/v1/charges", json={"amount": 7}, headers=h))
            if expect == 409:
                r = await second
                self.assertEqual(r.status_code, 409)
                self.assertGreaterEqual(int(r.headers["retry-after"]), 1)
                self.assertEqual(r.headers["stripe-should-retry"], "true")
                gate.set()
                self.assertEqual((await first).status_code, 200)
            else:
                asyncio.get_running_loop().call_later(0.2, gate.set)
                a, b = await first, await second
                self.assertEqual((a.status_code, b.status_code), (200, 200))
                self.assertEqual(b.headers["idempotent-replayed"], "true")
                self.assertEqual(a.content, b.content)
            self.assertEqual(self.runs[key], 1)
            self.assertEqual(len(await self.rows(key)), 1)

    async def test_handler_error_releases_the_key(self):
        c, key = self.client(), self.key()

        async def boom(request, run):
            if run == 1:
                raise RuntimeError("boom")
        self.hooks[key] = boom
        with self.assertRaises(RuntimeError):
            await c.post("/v1/charges", json={"amount": 3}, headers={"Idempotency-Key": key})
        self.assertEqual(await self.rows(key), [])
        self.assertEqual((await c.post("/v1/charges", json={"amount": 3}, headers={"Idempotency-Key": key})).status_code, 200)
        self.assertEqual(len(await self.rows(key)), 1)

    async def test_5xx_not_stored_4xx_stored(self):
        c, key = self.client(), self.key()

        async def answer(request, run):
            return JSONResponse({"error": "x"}, status_code=502 if run == 1 else 402)
        self.hooks[key] = answer
        h = {"Idempotency-Key": key}
        self.assertEqual((await c.post("/v1/charges", json={"amount": 4}, headers=h)).status_code, 502)
        self.assertEqual(await self.rows(key), [])
        self.assertEqual((await c.post("/v1/charges", json={"amount": 4}, headers=h)).status_code, 402)
        r = await c.post("/v1/charges", json={"amount": 4}, headers=h)
        self.assertEqual((r.status_code, r.headers.get("idempotent-replayed")), (402, "true"))
        self.assertEqual(self.runs[key], 2)

    async def test_serialization_failure_and_deadlock_run_again(self):
        c = self.client()
        for code in ("40001", "40P01"):
            key = self.key()

            async def fail(request, run, code=code):
                if run == 1:
                    await request.state.idempotency.conn.execute(
                        f"DO $$BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{code}'; END$$")
            self.hooks[key] = fail
            r = await c.post("/v1/charges", json={"amount": 5}, headers={"Idempotency-Key": key})
            self.assertEqual(r.status_code, 200)
            self.assertEqual(self.runs[key], 2)
            self.assertEqual(await self.rows(key), [r.json()["id"]])

    async def test_expired_key_per_policy(self):
        # an expired key whose endpoint answers its reuse with a conflict: the
        # same request gets 409 key_expired, another one is refused as reused
        await self.admin.execute("INSERT INTO idempotency.endpoints (endpoint, on_expired_reuse) "
                                 "VALUES ('POST /v1/expiring', 'conflict') "
                                 "ON CONFLICT (endpoint) DO UPDATE SET on_expired_reuse = 'conflict'")
        c, key = self.client(ttl="1 second"), self.key()
        h = {"Idempotency-Key": key}
        self.assertEqual((await c.post("/v1/expiring", json={"amount": 12}, headers=h)).status_code, 200)
        await asyncio.sleep(1.2)
        r = await c.post("/v1/expiring", json={"amount": 12}, headers=h)
        self.assertEqual((r.status_code, r.json()["error"]["code"], r.headers["stripe-should-retry"]),
                         (409, "key_expired", "false"))
        r = await c.post("/v1/expiring", json={"amount": 13}, headers=h)
        self.assertEqual((r.status_code, r.json()["error"]["code"]), (400, "idempotency_key_reuse"))
        self.assertEqual(self.runs[key], 1)

    async def test_killed_backend_runs_again(self):
        c, key = self.client(), self.key()

        async def kill(request, run):
            if run == 1:
                conn = request.state.idempotency.conn
                await self.admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
                await conn.execute("SELECT 1")
        self.hooks[key] = kill
        r = await c.post("/v1/charges", json={"amount": 6}, headers={"Idempotency-Key": key})
        self.assertEqual(r.status_code, 200)
        self.assertEqual(self.runs[key], 2)
        self.assertEqual(len(await self.rows(key)), 1)

    async def test_keys_missing_refused_hashed(self):
        c = self.client()
        self.assertEqual((await c.post("/v1/charges", json={"amount": 1})).status_code, 200)
        r = await self.client(required=True).post("/v1/charges", json={"amount": 1})
        self.assertEqual(r.status_code, 400)
        self.assertEqual(r.json()["error"]["type"], "invalid_request_error")
        self.assertEqual((await c.post("/v1/charges", json={"amount": 1}, headers={"Idempotency-Key": "order:1"})).status_code, 400)
        ch, key = self.client(key_policy="hash"), f"order:{self.key()}"
        self.assertEqual((await ch.post("/v1/charges", json={"amount": 1}, headers={"Idempotency-Key": key})).status_code, 200)
        r = await ch.post("/v1/charges", json={"amount": 1}, headers={"Idempotency-Key": key})
        self.assertEqual((r.headers["idempotent-replayed"], r.headers["idempotency-key"]), ("true", key))
        self.assertEqual(self.runs[key], 1)

    async def test_lease_mode(self):
        c, key = self.client(lease="2 seconds", heartbeat=0.1), self.key()

        async def slow_then_fail(request, run):
            async def look():
                cur = await self.admin.execute(
                    "SELECT locked_until FROM idempotency.idem_lookup('acme', 'POST /v1/charges', %s)", (key,))
                return (await cur.fetchone())[0]
            first = await look()
            for _ in range(200):
                if await look() > first:
                    break
                await asyncio.sleep(0.05)
            self.assertGreater(await look(), first)
            raise RuntimeError("card network timed out")
        self.hooks[key] = slow_then_fail
        with self.assertRaises(RuntimeError):
            await c.post("/v1/charges", json={"amount": 8}, headers={"Idempotency-Key": key})
        cur = await self.admin.execute("SELECT state FROM idempotency.idem_lookup('acme', 'POST /v1/charges', %s)", (key,))
        self.assertEqual((await cur.fetchone())[0], "unknown")
        r = await c.post("/v1/charges", json={"amount": 8}, headers={"Idempotency-Key": key})
        self.assertEqual((r.status_code, r.headers["stripe-should-retry"]), (409, "false"))
        self.assertEqual(r.json()["error"]["code"], "outcome_pending")

        k2 = self.key()

        async def nothing_yet(request, run):
            if run == 1:
                request.state.idempotency.no_side_effect()
                raise RuntimeError("validation")
        self.hooks[k2] = nothing_yet
        with self.assertRaises(RuntimeError):
            await c.post("/v1/charges", json={"amount": 9}, headers={"Idempotency-Key": k2})
        self.assertEqual((await c.post("/v1/charges", json={"amount": 9}, headers={"Idempotency-Key": k2})).status_code, 200)
        r = await c.post("/v1/charges", json={"amount": 9}, headers={"Idempotency-Key": k2})
        self.assertEqual(r.headers["idempotent-replayed"], "true")
        self.assertEqual(self.runs[k2], 2)


if __name__ == "__main__":
    unittest.main()
