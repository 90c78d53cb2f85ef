"""SQLAlchemy ORM: one Session transaction (session.begin()) holds the
claim, the mapped object's insert (flushed to get its id) and the finish.
A recipe of doc/orm.md, run by clients/test.sh python_orm (SQLAlchemy 1.4
on psycopg2, Debian 12's packages, in its 2.0 style); PGHOST, PGPORT,
PGDATABASE, PGUSER name the database.

    python3 examples/orm/python/sqlalchemy_orm.py
"""
import json
import os

from sqlalchemy import BigInteger, Column, Integer, create_engine, func, select, text
from sqlalchemy.orm import Session, declarative_base

Base = declarative_base()


class Order(Base):
    __tablename__ = "orm_sqlalchemy_orm_orders"
    id = Column(BigInteger, primary_key=True)
    amount = Column(Integer, nullable=False)


TENANT = "acct_demo"
ENDPOINT = "POST /orders"
CLAIM = text("SELECT action, http_status, response_json FROM idempotency.idem_claim(:tenant, :endpoint, :key,"
             " idempotency.idem_fingerprint('POST', '/orders', CAST(:body AS jsonb)))")
FINISH = text("SELECT idempotency.idem_finish(:tenant, :endpoint, :key, 201, CAST(:body AS jsonb))")


def create_order(engine, key, order, fail_after_write=False):
    """One request: the answer to send, (status, body, replayed)."""
    scope = {"tenant": TENANT, "endpoint": ENDPOINT, "key": key}
    with Session(engine, future=True) as session, session.begin():  # commit at the end, rollback on an exception
        claim = session.execute(CLAIM, dict(scope, body=json.dumps(order))).one()
        if claim.action != "execute":
            return claim.http_status, claim.response_json, claim.action == "replay"
        row = Order(amount=order["amount"])
        session.add(row)
        session.flush()  # the INSERT, in the claim's transaction: row.id is known
        if fail_after_write:
            raise RuntimeError("the handler failed after its write")
        body = {"id": row.id}
        session.execute(FINISH, dict(scope, body=json.dumps(body)))
        return 201, body, False


def main():
    engine = create_engine("postgresql+psycopg2://", future=True)  # no URL: libpq's PG* variables
    Base.metadata.create_all(engine)

    def count():
        with Session(engine, future=True) as session:
            return session.execute(select(func.count()).select_from(Order)).scalar_one()

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
    print("ok - sqlalchemy_orm: executed, replayed, rolled back leaving nothing")


if __name__ == "__main__":
    main()
