#!/usr/bin/env bash
# make test: install what is missing, build, then run every suite through
# the standard PGXS targets on throwaway clusters: "make installcheck"
# (pg_regress, then the isolation tester) on a cluster with the library
# preloaded and test/preload.conf, again on one with only the library
# preloaded (a server's default settings: the tests that depend on
# preload.conf skip themselves there), the nopreload_* tests on one without
# it, and "make prove_installcheck" (TAP); before them, the checks of src/:
# its modules include each other without a cycle (include_graph,
# scripts/include_graph.py), no function is over 120 lines and no file over
# 1,000 (function_lengths, scripts/function_lengths.py).  Prints the diffs of what failed,
# a line naming the security suite's tests and how many of their runs
# passed, and a closing line "N passed, N failed, N skipped" (a test that skipped
# itself is counted as skipped, not passed); exits non-zero on any failure.
# Under CI (CI=true) a test that skips itself where it must not is a
# failure: a pg_regress test on the cluster with test/preload.conf, a TAP
# test on Debian's PostgreSQL 15, where everything the TAP tests need is
# installed.
#
# TEST_PG_CONFIG=/path/to/pg_config (make test PG_CONFIG=...) tests the
# server of that installation instead of Debian's PostgreSQL 15.
# TESTS=name1,name2 limits the run to the named tests of every suite
# (include_graph and function_lengths name the checks of src/).

. "$(dirname "$0")/common.sh"
. "$(dirname "$0")/pgcache.sh"
. "$(dirname "$0")/citus.sh"
. "$(dirname "$0")/plproxy.sh"

selected() {
    [ -z "${TESTS:-}" ] && return 0
    case ",$TESTS," in *",$1,"*) return 0 ;; esac
    return 1
}

PGC=${TEST_PG_CONFIG:-}
if [ -n "$PGC" ]; then
    PGC=$(command -v "$PGC" || true)
    [ -n "$PGC" ] && [ -x "$PGC" ] || die "pg_config not found: ${TEST_PG_CONFIG}"
    ensure_deps "libipc-run-perl"
else
    ensure_deps
    PGC=$SYS_PG_CONFIG
fi
# the checks of src/ (scripts/include_graph.py, scripts/function_lengths.py)
if selected include_graph || selected function_lengths; then
    ensure_deps python3
fi
# the driver of the model-based test (test/model/idem_model.py)
if selected 062_model; then
    ensure_deps "python3-psycopg python3-hypothesis"
fi
# Install the Debian packages $1 when missing, where this is root or may
# sudo; else (or when that fails) return 1 with SKIP_REASON set: the TAP
# test that needs them skips with that reason.
try_deps() {
    local missing=() p
    for p in $1; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if is_root || { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }; then
        (ensure_deps "${missing[*]}") && return 0
        SKIP_REASON="installing ${missing[*]} failed"
    else
        SKIP_REASON="${missing[*]} not installed, and this is not root (sudo apt-get install -y ${missing[*]})"
    fi
    return 1
}
# 057_pgbouncer: PgBouncer, and for its keyed requests through the HTTP
# clients node with clients/node's packages and the Python client's
SKIP_PGBOUNCER= SKIP_NODE= SKIP_PYTHON=
if selected 057_pgbouncer; then
    SKIP_REASON=
    try_deps pgbouncer || SKIP_PGBOUNCER=$SKIP_REASON
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        try_deps "nodejs npm" || SKIP_NODE=$SKIP_REASON
    fi
    if [ -z "$SKIP_NODE" ] && [ ! -d "$PROJECT_DIR/clients/node" ]; then
        SKIP_NODE="no clients/ in this tree"
    elif [ -z "$SKIP_NODE" ] && [ ! -f "$PROJECT_DIR/clients/node/node_modules/.package-lock.json" ]; then
        say "npm ci (clients/node)"
        (cd "$PROJECT_DIR/clients/node" && npm ci --no-audit --no-fund --loglevel=error) >/dev/null ||
            SKIP_NODE="npm ci in clients/node failed"
    fi
    try_deps "python3-psycopg python3-psycopg-pool python3-starlette python3-httpx" || SKIP_PYTHON=$SKIP_REASON
