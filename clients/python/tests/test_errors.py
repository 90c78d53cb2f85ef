"""What a developer sees when something is wrong: intervals as PostgreSQL
reads them, options it cannot read, a response above the size cap, a
database that cannot be reached, a 5xx in lease mode; each answered in the
profile's format with a stable code and logged with the fix.  Needs
IDEM_TEST_PGPORT (clients/test.sh sets it); skipped without it."""

import logging
import uuid
from typing import Any, Dict, List, Optional

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from idempotency_asgi import IdempotencyMiddleware, idempotency

from .support import DEAD_CONNINFO, DatabaseCase, needs_db, new_pool


@needs_db
class Errors(DatabaseCase):
    pool_size = 5
    setup_sql = ("CREATE TABLE IF NOT EXISTS err_charges (idem_key text)",)

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        for e in ("POST /big", "POST /ietf-big"):
            await self.admin.execute("INSERT INTO idempotency.endpoints (endpoint, max_response_bytes) "
                                     "VALUES (%s, 200) ON CONFLICT DO NOTHING", (e,))
        self.logged: List[str] = []
        self.runs: Dict[str, int] = {}
        self.clients: List[httpx.AsyncClient] = []

    async def asyncTearDown(self) -> None:
        for c in self.clients:
            await c.aclose()
        await super().asyncTearDown()

    def log(self, message: str, err: Optional[BaseException] = None) -> None:
        self.logged.append(f"{message} {err or ''}")

    def client(self, answer: Any = None, pool: Any = None, **options: Any) -> httpx.AsyncClient:
        app = FastAPI()
        app.add_middleware(IdempotencyMiddleware, **{"pool": pool or self.pool, "tenant": "t", "log": self.log,
                                                     **options})

        async def handler(request: Request) -> Any:
            ctx = request.state.idempotency
            self.runs[ctx.key] = self.runs.get(ctx.key, 0) + 1
            await ctx.conn.execute("INSERT INTO err_charges (idem_key) VALUES (%s)", (ctx.key,))
            return answer(self.runs[ctx.key]) if answer else {"ok": True}

        for path in ("/x", "/big", "/ietf-big"):
            app.post(path, dependencies=[Depends(idempotency)])(handler)
        c = httpx.AsyncClient(app=app, base_url="http://test")
        self.clients.append(c)
        return c

    async def count(self, key: str) -> int:
        cur = await self.admin.execute("SELECT count(*) FROM err_charges WHERE idem_key = %s", (key,))
        row = await cur.fetchone()
        return int(row[0]) if row else -1

    async def test_ttl_as_postgresql_reads_it(self) -> None:
        for ttl in ("24 hours", "1 day", "P1D", "24h", 86400):
            key = f"py-{uuid.uuid4().hex}"
            r = await self.client(ttl=ttl).post("/x", json={"a": 1}, headers={"Idempotency-Key": key})
            self.assertEqual(r.status_code, 200, ttl)
            cur = await self.admin.execute("SELECT extract(epoch FROM expires_at - created_at)::int "
                                           "FROM idempotency.keys WHERE key = %s", (key,))
            row = await cur.fetchone()
            self.assertEqual(row[0] if row else None, 86400, ttl)

    async def test_interval_postgresql_cannot_read(self) -> None:
        # one the middleware's own look lets by ('tomorrow' is refused when it is built)
        key = f"py-{uuid.uuid4().hex}"
        r = await self.client(ttl="1 hour 1 hour").post("/x", json={"a": 1}, headers={"Idempotency-Key": key})
        self.assertEqual(r.status_code, 500)
        self.assertEqual(r.json()["error"]["code"], "idempotency_not_configured")
        self.assertTrue(any("idempotency_not_configured: the options ttl, lease and wait" in m for m in self.logged))
        self.assertEqual(await self.count(key), 0)

    async def test_response_too_large(self) -> None:
        big = lambda n: {"pad": "x" * 500}  # noqa: E731
        key = f"py-{uuid.uuid4().hex}"
        r = await self.client(answer=big).post("/big", json={"a": 1}, headers={"Idempotency-Key": key})
        self.assertEqual(r.status_code, 500)
        self.assertEqual(r.json()["error"]["code"], "response_too_large")
        self.assertEqual(await self.count(key), 0)
        self.assertTrue(any(m.startswith("response_too_large: ") and "max_response_bytes" in m for m in self.logged))
        r = await self.client(answer=big, profile="ietf").post("/ietf-big", json={"a": 1},
                                                              headers={"Idempotency-Key": f"py-{uuid.uuid4().hex}"})
        self.assertEqual(r.status_code, 500)
        self.assertEqual(r.headers["content-type"], "application/problem+json")
        self.assertEqual(r.json()["code"], "response_too_large")

    async def test_database_unavailable(self) -> None:
        dead = new_pool(1, DEAD_CONNINFO, min_size=0, timeout=2)
        await dead.open()
        try:
            r = await self.client(pool=dead, retries=1).post("/x", json={"a": 1},
                                                              headers={"Idempotency-Key": f"py-{uuid.uuid4().hex}"})
        finally:
            await dead.close()
        self.assertEqual(r.status_code, 503)
        self.assertEqual(r.headers["retry-after"], "1")
        self.assertEqual(r.json()["error"]["code"], "database_unavailable")
        self.assertTrue(any(m.startswith("database_unavailable: ") for m in self.logged))

    async def test_lease_5xx_gives_the_key_back(self) -> None:
        key = f"py-{uuid.uuid4().hex}"

        def answer(n: int) -> Any:
            return JSONResponse({"down": True}, status_code=503) if n == 1 else {"n": n}
        c = self.client(answer=answer, lease="10 seconds")
        self.assertEqual((await c.post("/x", json={"a": 1}, headers={"Idempotency-Key": key})).status_code, 503)
        r = await c.post("/x", json={"a": 1}, headers={"Idempotency-Key": key})
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.json(), {"n": 2})
        self.assertEqual(await self.count(key), 1)
        cur = await self.admin.execute("SELECT state FROM idempotency.keys WHERE key = %s", (key,))
        row = await cur.fetchone()
        self.assertEqual(row[0] if row else None, "completed")

    async def test_default_log_is_the_logging_module(self) -> None:
        dead = new_pool(1, DEAD_CONNINFO, min_size=0, timeout=1)
        await dead.open()
        app = FastAPI()
        app.add_middleware(IdempotencyMiddleware, pool=dead, tenant="t", retries=0)
        app.post("/x", dependencies=[Depends(idempotency)])(lambda: {})
        try:
            with self.assertLogs("idempotency_asgi", level=logging.ERROR) as logs:
                async with httpx.AsyncClient(app=app, base_url="http://test") as c:
                    r = await c.post("/x", headers={"Idempotency-Key": f"py-{uuid.uuid4().hex}"})
        finally:
            await dead.close()
        self.assertEqual(r.status_code, 503)
        self.assertTrue(any("database_unavailable" in line for line in logs.output), logs.output)
