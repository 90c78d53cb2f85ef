"""What the Python client's tests against a database share (tests/test_*.py):
the cluster clients/test.sh gives them (IDEM_TEST_PGHOST, IDEM_TEST_PGPORT,
IDEM_TEST_PGUSER, IDEM_TEST_PGDATABASE), the reason they are skipped
without it, pools on it, and DatabaseCase: a pool and an admin connection
opened before each test and closed after it.  The Node tests have the same
in test/support.js.  Not a test file itself (unittest discovers test_*.py)."""

import os
import unittest
from typing import Any, Optional, Sequence

import psycopg
from psycopg_pool import AsyncConnectionPool

CONNINFO = psycopg.conninfo.make_conninfo(
    host=os.environ.get("IDEM_TEST_PGHOST", "127.0.0.1"), port=os.environ.get("IDEM_TEST_PGPORT"),
    user=os.environ.get("IDEM_TEST_PGUSER"), dbname=os.environ.get("IDEM_TEST_PGDATABASE"))
#: a server that is not there (port 1): the pool's connections fail
DEAD_CONNINFO = CONNINFO + " port=1"
HAVE_DB = bool(os.environ.get("IDEM_TEST_PGPORT"))
NO_DB = "IDEM_TEST_PGPORT not set"
#: a test case or test that needs the cluster, skipped (and counted so) without it
needs_db = unittest.skipUnless(HAVE_DB, NO_DB)


def new_pool(max_size: int, conninfo: str = CONNINFO, min_size: int = 1, **kw: Any) -> AsyncConnectionPool:
    """A pool on the test database, not opened yet."""
    return AsyncConnectionPool(conninfo, min_size=min_size, max_size=max_size, open=False, **kw)


async def open_pool(max_size: int, **kw: Any) -> AsyncConnectionPool:
    """A pool on the test database, opened."""
    pool = new_pool(max_size, **kw)
    await pool.open()
    return pool


class DatabaseCase(unittest.IsolatedAsyncioTestCase):
    """Per test: self.pool (pool_size connections, opened) and, with
    with_admin, self.admin (an autocommit connection on which setup_sql
    runs first); both closed after the test.  A subclass's asyncSetUp
    calls super().asyncSetUp() first, its asyncTearDown
    super().asyncTearDown() last."""

    pool_size = 4
    with_admin = True
    setup_sql: Sequence[str] = ()

    async def asyncSetUp(self) -> None:
        self.pool = await open_pool(self.pool_size)
        if self.with_admin:
            self.admin = await psycopg.AsyncConnection.connect(CONNINFO, autocommit=True)
            for sql in self.setup_sql:
                await self.admin.execute(sql)

    async def asyncTearDown(self) -> None:
        await self.pool.close()
        if self.with_admin:
            await self.admin.close()

    async def key_state(self, key: str) -> Optional[str]:
        """The state of a key in idempotency.keys, None when it has no row."""
        cur = await self.admin.execute("SELECT state::text FROM idempotency.keys WHERE key = %s", (key,))
        row = await cur.fetchone()
        return None if row is None else str(row[0])
