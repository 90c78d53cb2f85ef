#!/usr/bin/env bash
# The FastAPI example in one command: builds the wheel of clients/python
# (python3 -m build, without network: Debian's setuptools), installs it into
# a fresh virtual environment in a temporary folder outside the checkout
# (with the system's site-packages: Debian's psycopg, psycopg_pool,
# starlette, fastapi), checks app.py with mypy --strict, sets up the
# database (../http_setup.sql) and serves the API with uvicorn on
# 127.0.0.1:${PORT:-8000}.
#
#   examples/fastapi/run.sh            against `make run`'s cluster (database demo)
#   examples/fastapi/run.sh --test     also checks the wheel, sends requests, stops
#
# PGHOST, PGPORT, PGDATABASE, PGUSER name another database (a superuser for the
# set-up; the API itself connects as role shop_api).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
MODE=${1:-run}
PY=/usr/bin/python3
say() { echo "==> $*" >&2; }
fail() { echo "FAILED: $*" >&2; exit 1; }

if [ -z "${PGPORT:-}" ]; then
    [ -f "$ROOT/build/run/port" ] || fail "no cluster: start one with make run (or set PGPORT)"
    export PGPORT=$(cat "$ROOT/build/run/port")
fi
export PGHOST=${PGHOST:-127.0.0.1} PGDATABASE=${PGDATABASE:-demo}
if [ -z "${PGUSER:-}" ]; then
    if [ "$(id -u)" = 0 ]; then export PGUSER=postgres; else export PGUSER=$(id -un); fi
fi

WORK=$(mktemp -d /tmp/idem-example-fastapi.XXXXXX)
SERVER=
cleanup() { [ -z "$SERVER" ] || kill "$SERVER" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

say "building the wheel of clients/python"
mkdir "$WORK/src"
cp -r "$ROOT/clients/python/pyproject.toml" "$ROOT/clients/python/README.md" "$ROOT/clients/python/idempotency_asgi" "$WORK/src/"
find "$WORK/src" -name __pycache__ -prune -exec rm -rf {} +
if [ -f "$ROOT/LICENSE" ]; then
    cp "$ROOT/LICENSE" "$WORK/src/"
else
    echo "skipped: the LICENSE in the wheel (no LICENSE at the repository root)"
    sed -i '/^license-files/d' "$WORK/src/pyproject.toml"
fi
$PY -m build --wheel --no-isolation --outdir "$WORK/dist" "$WORK/src" >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; fail "wheel build"; }
WHEEL=$(ls "$WORK"/dist/idempotency_asgi-*.whl)
if [ "$MODE" = --test ]; then
    $PY - "$WHEEL" "$ROOT" <<'PYEOF'
import email.parser, os, sys, zipfile
wheel, root = sys.argv[1], sys.argv[2]
z = zipfile.ZipFile(wheel)
names = z.namelist()
def need(cond, what):
    if not cond:
        print(f"FAILED: the wheel: {what}"); sys.exit(1)
need("idempotency_asgi/py.typed" in names, "no py.typed")
need(not any(n.startswith("tests/") for n in names), "the tests are in it")
meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
meta = email.parser.Parser().parsestr(z.read(meta_name).decode())
need(meta["Version"] == "0.4.0", f"version {meta['Version']}")
need(meta["License"] == "PostgreSQL", "license")
need(meta["Requires-Python"], "Requires-Python")
need(meta.get_payload().strip().startswith("# idempotency-asgi"), "the README as its description")
reqs = meta.get_all("Requires-Dist") or []
need(any(r.startswith("psycopg") for r in reqs) and any(r.startswith("starlette") for r in reqs), f"dependencies {reqs}")
need("Typing :: Typed" in (meta.get_all("Classifier") or []), "Typing :: Typed")
if os.path.exists(os.path.join(root, "LICENSE")):
    lic = [n for n in names if n.endswith(".dist-info/LICENSE")]
    need(lic and z.read(lic[0]) == open(os.path.join(root, "LICENSE"), "rb").read(), "LICENSE")
print("ok - the wheel's content and metadata")
PYEOF
fi

say "fresh virtual environment in $WORK/venv"
$PY -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/pip" install --no-index --quiet "$WHEEL"
mkdir "$WORK/app"
cp "$HERE/app.py" "$WORK/app/"
cd "$WORK/app"
"$WORK/venv/bin/python" -c 'import idempotency_asgi, sys; sys.exit(0 if "/venv/" in idempotency_asgi.__file__ else 1)' ||
    fail "idempotency_asgi is not imported from the installed wheel"
say "mypy --strict"
mypy --strict --python-executable "$WORK/venv/bin/python" --cache-dir "$WORK/mypy-cache" app.py
echo "ok - mypy --strict passes the typed example"

say "database set-up (examples/http_setup.sql)"
PGOPTIONS="-c client_min_messages=warning" psql -X -q -v ON_ERROR_STOP=1 -f "$ROOT/examples/http_setup.sql" >/dev/null

if [ "$MODE" != --test ]; then
    say "serving on 127.0.0.1:${PORT:-8000} (Ctrl-C stops)"
    PGUSER=shop_api exec "$WORK/venv/bin/python" -m uvicorn app:app --host 127.0.0.1 --port "${PORT:-8000}"
fi

PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
PGUSER=shop_api "$WORK/venv/bin/python" -m uvicorn app:app --host 127.0.0.1 --port "$PORT" >"$WORK/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 100); do grep -q 'Uvicorn running' "$WORK/server.log" && break; sleep 0.1; done
grep -q 'Uvicorn running' "$WORK/server.log" || { cat "$WORK/server.log"; fail "the server did not start"; }
CHARGE=$(BASE=http://127.0.0.1:$PORT $PY "$HERE/check.py" | tee "$WORK/check.log" | sed -n 's/^CHARGE //p') || true
cat "$WORK/check.log"
[ -n "$CHARGE" ] || { cat "$WORK/server.log"; fail "requests"; }
N=$(psql -X -qtA -c "SELECT count(*) FROM shop_charges WHERE id = '$CHARGE'")
[ "$N" = 1 ] || fail "charge $CHARGE has $N rows"
echo "ok - one row for the charge"
for _ in $(seq 50); do
    [ "$(psql -X -qtA -c "SELECT count(*) FROM shop_receipts WHERE charge_id = '$CHARGE'")" = 1 ] && break; sleep 0.1
done
[ "$(psql -X -qtA -c "SELECT count(*) FROM shop_receipts WHERE charge_id = '$CHARGE'")" = 1 ] || fail "no receipt after the commit"
echo "ok - the receipt written once by the background task"
echo "RESULT example fastapi passed"
