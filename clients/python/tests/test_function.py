"""idempotent_function against the database: a message executes once and
its redeliveries replay the stored result; another payload under the key
raises IdempotencyKeyReuseError; a running duplicate raises
IdempotencyInProgressError; lease mode keeps its lease with a heartbeat
and marks the key unknown (or releases it) when the function raises; the
async variant on an AsyncConnectionPool.  QueueConsumer: each message
delivered several times, concurrently by threads and after a consumer
killed with SIGKILL in the middle of the function, executes once.  Needs
IDEM_TEST_PGPORT (clients/test.sh sets it)."""

import asyncio
import os
import subprocess
import sys
import threading
import time
import unittest
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from idempotency_asgi import (IdempotencyInProgressError, IdempotencyKeyReuseError, IdempotencyOutcomePendingError,
                              idempotent_function)

CONNINFO = psycopg.conninfo.make_conninfo(
    host=os.environ.get("IDEM_TEST_PGHOST", "127.0.0.1"), port=os.environ.get("IDEM_TEST_PGPORT"),
    user=os.environ.get("IDEM_TEST_PGUSER"), dbname=os.environ.get("IDEM_TEST_PGDATABASE"))
HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = "CREATE TABLE IF NOT EXISTS fn_effects (msg_id text, pid int, at timestamptz DEFAULT clock_timestamp())"


def new_id() -> str:
    return uuid.uuid4().hex


def effects(conn: Any, msg_id: str) -> int:
    return conn.execute("SELECT count(*) FROM fn_effects WHERE msg_id = %s", (msg_id,)).fetchone()[0]


@unittest.skipUnless(os.environ.get("IDEM_TEST_PGPORT"), "IDEM_TEST_PGPORT not set")
class Function(unittest.TestCase):
    def setUp(self) -> None:
        self.pool = ConnectionPool(CONNINFO, min_size=1, max_size=8, open=True)
        with self.pool.connection() as c:
            c.execute(TABLE)
        self.calls: List[str] = []
        self.leases: List[Any] = []

    def tearDown(self) -> None:
        self.pool.close()

    def consumer(self, endpoint: str, **options: Any) -> Any:
        @idempotent_function(self.pool, endpoint, **options)
        def handle(msg: Dict[str, Any], conn: Any) -> Dict[str, Any]:
            self.calls.append(msg["id"])
            conn.execute("INSERT INTO fn_effects (msg_id, pid) VALUES (%s, %s)", (msg["id"], os.getpid()))
            if msg.get("sleep"):
                time.sleep(msg["sleep"])
                self.leases.append(conn.execute(
                    "SELECT state, locked_until > clock_timestamp() FROM idempotency.idem_lookup('default', %s, %s)",
                    (endpoint, msg["id"])).fetchone())
            if msg.get("fail"):
                raise RuntimeError("the function failed")
            return {"invoice": f"inv-{msg['id']}", "amount": msg.get("amount")}
        return handle

    def test_once_then_replay(self) -> None:
        handle = self.consumer("worker:invoice")
        msg = {"id": new_id(), "amount": 42}
        first = handle(msg)
        self.assertEqual(first, {"invoice": f"inv-{msg['id']}", "amount": 42})
        self.assertEqual(handle(dict(msg)), first)
        self.assertEqual(self.calls, [msg["id"]])
        with self.pool.connection() as c:
            self.assertEqual(effects(c, msg["id"]), 1)

    def test_other_payload_raises(self) -> None:
        handle = self.consumer("worker:invoice")
        mid = new_id()
        handle({"id": mid, "amount": 1})
        with self.assertRaises(IdempotencyKeyReuseError) as cm:
            handle({"id": mid, "amount": 2})
        self.assertEqual(cm.exception.claim["action"], "mismatch")
        self.assertIn("/amount", cm.exception.claim["mismatch"]["changed"])
        self.assertNotIn(mid, str(cm.exception))  # the message never shows the key
        # a payload callable: only what it returns must repeat
        pay = self.consumer("worker:payload", payload=lambda m: {"amount": m["amount"]})
        pay({"id": mid, "amount": 1, "attempt": 1})
        self.assertEqual(pay({"id": mid, "amount": 1, "attempt": 2})["amount"], 1)
        self.assertEqual(self.calls, [mid, mid])

    def test_failure_rolls_back_and_runs_again(self) -> None:
        handle = self.consumer("worker:invoice")
        mid = new_id()
        with self.assertRaises(RuntimeError):
            handle({"id": mid, "fail": True})
        with self.pool.connection() as c:
            self.assertEqual(effects(c, mid), 0)
        handle({"id": mid, "fail": True} | {"fail": False})
        with self.pool.connection() as c:
            self.assertEqual(effects(c, mid), 1)

    def test_running_duplicate_is_in_progress(self) -> None:
        handle = self.consumer("worker:slow", wait="0")
        msg = {"id": new_id(), "sleep": 1.5}
        with ThreadPoolExecutor(1) as ex:
            first = ex.submit(handle, msg)
            while not self.calls:
                time.sleep(0.02)
            with self.assertRaises(IdempotencyInProgressError) as cm:
                handle(msg)
            self.assertGreaterEqual(cm.exception.retry_after, 1)
            self.assertEqual(first.result()["invoice"], f"inv-{msg['id']}")
        # waiting for the first delivery replays it instead
        waiting = self.consumer("worker:slow2", wait="10 seconds")
        msg = {"id": new_id(), "sleep": 0.5}
        with ThreadPoolExecutor(4) as ex:
            results = list(ex.map(waiting, [msg] * 4))
        self.assertEqual([r["invoice"] for r in results], [f"inv-{msg['id']}"] * 4)
        self.assertEqual(self.calls.count(msg["id"]), 1)

    def test_lease_mode_heartbeat(self) -> None:
        # the function outlasts its lease twice over; the heartbeat keeps it
        # (without it the key turns unknown and the finish is refused); a
        # lease of 3 seconds, so that a heartbeat late on a loaded machine
        # does not let it lapse
        handle = self.consumer("worker:lease", lease="3 seconds")
        msg = {"id": new_id(), "sleep": 6.5}
        self.assertEqual(handle(msg)["invoice"], f"inv-{msg['id']}")
        self.assertEqual(self.leases, [("in_progress", True)])  # held at the end of the function
        self.assertEqual(handle(msg)["invoice"], f"inv-{msg['id']}")
        self.assertEqual(self.calls, [msg["id"]])

    def test_lease_mode_failure(self) -> None:
        handle = self.consumer("worker:lease", lease="30 seconds")
        mid = new_id()
        with self.assertRaises(RuntimeError):
            handle({"id": mid, "fail": True})
        with self.assertRaises(IdempotencyOutcomePendingError) as cm:
            handle({"id": mid, "fail": True})
        self.assertEqual(cm.exception.claim["action"], "pending")
        released = self.consumer("worker:lease", lease="30 seconds", release_on=(RuntimeError,))
        mid = new_id()
        with self.assertRaises(RuntimeError):
            released({"id": mid, "fail": True})
        self.assertEqual(released({"id": mid, "fail": True} | {"fail": False})["invoice"], f"inv-{mid}")

    def test_async(self) -> None:
        calls: List[str] = []

        async def run() -> List[Any]:
            async with AsyncConnectionPool(CONNINFO, min_size=1, max_size=4) as apool:
                @idempotent_function(apool, "worker:async", key=lambda m: m["msg_id"], wait="10 seconds")
                async def handle(msg: Dict[str, Any], conn: Any) -> Dict[str, Any]:
                    calls.append(msg["msg_id"])
                    await conn.execute("INSERT INTO fn_effects (msg_id) VALUES (%s)", (msg["msg_id"],))
                    await asyncio.sleep(0.2)
                    return {"n": len(calls)}
                msg = {"msg_id": new_id()}
                out = list(await asyncio.gather(*[handle(msg) for _ in range(3)]))
                out.append(await handle(msg))
                return out
        self.assertEqual(asyncio.run(run()), [{"n": 1}] * 4)
        self.assertEqual(len(calls), 1)


