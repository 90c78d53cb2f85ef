"""Background work after the commit: Starlette/FastAPI background tasks run
after the key is finished and committed and after the response is sent; a
failing task is logged and changes nothing, a slow one delays nothing.
Needs IDEM_TEST_PGPORT (clients/test.sh sets it); skipped without it."""

import asyncio
import uuid
from typing import Any, Dict, List, Optional

import httpx
from fastapi import BackgroundTasks, Depends, FastAPI, Request

from idempotency_asgi import IdempotencyMiddleware, idempotency

from .support import DatabaseCase, needs_db


@needs_db
class Background(DatabaseCase):
    # a pool of one connection: a task that held it would block the next request
    pool_size = 1
    setup_sql = ("CREATE TABLE IF NOT EXISTS bg_payments (idem_key text)",)

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.logged: List[str] = []
        self.task_runs: Dict[str, int] = {}
        self.seen_committed: Dict[str, int] = {}
        self.release = asyncio.Event()

        def log(message: str, err: Optional[BaseException] = None) -> None:
            self.logged.append(f"{message}: {err}")

        app = FastAPI()
        # a pool of one connection: a task that held it would block the next request
        app.add_middleware(IdempotencyMiddleware, pool=self.pool, tenant="t", log=log)

        async def failing(key: str) -> None:
            self.task_runs[key] = self.task_runs.get(key, 0) + 1
            cur = await self.admin.execute("SELECT count(*) FROM bg_payments WHERE idem_key = %s", (key,))
            row = await cur.fetchone()
            self.seen_committed[key] = int(row[0]) if row else -1
            raise ConnectionError("the mail server is down")

        async def slow(key: str) -> None:
            self.task_runs[key] = self.task_runs.get(key, 0) + 1
            await self.release.wait()

        @app.post("/pay/{kind}", dependencies=[Depends(idempotency)])
        async def pay(kind: str, request: Request, tasks: BackgroundTasks) -> Dict[str, Any]:
            ctx = request.state.idempotency
            await ctx.conn.execute("INSERT INTO bg_payments (idem_key) VALUES (%s)", (ctx.key,))
            tasks.add_task(failing if kind == "failing" else slow, ctx.key)
            return {"paid": ctx.key}

        self.client = httpx.AsyncClient(app=app, base_url="http://test")

    async def asyncTearDown(self) -> None:
        self.release.set()
        await self.client.aclose()
        await super().asyncTearDown()

    async def count(self, key: str) -> int:
        cur = await self.admin.execute("SELECT count(*) FROM bg_payments WHERE idem_key = %s", (key,))
        row = await cur.fetchone()
        return int(row[0]) if row else -1

    async def test_failing_task(self) -> None:
        key = f"bg-{uuid.uuid4().hex}"
        r = await self.client.post("/pay/failing", json={}, headers={"Idempotency-Key": key})
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.json(), {"paid": key})
        self.assertEqual(self.seen_committed[key], 1, "the task ran before the commit")
        self.assertEqual(await self.count(key), 1)
        self.assertTrue(any("background task failed" in m and "mail server" in m for m in self.logged), self.logged)
        r2 = await self.client.post("/pay/failing", json={}, headers={"Idempotency-Key": key})
        self.assertEqual(r2.headers.get("idempotent-replayed"), "true")
        self.assertEqual(self.task_runs[key], 1)
        self.assertEqual(await self.count(key), 1)

    async def test_slow_task(self) -> None:
        # httpx's ASGI transport returns when the application returns, so the
        # response is read from the messages sent to the server instead: the
        # whole response is sent while the task still waits, and the only pool
        # connection is free for another request meanwhile
        key = f"bg-{uuid.uuid4().hex}"
        app = self.client._transport.app  # type: ignore[attr-defined]
        sent: List[Dict[str, Any]] = []
        complete = asyncio.Event()

        async def receive() -> Dict[str, Any]:
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message: Dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                complete.set()

        scope = {"type": "http", "method": "POST", "path": "/pay/slow", "raw_path": b"/pay/slow",
                 "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
                 "server": ("test", 80), "client": ("127.0.0.1", 1),
                 "headers": [(b"idempotency-key", key.encode()), (b"content-type", b"application/json")]}
        run = asyncio.ensure_future(app(scope, receive, send))
        await asyncio.wait_for(complete.wait(), 10)
        self.assertFalse(run.done(), "the task should still be running")
        self.assertEqual(sent[0]["status"], 200)
        self.assertEqual(await self.count(key), 1, "committed before the task ends")
        other = f"bg-{uuid.uuid4().hex}"
        r = await asyncio.wait_for(self.client.post("/pay/failing", json={}, headers={"Idempotency-Key": other}), 10)
        self.assertEqual(r.status_code, 200)
        self.release.set()
        await asyncio.wait_for(run, 10)
        self.assertEqual(self.task_runs[key], 1)
