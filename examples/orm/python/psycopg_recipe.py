"""psycopg 3: the claim, the business write and the finish on one
connection, in one transaction (conn.transaction()).  A recipe of
doc/orm.md, run by clients/test.sh python_orm; PGHOST, PGPORT, PGDATABASE,
PGUSER name the database.

    python3 examples/orm/python/psycopg_recipe.py
"""
import os

import psycopg
from psycopg.types.json import Jsonb

TENANT = "acct_demo"
ENDPOINT = "POST /orders"


def create_order(conn, key, order, fail_after_write=False):
    """One request: the answer to send, (status, body, replayed)."""
    with conn.transaction():  # commits at the end of the block, rolls back on an exception
        action, status, stored = conn.execute(
            "SELECT action, http_status, response_json FROM idempotency.idem_claim(%s, %s, %s,"
            " idempotency.idem_fingerprint('POST', '/orders', %s))",
            (TENANT, ENDPOINT, key, Jsonb(order))).fetchone()
        if action != "execute":  # replay, in_progress, mismatch, ...: answer what the claim says
            return status, stored, action == "replay"
        (order_id,) = conn.execute("INSERT INTO orm_psycopg_orders (amount) VALUES (%s) RETURNING id",
                                   (order["amount"],)).fetchone()
        if fail_after_write:
            raise RuntimeError("the handler failed after its write")
        body = {"id": order_id}
        conn.execute("SELECT idempotency.idem_finish(%s, %s, %s, 201, %s)", (TENANT, ENDPOINT, key, Jsonb(body)))
        return 201, body, False


def main():
    with psycopg.connect("", autocommit=True) as conn:  # "": libpq's PG* variables
        conn.execute("CREATE TABLE IF NOT EXISTS orm_psycopg_orders"
                     " (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount integer NOT NULL)")

        def orders():
            return conn.execute("SELECT count(*) FROM orm_psycopg_orders").fetchone()[0]

        before = orders()
        key = f"order-{os.getpid()}-{os.urandom(4).hex()}"
        first = create_order(conn, key, {"amount": 4200})
        assert first[0] == 201 and orders() == before + 1, first

        again = create_order(conn, key, {"amount": 4200})  # the retry
        assert again == (201, first[1], True), again
        assert orders() == before + 1, "the replay wrote a second order"

        try:
            create_order(conn, key + "-b", {"amount": 100}, fail_after_write=True)
            raise AssertionError("the failing request did not fail")
        except RuntimeError:
            pass
        assert orders() == before + 1, "the rolled back request left its order"
        retried = create_order(conn, key + "-b", {"amount": 100})  # its key was given back
        assert retried[2] is False and orders() == before + 2, retried
    print("ok - psycopg: executed, replayed, rolled back leaving nothing")


if __name__ == "__main__":
    main()
