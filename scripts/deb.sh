#!/usr/bin/env bash
# The Debian package, as a distribution builds and tests it: a copy of the
# checkout's files is built with dpkg-buildpackage (debian/: pg_buildext,
# one out-of-tree build per PostgreSQL version of debian/pgversions that is
# installed, here Debian's 15), the package is installed, and
# debian/tests/installcheck (what autopkgtest runs) runs pg_regress and the
# isolation specs against the installed files on a pg_virtualenv cluster
# with the library preloaded.  The package is removed again at the end, and
# the files it replaced that belonged to no package (a "make install") are
# put back.
# Prints the tests as pg_regress reports them and a closing line "N passed,
# N failed, N skipped" (a test that skipped itself counts as skipped; a build
# or an installation that fails counts as one failure).  Needs root (it
# installs the package).

. "$(dirname "$0")/common.sh"

is_root || die "scripts/deb.sh installs a package: run it as root"
ensure_deps
ensure_deps "postgresql-server-dev-all debhelper dpkg-dev fakeroot gcc make"
choose_build_dir
DEB=$BUILD_DIR/deb
rm -rf "$DEB"
mkdir -p "$DEB/src"
# the files of the checkout (committed or not), without build products
(cd "$PROJECT_DIR" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - 2>/dev/null) | tar -xf - -C "$DEB/src"
version=$(cd "$DEB/src" && dpkg-parsechangelog -S Version)
PASSED=0 FAILED=0 SKIPPED=0
FAILED_NAMES=() SKIPPED_NAMES=()
finish() {
    echo
    [ $SKIPPED -gt 0 ] && echo "skipped: ${SKIPPED_NAMES[*]}"
    [ $FAILED -gt 0 ] && echo "failed: ${FAILED_NAMES[*]}"
    echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
    [ $FAILED -eq 0 ] && [ $PASSED -gt 0 ]
}

say "dpkg-buildpackage (idempotency $version)"
if ! (cd "$DEB/src" && dpkg-buildpackage -us -uc -b) >"$DEB/build.log" 2>&1; then
    tail -n 40 "$DEB/build.log"
    FAILED=1 FAILED_NAMES=("deb (dpkg-buildpackage; log in $DEB/build.log)")
    finish; exit 1
fi
mapfile -t debs < <(ls "$DEB"/postgresql-*-idempotency_*.deb 2>/dev/null | grep -v dbgsym)
[ ${#debs[@]} -gt 0 ] || die "dpkg-buildpackage made no package (log in $DEB/build.log)"
for d in "${debs[@]}"; do
    say "$(basename "$d"): $(dpkg-deb -c "$d" | grep -c 'extension/\|\.so$') files of the extension"
done

packages=()
for d in "${debs[@]}"; do packages+=("$(dpkg-deb -f "$d" Package)"); done
# The files of the package that are on the system already and belong to no
# package (a "make install" put them there) are kept aside and put back
# once the package is removed again: the system is left as it was found.
KEPT=$DEB/kept
rm -rf "$KEPT"
mkdir -p "$KEPT"
for d in "${debs[@]}"; do
    dpkg-deb --fsys-tarfile "$d" | tar -t | sed -n 's|^\./|/|p' | while IFS= read -r f; do
        if [ -f "$f" ] && ! dpkg -S "$f" >/dev/null 2>&1; then
            mkdir -p "$KEPT$(dirname "$f")"
            cp -a "$f" "$KEPT$f"
        fi
    done
done
put_back() {
    DEBIAN_FRONTEND=noninteractive dpkg -r "${packages[@]}" >/dev/null 2>&1 || true
    if [ -n "$(ls -A "$KEPT")" ]; then
        cp -a "$KEPT/." /
        say "put back the files the package had replaced: $(cd "$KEPT" && find . -type f | sed 's|^\.||' | tr '\n' ' ')"
    fi
}
trap put_back EXIT
say "installing ${packages[*]}"
if ! dpkg -i "${debs[@]}" >"$DEB/install.log" 2>&1; then
    cat "$DEB/install.log"
    FAILED=1 FAILED_NAMES=("deb (dpkg -i)")
    finish; exit 1
fi

# debian/tests/installcheck as autopkgtest runs it: in the source tree, as
# root (pg_virtualenv makes the cluster as postgres, which must read the
# test data)
own_dir "$DEB/src"
say "debian/tests/installcheck against the installed package"
set +e
(cd "$DEB/src" && debian/tests/installcheck) >"$DEB/installcheck.log" 2>&1
rc=$?
set -e
grep -E '\.\.\. |^(not )?ok [0-9]' "$DEB/installcheck.log" | sed 's/^/    /' || true
while IFS= read -r line; do
    if [[ $line =~ ^(test)?[[:space:]]+([A-Za-z0-9_]+)[[:space:]]+\.\.\.[[:space:]]+(ok|FAILED|failed) ]]; then
        name=${BASH_REMATCH[2]} result=${BASH_REMATCH[3]}
    elif [[ $line =~ ^(not[[:space:]]+)?ok[[:space:]]+[0-9]+[[:space:]]+[-+][[:space:]]+([A-Za-z0-9_]+) ]]; then
        name=${BASH_REMATCH[2]} result=ok
        [ -n "${BASH_REMATCH[1]}" ] && result=failed
    else
        continue
    fi
    if [ "$result" = ok ] && grep -qs '^skipped: ' "$DEB/src/results/$name.out" "$DEB/src/output_iso/results/$name.out"; then
        SKIPPED=$((SKIPPED + 1)); SKIPPED_NAMES+=("deb/$name")
    elif [ "$result" = ok ]; then
        PASSED=$((PASSED + 1))
    else
        FAILED=$((FAILED + 1)); FAILED_NAMES+=("deb/$name")
    fi
done <"$DEB/installcheck.log"
if [ $rc -ne 0 ]; then
    if [ $FAILED -eq 0 ]; then
        FAILED=1 FAILED_NAMES+=("deb (installcheck)")
    fi
    tail -n 60 "$DEB/installcheck.log"
fi
finish
