"""What run.sh --test asks the example API (BASE): a charge, its retry with
the same key (a replay of the same answer), the same key with another
amount (refused).  Prints the charge id for the row count; exits non-zero
on the first answer that is not as expected."""

import json
import os
import sys
import urllib.error
import urllib.request
import uuid

BASE = os.environ["BASE"]
KEY = f"example-{uuid.uuid4().hex}"


def post(body: dict, key: str = KEY) -> tuple:
    req = urllib.request.Request(f"{BASE}/v1/charges", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Idempotency-Key": f'"{key}"'})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def expect(cond: bool, what: str) -> None:
    if not cond:
        print(f"not ok - {what}")
        sys.exit(1)
    print(f"ok - {what}")


status, _, first = post({"amount": 1500, "currency": "eur"})
expect(status == 200, f"first call: 200 (got {status} {first!r})")
status, headers, again = post({"amount": 1500, "currency": "eur"})
expect(status == 200 and again == first, "retry: the same answer, byte for byte")
expect(headers.get("idempotent-replayed") == "true", "retry: Idempotent-Replayed: true")
status, _, other = post({"amount": 9999, "currency": "eur"})
expect(status == 422 and json.loads(other).get("mismatch") is not None, "same key, other amount: 422 problem")
print(f"CHARGE {json.loads(first)['id']}")
