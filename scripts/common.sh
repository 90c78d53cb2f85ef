#!/usr/bin/env bash
# Shared helpers of the project's scripts (make run, make test, make bench):
# installing what is missing, building into a project-local PostgreSQL tree,
# and running server programs as an unprivileged user.
#
# Source it; do not run it.

set -euo pipefail

PROJECT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_MAJOR=${PG_MAJOR:-15}
PACKAGES="postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR postgresql-$PG_MAJOR-cron libipc-run-perl"
SYS_PG_CONFIG=/usr/lib/postgresql/$PG_MAJOR/bin/pg_config

say() { printf '==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

is_root() { [ "$(id -u)" = 0 ]; }

# The user that owns the throwaway clusters: initdb refuses to run as root.
if is_root; then PGOS_USER=postgres; else PGOS_USER=$(id -un); fi

# Run a command as the cluster owner, keeping the environment it needs.
as_pg() {
    if is_root; then
        runuser -u "$PGOS_USER" -- env PATH="$PATH" PERL5LIB="${PERL5LIB:-}" "$@"
    else
        "$@"
    fi
}

# Install the Debian packages the project needs (or those named), if any is
# missing.
ensure_deps() {
    local missing=() p
    for p in ${1:-$PACKAGES}; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    local cmd="apt-get update && apt-get install -y ${missing[*]}"
    if is_root; then
        say "installing ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        say "installing ${missing[*]} (sudo)"
        sudo -n env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
        sudo -n env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
    else
        die "missing packages: ${missing[*]}. Install them with: sudo sh -c '$cmd'"
    fi
    is_root || command -v runuser >/dev/null || true
}

# Where build products and cluster folders go.  The cluster owner must be
# able to reach them, which a clone under a private home folder may prevent;
# then they go below /tmp.
choose_build_dir() {
    BUILD_DIR=$PROJECT_DIR/build
    if is_root && ! runuser -u "$PGOS_USER" -- test -x "$PROJECT_DIR" 2>/dev/null; then
        BUILD_DIR=/tmp/idempotency-build-$(printf '%s' "$PROJECT_DIR" | md5sum | cut -c1-8)
    fi
    mkdir -p "$BUILD_DIR"
    is_root && chown "$PGOS_USER": "$BUILD_DIR"
    return 0
}

# Build the extension (warnings are errors) for the PostgreSQL installation
# of pg_config $1 (Debian's PostgreSQL 15 by default) and install it into a
# private copy of that installation in $BUILD_DIR/pginstall (one per
# installation), the way PostgreSQL's own "make check" uses tmp_install: the
# clusters of the tests then run exactly this build, whatever is installed
# system-wide.  Sets PGBIN and PGLIB, and PATH to find PGBIN first.
build_local_install() {
    local pgc=${1:-$SYS_PG_CONFIG}
    choose_build_dir
    say "building the extension for $("$pgc" --version)"
    make -C "$PROJECT_DIR" -s PG_CONFIG="$pgc" WERROR=1 >/dev/null
    local root=$BUILD_DIR/pginstall
    [ "$pgc" = "$SYS_PG_CONFIG" ] || root=$BUILD_DIR/pginstall-$(printf '%s' "$pgc" | md5sum | cut -c1-8)
    local libdir sharedir
    libdir=$("$pgc" --pkglibdir)
    sharedir=$("$pgc" --sharedir)
    if [ ! -f "$root/.copied" ]; then
        rm -rf "$root"
        mkdir -p "$root$(dirname "$libdir")" "$root$(dirname "$sharedir")"
        local bindir_parent
        bindir_parent=$(dirname "$("$pgc" --bindir)")
        mkdir -p "$root$bindir_parent"
        cp -al "$bindir_parent/." "$root$bindir_parent/" 2>/dev/null || cp -a "$bindir_parent/." "$root$bindir_parent/"
        cp -al "$sharedir" "$root$(dirname "$sharedir")/" 2>/dev/null || cp -a "$sharedir" "$root$(dirname "$sharedir")/"
        touch "$root/.copied"
    fi
    # never write through a hard link into the system's own files
    rm -f "$root$libdir"/idempotency.so "$root$sharedir"/extension/idempotency*
    make -C "$PROJECT_DIR" -s PG_CONFIG="$pgc" DESTDIR="$root" install >/dev/null
    PGBIN=$root$("$pgc" --bindir)
    PGLIB=$root$libdir
    export PATH="$PGBIN:$PATH"
    export PERL5LIB="$PGLIB/pgxs/src/test/perl${PERL5LIB:+:$PERL5LIB}"
}

# examples/ into a folder, without what npm installed there (the ORM
# recipes' node_modules is hundreds of MB) nor the generated Prisma client
copy_examples() {
    (cd "$PROJECT_DIR" && tar -ch --exclude=node_modules --exclude=examples/orm/node/generated -f - examples) |
        tar -x -C "$1"
}

# Copy the test inputs where the cluster owner can read them.
stage_tests() {
    STAGE=$BUILD_DIR/stage
    rm -rf "$STAGE"
    mkdir -p "$STAGE"
    cp -rL "$PROJECT_DIR/test" "$STAGE/test"
    copy_examples "$STAGE"
    cp -r "$PROJECT_DIR/expected" "$STAGE/expected"
    rm -rf "$STAGE/test/expected"
    ln -s ../expected "$STAGE/test/expected"
    # a copy of the sources, for the test that runs "make run" as a new user
    mkdir -p "$STAGE/project"
    (cd "$PROJECT_DIR" && cp -r Makefile idempotency.control README.md LICENSE CHANGELOG.md \
        CONTRIBUTING.md doc src sql scripts test expected "$STAGE/project/")
    copy_examples "$STAGE/project"
    rm -f "$STAGE"/project/src/*.o "$STAGE"/project/src/*.bc
    own_dir "$STAGE"
}

# Make a folder the cluster owner's (never the pginstall tree, whose files
# are hard links to the system's).
own_dir() {
    mkdir -p "$1"
    if is_root; then chown -R "$PGOS_USER": "$1"; fi
    return 0
}

# A TCP port nothing listens on.
free_port() {
    local p
    for p in $(seq $((54320 + RANDOM % 500)) 55999); do
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && [ ! -e "/tmp/.s.PGSQL.$p" ]; then
            echo "$p"; return 0
        fi
    done
    die "no free TCP port found"
}

# Start a throwaway cluster in $1/data, owned by the cluster owner, with the
# library preloaded (unless $3 is "nopreload"), listening on a free local
# port and on a socket in SOCKET_DIR (a short folder below /tmp: a socket
# path has at most 107 bytes, which a deep checkout would exceed); $2 holds
# more postgresql.conf lines.  Sets PORT and SOCKET_DIR.
start_cluster() {
    local dir=$1 extra=${2:-} preload="shared_preload_libraries = 'idempotency'"
    [ "${3:-}" = nopreload ] && preload=
    SOCKET_DIR=/tmp/idem-$(printf '%s' "$dir" | md5sum | cut -c1-10)
    rm -rf "$SOCKET_DIR"
    own_dir "$SOCKET_DIR"
    PORT=$(free_port)
    say "starting a throwaway cluster in $dir/data on port $PORT"
    as_pg initdb -D "$dir/data" -A trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log"; die "initdb failed"; }
    cat >>"$dir/data/postgresql.conf" <<CONF
port = $PORT
listen_addresses = 'localhost'
unix_socket_directories = '$SOCKET_DIR'
$preload
$extra
CONF
    # a port taken between free_port and the start (by a server of another
    # run of this machine) is replaced by another, a few times
    local tries=0
    # -c: a crash leaves a core file in the data folder (kernel.core_pattern
    # permitting), for the backtrace a log line cannot give
    until as_pg pg_ctl -c -D "$dir/data" -l "$dir/postgres.log" -w start >/dev/null; do
        tries=$((tries + 1))
        if [ $tries -ge 5 ] || ! grep -q 'Address already in use' "$dir/postgres.log"; then
            tail -n 20 "$dir/postgres.log"; die "the server did not start"
        fi
        PORT=$(free_port)
        say "port taken meanwhile: starting it on port $PORT instead"
        echo "port = $PORT" >>"$dir/data/postgresql.conf"
    done
}

# Copy into the private PostgreSQL copy $2 (made by build_local_install) the
# files below the folders $3... of the installation rooted at $1 ("" for
# the system; a "make install DESTDIR=" tree otherwise), those of the
# folders that match the pattern $PATTERN (a shell glob, * by default).
# Each file is removed before it is copied: the copy's other files are hard
# links to the system's, which must never be written through.
copy_into_local_install() {
    local from=$1 root=$2 d f; shift 2
    for d in "$@"; do
        [ -d "$from$d" ] || continue
        (cd "$from$d" && find . -maxdepth 1 \( -type f -o -type l \) -name "${PATTERN:-*}") | while IFS= read -r f; do
            rm -f "$root$d/$f"
            cp -a "$from$d/$f" "$root$d/$f"
        done
    done
}
