#!/usr/bin/env bash
# make test-matrix: make test on every PostgreSQL version the project runs
# its suite on here: Debian's PostgreSQL 15, PostgreSQL 17 (put together
# once in a cache, see pg17.sh), then PostgreSQL 18 (built once into a cache
# when missing, see pgcache.sh; PG18_CONFIG=/path/to/pg_config names another
# build of it); then the Debian package for 15, built, installed and
# installchecked (deb.sh; as root only).  Prints one line per server and a closing line
# "N passed, N failed, N skipped" over all of them; exits non-zero on any
# failure.
#
# Where PostgreSQL 18 can be neither found nor built (a clone without the
# source release beside it), its run is skipped with a message, and only
# the other servers count; under CI (CI=true) that is a failure.

. "$(dirname "$0")/common.sh"
. "$(dirname "$0")/pgcache.sh"
. "$(dirname "$0")/pg17.sh"

choose_build_dir
LOGS=$BUILD_DIR/matrix
mkdir -p "$LOGS"
SUMMARY=()
EXCERPTS=()
TOTAL_PASSED=0
TOTAL_FAILED=0
TOTAL_SKIPPED=0

# make test on one server ($2: its pg_config, empty for the default), or
# the command given after it
run_server() {
    local label=$1 pgc=$2 log rc line passed=0 failed=1 skipped=0
    shift 2
    local cmd=("$@")
    [ ${#cmd[@]} -gt 0 ] || cmd=(env -u PG_CONFIG IDEM_MATRIX=1 make --no-print-directory -C "$PROJECT_DIR" test ${pgc:+PG_CONFIG="$pgc"})
    log=$LOGS/$(printf '%s' "$label" | tr -c 'A-Za-z0-9.' '_').log
    say "$label"
    set +e
    "${cmd[@]}" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    set -e
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?$' "$log" | tail -n 1 || true)
    if [[ $line =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed(,\ ([0-9]+)\ skipped)?$ ]]; then
        passed=${BASH_REMATCH[1]} failed=${BASH_REMATCH[2]} skipped=${BASH_REMATCH[4]:-0}
        # a run that stopped early counts as one more failure
        [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1
    fi
    TOTAL_PASSED=$((TOTAL_PASSED + passed))
    TOTAL_FAILED=$((TOTAL_FAILED + failed))
    TOTAL_SKIPPED=$((TOTAL_SKIPPED + skipped))
    SUMMARY+=("$label: $passed passed, $failed failed, $skipped skipped")
    # the failures' evidence (scripts/test.sh's excerpts), repeated at the end
    if [ "$failed" -gt 0 ]; then
        EXCERPTS+=("---- $label: what failed ----")
        EXCERPTS+=("$(awk '/^==== failure: /{on=1} on{print} /^==== end of failure: /{on=0}' "$log" | head -n 200)")
        [ -n "${EXCERPTS[-1]}" ] || EXCERPTS[-1]="(no excerpt: see the last lines of $log)"$'\n'"$(tail -n 40 "$log")"
    fi
}

# a server that cannot be tested: a failure where $1 is 2 or under CI
cannot_test() {
    local rc=$1 label=$2 how=$3
    SUMMARY+=("$label: skipped: $SKIP_REASON")
    if [ "$rc" -eq 2 ]; then
        TOTAL_FAILED=$((TOTAL_FAILED + 1))
    elif [ "${CI:-}" = true ]; then
        SUMMARY+=("  (CI: a server that cannot be tested is a failure)")
        TOTAL_FAILED=$((TOTAL_FAILED + 1))
    else
        SUMMARY+=("  ($how)")
    fi
}

ensure_deps
run_server "$("$SYS_PG_CONFIG" --version)" ""

rc=0
ensure_pg17 || rc=$?
if [ $rc -eq 0 ]; then
    run_server "$("$PG17_PG_CONFIG" --version) (scripts/pg17.sh)" "$PG17_PG_CONFIG"
else
    cannot_test $rc "PostgreSQL 17" "to test it, put the Debian packages at $PG17_DEB_DIR (see scripts/pg17.sh)"
fi

rc=0
if [ -n "${PG18_CONFIG:-}" ]; then
    PG18_PG_CONFIG=$PG18_CONFIG
else
    ensure_pg18 || rc=$?
fi
if [ $rc -eq 0 ]; then
    run_server "$("$PG18_PG_CONFIG" --version)" "$PG18_PG_CONFIG"
else
    SUMMARY+=("PostgreSQL $PG18_VERSION: skipped: $SKIP_REASON")
    if [ $rc -eq 2 ]; then
        TOTAL_FAILED=$((TOTAL_FAILED + 1))
    elif [ "${CI:-}" = true ]; then
        SUMMARY+=("  (CI: a server that cannot be tested is a failure)")
        TOTAL_FAILED=$((TOTAL_FAILED + 1))
    else
        SUMMARY+=("  (to test it, run: make test-matrix PG18_CONFIG=/path/to/pg_config, or make test PG_CONFIG=/path/to/pg_config; or put the source release at $PG18_TARBALL)")
    fi
fi

if is_root; then
    run_server "Debian package for $("$SYS_PG_CONFIG" --version | sed 's/ (.*//')" "" "$PROJECT_DIR/scripts/deb.sh"
else
    SKIP_REASON="building, installing and testing the Debian package needs root"
    cannot_test 1 "Debian package" "run make test-matrix as root, or scripts/deb.sh alone"
fi

if [ ${#EXCERPTS[@]} -gt 0 ]; then
    echo
    say "failures"
    printf '%s\n' "${EXCERPTS[@]}"
fi
echo
say "test matrix"
printf '%s\n' "${SUMMARY[@]}"
echo "$TOTAL_PASSED passed, $TOTAL_FAILED failed, $TOTAL_SKIPPED skipped"
[ $TOTAL_FAILED -eq 0 ] && [ $TOTAL_PASSED -gt 0 ]
