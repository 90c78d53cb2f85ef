"""A client that disconnects while the application runs (the server's
receive() says http.disconnect): the run is given up, the transaction
rolled back (its connection closed, the pool's slot given back), the claim
freed; in lease mode the key is marked unknown, or released after
no_side_effect(), and the heartbeat stops.  One that disconnects while its
claim waits for a duplicate that runs has the claim's query cancelled at
once, and the application does not run.  Needs IDEM_TEST_PGPORT
(clients/test.sh sets it)."""

import asyncio
import logging
import uuid
import warnings
from typing import Any, Dict, List, Optional

import httpx
from fastapi import Depends, FastAPI, Request
from psycopg_pool import AsyncConnectionPool

from idempotency_asgi import Context, IdempotencyMiddleware, idempotency

from .support import DatabaseCase, needs_db, new_pool


@needs_db
class Disconnect(DatabaseCase):
    # a pool of one connection: a request after the disconnect needs it back
    pool_size = 1
    setup_sql = ("CREATE TABLE IF NOT EXISTS dc_charges (idem_key text)",)

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.logged: List[str] = []
        self.runs: Dict[str, int] = {}
        self.started: Dict[str, asyncio.Event] = {}

    def app(self, pool: AsyncConnectionPool, **options: Any) -> FastAPI:
        app = FastAPI()
        app.add_middleware(IdempotencyMiddleware, pool=pool, tenant="t",
                           log=lambda m, e=None: self.logged.append(m), **options)

        @app.post("/pay")
        async def pay(request: Request, ctx: Context = Depends(idempotency)) -> Dict[str, Any]:
            key = str(ctx.key)
            self.runs[key] = self.runs.get(key, 0) + 1
            await ctx.conn.execute("INSERT INTO dc_charges (idem_key) VALUES (%s)", (key,))
            if request.headers.get("x-no-side-effect"):
                ctx.no_side_effect()
            if request.headers.get("x-hang"):
                self.started[key].set()
                if request.headers.get("x-hang") == "query":
                    await ctx.conn.execute("SELECT pg_sleep(60)")  # a query that takes long
                await asyncio.Event().wait()
            return {"run": self.runs[key]}
        return app

    async def disconnect_mid_handler(self, app: FastAPI, key: str, hold: float = 0.0, **headers: str) -> List[Any]:
        """Drives the app as a server would, and says http.disconnect once the handler hangs."""
        self.started[key] = asyncio.Event()
        call, gone, sent = self.drive(app, key, **{"x_hang": "1", **headers})
        await asyncio.wait_for(self.started[key].wait(), 10)
        await asyncio.sleep(hold)
        gone.set()
        await asyncio.wait_for(call, 10)
        return sent

    def drive(self, app: FastAPI, key: str, **headers: str) -> Any:
        """The app called as a server calls it: (the call, the event that
        makes receive() say http.disconnect, the messages sent)."""
        gone = asyncio.Event()
        body_sent = False

        async def receive() -> Dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": b"{}", "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}
        sent: List[Any] = []

        async def send(message: Any) -> None:
            sent.append(message)
        hdrs = [(b"idempotency-key", key.encode()), (b"content-type", b"application/json")]
        hdrs += [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/pay", "raw_path": b"/pay", "query_string": b"", "root_path": "",
                 "headers": hdrs, "client": ("127.0.0.1", 1), "server": ("test", 80)}
        return asyncio.ensure_future(app(scope, receive, send)), gone, sent

    async def count(self, key: str) -> int:
        cur = await self.admin.execute("SELECT count(*) FROM dc_charges WHERE idem_key = %s", (key,))
        row = await cur.fetchone()
        return int(row[0]) if row else -1

    def heartbeats(self) -> List[Any]:
        return [t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "").endswith("_heartbeat")]

    async def test_atomic_key_free_connection_back(self) -> None:
        app, key = self.app(self.pool), f"py-{uuid.uuid4().hex}"
        sent = await self.disconnect_mid_handler(app, key)
        self.assertEqual(sent, [])
        self.assertTrue(any(m.startswith("client_disconnected: the client disconnected while the application ran")
                            for m in self.logged), self.logged)
        self.assertIsNone(await self.key_state(key))
        self.assertEqual(await self.count(key), 0)
        async with httpx.AsyncClient(app=app, base_url="http://test") as c:
            r = await asyncio.wait_for(c.post("/pay", json={}, headers={"Idempotency-Key": key}), 10)
        self.assertEqual((r.status_code, r.json(), r.headers.get("idempotent-replayed")), (200, {"run": 2}, None))
        self.assertEqual(await self.count(key), 1)

    async def test_lease_unknown_heartbeat_stopped(self) -> None:
        pool = new_pool(3)
        await pool.open()
        try:
            app, key = self.app(pool, lease="2 seconds", heartbeat=0.1), f"py-{uuid.uuid4().hex}"
            await self.disconnect_mid_handler(app, key, hold=0.3)
            await asyncio.sleep(0.1)
            self.assertEqual(self.heartbeats(), [])
            self.assertEqual(await self.key_state(key), "unknown")
            k2 = f"py-{uuid.uuid4().hex}"
            await self.disconnect_mid_handler(app, k2, x_no_side_effect="1")
            self.assertIsNone(await self.key_state(k2))
            async with httpx.AsyncClient(app=app, base_url="http://test") as c:
                r = await c.post("/pay", json={}, headers={"Idempotency-Key": key})
                self.assertEqual((r.status_code, r.json()["error"]["code"]), (409, "outcome_pending"))
                r = await c.post("/pay", json={}, headers={"Idempotency-Key": k2})
                self.assertEqual((r.status_code, r.json()), (200, {"run": 2}))
        finally:
            await pool.close()

    async def test_gone_during_the_claims_wait_runs_nothing(self) -> None:
        pool = new_pool(3)
        await pool.open()
        try:
            app, key = self.app(pool, wait="10 seconds"), f"py-{uuid.uuid4().hex}"
            self.started[key] = asyncio.Event()
            first, first_gone, _ = self.drive(app, key, x_hang="1")
            await asyncio.wait_for(self.started[key].wait(), 10)
            second, second_gone, sent = self.drive(app, key)
            await asyncio.sleep(0.3)  # the second waits in its claim
            second_gone.set()  # its claim's query is cancelled
            first_gone.set()  # the first is given up
            await asyncio.wait_for(asyncio.gather(first, second), 10)
            self.assertEqual(sent, [])
            self.assertEqual(self.runs[key], 1)
            self.assertIsNone(await self.key_state(key))
            self.assertTrue(any("before the application ran" in m for m in self.logged), self.logged)
        finally:
            await pool.close()

    async def test_inside_a_long_query_the_claim_is_free_at_once(self) -> None:
        app, key = self.app(self.pool, wait="10 seconds"), f"py-{uuid.uuid4().hex}"
        await self.disconnect_mid_handler(app, key, hold=0.2, x_hang="query")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        async with httpx.AsyncClient(app=app, base_url="http://test") as c:
            r = await asyncio.wait_for(c.post("/pay", json={}, headers={"Idempotency-Key": key}), 20)
        self.assertEqual((r.status_code, r.json()), (200, {"run": 2}))
        self.assertLess(loop.time() - t0, 5, "the retry waited for the claim")
        cur = await self.admin.execute("SELECT count(*) FROM pg_stat_activity "
                                       "WHERE query = 'SELECT pg_sleep(60)' AND state = 'active'")
        row = await cur.fetchone()
        self.assertEqual(row[0] if row else None, 0, "the handler's query still runs")

    async def claims_running(self) -> List[int]:
        """The backends of this database that run a claim now."""
        cur = await self.admin.execute("SELECT pid FROM pg_stat_activity WHERE state = 'active' "
                                       "AND datname = current_database() AND query LIKE '%idem_claim(%' "
                                       "AND pid <> pg_backend_pid()")
        return [row[0] for row in await cur.fetchall()]

    async def gone_while_the_claim_waits(self, **options: Any) -> None:
        """A first request holds the key (its handler hangs); a duplicate's
        claim waits for it (wait: 60 seconds) and its client goes away: the
        claim's query is cancelled at once, the application does not run
        again, the duplicate's connection is given up (the pool of two, one
        held by the first request, serves another request), and once the
        first is given up too the key runs again."""
        pool = new_pool(2)
        await pool.open()
        app, key = self.app(pool, wait="60 seconds", **options), f"py-{uuid.uuid4().hex}"
        self.started[key] = asyncio.Event()
        first, first_gone, _ = self.drive(app, key, x_hang="1", x_no_side_effect="1")
        second: Optional["asyncio.Future[Any]"] = None
        try:
            await asyncio.wait_for(self.started[key].wait(), 10)
            second, second_gone, sent = self.drive(app, key)
            waiting: List[int] = []
            for _ in range(250):
                waiting = await self.claims_running()
                if waiting:
                    break
                await asyncio.sleep(0.02)
            self.assertEqual(len(waiting), 1, "the duplicate's claim does not wait")
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            second_gone.set()
            await asyncio.wait({second}, timeout=5)
            self.assertTrue(second.done(), "the duplicate's claim waits on for a client that is gone")
            second.result()
            self.assertLess(loop.time() - t0, 3, "the disconnect was noticed late")
            self.assertEqual(sent, [])
            self.assertTrue(any(m.startswith("client_disconnected: the client disconnected before the application "
                                             "ran, while its claim waited (the claim's query was cancelled)")
                                for m in self.logged), self.logged)
            # the claim's backend runs it no more (its connection was closed)
            for _ in range(100):
                if waiting[0] not in await self.claims_running():
                    break
                await asyncio.sleep(0.02)
            self.assertEqual(await self.claims_running(), [])
            self.assertEqual(self.runs[key], 1, "the duplicate ran the application")
            other = f"py-{uuid.uuid4().hex}"
            async with httpx.AsyncClient(app=app, base_url="http://test") as c:
                r = await asyncio.wait_for(c.post("/pay", json={}, headers={"Idempotency-Key": other}), 10)
                self.assertEqual((r.status_code, r.json()), (200, {"run": 1}))
                first_gone.set()
                await asyncio.wait_for(first, 10)
                self.assertIsNone(await self.key_state(key))
                r = await asyncio.wait_for(c.post("/pay", json={}, headers={"Idempotency-Key": key}), 10)
                self.assertEqual((r.status_code, r.json()), (200, {"run": 2}))
            self.assertEqual(await self.count(key), 1)
        finally:
            first_gone.set()
            await asyncio.wait({first} | ({second} if second is not None else set()), timeout=20)
            await pool.close()

    async def test_gone_while_the_claim_waits_cancels_it(self) -> None:
        await self.gone_while_the_claim_waits()

    async def test_lease_gone_while_the_claim_waits_cancels_it(self) -> None:
        await self.gone_while_the_claim_waits(lease="30 seconds")

    async def test_claim_at_once_gone_while_it_waits_cancels_it(self) -> None:
        quiet = logging.NullHandler()  # opt_in=False warns and logs
        logging.getLogger("idempotency_asgi").addHandler(quiet)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                await self.gone_while_the_claim_waits(opt_in=False)
        finally:
            logging.getLogger("idempotency_asgi").removeHandler(quiet)
