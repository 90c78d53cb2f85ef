#!/usr/bin/env bash
# make run: install what is missing, build and install the extension, start a
# throwaway cluster with the library preloaded on a free local port, create
# the extension in database "demo", run examples/payments.sql, and leave the
# cluster running.  "make stop" stops it.

. "$(dirname "$0")/common.sh"

ensure_deps
build_local_install

# Install system-wide too, so that other clusters of this machine can
# CREATE EXTENSION idempotency.
if is_root; then
    make -C "$PROJECT_DIR" -s PG_CONFIG="$SYS_PG_CONFIG" install >/dev/null
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo -n make -C "$PROJECT_DIR" -s PG_CONFIG="$SYS_PG_CONFIG" install >/dev/null
else
    say "not installed system-wide (no root): the demo cluster uses $BUILD_DIR/pginstall"
fi

RUN_DIR=$BUILD_DIR/run
if [ -f "$RUN_DIR/data/postmaster.pid" ]; then
    say "stopping the previous demo cluster"
    as_pg pg_ctl -D "$RUN_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
fi
rm -rf "$RUN_DIR"
own_dir "$RUN_DIR"
stage_tests

start_cluster "$RUN_DIR"
echo "$PORT" >"$RUN_DIR/port"

PSQL=(psql -X -h "$SOCKET_DIR" -p "$PORT" -U "$PGOS_USER" -v ON_ERROR_STOP=1)
as_pg "${PSQL[@]}" -q -d postgres -c 'CREATE DATABASE demo'
as_pg "${PSQL[@]}" -q -d demo -c 'CREATE EXTENSION idempotency CASCADE'
say "running examples/payments.sql"
as_pg "${PSQL[@]}" -d demo -f "$STAGE/examples/payments.sql"

cat <<MSG

The cluster is running.  Connect with:
    psql -h $SOCKET_DIR -p $PORT -U $PGOS_USER demo
Stop it with:
    make stop
MSG
