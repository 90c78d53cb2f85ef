#!/usr/bin/env bash
# The Express example in one command: packs clients/node (npm pack), makes a
# fresh application in a temporary folder outside the checkout from this
# folder's package.json and lock file (npm ci), installs the tarball into
# it, compiles src/app.ts with tsc --strict, sets up the database
# (../http_setup.sql) and serves the API on 127.0.0.1:${PORT:-3000}.
#
#   examples/express/run.sh            against `make run`'s cluster (database demo)
#   examples/express/run.sh --test     also checks the tarball, sends requests, stops
#
# PGHOST, PGPORT, PGDATABASE, PGUSER name another database (a superuser for the
# set-up; the API itself connects as role shop_api).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
MODE=${1:-run}
say() { echo "==> $*" >&2; }
fail() { echo "FAILED: $*" >&2; exit 1; }

if [ -z "${PGPORT:-}" ]; then
    [ -f "$ROOT/build/run/port" ] || fail "no cluster: start one with make run (or set PGPORT)"
    export PGPORT=$(cat "$ROOT/build/run/port") PGDATABASE=${PGDATABASE:-demo}
fi
export PGHOST=${PGHOST:-127.0.0.1} PGDATABASE=${PGDATABASE:-demo}
if [ -z "${PGUSER:-}" ]; then
    if [ "$(id -u)" = 0 ]; then export PGUSER=postgres; else export PGUSER=$(id -un); fi
fi

WORK=$(mktemp -d /tmp/idem-example-express.XXXXXX)
SERVER=
cleanup() { [ -z "$SERVER" ] || kill "$SERVER" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

say "npm pack clients/node"
TARBALL=$(cd "$ROOT/clients/node" && npm pack --silent --pack-destination "$WORK")
TARBALL=$WORK/$TARBALL
if [ "$MODE" = --test ]; then
    LIST=$(tar -tzf "$TARBALL" | sort)
    for f in package/package.json package/README.md package/src/index.js package/src/index.d.ts; do
        grep -qx "$f" <<<"$LIST" || fail "$f missing from the tarball"
    done
    if [ -f "$ROOT/LICENSE" ]; then
        grep -qx package/LICENSE <<<"$LIST" || fail "LICENSE missing from the tarball"
        tar -xzOf "$TARBALL" package/LICENSE | cmp -s - "$ROOT/LICENSE" || fail "the tarball's LICENSE is not the project's"
    else
        echo "skipped: the LICENSE check (no LICENSE at the repository root)"
    fi
    ! grep -q '^package/test/' <<<"$LIST" || fail "the tests are in the tarball"
    tar -xzOf "$TARBALL" package/package.json | node -e '
      const p = JSON.parse(require("fs").readFileSync(0, "utf8"));
      const need = (c, m) => { if (!c) { console.error("FAILED: package.json: " + m); process.exit(1); } };
      need(p.peerDependencies && p.peerDependencies.pg, "pg is not a peer dependency");
      need(!(p.dependencies && p.dependencies.pg), "pg is a dependency");
      need(p.exports && p.exports["."] && p.exports["."].types, "no exports types");
      need(p.types && p.license === "PostgreSQL" && p.engines && p.engines.node, "types, license or engines missing");'
    echo "ok - the tarball's content and metadata"
fi

say "fresh application in $WORK/app"
mkdir "$WORK/app"
cp -r "$HERE/package.json" "$HERE/package-lock.json" "$HERE/tsconfig.json" "$HERE/src" "$WORK/app/"
cd "$WORK/app"
npm ci --no-audit --no-fund --loglevel=error >/dev/null
npm install --no-save --no-audit --no-fund --loglevel=error "$TARBALL" >/dev/null
[ ! -L node_modules/@idempotency/express ] || fail "the package was linked, not installed"
say "tsc --strict"
npx --no-install tsc -p . --strict
echo "ok - tsc --strict compiles the typed example"

say "database set-up (examples/http_setup.sql)"
PGOPTIONS="-c client_min_messages=warning" psql -X -q -v ON_ERROR_STOP=1 -f "$ROOT/examples/http_setup.sql" >/dev/null

if [ "$MODE" != --test ]; then
    say "serving on 127.0.0.1:${PORT:-3000} (Ctrl-C stops)"
    PGUSER=shop_api exec node dist/app.js
fi

PORT=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close();})')
PGUSER=shop_api PORT=$PORT node dist/app.js >"$WORK/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 100); do grep -q LISTENING "$WORK/server.log" && break; sleep 0.1; done
grep -q LISTENING "$WORK/server.log" || { cat "$WORK/server.log"; fail "the server did not start"; }
CHARGE=$(BASE=http://127.0.0.1:$PORT node "$HERE/check.js" | tee "$WORK/check.log" | sed -n 's/^CHARGE //p') || true
cat "$WORK/check.log"
[ -n "$CHARGE" ] || { cat "$WORK/server.log"; fail "requests"; }
N=$(psql -X -qtA -c "SELECT count(*) FROM shop_charges WHERE id = '$CHARGE'")
[ "$N" = 1 ] || fail "charge $CHARGE has $N rows"
echo "ok - one row for the charge"
for _ in $(seq 50); do
    [ "$(psql -X -qtA -c "SELECT count(*) FROM shop_receipts WHERE charge_id = '$CHARGE'")" = 1 ] && break; sleep 0.1
done
[ "$(psql -X -qtA -c "SELECT count(*) FROM shop_receipts WHERE charge_id = '$CHARGE'")" = 1 ] || fail "no receipt after the commit"
echo "ok - the receipt written once after the commit"
echo "RESULT example express passed"
