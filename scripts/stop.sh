#!/usr/bin/env bash
# make stop: stop the demo cluster that "make run" started.

. "$(dirname "$0")/common.sh"

choose_build_dir
RUN_DIR=$BUILD_DIR/run
if [ -f "$RUN_DIR/data/postmaster.pid" ]; then
    PGBIN=$BUILD_DIR/pginstall$("$SYS_PG_CONFIG" --bindir)
    as_pg "$PGBIN/pg_ctl" -D "$RUN_DIR/data" -m fast -w stop
else
    say "no demo cluster is running"
fi
