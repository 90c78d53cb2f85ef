"""Smaller findings against a database: an sf-string key with parameters,
key policy 'hash' on the key's UTF-8 bytes, a stored header value outside
Latin-1 replayed.  Needs IDEM_TEST_PGPORT (clients/test.sh sets it)."""

import base64
import hashlib
import os
import unittest
import uuid
from typing import Any, Dict

import httpx
import psycopg
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool

from idempotency_asgi import IdempotencyMiddleware

CONNINFO = psycopg.conninfo.make_conninfo(
    host=os.environ.get("IDEM_TEST_PGHOST", "127.0.0.1"), port=os.environ.get("IDEM_TEST_PGPORT"),
    user=os.environ.get("IDEM_TEST_PGUSER"), dbname=os.environ.get("IDEM_TEST_PGDATABASE"))


@unittest.skipUnless(os.environ.get("IDEM_TEST_PGPORT"), "IDEM_TEST_PGPORT not set")
class Findings(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.pool = AsyncConnectionPool(CONNINFO, min_size=1, max_size=4, open=False)
        await self.pool.open()
        self.admin = await psycopg.AsyncConnection.connect(CONNINFO, autocommit=True)
        self.runs: Dict[str, int] = {}
        app = FastAPI()
        app.add_middleware(IdempotencyMiddleware, pool=self.pool, tenant="t", key_policy="hash")

        @app.post("/k")
        async def k(request: Request) -> Any:
            key = request.state.idempotency.key
            self.runs[key] = self.runs.get(key, 0) + 1
            return JSONResponse({"key": key, "run": self.runs[key]})

        self.client = httpx.AsyncClient(app=app, base_url="http://test")

    async def asyncTearDown(self) -> None:
        await self.client.aclose()
        await self.pool.close()
        await self.admin.close()

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
