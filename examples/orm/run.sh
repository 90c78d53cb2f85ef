#!/usr/bin/env bash
# The ORM recipes of doc/orm.md, each a program that claims a key, writes a
# business row in the claim's transaction, finishes, and checks that the
# retry replays (no second row) and that a failure after the write rolls
# the row and the claim back (nothing left, the key free again).  Prints
# "ok - RECIPE" or "not ok - RECIPE" per recipe; exits non-zero when one
# failed.  clients/test.sh runs it as the suites node_orm and python_orm.
#
#   examples/orm/run.sh node|python [RECIPE...]    RECIPE: a file name (pg.js, django_recipe.py)
#
# PGHOST, PGPORT, PGDATABASE, PGUSER name the database (the extension
# created; IDEM_TEST_PGHOST, IDEM_TEST_PGPORT, IDEM_TEST_PGDATABASE,
# IDEM_TEST_PGUSER as clients/test.sh sets them are taken first).  Node:
# npm ci in examples/orm/node first; the Prisma client is generated here.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
LANG_=${1:?usage: run.sh node\|python [RECIPE...]}; shift
export PGHOST=${IDEM_TEST_PGHOST:-${PGHOST:-127.0.0.1}} PGPORT=${IDEM_TEST_PGPORT:-${PGPORT:-5432}}
export PGDATABASE=${IDEM_TEST_PGDATABASE:-${PGDATABASE:-postgres}} PGUSER=${IDEM_TEST_PGUSER:-${PGUSER:-$(id -un)}}
export DATABASE_URL="postgresql://$PGUSER@$PGHOST:$PGPORT/$PGDATABASE"
PY=/usr/bin/python3

case $LANG_ in
    node)
        DIR=$HERE/node
        [ -d "$DIR/node_modules" ] || { echo "FAILED: no node_modules: npm ci in examples/orm/node"; exit 1; }
        RECIPES=${*:-pg.js drizzle.js knex.js prisma.js}
        if [[ " $RECIPES " == *" prisma.js "* ]]; then
            # prisma generate needs no engine binary (Prisma 7 queries through
            # the pg adapter), but the CLI fetches the schema engine (used by
            # migrate) unless told where one is: binaries.prisma.sh is not
            # reachable everywhere, and this recipe does not migrate
            (cd "$DIR" && PRISMA_SCHEMA_ENGINE_BINARY=/bin/true PRISMA_HIDE_UPDATE_MESSAGE=1 \
                CHECKPOINT_DISABLE=1 node_modules/.bin/prisma generate >/dev/null) ||
                { echo "not ok - prisma.js: prisma generate failed"; exit 1; }
        fi
        RUN=(node) ;;
    python)
        DIR=$HERE/python
        RECIPES=${*:-psycopg_recipe.py sqlalchemy_core.py sqlalchemy_orm.py django_recipe.py}
        RUN=("$PY") ;;
    *) echo "usage: run.sh node|python [RECIPE...]" >&2; exit 2 ;;
esac

failed=0
begun=$EPOCHREALTIME
for r in $RECIPES; do
    start=$EPOCHREALTIME
    if out=$(cd "$DIR" && timeout 60 "${RUN[@]}" "$r" 2>&1); then
        printf '%s\n' "$out" | grep '^ok - ' || echo "ok - $r"
        awk -v a="$start" -v b="$EPOCHREALTIME" -v r="$r" 'BEGIN { printf "    (%s: %.1f s)\n", r, b - a }'
    else
        printf '%s\n' "$out" | sed 's/^/    /'
        echo "not ok - $r"
        failed=$((failed + 1))
    fi
done
echo "RESULT $LANG_ ORM recipes: $(echo $RECIPES | wc -w) run, $failed failed" \
    "($(awk -v a="$begun" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }') s)"
[ $failed -eq 0 ]
