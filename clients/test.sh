#!/usr/bin/env bash
# The HTTP clients' tests: for each of clients/node and clients/python, its
# unit tests and an end-to-end test (a real HTTP server using the
# middleware, driven by a real client library with its own retries, under
# injected faults); and the packages as an application outside the checkout
# gets them (examples/express/run.sh --test: the npm pack tarball installed
# into a fresh application, compiled with tsc --strict;
# examples/fastapi/run.sh --test: the wheel installed into a fresh virtual
# environment, checked with mypy --strict; both then served and asked).
# The unit suites first check that no function of their language in
# clients/ is over 80 lines (clients/scripts/function_lengths.py).
# Prints one line "client SUITE ... ok|FAILED" per suite and exits non-zero
# when one failed.
#
#   clients/test.sh [SUITE...]     suites: node_unit node_e2e node_outbox node_example python_unit python_e2e python_outbox python_example
#                                          node_snippets python_snippets node_orm python_orm
#
# node_snippets, python_snippets: the client code of the documentation runs
# as written (clients/snippets/run.py: the markers are in CONTRIBUTING.md,
# "Client code in the documentation"); node_orm, python_orm: the ORM recipes of
# examples/orm (doc/orm.md), each a program run against the suite's database.
#
# node_outbox: the Node client's outbox sender (idempotency-outbox
# processes killed and restarted, against a fault-injecting server) and a
# queue consumer on idempotentFunction, end to end (test/e2e/outbox.js,
# test/e2e/consumer.js).
#
# With IDEM_TEST_PGPORT (and IDEM_TEST_PGHOST, IDEM_TEST_PGUSER) set, the
# tests use that running cluster (its library preloaded, the extension
# installable, a superuser); otherwise a throwaway cluster is started with
# the helpers of scripts/common.sh and stopped at the end.  Each suite gets
# a database of its own.  Everything listens on loopback only.

. "$(dirname "$0")/../scripts/common.sh"

CLIENTS_DIR=$PROJECT_DIR/clients
ALL_SUITES="node_unit node_e2e node_outbox node_example python_unit python_e2e python_outbox python_example node_snippets python_snippets node_orm python_orm"
SUITES=${*:-$ALL_SUITES}
PY=/usr/bin/python3
PY_PACKAGES="python3-psycopg python3-psycopg-pool python3-starlette python3-fastapi python3-httpx python3-uvicorn python3-urllib3"
# building the wheel and checking the typed example (python_example)
PY_PACKAGING="python3-build python3-setuptools python3-wheel python3-venv mypy"

apt_install() {
    if is_root; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" >/dev/null
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        sudo -n env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        sudo -n env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" >/dev/null
    else
        die "missing packages: $*. Install them with: sudo apt-get install -y $*"
    fi
}

ensure_node() {
    command -v node >/dev/null && command -v npm >/dev/null || { say "installing nodejs npm"; apt_install nodejs npm; }
    if [ ! -f "$CLIENTS_DIR/node/node_modules/.package-lock.json" ] ||
       [ "$CLIENTS_DIR/node/package-lock.json" -nt "$CLIENTS_DIR/node/node_modules/.package-lock.json" ]; then
        say "npm ci (clients/node)"
        (cd "$CLIENTS_DIR/node" && npm ci --no-audit --no-fund --loglevel=error) >/dev/null
    fi
}

# npm ci in a folder with its own lock file (the snippets' compiler, the ORM recipes' packages)
ensure_npm_dir() {
    local dir=$1
    if [ ! -f "$dir/node_modules/.package-lock.json" ] ||
       [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
        say "npm ci (${dir#$PROJECT_DIR/})"
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) >/dev/null
    fi
}

ensure_python() {
    local missing=() p
    for p in $PY_PACKAGES "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] || { say "installing ${missing[*]}"; apt_install "${missing[@]}"; }
}

if [ -z "${IDEM_TEST_PGPORT:-}" ]; then
    ensure_deps
    build_local_install
    CLUSTER_DIR=$BUILD_DIR/clients
    if [ -f "$CLUSTER_DIR/data/postmaster.pid" ]; then
        as_pg pg_ctl -D "$CLUSTER_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$CLUSTER_DIR"
    own_dir "$CLUSTER_DIR"
    start_cluster "$CLUSTER_DIR" "max_connections = 100
idempotency.maintenance_interval = '1s'"
    trap 'as_pg pg_ctl -D "$CLUSTER_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true' EXIT
    export IDEM_TEST_PGHOST=127.0.0.1 IDEM_TEST_PGPORT=$PORT IDEM_TEST_PGUSER=$PGOS_USER
fi
export IDEM_TEST_PGHOST=${IDEM_TEST_PGHOST:-127.0.0.1} IDEM_TEST_PGUSER=${IDEM_TEST_PGUSER:-$PGOS_USER}
# CLIENTS_LOG_DIR: where the suites' logs go (make test gives each server
# version its own, so that a later version's run keeps an earlier failure's)
LOG_DIR=${CLIENTS_LOG_DIR:-${BUILD_DIR:-$PROJECT_DIR/build}/clients-log}
mkdir -p "$LOG_DIR"

