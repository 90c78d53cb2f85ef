"""SQLAlchemy Core: engine.begin() opens the transaction, the claim and
the finish are text() statements on its connection, the business write a
Core insert on the same connection.  A recipe of doc/orm.md, run by
clients/test.sh python_orm (SQLAlchemy 1.4 on psycopg2, Debian 12's
python3-sqlalchemy and python3-psycopg2, in its 2.0 style); PGHOST,
PGPORT, PGDATABASE, PGUSER name the database.

    python3 examples/orm/python/sqlalchemy_core.py
"""
import json
import os

from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, create_engine, func, select, text

metadata = MetaData()
orders = Table("orm_sqlalchemy_core_orders", metadata,
               Column("id", BigInteger, primary_key=True),
               Column("amount", Integer, nullable=False))
TENANT = "acct_demo"
ENDPOINT = "POST /orders"
CLAIM = text("SELECT action, http_status, response_json FROM idempotency.idem_claim(:tenant, :endpoint, :key,"
             " idempotency.idem_fingerprint('POST', '/orders', CAST(:body AS jsonb)))")
FINISH = text("SELECT idempotency.idem_finish(:tenant, :endpoint, :key, 201, CAST(:body AS jsonb))")


def create_order(engine, key, order, fail_after_write=False):
    """One request: the answer to send, (status, body, replayed)."""
    scope = {"tenant": TENANT, "endpoint": ENDPOINT, "key": key}
    with engine.begin() as conn:  # commits at the end of the block, rolls back on an exception
        claim = conn.execute(CLAIM, dict(scope, body=json.dumps(order))).one()
        if claim.action != "execute":
            return claim.http_status, claim.response_json, claim.action == "replay"
        order_id = conn.execute(orders.insert().values(amount=order["amount"]).returning(orders.c.id)).scalar_one()
        if fail_after_write:
            raise RuntimeError("the handler failed after its write")
        body = {"id": order_id}
        conn.execute(FINISH, dict(scope, body=json.dumps(body)))
        return 201, body, False


def main():
    engine = create_engine("postgresql+psycopg2://", future=True)  # no URL: libpq's PG* variables
    metadata.create_all(engine)

    def count():
        with engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(orders)).scalar_one()

    before = count()
    key = f"order-{os.getpid()}-{os.urandom(4).hex()}"
    first = create_order(engine, key, {"amount": 4200})
    assert first[0] == 201 and count() == before + 1, first

    again = create_order(engine, key, {"amount": 4200})  # the retry
    assert again == (201, first[1], True), again
    assert count() == before + 1, "the replay wrote a second order"

    try:
        create_order(engine, key + "-b", {"amount": 100}, fail_after_write=True)
        raise AssertionError("the failing request did not fail")
    except RuntimeError:
        pass
    assert count() == before + 1, "the rolled back request left its order"
    retried = create_order(engine, key + "-b", {"amount": 100})  # its key was given back
    assert retried[2] is False and count() == before + 2, retried
    engine.dispose()
    print("ok - sqlalchemy_core: executed, replayed, rolled back leaving nothing")


if __name__ == "__main__":
    main()
