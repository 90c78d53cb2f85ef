"""psycopg's own prepared statements behind PgBouncer's transaction mode,
for test/t/057_pgbouncer.pl: a query run 6 times on a connection is
prepared there (prepare_threshold, 5 by default); when the next run gets
another server connection (a transaction of another client holds the one
it used), a PgBouncer before 1.21 has no such statement there.  With
prepare_threshold=None nothing is prepared.

    python3 prepare_threshold.py CONNINFO

Prints "default: ok|ERROR" and "none: ok|ERROR"."""
import sys
from typing import Any, Dict

import psycopg


def run(conninfo: str, kwargs: Dict[str, Any]) -> str:
    with psycopg.connect(conninfo, autocommit=True, **kwargs) as conn, \
            psycopg.connect(conninfo, autocommit=True) as other:
        for i in range(6):
            conn.execute("SELECT %s::int", (i,))
        other.execute("BEGIN")
        other.execute("SELECT 1")  # holds the server connection conn used last
        try:
            conn.execute("SELECT %s::int", (6,))
            return "ok"
        except psycopg.Error as err:
            return f"{type(err).__name__}: {err}"
        finally:
            other.execute("COMMIT")


print("default:", run(sys.argv[1], {}), flush=True)
print("none:", run(sys.argv[1], {"prepare_threshold": None}), flush=True)
