"""The outbox sender (run_outbox) against the database, sending through an
httpx.MockTransport that answers by a script: the key on every attempt
and a fresh X-Request-Id; the final states by the retry rules (422 and 400
never retried, retries ended in attention, 401 refreshed); Retry-After
followed; a rolled-back enqueue never sent; a timeout retried; the stored
body bounded; stopping releases an operation leased and not sent.  Needs
IDEM_TEST_PGPORT (clients/test.sh sets it)."""

import asyncio
import os
import signal
import subprocess
import sys
import time
import unittest
from typing import Any, Callable, Dict, List

import httpx
import psycopg
from psycopg_pool import AsyncConnectionPool

from idempotency_asgi.outbox import Options, _arguments, _interval, _Sender, run_outbox

CONNINFO = psycopg.conninfo.make_conninfo(
    host=os.environ.get("IDEM_TEST_PGHOST", "127.0.0.1"), port=os.environ.get("IDEM_TEST_PGPORT"),
    user=os.environ.get("IDEM_TEST_PGUSER"), dbname=os.environ.get("IDEM_TEST_PGDATABASE"))
FINAL = ("succeeded", "failed", "attention")


class Settings(unittest.TestCase):
    def test_intervals_and_checks(self) -> None:
        self.assertEqual([_interval(v) for v in ("1 day", "6 hours", "30 seconds", "500 ms", 5)],
                         [86400.0, 21600.0, 30.0, 0.5, 5.0])
        with self.assertRaises(ValueError):  # a lease shorter than a send lets another sender take it over
            Options(lease=10, timeout=30).check()
        args = _arguments(["--database", "dbname=x", "--concurrency", "8"])
        self.assertEqual((args.concurrency, _interval(args.max_total), _interval(args.lease)), (8, 86400.0, 60.0))


