"""The retry helper against every vector of clients/vectors/retry.json
(shared with the Node client), and with_retry / with_retry_sync driven by
scripted answers (no network, no database)."""

import asyncio
import json
import os
import unittest
from typing import Any, Dict, List, Optional

from idempotency_asgi.retry import (FINAL_STATE, backoff_delay, backoff_max, classify, decide, parse_retry_after,
                                    with_retry, with_retry_sync)

VECTORS_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "vectors", "retry.json")
with open(VECTORS_PATH, encoding="utf-8") as f:
    VECTORS = json.load(f)


class Answer:
    def __init__(self, status: int, headers: Optional[Dict[str, str]] = None) -> None:
        self.status_code, self.headers = status, headers or {}


class Vectors(unittest.TestCase):
    def test_classify(self) -> None:
        self.assertGreater(len(VECTORS["classify"]), 20)
        for case in VECTORS["classify"]:
            with self.subTest(case=case):
                self.assertEqual(classify(status=case.get("status"), error=case.get("error")), case["kind"])

    def test_classify_exceptions(self) -> None:
        self.assertEqual(classify(error=ConnectionResetError()), "retry")
        self.assertEqual(classify(error=asyncio.TimeoutError()), "retry")
        self.assertEqual(classify(error=ValueError("a bug")), "fatal")

    def test_retry_after(self) -> None:
        ra = VECTORS["retry_after"]
        for case in ra["cases"]:
            with self.subTest(case=case):
                self.assertEqual(parse_retry_after(case["header"], ra["now"]), case["ms"])

    def test_backoff_bounds(self) -> None:
        b = VECTORS["backoff"]
        for case in b["cases"]:
            with self.subTest(case=case):
                self.assertEqual(backoff_max(case["attempts"], b["base_ms"], b["cap_ms"]), case["max_ms"])
                self.assertEqual(backoff_delay(case["attempts"], b["base_ms"], b["cap_ms"], lambda: 0.0), 0)
                top = backoff_delay(case["attempts"], b["base_ms"], b["cap_ms"], lambda: 0.999999)
                self.assertLessEqual(top, case["max_ms"])
                self.assertGreater(top, case["max_ms"] * 0.99)

    def test_outcome_when_retries_end(self) -> None:
        ends = {k: v for k, v in VECTORS["outcome_when_retries_end"].items() if k != "about"}
        self.assertEqual(ends, FINAL_STATE)
        for kind, state in ends.items():
            with self.subTest(kind=kind):
                d = decide(kind, attempts=3, elapsed_ms=0, max_attempts=3, can_refresh=True)
                self.assertEqual(d.outcome, state)


class Decide(unittest.TestCase):
    def test_retry_after_replaces_backoff_within_total(self) -> None:
        d = decide("retry", attempts=1, elapsed_ms=0, retry_after_ms=5000, random=lambda: 0.5)
        self.assertEqual((d.outcome, d.delay_ms), ("retry", 5000))
        d = decide("wait", attempts=1, elapsed_ms=0, retry_after_ms=None, random=lambda: 0.5)
        self.assertEqual((d.outcome, d.delay_ms), ("retry", 50))
        # a Retry-After beyond the total time ends the retries: unknown outcome
        d = decide("retry", attempts=1, elapsed_ms=1000, retry_after_ms=60000, max_total_ms=30000)
        self.assertEqual(d.outcome, "attention")

    def test_never_retried(self) -> None:
        for kind, state in (("new_key", "failed"), ("fatal", "failed"), ("success", "succeeded")):
            self.assertEqual(decide(kind, attempts=1, elapsed_ms=0).outcome, state)
        self.assertEqual(decide("refresh", attempts=1, elapsed_ms=0).outcome, "attention")
        self.assertEqual(decide("refresh", attempts=1, elapsed_ms=0, can_refresh=True).outcome, "retry")


class WithRetry(unittest.TestCase):
    def script(self, answers: List[Any]) -> Any:
        seen: List[Any] = []

        def send(key: str, attempt: int) -> Any:
            seen.append((key, attempt))
            a = answers[attempt - 1]
            if isinstance(a, BaseException):
                raise a
            return a
        return send, seen

    def test_same_key_until_success_honouring_retry_after(self) -> None:
        send, seen = self.script([Answer(503), ConnectionResetError(), Answer(429, {"retry-after": "2"}),
                                  asyncio.TimeoutError(), Answer(201)])
        slept: List[float] = []
        out = with_retry_sync(send, key="k-1", sleep=slept.append, random=lambda: 0.5)
        self.assertEqual((out.state, out.kind, out.attempts, out.response.status_code), ("succeeded", "success", 5, 201))
        self.assertEqual({k for k, _ in seen}, {"k-1"})
        self.assertEqual(slept, [0.05, 0.1, 2.0, 0.4])

    def test_422_and_400_never_retried(self) -> None:
        for status, state in ((422, "failed"), (400, "failed"), (404, "failed")):
            send, seen = self.script([Answer(status), Answer(201)])
            out = with_retry_sync(send, sleep=lambda s: None)
            self.assertEqual((out.state, out.attempts, len(seen)), (state, 1, 1), status)

    def test_bounded_attempts_end_in_attention(self) -> None:
        send, seen = self.script([Answer(500)] * 10)
        out = with_retry_sync(send, max_attempts=4, sleep=lambda s: None)
        self.assertEqual((out.state, out.kind, len(seen)), ("attention", "retry", 4))
        self.assertEqual(len({k for k, _ in seen}), 1)

    def test_bounded_total_time(self) -> None:
        now = [0.0]
        send, seen = self.script([Answer(503, {"Retry-After": "30"})] * 10)
        out = with_retry_sync(send, max_total=65, sleep=lambda s: now.__setitem__(0, now[0] + s),
                              clock=lambda: now[0])
        self.assertEqual((out.state, len(seen)), ("attention", 3))

    def test_refresh_then_same_key(self) -> None:
        send, seen = self.script([Answer(401), Answer(409), Answer(200)])
        refreshed: List[int] = []
        out = with_retry_sync(send, refresh=lambda: refreshed.append(1), sleep=lambda s: None)
        self.assertEqual((out.state, refreshed, len({k for k, _ in seen})), ("succeeded", [1], 1))

    def test_a_bug_is_raised(self) -> None:
        send, _ = self.script([KeyError("bug")])
        with self.assertRaises(KeyError):
            with_retry_sync(send, sleep=lambda s: None)

    def test_async(self) -> None:
        answers = [Answer(409, {"Retry-After": "1"}), Answer(200)]
        slept: List[float] = []

        async def send(key: str, attempt: int) -> Any:
            return answers[attempt - 1]

        async def sleep(s: float) -> None:
            slept.append(s)

        async def refresh() -> None:
            pass
        out = asyncio.run(with_retry(send, key="k-2", sleep=sleep, refresh=refresh))
        self.assertEqual((out.state, out.key, out.attempts, slept), ("succeeded", "k-2", 2, [1.0]))


if __name__ == "__main__":
    unittest.main()