fi
# 058_exporter: Debian's postgres_exporter
SKIP_EXPORTER=
if selected 058_exporter; then
    SKIP_REASON=
    try_deps prometheus-postgres-exporter || SKIP_EXPORTER=$SKIP_REASON
fi
build_local_install "$PGC"
# what the scale-out TAP tests need besides the extension, when they run:
# copied into the private copy, or a reason to skip, which they print
PGROOT=${PGBIN%"$("$PGC" --bindir)"}
SKIP_PLPROXY= SKIP_CITUS=
if selected 070_plproxy; then
    SKIP_REASON=
    ensure_plproxy "$PGC" "$PGROOT" || SKIP_PLPROXY=$SKIP_REASON
fi
# Citus and PostgreSQL 18 (for 082_pg_upgrade) are built from ../shared
# the first time they are needed, which takes long on a small machine: make
# test leaves the tests that need them to make test-matrix (which sets
# IDEM_MATRIX=1), unless they are named in TESTS.
NEEDS_MATRIX=
[ -z "${IDEM_MATRIX:-}" ] && [ -z "${TESTS:-}" ] && NEEDS_MATRIX=1
# the Citus tests: 071_citus, 072_citus_update
selected_citus() { selected 071_citus || selected 072_citus_update; }
if selected_citus && [ -n "$NEEDS_MATRIX" ]; then
    SKIP_CITUS="it needs Citus, built once from ../shared/citus: make test-matrix runs it (or make test TESTS=071_citus,072_citus_update)"
elif selected_citus && [ "$("$PGC" --configure 2>/dev/null)" = "stand-in of scripts/pg17.sh" ]; then
    SKIP_CITUS="Citus is not built for the PostgreSQL 17 that scripts/pg17.sh puts together (a stand-in pg_config, headers of 17.12)"
elif selected_citus; then
    SKIP_REASON=
    { ensure_citus "$PGC" && install_citus "$PGC" "$PGROOT"; } || SKIP_CITUS=${SKIP_REASON:-copying Citus into $PGROOT failed}
fi
# 082_pg_upgrade upgrades a cluster of this server to PostgreSQL 18: on an
# older server, the extension is built for 18 too (the cached build, made
# once when missing, see pgcache.sh; PG18_CONFIG names another, as for make
# test-matrix) into a private copy of its own, whose bindir the test gets.
# Otherwise the test gets the reason it cannot run: it skips with it, or
# fails under CI (CI=true), where PostgreSQL 18 must be available.
PG_UPGRADE_BINDIR= SKIP_PG_UPGRADE= FAIL_PG_UPGRADE=
if selected 082_pg_upgrade; then
    if [ "$PGC" != "$SYS_PG_CONFIG" ]; then
        SKIP_PG_UPGRADE="it upgrades Debian's PostgreSQL 15 to PostgreSQL 18, and runs in the PostgreSQL 15 run (make test-matrix)"
    elif [ -n "$NEEDS_MATRIX" ]; then
        SKIP_PG_UPGRADE="it needs PostgreSQL 18, built once from ../shared/postgresql: make test-matrix runs it (or make test TESTS=082_pg_upgrade)"
    else
        SKIP_REASON= rc=0
        if [ -n "${PG18_CONFIG:-}" ]; then PG18_PG_CONFIG=$PG18_CONFIG; else ensure_pg18 || rc=$?; fi
        if [ $rc -eq 0 ]; then
            # in a subshell: PGBIN, PATH and PERL5LIB stay this server's
            set +e
            (set -e; build_local_install "$PG18_PG_CONFIG"; echo "$PGBIN" >"$BUILD_DIR/pg-upgrade-bindir")
            rc=$?
            set -e
            [ $rc -eq 0 ] || { rc=2; SKIP_REASON="building the extension for $PG18_PG_CONFIG failed"; }
        fi
        if [ $rc -eq 0 ]; then
            PG_UPGRADE_BINDIR=$(cat "$BUILD_DIR/pg-upgrade-bindir")
        elif [ "${CI:-}" = true ] || [ $rc -eq 2 ] || [ -n "${PG18_CONFIG:-}" ]; then
            FAIL_PG_UPGRADE=$SKIP_REASON
        else
            SKIP_PG_UPGRADE="$SKIP_REASON (make test PG18_CONFIG=/path/to/pg_config names a PostgreSQL 18)"
        fi
    fi
