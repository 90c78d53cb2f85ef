#!/usr/bin/env bash
# PL/Proxy for the scale-out tests: Debian's package for the server of the
# tests, installed when missing (as common.sh installs the project's
# packages), then copied into the tests' private PostgreSQL copy.  Servers
# built from source (the cached PostgreSQL 18) have no package: the tests
# that need PL/Proxy then skip.
#
# Source it after common.sh; do not run it.

# Install PL/Proxy for pg_config $1 and copy it into the private copy $2.
# Returns 1 when it cannot be had; the reason is in SKIP_REASON.
ensure_plproxy() {
    local pgc=$1 root=$2 major pkg
    major=$("$pgc" --version | sed 's/^PostgreSQL \([0-9]*\).*/\1/')
    pkg=postgresql-$major-plproxy
    if [ "$pgc" != "/usr/lib/postgresql/$major/bin/pg_config" ]; then
        SKIP_REASON="PL/Proxy comes from the Debian package $pkg, which serves Debian's own PostgreSQL only, not $pgc"
        return 1
    fi
    if ! apt-cache show "$pkg" >/dev/null 2>&1; then
        SKIP_REASON="there is no Debian package $pkg (PL/Proxy for PostgreSQL $major) in this system's package sources"
        return 1
    fi
    # in a subshell: ensure_deps ends the script when it cannot install
    if ! (ensure_deps "$pkg"); then
        SKIP_REASON="the Debian package $pkg is missing and could not be installed"
        return 1
    fi
    PATTERN='plproxy*' copy_into_local_install "" "$root" \
        "$("$pgc" --pkglibdir)" "$("$pgc" --sharedir)/extension"
}
