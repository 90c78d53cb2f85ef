#!/usr/bin/env bash
# make test: install what is missing, build, then run every suite on
# throwaway clusters: pg_regress with and without the library preloaded, the
# isolation tester, and the TAP tests.  Prints the diffs of what failed and a
# closing line "N passed, N failed"; exits non-zero on any failure.
#
# TESTS=name1,name2 limits the run to the named tests of every suite.

. "$(dirname "$0")/common.sh"

ensure_deps
build_local_install
stage_tests
OUT=$BUILD_DIR/test-output
rm -rf "$OUT"
own_dir "$OUT"

PASSED=0
FAILED=0
FAILED_NAMES=()

selected() {
    [ -z "${TESTS:-}" ] && return 0
    case ",$TESTS," in *",$1,"*) return 0 ;; esac
    return 1
}

# Count the "test NAME ... ok|FAILED" lines pg_regress prints.
count_regress() {
    local log=$1 suite=$2 line name
    local before=$((PASSED + FAILED))
    while IFS= read -r line; do
        if [[ $line =~ ^(test)?[[:space:]]+([A-Za-z0-9_]+)[[:space:]]+\.\.\.[[:space:]]+(ok|FAILED|failed) ]]; then
            name=${BASH_REMATCH[2]}
            if [ "${BASH_REMATCH[3]}" = ok ]; then
                PASSED=$((PASSED + 1))
            else
                FAILED=$((FAILED + 1)); FAILED_NAMES+=("$suite/$name")
            fi
        fi
    done <"$log"
    return $((PASSED + FAILED - before == 0))
}

run_regress() {
    local suite=$1 conf=$2; shift 2
    local tests=() f name
    for f in "$@"; do
        name=$(basename "$f"); name=${name%.*}
        selected "$name" && tests+=("$name")
    done
    [ ${#tests[@]} -eq 0 ] && return 0
    say "$suite: ${tests[*]}"
    local dir=$OUT/$suite
    own_dir "$dir"
    local prog=$PGLIB/pgxs/src/test/regress/pg_regress
    if [ "$suite" = isolation ]; then
        prog=$PGLIB/pgxs/src/test/isolation/pg_isolation_regress
    fi
    set +e
    (cd "$dir" && as_pg "$prog" \
        --temp-instance="$dir/tmp_instance" \
        --temp-config="$STAGE/test/$conf" \
        --bindir="$PGBIN" \
        --inputdir="$STAGE/test" \
        --outputdir="$dir" \
        --dbname=contrib_regression \
        "${tests[@]}") >"$dir/run.log" 2>&1
    local rc=$?
    set -e
    sed 's/^/    /' "$dir/run.log" | grep -E '\.\.\. |^    (=|!)' || true
    if ! count_regress "$dir/run.log" "$suite" || { [ $rc -ne 0 ] && ! grep -q 'FAILED\|failed' "$dir/run.log"; }; then
        FAILED=$((FAILED + 1)); FAILED_NAMES+=("$suite (driver)")
        tail -n 30 "$dir/run.log"
        [ -f "$dir/log/postmaster.log" ] && tail -n 30 "$dir/log/postmaster.log"
    fi
    if [ -s "$dir/regression.diffs" ]; then
        echo "---- $suite: regression.diffs ----"
        cat "$dir/regression.diffs"
    fi
    return 0
}

run_tap() {
    local f name dir rc
    for f in "$PROJECT_DIR"/test/t/*.pl; do
        [ -e "$f" ] || continue
        name=$(basename "$f" .pl)
        selected "$name" || continue
        dir=$OUT/tap/$name
        own_dir "$dir"
        say "tap: $name"
        set +e
        (cd "$STAGE/test" && as_pg env TESTDIR="$dir" PG_REGRESS="$PGLIB/pgxs/src/test/regress/pg_regress" \
            PROJECT_DIR="$PROJECT_DIR" STAGE="$STAGE" PGLIB="$PGLIB" \
            prove "t/$name.pl") >"$dir/run.log" 2>&1
        rc=$?
        set -e
        if [ $rc -eq 0 ]; then
            PASSED=$((PASSED + 1))
            grep -E '^t/' "$dir/run.log" | sed 's/^/    /' || true
        else
            FAILED=$((FAILED + 1)); FAILED_NAMES+=("tap/$name")
            cat "$dir/run.log"
            for l in "$dir"/tmp_check/log/*; do
                [ -f "$l" ] || continue
                echo "---- $l (last lines) ----"; tail -n 40 "$l"
            done
        fi
    done
}

shopt -s nullglob
preload_tests=()
nopreload_tests=()
for f in "$PROJECT_DIR"/test/sql/*.sql; do
    case $(basename "$f") in
        nopreload_*) nopreload_tests+=("$f") ;;
        *) preload_tests+=("$f") ;;
    esac
done
run_regress regress preload.conf "${preload_tests[@]}"
run_regress regress_nopreload nopreload.conf "${nopreload_tests[@]}"
run_regress isolation preload.conf "$PROJECT_DIR"/test/specs/*.spec
run_tap
# the HTTP clients (clients/test.sh): each suite one test, named client_SUITE in TESTS
CLIENT_SUITES=$(for s in node_unit node_e2e python_unit python_e2e; do selected "client_$s" && echo "$s"; done || true)
if [ -n "$CLIENT_SUITES" ]; then
    set +e; "$PROJECT_DIR/clients/test.sh" $CLIENT_SUITES >"$OUT/clients.log" 2>&1; rc=$?; set -e
    grep -E '^(client |    RESULT|==> client)' "$OUT/clients.log" || true
    PASSED=$((PASSED + $(grep -c '^client .* \.\.\. ok$' "$OUT/clients.log" || true)))
    for s in $(sed -n 's/^client \([a-z0-9_]*\) \.\.\. FAILED.*/\1/p' "$OUT/clients.log"); do FAILED=$((FAILED + 1)); FAILED_NAMES+=("client_$s"); done
    if [ $rc -ne 0 ] && ! grep -q '^client .* FAILED' "$OUT/clients.log"; then
        FAILED=$((FAILED + 1)); FAILED_NAMES+=("clients (driver)"); tail -n 30 "$OUT/clients.log"
    fi
fi

echo
if [ $FAILED -gt 0 ]; then
    echo "failed: ${FAILED_NAMES[*]}"
fi
echo "$PASSED passed, $FAILED failed"
[ $FAILED -eq 0 ] && [ $PASSED -gt 0 ]