fi
stage_tests
# the suites run in a copy of the project of their own: 002_make_run copies
# $STAGE/project, which must hold the sources only
SUITE=$STAGE/suite
cp -r "$STAGE/project" "$SUITE"
own_dir "$SUITE"
# one folder of results per server version
OUT=$BUILD_DIR/test-output/pg$("$PGC" --version | sed 's/^PostgreSQL \([0-9]*\).*/\1/')
rm -rf "$OUT"
own_dir "$OUT"
say "testing on $("$PGC" --version) ($PGC)"

PASSED=0
FAILED=0
SKIPPED=0
FAILED_NAMES=()
# A failure's evidence, printed and kept in $OUT/failures.txt between
# marker lines, at most 60 lines (test-matrix.sh repeats the files at its
# end, where a long run's output is read first).
failure_excerpt() {
    local title=$1
    { echo "==== failure: $title"; sed -n 1,60p; echo "==== end of failure: $title"; } | tee -a "$OUT/failures.txt"
}
SKIPPED_NAMES=()

# The security suite (doc/security.md#the-security-suite): the pg_regress
# tests and specs named security_*, the TAP tests 09*_security_*.  Each run
# of one is counted here too (a pg_regress test runs on two clusters), for
# the line that names them before the closing line.
SEC_PASSED=0
SEC_FAILED=0
SEC_SKIPPED=0
SEC_NAMES=()
count_security() {
    local outcome=$1 name=${2##*/}
    name=${name%% *}
    [[ $name == security_* || $name =~ ^09[0-9]_security_ ]] || return 0
    case $outcome in
        passed) SEC_PASSED=$((SEC_PASSED + 1)) ;;
        failed) SEC_FAILED=$((SEC_FAILED + 1)) ;;
        skipped) SEC_SKIPPED=$((SEC_SKIPPED + 1)) ;;
    esac
    [[ " ${SEC_NAMES[*]} " == *" $name "* ]] || SEC_NAMES+=("$name")
}

# A test that skipped itself: a skip where skips are allowed ($2 empty),
# else (under CI) a failure.
count_skip() {
    local name=$1 strict=${2:-}
    if [ -n "$strict" ] && [ "${CI:-}" = true ]; then
        FAILED=$((FAILED + 1)); FAILED_NAMES+=("$name (skipped itself: $strict)")
        count_security failed "$name"
    else
        SKIPPED=$((SKIPPED + 1)); SKIPPED_NAMES+=("$name")
        count_security skipped "$name"
    fi
}

