#!/usr/bin/env bash
# PostgreSQL servers the tests need besides Debian's: built once from an
# upstream source release into a cache outside the checkout, and reused.
#
#   cache: $IDEMPOTENCY_CACHE, or /var/cache/idempotency as root (readable by
#          the postgres user, which runs the clusters), or
#          ${XDG_CACHE_HOME:-$HOME/.cache}/idempotency otherwise
#   PostgreSQL 18.6: CACHE/postgresql-18.6, built from CACHE/src/postgresql-18.6
#   (logs and a status file, DONE or FAIL, in CACHE/src)
#
# Source it after common.sh; do not run it.

PG18_VERSION=18.6
PG18_SHA256=555610c24d53e4316da5b7d3fc25c279d96856d5e0e23ee308c328c5fa881d9f
# the release tarball: CI and the project's machines have ../shared beside
# the checkout
PG18_TARBALL=${PG18_TARBALL:-$(dirname "$PROJECT_DIR")/shared/postgresql/postgresql-$PG18_VERSION.tar.bz2}
# what building it needs (Debian packages)
PG18_BUILD_PACKAGES="gcc make bison flex bzip2 pkg-config libssl-dev liblz4-dev libzstd-dev libicu-dev zlib1g-dev libipc-run-perl"

cache_dir() {
    if [ -n "${IDEMPOTENCY_CACHE:-}" ]; then
        echo "$IDEMPOTENCY_CACHE"
    elif is_root; then
        echo /var/cache/idempotency
    else
        echo "${XDG_CACHE_HOME:-$HOME/.cache}/idempotency"
    fi
}

# A usable installation has its pg_config and pgcrypto (contrib).
pg_installed() {
    [ -x "$1/bin/pg_config" ] && [ -e "$("$1/bin/pg_config" --pkglibdir)/pgcrypto.so" ]
}

# Set PG18_PG_CONFIG to the pg_config of the cached PostgreSQL 18, building
# it first when it is missing.  Returns 1 when there is neither a build nor
# a source release to build it from, 2 when building it failed; the reason
# is in SKIP_REASON.
ensure_pg18() {
    local cache prefix src
    cache=$(cache_dir)
    prefix=$cache/postgresql-$PG18_VERSION
    src=$cache/src
    PG18_PG_CONFIG=$prefix/bin/pg_config
    pg_installed "$prefix" && return 0
    if [ ! -f "$PG18_TARBALL" ]; then
        SKIP_REASON="no build in $prefix, and no source release to build it from ($PG18_TARBALL)"
        return 1
    fi
    ensure_deps "$PG18_BUILD_PACKAGES"
    mkdir -p "$src"
    (
        umask 022
        # one build at a time, whoever else asks for it meanwhile
        exec 9>"$src/.lock"
        flock 9
        pg_installed "$prefix" && exit 0
        say "building PostgreSQL $PG18_VERSION into $prefix (a few minutes, once; logs in $src)"
        echo "$PG18_SHA256  $PG18_TARBALL" | sha256sum --check --quiet \
            || { echo FAIL >"$src/status"; die "$PG18_TARBALL: checksum mismatch"; }
        rm -rf "$src/postgresql-$PG18_VERSION" "$prefix" "$src/status"
        # a build of its own, not a part of the make that runs this script:
        # PostgreSQL's makefiles generate their headers (errcodes.h, ...)
        # only at make level 0, and the parent's flags must not leak in
        unset MAKELEVEL MAKEFLAGS MFLAGS
        tar -xjf "$PG18_TARBALL" -C "$src"
        cd "$src/postgresql-$PG18_VERSION"
        if ./configure --prefix="$prefix" --with-openssl --with-lz4 --with-zstd --with-icu \
                --enable-tap-tests --without-readline >"$src/configure.log" 2>&1 \
            && make -j"$(nproc)" >"$src/make.log" 2>&1 \
            && make install >"$src/install.log" 2>&1 \
            && make -C contrib install >>"$src/install.log" 2>&1; then
            echo DONE >"$src/status"
        else
            echo FAIL >"$src/status"
            tail -n 20 "$src"/*.log
            die "building PostgreSQL $PG18_VERSION failed (logs in $src)"
        fi
    ) || { SKIP_REASON="building PostgreSQL $PG18_VERSION failed (logs in $src)"; return 2; }
}
