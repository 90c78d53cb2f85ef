"""End-to-end: urllib3 with its own retries (connect, read and 409/503,
POST included, Retry-After respected) against app.py under uvicorn, with
lost responses, crashes before commit, slow handlers, killed backends,
serialization failures, and kill -9 of the server by this driver.  Then,
from the database: no key executed twice, every acknowledged order is
there, every retry (and a final replay of every key) got the first
response.  Loopback only; bounded in calls and time."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import urllib3
from urllib3.util.retry import Retry

CALLS = int(os.environ.get("E2E_CALLS", "200"))
CONCURRENCY = 12
TIME_BUDGET = 45.0  # no call starts later: the run stays well under 2 minutes on a loaded machine
SERVER_KILLS = 3
HERE = os.path.dirname(os.path.abspath(__file__))
CONNINFO = psycopg.conninfo.make_conninfo(
    host=os.environ.get("IDEM_TEST_PGHOST", "127.0.0.1"), port=os.environ["IDEM_TEST_PGPORT"],
    user=os.environ["IDEM_TEST_PGUSER"], dbname=os.environ["IDEM_TEST_PGDATABASE"])

faults = {}
lock = threading.Lock()


class BoundedRetry(Retry):
    """urllib3's Retry with its backoff capped at 3 s (120 s by default)."""
    DEFAULT_BACKOFF_MAX = 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """uvicorn running app.py, restarted whenever it dies until stop()."""

    def __init__(self, port, rate):
        self.port, self.rate = port, rate
        self.proc = None
        self.stopping = False
        self.lock = threading.Lock()  # no new process once stop() has begun
        self.starts = 0
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._supervise, daemon=True)
        self.thread.start()
        if not self.ready.wait(60):
            raise RuntimeError("the server did not start")

    def _supervise(self):
        while True:
            env = dict(os.environ, FAULT_RATE=str(self.rate),
                       PYTHONPATH=os.path.dirname(os.path.dirname(HERE)))
            with self.lock:
                if self.stopping:
                    return
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "uvicorn", "tests.e2e.app:app", "--host", "127.0.0.1",
                     "--port", str(self.port), "--log-level", "critical", "--no-access-log"],
                    cwd=os.path.dirname(os.path.dirname(HERE)), env=env, stdout=subprocess.PIPE, text=True)
            self.starts += 1
            threading.Thread(target=self._wait_listening, daemon=True).start()
            for line in self.proc.stdout:
                if line.startswith("FAULT "):
                    kind = line.split()[1]
                    with lock:
                        faults[kind] = faults.get(kind, 0) + 1
            self.proc.wait()

    def _wait_listening(self):
        for _ in range(600):
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    self.ready.set()
                    return
            except OSError:
                time.sleep(0.05)

    def kill9(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            return True
        return False

    def stop(self):
        with self.lock:
            self.stopping = True
            proc = self.proc
        if proc and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:  # a graceful shutdown that hangs
                proc.kill()
        self.thread.join(30)


def call_phase(port, url, started):
    """CALLS orders by CONCURRENCY threads through urllib3's own retries,
    the server killed now and then: (acknowledged, failures, skipped,
    server starts)."""
    server = Server(port, 0.15)
    retry = BoundedRetry(total=12, connect=12, read=12, status=12, other=0, allowed_methods=None,
                  status_forcelist={409, 503}, backoff_factor=0.1, raise_on_status=False,
                  respect_retry_after_header=True)
    http = urllib3.PoolManager(maxsize=CONCURRENCY, retries=retry, timeout=urllib3.Timeout(connect=2, read=2))

    def call(i):
        if time.monotonic() - started > TIME_BUDGET:
            return ("skipped", i, None)
        key = f"py-e2e-{os.getpid()}-{i}"
        body = json.dumps({"amount": 100 + i, "metadata": {"request_ts": time.time()}})
        try:
            r = http.request("POST", url, body=body, headers={
                "Content-Type": "application/json", "Idempotency-Key": f'"{key}"'})
        except Exception as err:  # retries exhausted
            return ("failed", key, repr(err))
        if r.status != 201:
            return ("failed", key, f"{r.status} {r.data[:200]!r}")
        return ("ok", key, (json.loads(r.data)["id"], r.headers.get("request-id"), 100 + i))

    stop_killer = threading.Event()

    def killer():
        kills = 0
        while kills < SERVER_KILLS and not stop_killer.wait(3.0):
            if server.kill9():
                kills += 1
                with lock:
                    faults["server_kill_9"] = kills
    threading.Thread(target=killer, daemon=True).start()
    with ThreadPoolExecutor(CONCURRENCY) as ex:
        results = list(ex.map(call, range(CALLS)))
    stop_killer.set()
    server.stop()
    print(f"calls done after {time.monotonic() - started:.1f} s", flush=True)
    acknowledged = {k: v for s, k, v in results if s == "ok"}
    failures = [f"{k}: {v}" for s, k, v in results if s == "failed"]
    skipped = sum(1 for s, _, _ in results if s == "skipped")
    return acknowledged, failures, skipped, server.starts


def replay_phase(port, url, acknowledged, problems):
    """No faults; every key again, with another (excluded) request_ts, the
    key bare; then one reused with another amount: (mismatched, replayed,
    reuse refused)."""
    server = Server(port, 0)
    plain = urllib3.PoolManager(retries=Retry(total=3, allowed_methods=None, status_forcelist={503}, backoff_factor=0.1),
                                timeout=urllib3.Timeout(connect=5, read=10))
    mismatched, replayed = 0, 0
    for key, (oid, request_id, amount) in acknowledged.items():
        r = plain.request("POST", url, body=json.dumps({"amount": amount, "metadata": {"request_ts": "later"}}),
                          headers={"Content-Type": "application/json", "Idempotency-Key": key})
        got = json.loads(r.data).get("id") if r.status == 201 else None
        if r.status != 201 or got != oid or r.headers.get("request-id") != request_id \
                or r.headers.get("idempotent-replayed") != "true":
            mismatched += 1
            problems.append(f"{key}: first {oid} {request_id}, replay {r.status} {got} {r.headers.get('request-id')}")
        else:
            replayed += 1
    some_key, (_, _, some_amount) = next(iter(acknowledged.items()))
    r = plain.request("POST", url, body=json.dumps({"amount": some_amount + 1}),
                      headers={"Content-Type": "application/json", "Idempotency-Key": some_key})
    reuse_refused = r.status == 422 and r.headers.get("content-type") == "application/problem+json"
    server.stop()
    return mismatched, replayed, reuse_refused


def check_database(acknowledged, problems):
    """(duplicates, acknowledged orders lost, keys not completed)."""
    with psycopg.connect(CONNINFO, autocommit=True) as db:
        dup = db.execute("SELECT idem_key FROM orders GROUP BY idem_key HAVING count(*) > 1").fetchall()
        by_key = dict(db.execute("SELECT idem_key, id FROM orders").fetchall())
        not_completed = db.execute("SELECT count(*) FROM idempotency.keys WHERE state <> 'completed'").fetchone()[0]
    lost = 0
    for key, (oid, _, _) in acknowledged.items():
        if by_key.get(key) != oid:
            lost += 1
            problems.append(f"{key}: acknowledged {oid}, database has {by_key.get(key)}")
    return len(dup), lost, not_completed


def main():
    started = time.monotonic()
    with psycopg.connect(CONNINFO, autocommit=True) as db:
        db.execute("CREATE TABLE orders (id text PRIMARY KEY, idem_key text NOT NULL, amount int NOT NULL)")
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/orders"
    acknowledged, failures, skipped, starts = call_phase(port, url, started)
    problems = []
    mismatched, replayed, reuse_refused = replay_phase(port, url, acknowledged, problems)
    duplicates, lost, not_completed = check_database(acknowledged, problems)
    fault_total = sum(faults.values())
    print(f"faults: {json.dumps(faults)}", flush=True)
    for p in problems[:20]:
        print(f"problem: {p}")
    for f in failures[:10]:
        print(f"unacknowledged: {f}")
    ok = (duplicates == 0 and lost == 0 and mismatched == 0 and reuse_refused and fault_total > 0
          and len(acknowledged) >= 0.95 * (CALLS - skipped))
    print(f"RESULT {'ok' if ok else 'FAILED'}: calls={CALLS - skipped} acknowledged={len(acknowledged)} "
          f"unacknowledged={len(failures)} faults={fault_total} server_starts={starts} duplicates={duplicates} "
          f"lost={lost} mismatched_replays={mismatched} replayed={replayed} reuse_refused={reuse_refused} "
          f"keys_not_completed={not_completed} seconds={time.monotonic() - started:.1f}")
    sys.stdout.flush()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