# Count the tests pg_regress reports: "test NAME ... ok|FAILED" up to
# PostgreSQL 15, "ok N - NAME" / "not ok N - NAME" (TAP) from 16 on.  A test
# that passed with output saying "skipped: ..." (the notice of its skip
# path, matched by its alternative expected output NAME_1.out) skipped
# itself; $3 says why that must not happen here, if it must not.
count_regress() {
    local log=$1 suite=$2 strict=${3:-} line name result
    local results=${log%/*}/results
    local before=$((PASSED + FAILED + SKIPPED))
    RUN_PASSED=0 RUN_SKIPPED=0 RUN_FAILED=0
    while IFS= read -r line; do
        if [[ $line =~ ^(test)?[[:space:]]+([A-Za-z0-9_]+)[[:space:]]+\.\.\.[[:space:]]+(ok|FAILED|failed) ]]; then
            name=${BASH_REMATCH[2]} result=${BASH_REMATCH[3]}
        elif [[ $line =~ ^(not[[:space:]]+)?ok[[:space:]]+[0-9]+[[:space:]]+[-+][[:space:]]+([A-Za-z0-9_]+) ]]; then
            name=${BASH_REMATCH[2]} result=ok
            [ -n "${BASH_REMATCH[1]}" ] && result=failed
        else
            continue
        fi
        if [ "$result" = ok ] && grep -q '^skipped: ' "$results/$name.out" 2>/dev/null; then
            # pg_regress says "ok" for it: the reason is printed here
            echo "    $suite/$name: $(grep -m 1 '^skipped: ' "$results/$name.out")"
            count_skip "$suite/$name" "$strict"
            RUN_SKIPPED=$((RUN_SKIPPED + 1))
        elif [ "$result" = ok ]; then
            PASSED=$((PASSED + 1)); RUN_PASSED=$((RUN_PASSED + 1))
            count_security passed "$name"
        else
            FAILED=$((FAILED + 1)); FAILED_NAMES+=("$suite/$name"); RUN_FAILED=$((RUN_FAILED + 1))
            count_security failed "$name"
        fi
    done <"$log"
    return $((PASSED + FAILED + SKIPPED - before == 0))
}

# make VARIABLES... TARGET in the staged copy of the project, as the cluster
# owner, against the server of the cluster started last.
make_staged() {
    as_pg env PGHOST="$SOCKET_DIR" PGPORT="$PORT" PGUSER="$PGOS_USER" \
        make -C "$SUITE" --no-print-directory PG_CONFIG="$PGC" bindir="$PGBIN" "$@"
}

# Run "make installcheck" for one kind of test ($2: regress or isolation)
# with the tests named after it; $1 names the suite and its output folder.
# STRICT (when set) says why a test must not skip itself on this cluster.
run_installcheck() {
    local suite=$1 kind=$2; shift 2
    local tests=("$@")
    [ ${#tests[@]} -eq 0 ] && return 0
    say "$suite: ${tests[*]}"
    local dir=$OUT/$suite
    own_dir "$dir"
    local vars=(REGRESS= ISOLATION= TAP_TESTS= EXTRA_REGRESS_OPTS="--outputdir=$dir")
    if [ "$kind" = isolation ]; then
        vars+=(ISOLATION="${tests[*]}")
    else
        vars+=(REGRESS="${tests[*]}")
    fi
    set +e
    make_staged "${vars[@]}" installcheck >"$dir/run.log" 2>&1
    local rc=$?
    set -e
    sed 's/^/    /' "$dir/run.log" | grep -E '\.\.\. |^    (not )?ok [0-9]' || true
    if ! count_regress "$dir/run.log" "$suite" "${STRICT:-}" || { [ $rc -ne 0 ] && ! grep -qE 'FAILED|failed|^not ok' "$dir/run.log"; }; then
        FAILED=$((FAILED + 1)); FAILED_NAMES+=("$suite (driver)")
        tail -n 30 "$dir/run.log"
    elif [ "$kind" = regress ]; then
        # the line scripts/installcheck-summary.sh prints after pg_regress's
        # own (which counts skips as passes) must agree with the count here
        local want="installcheck: $RUN_PASSED passed, $RUN_SKIPPED skipped, $RUN_FAILED failed" got
        got=$(grep -m 1 '^installcheck: ' "$dir/run.log" || true)
        echo "    ${got:-(no line \"installcheck: ...\" after pg_regress)}"
        if [ "${got%% (*}" != "$want" ]; then
            FAILED=$((FAILED + 1)); FAILED_NAMES+=("$suite (installcheck's summary)")
            echo "    make installcheck's summary does not say \"$want\""
        fi
    fi
    if [ -s "$dir/regression.diffs" ]; then
        echo "---- $suite: regression.diffs ----"
        cat "$dir/regression.diffs"
        failure_excerpt "$suite: regression.diffs" <"$dir/regression.diffs" >/dev/null
    fi
    return 0
}

stop_cluster() {
    as_pg pg_ctl -D "$1/data" -m fast -w stop >/dev/null 2>&1 || true
}

# The TAP tests, through "make prove_installcheck": each starts clusters of
# its own from PGBIN.  One pass or failure per test file.
run_tap() {
    local f name tests=()
    for f in "$PROJECT_DIR"/test/t/*.pl; do
        [ -e "$f" ] || continue
        name=$(basename "$f" .pl)
        selected "$name" && tests+=("test/t/$name.pl")
    done
    [ ${#tests[@]} -eq 0 ] && return 0
    say "tap: ${tests[*]}"
    local dir=$OUT/tap
    own_dir "$dir"
    # "make run" is the path of Debian's PostgreSQL 15 (002_make_run)
    local stage_env=()
    [ "$PGC" = "$SYS_PG_CONFIG" ] && stage_env=(STAGE="$STAGE")
    set +e
    as_pg env "${stage_env[@]}" PATH="$PGBIN:$PATH" \
        IDEM_SKIP_PLPROXY="$SKIP_PLPROXY" IDEM_SKIP_CITUS="$SKIP_CITUS" \
        IDEM_PG_UPGRADE_BINDIR="$PG_UPGRADE_BINDIR" IDEM_SKIP_PG_UPGRADE="$SKIP_PG_UPGRADE" \
        IDEM_FAIL_PG_UPGRADE="$FAIL_PG_UPGRADE" CI="${CI:-}" \
        IDEM_SKIP_PGBOUNCER="$SKIP_PGBOUNCER" IDEM_SKIP_NODE="$SKIP_NODE" IDEM_SKIP_PYTHON="$SKIP_PYTHON" \
        IDEM_SKIP_EXPORTER="$SKIP_EXPORTER" IDEM_CLIENTS_DIR="$PROJECT_DIR/clients" \
        make -C "$SUITE" --no-print-directory PG_CONFIG="$PGC" bindir="$PGBIN" \
        PROVE_TESTS="${tests[*]}" prove_installcheck >"$dir/run.log" 2>&1
    set -e
    local t line failed_tap=() failed_before=$FAILED tap_strict=
    # on Debian's 15 make test installs all that the TAP tests need
    [ "$PGC" = "$SYS_PG_CONFIG" ] && [ -z "$NEEDS_MATRIX" ] && tap_strict="on Debian's PostgreSQL 15 everything the TAP tests need is installed"
    # prove's closing summary names every file that failed
    while IFS= read -r line; do
        [[ $line =~ ^(test/t/[A-Za-z0-9_]+\.pl)[[:space:]]+\(Wstat ]] && failed_tap+=("${BASH_REMATCH[1]}")
    done <"$dir/run.log"
    for t in "${tests[@]}"; do
        name=$(basename "$t" .pl)
        if [[ " ${failed_tap[*]} " == *" $t "* ]]; then
            FAILED=$((FAILED + 1)); FAILED_NAMES+=("tap/$name")
            count_security failed "$name"
        elif grep -qE "^$t \.+ ?skipped" "$dir/run.log"; then
            count_skip "tap/$name" "$tap_strict"
            grep -E "^$t \.+" "$dir/run.log" | sed 's/^/    /'
        elif grep -qE "^$t \.+ ?ok" "$dir/run.log"; then
            PASSED=$((PASSED + 1))
            count_security passed "$name"
            grep -E "^$t \.+" "$dir/run.log" | sed 's/^/    /'
        else
            FAILED=$((FAILED + 1)); FAILED_NAMES+=("tap/$name")
            count_security failed "$name"
        fi
    done
    if [ $((FAILED - failed_before)) -gt 0 ]; then
        cat "$dir/run.log"
        for f in "$SUITE"/tmp_check/log/*; do
            [ -f "$f" ] || continue
            for t in "${FAILED_NAMES[@]}"; do
                case $t in tap/*) [[ $(basename "$f") == *"${t#tap/}"* ]] || continue ;; *) continue ;; esac
                echo "---- $f (last lines) ----"; tail -n 40 "$f"
                tail -n 40 "$f" | failure_excerpt "$t: ${f##*/}" >/dev/null
            done
        done
    fi
}

