#!/usr/bin/env bash
# make model: the model-based test of the protocol (test/model/idem_model.py,
# which test/t/062_model.pl runs with a small budget in make test) with a
# longer budget and the seeds named on the command line:
#
#   make model SEEDS="7 31337" EXAMPLES=400 STEPS=100
#
# SEEDS     the seeds to run, one run each (default: one random seed)
# EXAMPLES  sequences a run makes (default 400)
# STEPS     most calls in a sequence (default 100)
# SHRINK    0: report the first failing sequence as it came, unshrunk
# PG_CONFIG the server to test (default Debian's PostgreSQL 15, as make test)
# IDEM_MODEL_FILL_MAX (environment) the most partitions the driver may make
#           to fill the server's table of tombstone filters (default 600:
#           enough for the tiny table of test/model/model.conf; a server
#           without idempotency.tombstone_filter_entries has 8,192 entries,
#           which IDEM_MODEL_FILL_MAX=9000 fills, in 4 to 7 minutes)
# IDEM_MODEL_SCENARIO (environment) a scripted sequence to run first
#           (idem_model.py SCENARIOS: filter_room, the filter defect of
#           issue 36, which needs the table of filters filled)
#
# Installs what is missing, builds the extension into the private copy of
# the server that make test uses, and runs each seed on a throwaway cluster
# of its own with the settings of test/model/model.conf.  Prints, for each
# seed, its result, and for a failure the command that replays it; exits
# non-zero when any seed failed.  The output of each run is kept in
# build/model/seed-N.log.

. "$(dirname "$0")/common.sh"

PGC=${MODEL_PG_CONFIG:-}
if [ -n "$PGC" ]; then
    PGC=$(command -v "$PGC" || true)
    [ -n "$PGC" ] && [ -x "$PGC" ] || die "pg_config not found: ${MODEL_PG_CONFIG}"
    ensure_deps "libipc-run-perl python3-psycopg python3-hypothesis"
else
    ensure_deps
    ensure_deps "python3-psycopg python3-hypothesis"
    PGC=$SYS_PG_CONFIG
fi
EXAMPLES=${EXAMPLES:-400}
STEPS=${STEPS:-100}
SHRINK=${SHRINK:-1}
SEEDS=${SEEDS:-$(od -An -N4 -tu4 /dev/urandom | awk '{print $1 % 2147483646 + 1}')}
for s in $SEEDS; do
    [[ $s =~ ^[0-9]+$ ]] || die "SEEDS must be whole numbers: $s"
done
[[ $EXAMPLES =~ ^[0-9]+$ && $STEPS =~ ^[0-9]+$ ]] || die "EXAMPLES and STEPS must be whole numbers"

build_local_install "$PGC"
MODEL_DIR=$BUILD_DIR/model
rm -rf "$MODEL_DIR"
own_dir "$MODEL_DIR"
# the driver, where the cluster owner can read it
cp -r "$PROJECT_DIR/test/model" "$MODEL_DIR/driver"
own_dir "$MODEL_DIR/driver"
say "model: $EXAMPLES sequences of at most $STEPS calls for each seed of: $SEEDS, on $("$PGC" --version)"

replay() {
    local pgc= env=
    [ "$PGC" = "$SYS_PG_CONFIG" ] || pgc=" PG_CONFIG=$PGC"
    [ -z "${IDEM_MODEL_FILL_MAX:-}" ] || env="IDEM_MODEL_FILL_MAX=$IDEM_MODEL_FILL_MAX "
    [ -z "${IDEM_MODEL_SCENARIO:-}" ] || env="${env}IDEM_MODEL_SCENARIO=$IDEM_MODEL_SCENARIO "
    printf '%smake model SEEDS=%s EXAMPLES=%s STEPS=%s%s' "$env" "$1" "$EXAMPLES" "$STEPS" "$pgc"
}

CLUSTER=
stop_cluster() {
    if [ -n "$CLUSTER" ] && [ -f "$CLUSTER/data/postmaster.pid" ]; then
        as_pg pg_ctl -D "$CLUSTER/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    CLUSTER=
}
trap stop_cluster EXIT

FAILED_SEEDS=()
for seed in $SEEDS; do
    CLUSTER=$MODEL_DIR/seed-$seed
    own_dir "$CLUSTER"
    start_cluster "$CLUSTER" "$(cat "$PROJECT_DIR/test/model/model.conf")"
    as_pg psql -X -q -h "$SOCKET_DIR" -p "$PORT" -U "$PGOS_USER" -d postgres -v ON_ERROR_STOP=1 \
        -c 'CREATE EXTENSION idempotency CASCADE' >/dev/null
    log=$MODEL_DIR/seed-$seed.log
    set +e
    # from the model's folder: Hypothesis writes .hypothesis/ where it runs
    (cd "$MODEL_DIR" && as_pg env PGHOST="$SOCKET_DIR" PGPORT="$PORT" PGUSER="$PGOS_USER" PGDATABASE=postgres \
        PYTHONDONTWRITEBYTECODE=1 IDEM_MODEL_SEED="$seed" IDEM_MODEL_EXAMPLES="$EXAMPLES" \
        IDEM_MODEL_STEPS="$STEPS" IDEM_MODEL_SHRINK="$SHRINK" \
        IDEM_MODEL_PGDATA="$CLUSTER/data" IDEM_MODEL_PGCTL="$PGBIN/pg_ctl" \
        IDEM_MODEL_PGLOG="$CLUSTER/postgres.log" IDEM_MODEL_REPLAY="$(replay "$seed")" \
        IDEM_MODEL_FILL_MAX="${IDEM_MODEL_FILL_MAX:-}" IDEM_MODEL_SCENARIO="${IDEM_MODEL_SCENARIO:-}" \
        /usr/bin/python3 "$MODEL_DIR/driver/idem_model.py") >"$log" 2>&1
    rc=$?
    set -e
    if [ $rc -eq 0 ]; then
        grep -E '^model: passed' "$log" | sed 's/^/    /'
    else
        FAILED_SEEDS+=("$seed")
        tail -n 60 "$log" | sed 's/^/    /'
        say "model: seed $seed FAILED (the whole output: $log); replay it with:"
        echo "    $(replay "$seed")"
    fi
    stop_cluster
done

if [ ${#FAILED_SEEDS[@]} -eq 0 ]; then
    say "model: every seed passed: $SEEDS"
else
    say "model: ${#FAILED_SEEDS[@]} seed(s) failed: ${FAILED_SEEDS[*]}"
    for seed in "${FAILED_SEEDS[@]}"; do
        echo "    $(replay "$seed")"
    done
    exit 1
fi
