"""Header parsing, key policy, form mapping and profile answers: no database.
The expected values are the Node client's, so that both fingerprint alike."""

import hashlib
import base64
import json
import unittest

from idempotency_asgi import (BodyError, IdempotencyKeyError, answer, apply_key_policy, form_to_json,
                              interval_seconds, parse_key_header)


class Pure(unittest.TestCase):
    def test_header(self):
        self.assertIsNone(parse_key_header([]))
        self.assertEqual(parse_key_header(["  abc-123 "]), "abc-123")
        self.assertEqual(parse_key_header(['"abc-123"']), "abc-123")
        self.assertEqual(parse_key_header(['"a\\"b\\\\c"']), 'a"b\\c')
        self.assertEqual(parse_key_header(["order:1"]), "order:1")
        for bad in [[""], ['""'], ['"abc'], ['"a"b'], ['"a\\b"'], ['"\u00e9"'], ["a", "b"]]:
            with self.assertRaises(IdempotencyKeyError, msg=repr(bad)):
                parse_key_header(bad)

    def test_key_policy(self):
        self.assertEqual(apply_key_policy("stripe-node-retry-7f3c", "refuse"), "stripe-node-retry-7f3c")
        with self.assertRaises(IdempotencyKeyError):
            apply_key_policy("order:1", "refuse")
        with self.assertRaises(IdempotencyKeyError):
            apply_key_policy("x" * 256, "refuse")
        expected = "h_" + base64.urlsafe_b64encode(hashlib.sha256(b"order:1").digest()).decode().rstrip("=")
        self.assertEqual(apply_key_policy("order:1", "hash"), expected)
        self.assertRegex(expected, r"^h_[A-Za-z0-9_-]{43}$")

    def test_form(self):
        j = lambda s: json.dumps(form_to_json(s), separators=(",", ":"), ensure_ascii=False)
        self.assertEqual(j(""), "{}")
        self.assertEqual(j("amount=1000&currency=usd"), '{"amount":"1000","currency":"usd"}')
        self.assertEqual(j("metadata[order_id]=6735&metadata[request_ts]=17"),
                         '{"metadata":{"order_id":"6735","request_ts":"17"}}')
        self.assertEqual(j("expand[]=customer&expand[]=invoice"), '{"expand":["customer","invoice"]}')
        self.assertEqual(j("a=1&a=2"), '{"a":["1","2"]}')
        self.assertEqual(j("items[0][price]=p1&items[1][price]=p2"),
                         '{"items":{"0":{"price":"p1"},"1":{"price":"p2"}}}')
        self.assertEqual(j("items[][price]=p1&items[][price]=p2"), '{"items":[{"price":"p1"},{"price":"p2"}]}')
        self.assertEqual(j("name=J%C3%B6rg+M&flag"), '{"name":"Jörg M","flag":""}')
        for bad in ["a=1&a[b]=2", "a[b]=1&a=2", "a[]=1&a[b]=2", "a=%E0%A4%A"]:
            with self.assertRaises(BodyError, msg=bad):
                form_to_json(bad)

    def test_profiles(self):
        self.assertEqual(answer("stripe", "mismatch")[0], 400)
        self.assertEqual(answer("stripe", "mismatch")[2]["error"]["type"], "idempotency_error")
        self.assertEqual(answer("stripe", "mismatch")[1]["Stripe-Should-Retry"], "false")
        self.assertEqual(answer("ietf", "mismatch")[0], 422)
        self.assertEqual(answer("ietf", "mismatch")[1]["Content-Type"], "application/problem+json")
        s, h, _ = answer("stripe", "in_progress", retry_after=2)
        self.assertEqual((s, h["Retry-After"], h["Stripe-Should-Retry"]), (409, "2", "true"))
        self.assertEqual(answer("stripe", "pending")[1]["Stripe-Should-Retry"], "false")
        self.assertEqual(answer("stripe", "unavailable")[0], 503)
        self.assertEqual(answer("ietf", "key_missing")[0], 400)

    def test_intervals(self):
        self.assertEqual(interval_seconds("30 seconds"), 30)
        self.assertEqual(interval_seconds("500 ms"), 0.5)
        self.assertEqual(interval_seconds("2 min"), 120)
        with self.assertRaises(ValueError):
            interval_seconds("tomorrow")

    def test_mismatch_answer(self):
        m = {"changed": ["/amount"], "added": [], "removed": ["/metadata/trace_id"], "method": False,
             "path": True, "truncated": False}
        st = answer("stripe", "mismatch", code="idempotency_key_reuse", mismatch=m)
        self.assertEqual(st[2]["error"]["message"], "This Idempotency-Key was used with a different request "
                         "(the path differs; changed: /amount; removed: /metadata/trace_id).")
        self.assertEqual(st[2]["error"]["mismatch"], m)
        ie = answer("ietf", "mismatch", mismatch={"changed": [""], "added": [], "removed": [], "method": None,
                                                  "path": None, "truncated": True})
        self.assertEqual(ie[2]["detail"], "This Idempotency-Key was used with a different request "
                         "(changed: the whole body; within the members named).")
        self.assertEqual(ie[0], 422)
        self.assertNotIn("mismatch", answer("ietf", "mismatch", mismatch=None)[2])


if __name__ == "__main__":
    unittest.main()