# the checks of src/ that need no server: its module dependency graph, from
# its #include lines, has no cycle (include_graph, scripts/include_graph.py);
# no function over 120 lines and no file over 1,000 (function_lengths,
# scripts/function_lengths.py)
source_check() {
    local name=$1; shift
    selected "$name" || return 0
    say "$name: $(basename "$1")"
    set +e
    python3 "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    set -e
    if [ $rc -eq 0 ]; then
        PASSED=$((PASSED + 1))
        sed 's/^/    /' "$OUT/$name.log"
    else
        FAILED=$((FAILED + 1)); FAILED_NAMES+=("$name")
        cat "$OUT/$name.log"
    fi
}
source_check include_graph "$PROJECT_DIR/scripts/include_graph.py" --doc "$PROJECT_DIR/CONTRIBUTING.md" "$PROJECT_DIR/src"
source_check function_lengths "$PROJECT_DIR/scripts/function_lengths.py" "$PROJECT_DIR/src"

shopt -s nullglob
preload_tests=() nopreload_tests=() specs=()
for f in "$PROJECT_DIR"/test/sql/*.sql; do
    name=$(basename "$f" .sql)
    selected "$name" || continue
    case $name in
        nopreload_*) nopreload_tests+=("$name") ;;
        *) preload_tests+=("$name") ;;
    esac
done
for f in "$PROJECT_DIR"/test/specs/*.spec; do
    name=$(basename "$f" .spec)
    selected "$name" && specs+=("$name")
done

trap 'stop_cluster "$OUT/preload"; stop_cluster "$OUT/default"; stop_cluster "$OUT/nopreload"; stop_cluster "$OUT/clients"' EXIT

# pg_regress and the isolation tester, with the library preloaded and
# test/preload.conf (no test may skip itself there)
if [ ${#preload_tests[@]} -gt 0 ] || [ ${#specs[@]} -gt 0 ]; then
    own_dir "$OUT/preload"
    start_cluster "$OUT/preload" "$(cat "$STAGE/test/preload.conf")"
    STRICT="test/preload.conf keeps the maintenance worker out of the tests"
    run_installcheck regress regress "${preload_tests[@]}"
    run_installcheck isolation isolation "${specs[@]}"
    STRICT=
    stop_cluster "$OUT/preload"
fi

# the same on a server's default settings, only the library preloaded (what
# "make installcheck" meets on a user's server): the tests that depend on
# test/preload.conf skip themselves (and are counted as skipped)
if [ ${#preload_tests[@]} -gt 0 ] || [ ${#specs[@]} -gt 0 ]; then
    own_dir "$OUT/default"
    start_cluster "$OUT/default" ""
    run_installcheck regress_default regress "${preload_tests[@]}"
    # the isolation tester has no way for a spec to skip itself: the specs
    # that a pass of the maintenance worker would disturb say so in a line
    # "# needs: no worker passes", and are skipped here
    default_specs=()
    for name in "${specs[@]}"; do
        if grep -q '^# needs: no worker passes' "$PROJECT_DIR/test/specs/$name.spec"; then
            say "isolation_default/$name: skipped: it needs a server whose maintenance worker runs no pass during it"
            count_skip "isolation_default/$name"
        else
            default_specs+=("$name")
        fi
    done
    run_installcheck isolation_default isolation "${default_specs[@]}"
    stop_cluster "$OUT/default"
fi

# pg_regress without the library preloaded
if [ ${#nopreload_tests[@]} -gt 0 ]; then
    own_dir "$OUT/nopreload"
    start_cluster "$OUT/nopreload" "$(cat "$STAGE/test/nopreload.conf")" nopreload
    run_installcheck regress_nopreload regress "${nopreload_tests[@]}"
    stop_cluster "$OUT/nopreload"
fi

# the HTTP clients (clients/test.sh): each suite one test, named client_SUITE
# in TESTS.  They run while the TAP tests do (most of both is waiting: on
# servers, timers, child processes), on a cluster of their own started here
# from the same installation, so that clients/test.sh builds and installs
# nothing while TAP tests start servers from it.
CLIENT_SUITES=$(for s in node_unit node_e2e node_outbox node_example python_unit python_e2e python_outbox python_example node_snippets python_snippets node_orm python_orm; do selected "client_$s" && echo "$s"; done || true)
PG_MAJOR_TESTED=$("$PGC" --version | sed 's/^PostgreSQL \([0-9]*\).*/\1/')
CLIENTS_PID=
if [ -n "$CLIENT_SUITES" ] && [ "$PG_MAJOR_TESTED" = 17 ] && [ -z "${TESTS:-}" ]; then
    # the clients talk SQL that does not change between majors: the matrix
    # tests them on 15 and 18 and spends CI's time on 17 on the extension
    for s in $CLIENT_SUITES; do
        say "client_$s: skipped: the HTTP clients are tested on PostgreSQL 15 and 18 (TESTS=client_$s runs it here)"
        count_skip "client_$s"
    done
