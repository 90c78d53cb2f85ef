"""The request body goes to the application as the server gives it: a
request the middleware does not claim (no Idempotency-Key, a route that
does not opt in, a method it leaves alone) is streamed, nothing of it
buffered; a keyed claim reads the body (bounded by limit) for the
fingerprint and gives it to the application again.  The client's
http.disconnect, which the middleware watches for once the body was given
whole, reaches an application that waits for it as well.

The requests are driven by hand (ASGI messages), so that the test decides
when each chunk of the body arrives.  The tests that claim need
IDEM_TEST_PGPORT (clients/test.sh sets it); the others run without a
database (their pool fails the test if asked)."""

import asyncio
import json
import logging
import unittest
import uuid
import warnings
from typing import Any, Dict, List, Optional

from fastapi import Depends, FastAPI, Request
from psycopg_pool import AsyncConnectionPool

from idempotency_asgi import Context, IdempotencyMiddleware, idempotency

from .support import HAVE_DB, needs_db, open_pool

LIMIT = 1000


def no_pool() -> AsyncConnectionPool:
    raise AssertionError("the middleware asked for a connection for a request it does not claim")


class Client:
    """One request as a server gives it: the body in the chunks the test
    releases, then (when the test says so) one http.disconnect, after which
    receive() never returns again (a server with a queue of messages gives
    the disconnect once)."""

    def __init__(self, app: Any, path: str, headers: Dict[str, str], method: str = "POST") -> None:
        self.app = app
        self.scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                      "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
                      "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
                      "client": ("127.0.0.1", 50000), "server": ("test", 80)}
        self.queue: "asyncio.Queue[Dict[str, Any]]" = asyncio.Queue()
        self.sent: List[Dict[str, Any]] = []
        self.chunks_given = 0
        self.disconnects_given = 0

    async def receive(self) -> Dict[str, Any]:
        message = await self.queue.get()
        if message["type"] == "http.request":
            self.chunks_given += 1
        else:
            self.disconnects_given += 1
        return message

    async def send(self, message: Dict[str, Any]) -> None:
        self.sent.append(message)

    def chunk(self, body: bytes, more: bool) -> None:
        self.queue.put_nowait({"type": "http.request", "body": body, "more_body": more})

    def disconnect(self) -> None:
        self.queue.put_nowait({"type": "http.disconnect"})

    def start(self) -> "asyncio.Task[None]":
        return asyncio.ensure_future(self.app(self.scope, self.receive, self.send))

    @property
    def status(self) -> Optional[int]:
        return next((m["status"] for m in self.sent if m["type"] == "http.response.start"), None)

    @property
    def json(self) -> Any:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body"))


