"""Header parsing, key policy, form mapping, fingerprint input, intervals
and profile answers: no database.  The expected values are those of
clients/vectors/expected.json, which the Node client's tests read too, so
that both clients read keys, fingerprint bodies and answer alike."""

import json
import os
import unittest
from typing import Any, Dict

from idempotency_asgi import (BodyError, IdempotencyKeyError, answer, apply_key_policy, fingerprint_body,
                              form_to_json, interval_seconds, parse_key_header)
from idempotency_asgi.profiles import OUTCOMES

VECTORS = os.path.join(os.path.dirname(__file__), "..", "..", "vectors", "expected.json")
with open(VECTORS, encoding="utf-8") as f:
    V: Dict[str, Any] = json.load(f)


def headers(value: Any) -> Any:
    """A vector's header: one value, or (a list) several headers."""
    return value if isinstance(value, list) else [value]


class Pure(unittest.TestCase):
    def test_header(self) -> None:
        self.assertEqual(parse_key_header([]), V["key_header"]["absent"])
        for header, key in V["key_header"]["valid"]:
            self.assertEqual(parse_key_header(headers(header)), key, repr(header))
        for bad in V["key_header"]["invalid"]:
            with self.assertRaises(IdempotencyKeyError, msg=repr(bad)):
                parse_key_header(headers(bad))

    def test_key_policy(self) -> None:
        for key in V["key_policy"]["within"]:
            self.assertEqual(apply_key_policy(key, "refuse"), key)
            self.assertEqual(apply_key_policy(key, "hash"), key)
        for key in V["key_policy"]["outside"]:
            with self.assertRaises(IdempotencyKeyError, msg=key):
                apply_key_policy(key, "refuse")
        for key, mapped in V["key_policy"]["hash"]:
            self.assertEqual(apply_key_policy(key, "hash"), mapped, key)
            self.assertRegex(mapped, r"^h_[A-Za-z0-9_-]{43}$")

    def test_form(self) -> None:
        for form, expected in V["form"]["valid"]:
            self.assertEqual(form_to_json(form), expected, form)
        for bad in V["form"]["invalid"]:
            with self.assertRaises(BodyError, msg=bad):
                form_to_json(bad)

    def test_fingerprint(self) -> None:
        for v in V["fingerprint"]["valid"]:
            text, _ = fingerprint_body(v["content_type"], v["body"].encode())
            self.assertEqual(None if text is None else json.loads(text), v["json"], repr(v))
        for v in V["fingerprint"]["invalid"]:
            with self.assertRaises(BodyError, msg=repr(v)):
                fingerprint_body(v["content_type"], v["body"].encode())

    def test_intervals(self) -> None:
        for text, seconds in V["intervals"]["seconds"]:
            self.assertEqual(interval_seconds(text), seconds, repr(text))
        for bad in V["intervals"]["invalid"]:
            with self.assertRaises(ValueError, msg=bad):
                interval_seconds(bad)

    def test_profiles(self) -> None:
        self.assertEqual(sorted(V["answers"]), sorted(OUTCOMES), "the vectors name every outcome")
        for outcome, by_profile in V["answers"].items():
            for profile, expected in by_profile.items():
                status, hdrs, body = answer(profile, outcome)
                self.assertEqual({"status": status, "headers": hdrs, "body": body}, expected, f"{profile} {outcome}")

    def test_answer_cases(self) -> None:
        for c in V["answer_cases"]:
            status, hdrs, body = answer(c["profile"], c["outcome"], **c["options"])
            what, stripe = repr(c), c["profile"] == "stripe"
            part = body["error"] if stripe else body
            if "status" in c:
                self.assertEqual(status, c["status"], what)
            if "headers" in c:
                self.assertEqual(hdrs, c["headers"], what)
            if "body" in c:
                self.assertEqual(body, c["body"], what)
            if "body_code" in c:
                self.assertEqual(part["code"], c["body_code"], what)
            if "message" in c:
                self.assertEqual(part["message" if stripe else "detail"], c["message"], what)
            if "body_mismatch" in c:
                self.assertEqual(part.get("mismatch"), c["body_mismatch"], what)


if __name__ == "__main__":
    unittest.main()
