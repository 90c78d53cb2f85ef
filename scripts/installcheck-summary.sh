#!/usr/bin/env bash
# pg_regress for "make installcheck" (the Makefile puts this script in front
# of PGXS's pg_regress command), then a line that corrects its count.
#
# A test that cannot run where it is (it needs test/preload.conf's
# settings, or the library preloaded) skips itself: its output is its
# notice "skipped: REASON", which its alternative expected output
# (expected/NAME_1.out) matches, and pg_regress counts it as passed ("All
# 29 tests passed.").  After pg_regress, this prints each such test with
# its reason, and the line
#
#   installcheck: N passed, M skipped, F failed (pg_regress counts a test that skipped itself as passed)
#
# (scripts/test.sh checks that its own count agrees).  The exit status is
# pg_regress's.
#
#   scripts/installcheck-summary.sh PG_REGRESS [OPTION...] [TEST...]

set -u
outputdir=.
for arg in "$@"; do
    case $arg in --outputdir=*) outputdir=${arg#--outputdir=} ;; esac
done
log=$(mktemp "${TMPDIR:-/tmp}/idempotency-installcheck.XXXXXX")
trap 'rm -f "$log"' EXIT
"$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

passed=0 skipped=0 failed=0
while IFS= read -r line; do
    # "test NAME ... ok|FAILED" up to PostgreSQL 15, "ok N - NAME" and
    # "not ok N - NAME" (TAP) from 16 on
    if [[ $line =~ ^(test)?[[:space:]]+([A-Za-z0-9_]+)[[:space:]]+\.\.\.[[:space:]]+(ok|FAILED|failed) ]]; then
        name=${BASH_REMATCH[2]} result=${BASH_REMATCH[3]}
    elif [[ $line =~ ^(not[[:space:]]+)?ok[[:space:]]+[0-9]+[[:space:]]+[-+][[:space:]]+([A-Za-z0-9_]+) ]]; then
        name=${BASH_REMATCH[2]} result=ok
        [ -n "${BASH_REMATCH[1]}" ] && result=failed
    else
        continue
    fi
    if [ "$result" != ok ]; then
        failed=$((failed + 1))
    elif reason=$(grep -m 1 '^skipped: ' "$outputdir/results/$name.out" 2>/dev/null); then
        echo "$name: $reason"
        skipped=$((skipped + 1))
    else
        passed=$((passed + 1))
    fi
done <"$log"
if [ $((passed + skipped + failed)) -gt 0 ]; then
    note=
    [ $skipped -gt 0 ] && note=" (pg_regress counts a test that skipped itself as passed)"
    echo "installcheck: $passed passed, $skipped skipped, $failed failed$note"
fi
exit "$rc"