elif [ -n "$CLIENT_SUITES" ] && [ ! -x "$PROJECT_DIR/clients/test.sh" ]; then
    # a release tarball leaves the clients out (.gitattributes)
    for s in $CLIENT_SUITES; do
        say "client_$s: skipped: no clients/ in this tree"
        count_skip "client_$s"
    done
elif [ -n "$CLIENT_SUITES" ]; then
    own_dir "$OUT/clients"
    start_cluster "$OUT/clients" "max_connections = 100
idempotency.maintenance_interval = '1s'"
    say "clients: $(echo $CLIENT_SUITES) (on port $PORT, while the TAP tests run; their lines follow the TAP tests')"
    rm -f "$OUT/clients.rc"
    ( set +e
      IDEM_TEST_PGHOST=127.0.0.1 IDEM_TEST_PGPORT=$PORT IDEM_TEST_PGUSER=$PGOS_USER \
          CLIENTS_LOG_DIR="$OUT/clients-log" \
          "$PROJECT_DIR/clients/test.sh" $CLIENT_SUITES >"$OUT/clients.log" 2>&1
      echo $? >"$OUT/clients.rc" ) &
    CLIENTS_PID=$!
fi

run_tap

if [ -n "$CLIENTS_PID" ]; then
    wait "$CLIENTS_PID" || true
    stop_cluster "$OUT/clients"
    rc=$(cat "$OUT/clients.rc" 2>/dev/null || echo 1)
    grep -E '^(client |    RESULT|==> client)' "$OUT/clients.log" || true
    PASSED=$((PASSED + $(grep -c '^client .* \.\.\. ok$' "$OUT/clients.log" || true)))
    for s in $(sed -n 's/^client \([a-z0-9_]*\) \.\.\. FAILED.*/\1/p' "$OUT/clients.log"); do
        FAILED=$((FAILED + 1)); FAILED_NAMES+=("client_$s")
        # what failed in the suite's log (a TAP "not ok" and what follows
        # it), then what the suite printed when it failed (its last lines)
        { grep -n -A 25 -E '^[[:space:]]*not ok|^FAIL:|^ERROR:|^Traceback' "$OUT/clients-log/$s.log" 2>/dev/null | head -n 35
          sed -n "/^==> client $s\$/,/^client $s \.\.\. FAILED/p" "$OUT/clients.log" | tail -n 25; } |
            failure_excerpt "client_$s"
    done
    if [ "$rc" -ne 0 ] && ! grep -q '^client .* FAILED' "$OUT/clients.log"; then
        FAILED=$((FAILED + 1)); FAILED_NAMES+=("clients (driver)"); tail -n 30 "$OUT/clients.log"
    fi
