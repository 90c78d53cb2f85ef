#!/usr/bin/env bash
# Citus for the scale-out tests: built once from its source release into a
# cache outside the checkout (the cache of pgcache.sh), and copied into the
# tests' private PostgreSQL copy, so that the server installed on the
# system is never modified.
#
#   source: ../shared/citus/citus-13.2.2.tar.gz and the patch beside it
#           (needed with Debian's PostgreSQL 15.20 headers)
#   build:  CACHE/citus-13.2.2-pgMAJOR-HASH, a "make install DESTDIR=" tree
#           (HASH names the pg_config it was built for); logs and a status
#           file, DONE or FAIL, in CACHE/src/citus-13.2.2-pgMAJOR-HASH.log.d
#
# Source it after common.sh and pgcache.sh; do not run it.

CITUS_VERSION=13.2.2
CITUS_SHA256=c8fc76dc8294636a52b1a0dd75a20d8b4a36937df6443e30ca84d8d0464a6bb9
CITUS_PATCH_SHA256=8f5a051f9d62b00086802c5ecc86b704e226f96195e3e50c8e5749325d521748
CITUS_DIR=${CITUS_DIR:-$(dirname "$PROJECT_DIR")/shared/citus}
CITUS_TARBALL=$CITUS_DIR/citus-$CITUS_VERSION.tar.gz
CITUS_PATCH=$CITUS_DIR/citus-$CITUS_VERSION-pg15.20.patch
# what building it needs (Debian packages; ../shared/citus/README.md)
CITUS_BUILD_PACKAGES="gcc make libcurl4-openssl-dev liblz4-dev libzstd-dev libkrb5-dev libssl-dev libselinux1-dev libxslt1-dev libpam0g-dev libreadline-dev"

# Set CITUS_ROOT to the DESTDIR tree of Citus built for pg_config $1,
# building it first when it is missing.  Returns 1 when Citus cannot serve
# that server (version, no source release), 2 when building it failed; the
# reason is in SKIP_REASON.
ensure_citus() {
    local pgc=$1 major cache tag src
    major=$("$pgc" --version | sed 's/^PostgreSQL \([0-9]*\).*/\1/')
    if [ "$major" -lt 15 ] || [ "$major" -gt 17 ]; then
        SKIP_REASON="Citus $CITUS_VERSION supports PostgreSQL 15 to 17, not $major"
        return 1
    fi
    cache=$(cache_dir)
    tag=citus-$CITUS_VERSION-pg$major-$(printf '%s' "$pgc" | md5sum | cut -c1-8)
    CITUS_ROOT=$cache/$tag
    src=$cache/src/$tag.log.d
    [ -f "$CITUS_ROOT/.done" ] && return 0
    if [ ! -f "$CITUS_TARBALL" ] || [ ! -f "$CITUS_PATCH" ]; then
        SKIP_REASON="no Citus build in $CITUS_ROOT, and no source release to build it from ($CITUS_TARBALL and its patch)"
        return 1
    fi
    # in a subshell: ensure_deps ends the script when it cannot install
    if ! (ensure_deps "$CITUS_BUILD_PACKAGES"); then
        SKIP_REASON="the packages building Citus needs are missing and could not be installed ($CITUS_BUILD_PACKAGES)"
        return 2
    fi
    mkdir -p "$src"
    (
        umask 022
        # one build at a time, whoever else asks for it meanwhile
        exec 9>"$src/.lock"
        flock 9
        [ -f "$CITUS_ROOT/.done" ] && exit 0
        say "building Citus $CITUS_VERSION for $("$pgc" --version) into $CITUS_ROOT (a few minutes, once; logs in $src)"
        { echo "$CITUS_SHA256  $CITUS_TARBALL"; echo "$CITUS_PATCH_SHA256  $CITUS_PATCH"; } \
            | sha256sum --check --quiet \
            || { echo FAIL >"$src/status"; die "$CITUS_TARBALL or its patch: checksum mismatch"; }
        rm -rf "$src/citus-$CITUS_VERSION" "$CITUS_ROOT" "$src/status"
        # a build of its own, not a part of the make that runs this script:
        # PostgreSQL's makefiles generate their headers (errcodes.h, ...)
        # only at make level 0, and the parent's flags must not leak in
        unset MAKELEVEL MAKEFLAGS MFLAGS
        tar -xzf "$CITUS_TARBALL" -C "$src"
        cd "$src/citus-$CITUS_VERSION"
        if patch -p1 -i "$CITUS_PATCH" >"$src/patch.log" 2>&1 \
            && ./configure PG_CONFIG="$pgc" >"$src/configure.log" 2>&1 \
            && make -j"$(nproc)" >"$src/make.log" 2>&1 \
            && make install DESTDIR="$CITUS_ROOT" >"$src/install.log" 2>&1; then
            touch "$CITUS_ROOT/.done"
            echo DONE >"$src/status"
            # the build tree is large; the logs stay
            rm -rf "$src/citus-$CITUS_VERSION"
        else
            echo FAIL >"$src/status"
            tail -n 20 "$src"/*.log
            die "building Citus $CITUS_VERSION failed (logs in $src)"
        fi
    ) || { SKIP_REASON="building Citus $CITUS_VERSION failed (logs in $src)"; return 2; }
}

# Copy Citus (CITUS_ROOT, for pg_config $1) into the private PostgreSQL
# copy $2 made by build_local_install: its libraries and extension files.
install_citus() {
    copy_into_local_install "$CITUS_ROOT" "$2" "$("$1" --pkglibdir)" "$("$1" --sharedir)/extension"
}
