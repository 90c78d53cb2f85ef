"""Smaller findings against a database: an sf-string key with parameters,
key policy 'hash' on the key's UTF-8 bytes, a stored header value outside
Latin-1 replayed.  Needs IDEM_TEST_PGPORT (clients/test.sh sets it)."""

import asyncio
import base64
import hashlib
import unittest
import uuid
from typing import Any, Dict

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from idempotency_asgi import IdempotencyMiddleware, idempotency

from .support import DatabaseCase, needs_db, new_pool


@needs_db
class Findings(DatabaseCase):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.runs: Dict[str, int] = {}
        app = FastAPI()
        app.add_middleware(IdempotencyMiddleware, pool=self.pool, tenant="t", key_policy="hash")

        @app.post("/k", dependencies=[Depends(idempotency)])
        async def k(request: Request) -> Any:
            key = request.state.idempotency.key
            self.runs[key] = self.runs.get(key, 0) + 1
            return JSONResponse({"key": key, "run": self.runs[key]})

        self.client = httpx.AsyncClient(app=app, base_url="http://test")

    async def asyncTearDown(self) -> None:
        await self.client.aclose()
        await super().asyncTearDown()

    async def test_sf_string_with_parameters(self) -> None:
        key = f"py-{uuid.uuid4().hex}"
        r1 = await self.client.post("/k", json={}, headers={"Idempotency-Key": f'"{key}";v=1'})
        self.assertEqual(r1.status_code, 200)
        self.assertEqual(r1.json()["key"], key)
        r2 = await self.client.post("/k", json={}, headers={"Idempotency-Key": key})
        self.assertEqual(r2.headers.get("idempotent-replayed"), "true")
        self.assertEqual(self.runs[key], 1)

    async def test_hash_of_utf8_bytes(self) -> None:
        key = f"clé-{uuid.uuid4().hex}"
        r = await self.client.post("/k", json={}, headers={b"Idempotency-Key": key.encode("utf-8")})
        self.assertEqual(r.status_code, 200)
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        self.assertEqual(r.json()["key"], "h_" + base64.urlsafe_b64encode(digest).decode().rstrip("="))
        bad = await self.client.post("/k", json={}, headers={b"Idempotency-Key": b"\xff\xfe"})
        self.assertEqual(bad.status_code, 400)

    async def test_stored_header_outside_latin1(self) -> None:
        key = f"py-{uuid.uuid4().hex}"
        r1 = await self.client.post("/k", json={}, headers={"Idempotency-Key": key})
        await self.admin.execute("UPDATE idempotency.keys SET response_headers = response_headers || "
                                 "'{\"x-note\": \"Zürich → 東京\"}' WHERE key = %s", (key,))
        r2 = await self.client.post("/k", json={}, headers={"Idempotency-Key": key})
        self.assertEqual(r2.status_code, 200)
        self.assertEqual(r2.content, r1.content)
        raw = dict(r2.headers.raw)
        self.assertEqual(raw[b"x-note"].decode("utf-8"), "Zürich → 東京")


@needs_db
class Deadline(unittest.IsolatedAsyncioTestCase):
    async def test_hung_handler_frees_claim_and_connection(self) -> None:
        pool = new_pool(1)
        await pool.open()
        logged: list = []
        app = FastAPI()
        app.add_middleware(IdempotencyMiddleware, pool=pool, tenant="t", deadline=0.3,
                           log=lambda m, e=None: logged.append(m))

        @app.post("/hang", dependencies=[Depends(idempotency)])
        async def hang(request: Request) -> Any:
            await request.state.idempotency.conn.execute("SELECT 1")
            if request.headers.get("x-hang"):
                await asyncio.Event().wait()
            return {"ok": True}

        key = f"py-{uuid.uuid4().hex}"
        try:
            async with httpx.AsyncClient(app=app, base_url="http://test") as c:
                r1 = await asyncio.wait_for(c.post("/hang", json={}, headers={"Idempotency-Key": key, "x-hang": "1"}), 10)
                self.assertEqual(r1.status_code, 503)
                self.assertEqual(r1.json()["error"]["code"], "handler_timeout")
                self.assertTrue(any(m.startswith("handler_timeout: ") for m in logged))
                # the pool's only connection is usable again, and the key is
                # free: at once, or once the server has seen the cancelled
                # query and the closed connection (its backend ends a moment
                # after the client closes it; meanwhile the pool makes a new
                # connection, or the key is still held: 503 or 409)
                for _ in range(20):
                    r2 = await asyncio.wait_for(c.post("/hang", json={}, headers={"Idempotency-Key": key}), 10)
                    if r2.status_code not in (409, 503):
                        break
                    await asyncio.sleep(0.25)
                self.assertEqual(r2.status_code, 200, r2.text)
                self.assertIsNone(r2.headers.get("idempotent-replayed"))
        finally:
            await pool.close()