fi

# A server process that died of a signal other than the tests' own SIGKILL
# (a segfault, an abort) is a failure even when every test passed: its
# log lines, and the backtrace of its core file when one was written
# (start_cluster's pg_ctl -c) and gdb is installed.
check_crashes() {
    local log core
    while IFS= read -r log; do
        FAILED=$((FAILED + 1)); FAILED_NAMES+=("server crash (${log#"$OUT"/})")
        grep -B 3 -A 2 -E 'terminated by signal (4|6|7|8|11)\b' "$log" | failure_excerpt "server crash: ${log#"$OUT"/}"
    done < <(grep -rlE --include='*.log' 'terminated by signal (4|6|7|8|11)\b' "$OUT" 2>/dev/null || true)
    command -v gdb >/dev/null || return 0
    while IFS= read -r core; do
        gdb -q -batch -ex 'bt' "$PGBIN/postgres" "$core" 2>&1 | grep -v '^\[New LWP' |
            failure_excerpt "backtrace of ${core#"$OUT"/}"
    done < <(find "$OUT" -type f -name 'core*' 2>/dev/null || true)
}
check_crashes

echo
if [ ${#SEC_NAMES[@]} -gt 0 ]; then
    echo "security suite (${SEC_NAMES[*]}): $SEC_PASSED of $((SEC_PASSED + SEC_FAILED + SEC_SKIPPED)) runs passed, $SEC_FAILED failed, $SEC_SKIPPED skipped"
fi
if [ $SKIPPED -gt 0 ]; then
    echo "skipped: ${SKIPPED_NAMES[*]}"
fi
if [ $FAILED -gt 0 ]; then
    echo "failed: ${FAILED_NAMES[*]}"
fi
echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
[ $FAILED -eq 0 ] && [ $PASSED -gt 0 ]
