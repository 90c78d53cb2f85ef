"""A typed FastAPI payments API on idempotency_asgi: POST /v1/charges takes
an Idempotency-Key (IETF style here), writes the charge in the claim's
transaction, and a retry with the same key gets the same answer.

Environment: libpq's (PGHOST, PGPORT, PGDATABASE, PGUSER)."""

from contextlib import asynccontextmanager
from typing import AsyncIterator, Dict

from fastapi import BackgroundTasks, Depends, FastAPI
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from idempotency_asgi import Context, IdempotencyMiddleware, idempotency

pool = AsyncConnectionPool("", min_size=1, max_size=20, open=False)


def tenant(scope: Dict[str, object]) -> str:
    """The authenticated account; a fixed one in this example."""
    return "acct_demo"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The pool is opened when the application starts, closed when it stops."""
    async with pool:
        yield


app = FastAPI()
# FastAPI 0.93 and later: FastAPI(lifespan=lifespan) does the same (Debian
# 12's 0.92 ignores that argument)
app.router.lifespan_context = lifespan
# only the routes that depend on idempotency claim a key (and take a
# connection); their endpoint is the route template FastAPI matched
app.add_middleware(IdempotencyMiddleware, pool=pool, tenant=tenant, profile="ietf",
                   exclude=["/metadata/request_ts"], wait="5 seconds", ttl="1 day")


class Charge(BaseModel):
    amount: int
    currency: str


async def write_receipt(charge_id: str) -> None:
    """A background task: it runs after the commit, once the response is sent,
    on a connection of its own."""
    async with pool.connection() as conn:
        await conn.execute("INSERT INTO shop_receipts (charge_id) VALUES (%s)", (charge_id,))


@app.post("/v1/charges")
async def create_charge(charge: Charge, tasks: BackgroundTasks,
                        ctx: Context = Depends(idempotency)) -> JSONResponse:
    if charge.amount <= 0:
        return JSONResponse({"title": "amount must be positive"}, status_code=400)
    # ctx.conn: inside the claim's transaction
    cur = await ctx.conn.execute(
        "INSERT INTO shop_charges (amount, currency) VALUES (%s, %s) RETURNING id", (charge.amount, charge.currency))
    row = await cur.fetchone()
    if row is None:
        raise RuntimeError("no row returned")
    tasks.add_task(write_receipt, str(row[0]))
    return JSONResponse({"id": str(row[0]), "object": "charge", "amount": charge.amount, "currency": charge.currency})
