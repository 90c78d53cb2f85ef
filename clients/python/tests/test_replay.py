"""Replays that depend on the request: a body stored encoded (a
GZipMiddleware inside the idempotency middleware compressed it for the
first client) replayed decoded to a client whose Accept-Encoding does not
take gzip, as stored to one that does; a HEAD answer and its replay carry
the Content-Length of the body a GET gets, without a body.  Needs
IDEM_TEST_PGPORT (clients/test.sh sets it)."""

import gzip
import json
import uuid
from typing import Any, Dict

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.middleware.gzip import GZipMiddleware

from idempotency_asgi import Context, IdempotencyMiddleware, idempotency

from .support import DatabaseCase, needs_db


BIG = {"items": [{"n": i, "label": "an item of the order"} for i in range(100)]}


@needs_db
class Replay(DatabaseCase):
    with_admin = False

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.runs: Dict[str, int] = {}
        app = FastAPI()
        # added first, so inside the idempotency middleware: it compresses what is stored
        app.add_middleware(GZipMiddleware, minimum_size=100)
        app.add_middleware(IdempotencyMiddleware, pool=self.pool, tenant="t", methods=("POST", "GET", "HEAD"))

        @app.post("/orders")
        async def orders(ctx: Context = Depends(idempotency)) -> Any:
            self.runs[str(ctx.key)] = self.runs.get(str(ctx.key), 0) + 1
            return JSONResponse(BIG)

        @app.api_route("/thing", methods=["GET", "HEAD"])
        async def thing(ctx: Context = Depends(idempotency)) -> Any:
            self.runs[str(ctx.key)] = self.runs.get(str(ctx.key), 0) + 1
            return JSONResponse({"thing": "x" * 40})

        # as FileResponse and newer Starlette answer a HEAD: the headers, no body
        @app.api_route("/file", methods=["GET", "HEAD"])
        async def file(request: Request, ctx: Context = Depends(idempotency)) -> Any:
            self.runs[str(ctx.key)] = self.runs.get(str(ctx.key), 0) + 1
            body = b"0123456789" * 7
            return Response(b"" if request.method == "HEAD" else body, media_type="text/plain",
                            headers={"content-length": str(len(body))})

        self.client = httpx.AsyncClient(app=app, base_url="http://test")

    async def asyncTearDown(self) -> None:
        await self.client.aclose()
        await super().asyncTearDown()

    async def test_gzip_body_replayed_to_a_client_without_gzip(self) -> None:
        key = f"py-{uuid.uuid4().hex}"
        r1 = await self.client.post("/orders", json={}, headers={"Idempotency-Key": key, "Accept-Encoding": "gzip"})
        self.assertEqual((r1.status_code, r1.headers.get("content-encoding")), (200, "gzip"))
        self.assertEqual(r1.json(), BIG)
        for accept in ("identity", "br", "gzip;q=0, deflate", None):
            h = {"Idempotency-Key": key, "Accept-Encoding": accept} if accept else {"Idempotency-Key": key}
            if accept is None:  # no Accept-Encoding at all (httpx sends one by default)
                req = self.client.build_request("POST", "/orders", json={}, headers=h)
                del req.headers["accept-encoding"]
                r = await self.client.send(req)
            else:
                r = await self.client.post("/orders", json={}, headers=h)
            self.assertEqual(r.headers.get("idempotent-replayed"), "true", accept)
            self.assertIsNone(r.headers.get("content-encoding"), accept)
            self.assertEqual(json.loads(r.content), BIG, accept)
            self.assertEqual(int(r.headers["content-length"]), len(r.content), accept)
        # a client that takes gzip gets the stored bytes
        r = await self.client.post("/orders", json={}, headers={"Idempotency-Key": key, "Accept-Encoding": "br, gzip"})
        self.assertEqual((r.headers.get("idempotent-replayed"), r.headers.get("content-encoding")), ("true", "gzip"))
        self.assertEqual(json.loads(gzip.decompress(await self._raw(key, "gzip"))), BIG)
        self.assertEqual(self.runs[key], 1)

    async def _raw(self, key: str, accept: str) -> bytes:
        req = self.client.build_request("POST", "/orders", json={},
                                        headers={"Idempotency-Key": key, "Accept-Encoding": accept})
        r = await self.client.send(req, stream=True)
        body = b"".join([c async for c in r.aiter_raw()])
        await r.aclose()
        return body

    async def test_head_carries_content_length(self) -> None:
        for path in ("/thing", "/file"):
            g = await self.client.get(path, headers={"Idempotency-Key": f"py-{uuid.uuid4().hex}",
                                                     "Accept-Encoding": "identity"})
            length = len(g.content)
            key = f"py-{uuid.uuid4().hex}"
            for replayed in (None, "true"):
                r = await self.client.head(path, headers={"Idempotency-Key": key, "Accept-Encoding": "identity"})
                self.assertEqual(r.status_code, 200, path)
                self.assertEqual(r.headers.get("idempotent-replayed"), replayed, path)
                self.assertEqual(r.headers.get("content-length"), str(length), path)
                self.assertEqual(r.content, b"", path)
            self.assertEqual(self.runs[key], 1, path)