@unittest.skipUnless(os.environ.get("IDEM_TEST_PGPORT"), "IDEM_TEST_PGPORT not set")
class Outbox(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.pool = AsyncConnectionPool(CONNINFO, min_size=1, max_size=6, open=False)
        await self.pool.open()
        self.seen: List[httpx.Request] = []
        self.script: Dict[str, List[Any]] = {}
        self.times: Dict[str, List[float]] = {}
        async with self.pool.connection() as c:  # a test's operations only: the others are finished
            await c.execute("UPDATE idempotency.outbox SET state = 'failed', finished_at = now(), lease_token = NULL,"
                            " locked_until = NULL, leased_at = NULL WHERE state IN ('pending', 'in_flight')")

    async def asyncTearDown(self) -> None:
        await self.pool.close()

    async def add(self, path: str, answers: List[Any], body: Any = None, commit: bool = True) -> str:
        async with self.pool.connection() as c:
            async with c.transaction(force_rollback=not commit):
                cur = await c.execute("SELECT idempotency.idem_outbox_add('POST', %s, %s::jsonb, '{\"X-Tenant\": \"t1\"}')",
                                      (f"http://api.test{path}", psycopg.types.json.Jsonb(body or {"path": path})))
                key = (await cur.fetchone())[0]
        self.script[path] = list(answers)
        return key

    async def handler(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        self.times.setdefault(request.url.path, []).append(time.time())
        answer = self.script[request.url.path].pop(0)
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            return await answer(request)
        status, headers = answer if isinstance(answer, tuple) else (answer, {})
        return httpx.Response(status, headers=headers, json={"status": status})

    async def send_all(self, until: Callable[[], bool], **options: Any) -> Dict[str, int]:
        stop = asyncio.Event()
        client = httpx.AsyncClient(transport=httpx.MockTransport(self.handler))
        opts = dict(concurrency=3, lease=5, timeout=2, base_ms=20, cap_ms=100, idle=0.05, max_attempts=5)
        opts.update(options)
        task = asyncio.ensure_future(run_outbox(self.pool, client=client, stop_event=stop, **opts))
        deadline = time.monotonic() + 30
        while not await until() and time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.05)
        stop.set()
        stats = await task
        await client.aclose()
        return stats

    async def rows(self, key: str) -> Dict[str, Any]:
        async with self.pool.connection() as c:
            cur = await c.cursor(row_factory=psycopg.rows.dict_row).execute(
                "SELECT * FROM idempotency.outbox WHERE key = %s", (key,))
            row = await cur.fetchone()
            cur = await c.execute("SELECT status, outcome, started_at, ended_at FROM idempotency.outbox_attempts"
                                  " WHERE outbox_id = %s ORDER BY attempt", (row["id"],))
            row["tries"] = await cur.fetchall()
        return row

    def finished(self, *keys: str) -> Callable[[], Any]:
        async def check() -> bool:
            return all([(await self.rows(k))["state"] in FINAL for k in keys])
        return check

    async def test_keys_request_ids_and_final_states(self) -> None:
        ok = await self.add("/ok", [503, httpx.ConnectError("refused"), 201])
        reuse = await self.add("/reuse", [422, 201])
        bad = await self.add("/bad", [400, 201])
        gone = await self.add("/gone", [404])
        down = await self.add("/down", [500] * 10)
        stats = await self.send_all(self.finished(ok, reuse, bad, gone, down), max_attempts=3)
        self.assertEqual([(await self.rows(k))["state"] for k in (ok, reuse, bad, gone, down)],
                         ["succeeded", "failed", "failed", "failed", "attention"], stats)
        row = await self.rows(ok)
        self.assertEqual((row["response_status"], row["attempts"], [t[0] for t in row["tries"]]),
                         (201, 3, [503, None, 201]))
        self.assertIn('"status": 201', row["response_body"])
        by_path: Dict[str, List[httpx.Request]] = {}
        for r in self.seen:
            by_path.setdefault(r.url.path, []).append(r)
        self.assertEqual((len(by_path["/reuse"]), len(by_path["/bad"]), len(by_path["/down"])), (1, 1, 3))
        for path, key in (("/ok", ok), ("/down", down)):
            self.assertEqual({r.headers["idempotency-key"] for r in by_path[path]}, {key})
            ids = [r.headers["x-request-id"] for r in by_path[path]]
            self.assertEqual(len(set(ids)), len(ids))
            self.assertNotIn(key, "".join(ids))
            self.assertEqual(by_path[path][0].headers["x-tenant"], "t1")
            self.assertEqual(by_path[path][0].headers["content-type"], "application/json")

    async def test_rolled_back_never_sent(self) -> None:
        await self.add("/rolled-back", [201], commit=False)
        kept = await self.add("/kept", [201])
        await self.send_all(self.finished(kept))
        self.assertEqual([r.url.path for r in self.seen], ["/kept"])

    async def test_retry_after_followed(self) -> None:
        key = await self.add("/busy", [(429, {"Retry-After": "1"}), (409, {"Retry-After": "1"}), 200])
        await self.send_all(self.finished(key))
        row = await self.rows(key)
        self.assertEqual([t[0] for t in row["tries"]], [429, 409, 200])
        # the next request comes Retry-After after the answer (the server's
        # clock is the machine's, as the database's), and each attempt
        # begins after the one before was recorded
        times = self.times["/busy"]
        self.assertGreaterEqual(times[1] - times[0], 1.0)
        self.assertGreaterEqual(times[2] - times[1], 1.0)
        for before, after in zip(row["tries"], row["tries"][1:]):
            self.assertGreater(after[2], before[3])

    async def test_refresh_and_timeout(self) -> None:
        async def slow(request: httpx.Request) -> httpx.Response:
            await asyncio.sleep(3)
            return httpx.Response(200)
        refreshed: List[bool] = []

        def credentials(refresh: bool) -> Dict[str, str]:
            refreshed.append(refresh)
            return {"Authorization": f"Bearer t{sum(refreshed)}"}
        auth = await self.add("/auth", [401, 201])
        late = await self.add("/late", [slow, 202])
        await self.send_all(self.finished(auth, late), credentials=credentials, timeout=0.5, grace=0.2)
        self.assertEqual([(await self.rows(k))["state"] for k in (auth, late)], ["succeeded", "succeeded"])
        self.assertIn(True, refreshed)
        self.assertEqual((await self.rows(late))["tries"][0][0], None)
        no_hook = await self.add("/auth2", [401, 201])
        await self.send_all(self.finished(no_hook))
        self.assertEqual((await self.rows(no_hook))["state"], "attention")

    async def test_body_bounded(self) -> None:
        key = await self.add("/big", [lambda r: self.big()])
        await self.send_all(self.finished(key), max_body=1000)
        self.assertEqual(len((await self.rows(key))["response_body"]), 1000)

    async def big(self) -> httpx.Response:
        return httpx.Response(200, content=b"x" * 200000)

    async def test_command_stops_on_sigint_and_sigterm(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        for sig in (signal.SIGINT, signal.SIGTERM):
            proc = subprocess.Popen([sys.executable, "-m", "idempotency_asgi.outbox", "--database", CONNINFO,
                                     "--idle", "0.1"], env=env, stderr=subprocess.PIPE, text=True)
            for _ in range(600):  # until it leases (its signal handlers are set before)
                async with self.pool.connection() as c:
                    cur = await c.execute("SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
                                          " AND query LIKE '%%idem_outbox_lease%%'")
                    if (await cur.fetchone())[0] > 0:
                        break
                await asyncio.sleep(0.05)
            proc.send_signal(sig)
            _, err = await asyncio.get_running_loop().run_in_executor(None, proc.communicate)
            self.assertEqual(proc.returncode, 0, err)
            self.assertIn("outbox sender stopped", err)

    async def test_stop_releases_what_was_not_sent(self) -> None:
        key = await self.add("/later", [201])
        sender = _Sender(self.pool, Options(lease=5, timeout=1), None, None, asyncio.Event())
        leased = await sender.lease(10)
        self.assertEqual([op["key"] for op in leased], [key])
        sender.stop.set()
        await sender.one(leased[0])
        row = await self.rows(key)
        self.assertEqual((row["state"], row["attempts"], sender.stats), ("pending", 0, {"released": 1}))
        self.assertEqual(self.seen, [])


if __name__ == "__main__":
    unittest.main()