class Streaming(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.pool: Optional[AsyncConnectionPool] = None
        if HAVE_DB:
            self.pool = await open_pool(2)
        self.first = asyncio.Event()  # the application has a first chunk
        self.logged: List[str] = []
        self.runs: List[int] = []

    async def asyncTearDown(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    def app(self, pool: Any, **options: Any) -> FastAPI:
        app = FastAPI()
        app.add_middleware(IdempotencyMiddleware, pool=pool, tenant="t", limit=LIMIT,
                           log=lambda m, e=None: self.logged.append(m), **options)

        async def read(request: Request) -> Dict[str, Any]:
            chunks = []
            async for chunk in request.stream():
                if chunk:
                    chunks.append(len(chunk))
                    self.first.set()
            return {"chunks": chunks}

        # a route that claims (with a key, or without one), reading the body itself
        @app.post("/claims")
        async def claims(request: Request, ctx: Context = Depends(idempotency)) -> Dict[str, Any]:
            out = await read(request)
            await ctx.conn.execute("SELECT 1")
            return {**out, "key": ctx.key}

        # a route whose first run fails with a deadlock once it has the body
        @app.post("/deadlocks")
        async def deadlocks(request: Request, ctx: Context = Depends(idempotency)) -> Dict[str, Any]:
            out = await read(request)
            self.runs.append(sum(out["chunks"]))
            if len(self.runs) == 1:
                await ctx.conn.execute("DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40P01'; END $$")
            return {**out, "runs": len(self.runs)}

        # a route that does not opt in
        @app.post("/plain")
        async def plain(request: Request) -> Dict[str, Any]:
            return await read(request)

        # a route that waits for the client to go away once it has the body
        @app.post("/waits")
        async def waits(request: Request) -> Dict[str, Any]:
            out = await read(request)
            await asyncio.sleep(0.05)  # the middleware's watch waits first
            message = await request.receive()
            return {**out, "then": message["type"]}
        return app

    async def streamed(self, app: Any, path: str, headers: Dict[str, str]) -> Client:
        """Sends two chunks, the second only once the application has the
        first (or after 2 s): asserts it had the first before the last was sent."""
        c = Client(app, path, headers)
        run = c.start()
        c.chunk(b"a" * 600, True)
        try:
            await asyncio.wait_for(self.first.wait(), 2)
            had_first = True
        except asyncio.TimeoutError:
            had_first = False
        c.chunk(b"b" * 600, False)
        await asyncio.wait_for(run, 10)
        self.assertTrue(had_first, "the application got no chunk before the client sent the last one")
        return c

    async def test_not_opted_in_streams(self) -> None:
        # no key, and a key: neither is buffered by a route that does not claim
        for headers in ({}, {"Idempotency-Key": str(uuid.uuid4())}):
            self.first.clear()
            c = await self.streamed(self.app(no_pool), "/plain", headers)
            self.assertEqual(c.status, 200, headers)
            self.assertEqual(c.json, {"chunks": [600, 600]})

    async def test_method_left_alone_streams(self) -> None:
        c = await self.streamed(self.app(no_pool, methods=("PUT",)), "/plain", {"Idempotency-Key": "k"})
        self.assertEqual(c.json, {"chunks": [600, 600]})

    async def test_app_waiting_for_the_disconnect_gets_it(self) -> None:
        # the middleware watches for the disconnect once the body is whole;
        # the application waiting for it too gets the same message
        for headers in ({}, {"Idempotency-Key": str(uuid.uuid4())}):
            c = Client(self.app(no_pool), "/waits", headers)
            run = c.start()
            c.chunk(b"x" * 10, False)
            await asyncio.sleep(0.2)
            c.disconnect()
            await asyncio.wait_for(run, 5)
            self.assertEqual(c.json, {"chunks": [10], "then": "http.disconnect"}, headers)
            self.assertEqual(c.disconnects_given, 1)

    @needs_db
    async def test_unkeyed_claim_streams(self) -> None:
        c = await self.streamed(self.app(self.pool), "/claims", {})
        self.assertEqual(c.status, 200)
        self.assertEqual(c.json, {"chunks": [600, 600], "key": None})

    @needs_db
    async def test_unkeyed_body_above_limit_passes(self) -> None:
        body = json.dumps({"pad": "x" * (3 * LIMIT)}).encode()
        for app in (self.app(self.pool), self.app(self.pool, opt_in=False)):
            quiet = logging.NullHandler()  # opt_in=False warns and logs
            logging.getLogger("idempotency_asgi").addHandler(quiet)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                c = Client(app, "/claims", {"Content-Type": "application/json"})
                run = c.start()
                for i in range(0, len(body), 500):
                    c.chunk(body[i:i + 500], i + 500 < len(body))
                await asyncio.wait_for(run, 10)
            logging.getLogger("idempotency_asgi").removeHandler(quiet)
            self.assertEqual(c.status, 200, c.sent)
            self.assertEqual(sum(c.json["chunks"]), len(body))

    @needs_db
    async def test_keyed_claim_reads_the_body_then_replays_it(self) -> None:
        key = str(uuid.uuid4())
        app = self.app(self.pool)
        results = []
        for _ in range(2):
            c = Client(app, "/claims", {"Idempotency-Key": key, "Content-Type": "application/json"})
            run = c.start()
            c.chunk(b'{"amount": ', True)
            c.chunk(b'1}', False)
            await asyncio.wait_for(run, 10)
            results.append(c)
        # the claim read both chunks for the fingerprint; the application got them again
        self.assertEqual(results[0].status, 200)
        self.assertEqual(results[0].json, {"chunks": [11, 2], "key": key})
        replay = results[1]
        self.assertEqual(replay.status, 200)
        self.assertEqual(replay.json, results[0].json)
        self.assertIn((b"idempotent-replayed", b"true"), replay.sent[0]["headers"])
        # another body under the same key is a mismatch: the fingerprint saw the body
        c = Client(app, "/claims", {"Idempotency-Key": key, "Content-Type": "application/json"})
        run = c.start()
        c.chunk(b'{"amount": 2}', False)
        await asyncio.wait_for(run, 10)
        self.assertEqual(c.status, 400)
        self.assertEqual(c.json["error"]["code"], "idempotency_key_reuse")

    @needs_db
    async def test_run_again_with_the_kept_body_only(self) -> None:
        # a keyed request runs again after a deadlock with its body given again
        c = Client(self.app(self.pool), "/deadlocks", {"Idempotency-Key": str(uuid.uuid4())})
        run = c.start()
        c.chunk(b"z" * 100, False)
        await asyncio.wait_for(run, 10)
        self.assertEqual((c.status, c.json["runs"], self.runs), (200, 2, [100, 100]))
        # a keyless one streamed its body, which was not kept: not run again
        self.runs.clear()
        c = Client(self.app(self.pool), "/deadlocks", {})
        run = c.start()
        c.chunk(b"z" * 100, False)
        await asyncio.wait_for(run, 10)
        self.assertEqual((c.status, self.runs), (503, [100]))
        self.assertTrue(any("not run again" in m for m in self.logged), self.logged)

    @needs_db
    async def test_keyed_claim_above_limit_is_refused_without_reading_on(self) -> None:
        c = Client(self.app(self.pool), "/claims", {"Idempotency-Key": str(uuid.uuid4())})
        run = c.start()
        for _ in range(5):
            c.chunk(b"y" * 600, True)
        c.chunk(b"", False)
        await asyncio.wait_for(run, 10)
        self.assertEqual(c.status, 400)
        self.assertIn("too large", json.dumps(c.json))
        # the claim stopped reading past the limit (two chunks of 600)
        self.assertEqual(c.chunks_given, 2)


if __name__ == "__main__":
    unittest.main()