# A fresh database with the extension for one suite: sets IDEM_TEST_PGDATABASE.
fresh_db() {
    local db=idem_$1
    export PGOPTIONS='-c client_min_messages=warning'
    psql -X -q -h "$IDEM_TEST_PGHOST" -p "$IDEM_TEST_PGPORT" -U "$IDEM_TEST_PGUSER" -d postgres -v ON_ERROR_STOP=1 \
        -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null
    psql -X -q -h "$IDEM_TEST_PGHOST" -p "$IDEM_TEST_PGPORT" -U "$IDEM_TEST_PGUSER" -d "$db" -v ON_ERROR_STOP=1 \
        -c 'CREATE EXTENSION idempotency CASCADE' >/dev/null
    unset PGOPTIONS
    export IDEM_TEST_PGDATABASE=$db
}

# An example's run.sh --test against the suite's database (libpq's variables).
AS_EXAMPLE='PGHOST=$IDEM_TEST_PGHOST PGPORT=$IDEM_TEST_PGPORT PGUSER=$IDEM_TEST_PGUSER PGDATABASE=$IDEM_TEST_PGDATABASE exec "$0" --test'

# A unit suite's command, its language's function lengths checked first
# (clients/scripts/function_lengths.py: no function over 80 lines):
#   bash -c "$LENGTHS_FIRST" "$PY" SCRIPT js|py COMMAND...
LENGTHS_FIRST='"$0" "$1" --lang "$2" && shift 2 && exec "$@"'
LENGTHS=$CLIENTS_DIR/scripts/function_lengths.py

PASSED=0
FAILED=0
run_suite() {
    local name=$1; shift
    local log=$LOG_DIR/$name.log rc
    fresh_db "$name"
    say "client $name"
    set +e
    timeout "${SUITE_TIMEOUT:-170}" "$@" >"$log" 2>&1
    rc=$?
    set -e
    grep -E '^(# (pass|fail)|RESULT|ok - |fragment - |skipped: |FAILED: |calls done|not ok|ok [0-9]+ - |Ran [0-9]+ tests|OK|FAILED)|\.\.\. (ok|FAIL|ERROR|skipped)' "$log" | sed 's/^/    /' | tail -n 40 || true
    if [ $rc -eq 0 ]; then
        echo "client $name ... ok"; PASSED=$((PASSED + 1))
    else
        # the failures first (a TAP "not ok" and what follows it), then the end
        grep -n -A 25 -E '^[[:space:]]*not ok|^FAIL:|^ERROR:|^Traceback' "$log" | head -n 80 || true
        tail -n 60 "$log"
        echo "client $name ... FAILED (exit $rc, log $log)"; FAILED=$((FAILED + 1))
    fi
}

for s in $SUITES; do
    case $s in
        node_unit) ensure_node; run_suite "$s" bash -c "$LENGTHS_FIRST" "$PY" "$LENGTHS" js node --test --test-concurrency=1 "$CLIENTS_DIR/node/test/unit/" ;;
        node_e2e) ensure_node; run_suite "$s" node "$CLIENTS_DIR/node/test/e2e/run.js" ;;
        node_outbox) ensure_node; run_suite "$s" bash -c 'node "$1/outbox.js" && node "$1/consumer.js"' _ "$CLIENTS_DIR/node/test/e2e" ;;
        python_unit) ensure_python; run_suite "$s" bash -c "$LENGTHS_FIRST" "$PY" "$LENGTHS" py env PYTHONPATH="$CLIENTS_DIR/python" "$PY" -m unittest discover -v -s "$CLIENTS_DIR/python/tests" -t "$CLIENTS_DIR/python" ;;
        python_e2e) ensure_python; run_suite "$s" env PYTHONPATH="$CLIENTS_DIR/python" "$PY" "$CLIENTS_DIR/python/tests/e2e/run.py" ;;
        # the outbox sender killed and restarted against a faulty server, then
        # idempotent_function's queue consumers (issue 37)
        python_outbox) ensure_python; run_suite "$s" env PYTHONPATH="$CLIENTS_DIR/python" OUTBOX_LOG_DIR="$LOG_DIR" sh -c \
            '"$0" "$1"/tests/e2e/outbox_run.py && cd "$1" && "$0" -m unittest -v tests.test_function.QueueConsumer' \
            "$PY" "$CLIENTS_DIR/python" ;;
        node_example) ensure_node; SUITE_TIMEOUT=600 run_suite "$s" bash -c "$AS_EXAMPLE" "$PROJECT_DIR/examples/express/run.sh" ;;
        python_example) ensure_python $PY_PACKAGING; SUITE_TIMEOUT=600 run_suite "$s" bash -c "$AS_EXAMPLE" "$PROJECT_DIR/examples/fastapi/run.sh" ;;
        node_snippets) ensure_node; ensure_npm_dir "$CLIENTS_DIR/snippets"
            run_suite "$s" "$PY" "$CLIENTS_DIR/snippets/run.py" node ;;
        python_snippets) ensure_python; run_suite "$s" "$PY" "$CLIENTS_DIR/snippets/run.py" python ;;
        node_orm) ensure_node; ensure_npm_dir "$PROJECT_DIR/examples/orm/node"
            run_suite "$s" "$PROJECT_DIR/examples/orm/run.sh" node ;;
        python_orm) ensure_python python3-sqlalchemy python3-django python3-psycopg2
            run_suite "$s" "$PROJECT_DIR/examples/orm/run.sh" python ;;
        *) die "unknown suite $s (suites: $ALL_SUITES)" ;;
    esac
done
echo "clients: $PASSED passed, $FAILED failed"
[ $FAILED -eq 0 ]