CHILD = """
import os, sys, time
from psycopg_pool import ConnectionPool
from idempotency_asgi import idempotent_function
pool = ConnectionPool(sys.argv[1], min_size=1, max_size=2)
@idempotent_function(pool, "worker:queue", wait="0")
def handle(msg, conn):
    conn.execute("INSERT INTO fn_effects (msg_id, pid) VALUES (%s, %s)", (msg["id"], os.getpid()))
    print("inside", flush=True)
    time.sleep(60)
handle({"id": sys.argv[2], "n": 7})
"""


@unittest.skipUnless(os.environ.get("IDEM_TEST_PGPORT"), "IDEM_TEST_PGPORT not set")
class QueueConsumer(unittest.TestCase):
    """A queue that delivers at least once: every message several times,
    by concurrent consumers, one of them killed in the middle."""

    def test_each_message_once(self) -> None:
        pool = ConnectionPool(CONNINFO, min_size=2, max_size=12)
        with pool.connection() as c:
            c.execute(TABLE)
        ids = [new_id() for _ in range(12)]
        crashed = self.crash_a_consumer(ids[0])
        runs: Dict[str, int] = {}
        lock = threading.Lock()

        @idempotent_function(pool, "worker:queue", wait="0")
        def handle(msg: Dict[str, Any], conn: Any) -> Dict[str, Any]:
            with lock:
                runs[msg["id"]] = runs.get(msg["id"], 0) + 1
            conn.execute("INSERT INTO fn_effects (msg_id, pid) VALUES (%s, %s)", (msg["id"], os.getpid()))
            time.sleep(0.05)
            return {"done": msg["id"], "pid": os.getpid()}

        def deliver(mid: str) -> Dict[str, Any]:
            for _ in range(200):  # the queue redelivers a message whose consumer said "in progress"
                try:
                    return handle({"id": mid, "n": 7})
                except IdempotencyInProgressError as err:
                    time.sleep(min(err.retry_after, 0.05))
            raise AssertionError("a message stayed in progress")
        with ThreadPoolExecutor(8) as ex:
            answers = list(ex.map(deliver, ids * 4))
        self.assertEqual(crashed.returncode, -9)
        self.assertEqual({mid: runs.get(mid) for mid in ids}, {mid: 1 for mid in ids})
        for mid, answer in zip(ids * 4, answers):
            self.assertEqual(answer["done"], mid)
        with pool.connection() as c:
            counts = dict(c.execute("SELECT msg_id, count(*) FROM fn_effects WHERE msg_id = ANY(%s) GROUP BY 1",
                                    (ids,)).fetchall())
        pool.close()
        self.assertEqual(counts, {mid: 1 for mid in ids})

    def crash_a_consumer(self, mid: str) -> "subprocess.Popen[str]":
        env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
        child = subprocess.Popen([sys.executable, "-c", CHILD, CONNINFO, mid], stdout=subprocess.PIPE, text=True,
                                 env=env)
        assert child.stdout is not None
        self.assertEqual(child.stdout.readline().strip(), "inside")
        child.kill()
        child.wait()
        child.stdout.close()
        return child


if __name__ == "__main__":
    unittest.main()
