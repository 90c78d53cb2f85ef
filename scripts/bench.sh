#!/usr/bin/env bash
# make bench: install what is missing, build, start a throwaway cluster with
# the library preloaded, and run the benchmarks of test/bench with pgbench:
# several scripts mixed in one run (so that their latencies are measured under
# the same conditions), once with 1 client and once with 8; then the scale,
# contention, fingerprint, expiry and tombstone scenarios.  Prints a table of
# per-script average and p99 latencies and the ratios against their targets,
# and writes it to test/bench/RESULTS.md.  Benchmarks only report: nothing
# here fails because a target is missed.
#
# The parts (BENCH_ONLY names them):
#   main         execute and replay paths against their floors, 1 and 8 clients
#   scale        the execute path (claim + business insert + finish) at 8 and
#                at 33 dated key partitions and with 10 million live keys,
#                1 client, synchronous_commit = off, each run mixed with the
#                floor (and ext_execute_merged, on the floor's footing) so
#                that every database has its ratio to the floor
#   contention   32 clients on 16 hot keys
#   fingerprint  canonical JSON fingerprints against sha256 of the text
#   diagnostics  the execute path with and without a request digest
#   expiry       dropping partitions against a batched DELETE
#   tombstones   the execute path on an endpoint that keeps tombstones against
#                one that keeps none, 1 client, synchronous_commit = off, with
#                1 million tombstones over 30 one-day partitions (max_ttl 30
#                days), then again with an endpoint at tombstone_ttl 10 years
#   locks        relation locks (and how many fast-path) held by a claim of a
#                new key in that database, atomic and lease mode: the most,
#                the mean and the fewest over 500 claims each
#   bytes        bytes written (heap + index of the tombstones, WAL) per
#                expired key by the maintenance pass that drops its partition,
#                with tombstones kept and with them off
#   roundtrip    the one-round-trip workload of test/bench/roundtrip (issue
#                39's targets): floor, PL/pgSQL reference, extension with
#                and without tombstones, each one stored-procedure call, five
#                mixed runs, 1 client, synchronous_commit = off
#   callgrind    instruction counts under valgrind (BENCH_CALLGRIND=1), of the
#                main scripts and, when their parts ran, of ext_execute in
#                s_base, s_parts and s_tomb (and ext_execute_no_tombstones),
#                and of floor_pay, ext_pay and ext_pay_notomb in s_rt (with
#                BENCH_ONLY=roundtrip,callgrind the main part does not run:
#                only the round trip's instructions are counted)
# Key horizons and tombstone filters are learned by a database's first
# maintenance pass after the server starts: every database gets one before
# it is measured (and again after the restart under callgrind), and the
# report says what each learned.
#
# BENCH_QUICK=1 runs shorter, with 1 million keys instead of 10 million for
# the scale scenario, 200,000 instead of 1 million for expiry, the tombstones
# and the bytes per expired key (about 4 minutes on 2 cores); the full run
# takes about 15 minutes.
# BENCH_CALLGRIND=1 adds instruction counts under valgrind's callgrind.
# BENCH_ONLY=main,scale,contention,fingerprint,expiry,diagnostics,tombstones,locks,bytes,roundtrip,callgrind
# runs only the parts named (callgrind implies BENCH_CALLGRIND=1) and writes
# its report to build/bench/RESULTS.md instead of test/bench/RESULTS.md.

. "$(dirname "$0")/common.sh"

QUICK=${BENCH_QUICK:-0}
[ "$QUICK" = 0 ] || QUICK=1
if [ $QUICK = 1 ]; then
    T_WARM=2 T_MAIN=15 T_SCALE=4 SCALE_ROUNDS=2 T_CONT=8 T_FP=10 T_DIAG=15 T_TOMB=10 T_RT=4
    SCALE_KEYS=1000000 NREPLAY=2000 EXPIRY_ROWS=200000 TOMB_ROWS=200000 BYTES_ROWS=200000
else
    T_WARM=5 T_MAIN=60 T_SCALE=10 SCALE_ROUNDS=3 T_CONT=30 T_FP=30 T_DIAG=60 T_TOMB=30 T_RT=12
    SCALE_KEYS=10000000 NREPLAY=10000 EXPIRY_ROWS=1000000 TOMB_ROWS=1000000 BYTES_ROWS=1000000
fi
FEW_PARTS=8 MANY_PARTS=33 LOCK_CLAIMS=500 RT_RUNS=5 RT_TOMBS=200000
ONLY=${BENCH_ONLY:-}
want() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
[[ ",$ONLY," == *",callgrind,"* ]] && BENCH_CALLGRIND=1

ensure_deps
build_local_install
stage_tests
BENCH_SRC=$STAGE/test/bench
BENCH_DIR=$BUILD_DIR/bench
STARTED=$(date +%s)

if [ -f "$BENCH_DIR/data/postmaster.pid" ]; then
    as_pg pg_ctl -D "$BENCH_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
fi
rm -rf "$BENCH_DIR"
own_dir "$BENCH_DIR"
own_dir "$BENCH_DIR/logs"
own_dir "$BENCH_DIR/scripts"

# The settings of the benchmark cluster, the same for every script.  WAL is
# flushed at every commit (synchronous_commit = on, as in production), so
# every latency includes one WAL flush.  shared_buffers holds the whole
# working set of the scale scenario; checkpoints are spaced so that none
# falls in a short run; the maintenance worker is off (the benchmark runs the
# maintenance pass itself, so no pass lands in the middle of a measurement);
# JIT is off (it only ever kicks in for the bulk set-up queries).
SETTINGS="shared_buffers = 2GB
max_wal_size = 8GB
checkpoint_timeout = 30min
maintenance_work_mem = 512MB
synchronous_commit = on
jit = off
max_connections = 100
idempotency.enable_worker = off"

start_cluster "$BENCH_DIR" "$SETTINGS"
trap 'as_pg pg_ctl -D "$BENCH_DIR/data" -m fast -w stop >/dev/null 2>&1 || true' EXIT

PSQL=(psql -X -q -h "$SOCKET_DIR" -p "$PORT" -U "$PGOS_USER" -v ON_ERROR_STOP=1)
psql_db() { local db=$1; shift; as_pg "${PSQL[@]}" -d "$db" "$@"; }
val() { psql_db "$1" -At -c "$2"; }

RESULTS=$BENCH_DIR/results.tsv
: >"$RESULTS"
meta() { printf 'meta\t%s\t%s\n' "$1" "$2" >>"$RESULTS"; }

# ---- the request of every script --------------------------------------------
# A payment request body of about 300 bytes and the response the API stores.
BODY='{"amount": 1000, "currency": "EUR", "customer": {"id": "cus_8f3a2b", "email": "ada@example.com", "name": "Ada Lovelace"}, "description": "Order 4711: 2 items", "metadata": {"order_id": "4711", "channel": "web", "client_ts": "2026-11-30T10:00:00Z"}, "payment_method": {"type": "card", "token": "tok_visa_4242", "exp": "12/29"}, "capture": true}'
RESP='{"id": "pay_4711", "status": "succeeded", "amount": 1000, "currency": "EUR"}'

psql_db postgres -c 'CREATE DATABASE bench'
psql_db bench -c 'SET client_min_messages = warning' -c 'CREATE EXTENSION idempotency CASCADE'
has_proc() { [ "$(val "$1" "SELECT to_regprocedure('$2') IS NOT NULL")" = t ]; }
# Without the core (idem_claim) only the floor and PL/pgSQL scripts run.
EXT=1
# (0.3.0's claim also takes the request digest of mismatch diagnostics)
if ! has_proc bench 'idempotency.idem_claim(text,text,text,bytea,interval,interval,interval)' &&
   ! has_proc bench 'idempotency.idem_claim(text,text,text,bytea,interval,interval,interval,bytea)'; then
    EXT=0
    meta core_missing "this build has no \`idem_claim\`: only the floor, plain and PL/pgSQL scripts ran"
    say "this build has no idempotency.idem_claim: running only the scripts that do not need it"
fi

# The extension's fingerprint: the canonical JSON digest when the build has
# it, else a constant computed once here.
if has_proc bench 'idempotency.idem_canonical_json_text_sha256(text)'; then
    # the body as the API received it, canonicalized from its text
    FP_EXPR='idempotency.idem_canonical_json_text_sha256(:body)'
    FP=$(as_pg "${PSQL[@]}" -d bench -At -v body="$BODY" \
        <<<"SELECT idempotency.idem_canonical_json_text_sha256(:'body')")
    meta fingerprint "extension scripts compute \`idem_canonical_json_text_sha256(body)\` (the request body's text) on every request"
else
    FP_EXPR=':fp::bytea'
    FP=$(as_pg "${PSQL[@]}" -d bench -At -v body="$BODY" \
        <<<"SELECT sha256(convert_to(:'body', 'UTF8'))")
    meta fingerprint "this build has no \`idem_canonical_json_sha256\`: extension scripts send a precomputed constant fingerprint"
fi
for f in "$BENCH_SRC"/*.sql; do
    sed "s/@FP@/$FP_EXPR/g" "$f" >"$BENCH_DIR/scripts/$(basename "$f")"
done
own_dir "$BENCH_DIR/scripts"
S=$BENCH_DIR/scripts

# Dated partitions: by the maintenance pass when the build has it (with
# idempotency.max_ttl set so that it makes about $2 of them), else by
# partitions.sql.  Prints the number of dated partitions of idempotency.keys
# (the default partition comes on top).
make_partitions() {
    local db=$1 n=$2
    if has_proc "$db" 'idempotency.idem_maintenance(timestamptz,boolean)'; then
        # a pass premakes from today to today + max_ttl and one more
        psql_db postgres -c "ALTER DATABASE $db SET idempotency.max_ttl = '$((n - 2))d'"
        learn_pass "$db"
    else
        psql_db "$db" -v nparts="$n" -f "$S/partitions.sql"
    fi
    val "$db" "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
               WHERE i.inhparent = 'idempotency.keys'::regclass
                 AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'"
}
# learn_pass DB: one maintenance pass in DB.  The first after the server
# started learns the database's key horizons and tombstone filters (until
# then claims probe every partition); what it learned (its DEBUG1 messages)
# goes to $BENCH_DIR/learned as "DB<TAB>what", for the report.
learn_pass() {
    local db=$1 out what
    out=$(psql_db "$db" -c 'SET client_min_messages = debug1' \
        -c 'SELECT count(*) FROM idempotency.idem_maintenance()' 2>&1 >/dev/null) \
        || { printf '%s\n' "$out" >&2; die "maintenance pass in $db failed"; }
    what=$(printf '%s\n' "$out" | sed -n 's/.*idempotency: \(.* learned from [0-9]* rows\).*/\1/p' | paste -sd';' | sed 's/;/; /g')
    printf '%s\t%s\n' "$db" "${what:-nothing learned (no horizons in this build, or learned before)}" >>"$BENCH_DIR/learned"
}
: >"$BENCH_DIR/learned"
if has_proc bench 'idempotency.idem_maintenance(timestamptz,boolean)'; then
    meta partitions "made by \`idempotency.idem_maintenance()\` (with \`idempotency.max_ttl\` set per database)"
else
    meta partitions "this build has no \`idem_maintenance\`: daily partitions made by test/bench/partitions.sql"
fi

# setup_db DB PARTS [SETTING=VALUE...]: the settings are the database's
# (ALTER DATABASE ... SET), set before anything runs in it
setup_db() {
    local db=$1 parts=$2 kv
    shift 2
    [ "$db" = bench ] || { psql_db postgres -c "CREATE DATABASE $db"; }
    for kv in "$@"; do
        psql_db postgres -c "ALTER DATABASE $db SET ${kv%%=*} = '${kv#*=}'"
    done
    psql_db "$db" -f "$S/setup.sql"
    psql_db "$db" -f "$S/plpgsql_reference.sql"
    make_partitions "$db" "$parts"
}

# ---- pgbench ------------------------------------------------------------------
RUN=0
DIAG_SCRIPTS=()		# set by bench_diagnostics, for the callgrind runs
# run_pgbench NAME DB CLIENTS SECONDS SCRIPT... : one pgbench run, logged
# per transaction into $BENCH_DIR/logs/NAME.*, output in NAME.out.
run_pgbench() {
    local name=$1 db=$2 clients=$3 secs=$4; shift 4
    local args=() s threads=1
    RUN=$((RUN + 1))
    for s in "$@"; do args+=(-f "$S/$s@1"); done
    [ "$clients" -ge 8 ] && threads=2
    if ! as_pg pgbench -h "$SOCKET_DIR" -p "$PORT" -U "$PGOS_USER" -n -M prepared \
        -c "$clients" -j "$threads" -T "$secs" -l --log-prefix="$BENCH_DIR/logs/$name" \
        -D run="$RUN" -D n=0 -D nreplay="$NREPLAY" -D body="$BODY" -D resp="$RESP" -D fp="$FP" \
        "${args[@]}" "$db" >"$BENCH_DIR/logs/$name.out" 2>&1; then
        tail -n 30 "$BENCH_DIR/logs/$name.out"
        die "pgbench run $name failed"
    fi
    grep -E '^(tps|number of (failed|transactions actually))' "$BENCH_DIR/logs/$name.out" | sed "s/^/    $name: /"
}
# latency LABEL NAME,NAME,... LOGPREFIX...: per-script latencies into $RESULTS
latency() {
    local label=$1 names=$2 p files=(); shift 2
    for p in "$@"; do files+=("$BENCH_DIR/logs/$p".[0-9]*); done
    perl "$PROJECT_DIR/test/bench/report.pl" latency "$label" "$names" "${files[@]}" >>"$RESULTS"
}

# ---- tombstones of expired keys ---------------------------------------------------
has_tombstones() { [ $EXT = 1 ] && [ "$(val "$1" "SELECT to_regclass('idempotency.tombstones') IS NOT NULL")" = t ]; }
# tomb_load DB N [ENDPOINT]: N tombstones of ENDPOINT (POST /payments, which
# ext_execute claims on; ext_execute_no_tombstones' endpoint keeps none),
# spread evenly over the dated partitions of idempotency.tombstones that
# maintenance made (test/bench/tombstones_load.sql).
tomb_load() {
    psql_db "$1" -v n="$2" -v endpoint="${3:-POST /payments}" -f "$S/tombstones_load.sql" >/dev/null
}
# tomb_parts_meta DB: "N partitions of idempotency.tombstones (default
# included), K holding rows, D in the default partition"
tomb_parts_meta() {
    val "$1" "SELECT (SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency.tombstones'::regclass)
                     || ' partitions of idempotency.tombstones (default included), '
                     || (SELECT count(DISTINCT tableoid) FROM idempotency.tombstones) || ' holding rows, '
                     || (SELECT count(*) FROM idempotency.tombstones_default) || ' rows in the default partition'"
}
# In database bench: $TOMB_ROWS tombstones, so that ext_execute (whose
# endpoint keeps tombstones) probes populated partitions and
# ext_execute_no_tombstones (whose endpoint keeps none) does not; and what
# they take on disk, per million.
TOMB_BYTES=""
bench_tombstones() {
    has_tombstones bench || return 0
    tomb_load bench "$TOMB_ROWS"
    TOMB_BYTES=$(val bench "SELECT round(sum(pg_total_relation_size(inhrelid))::numeric / $TOMB_ROWS * 1000000)
                             FROM pg_inherits WHERE inhparent = 'idempotency.tombstones'::regclass")
    meta tombstones "$TOMB_ROWS tombstones in database bench (endpoint POST /payments, which ext_execute claims on): $(tomb_parts_meta bench); $((TOMB_BYTES / 1048576)) MiB per million, $((TOMB_BYTES / 1000000)) bytes each (heap and index; scope_hash 16 bytes, fingerprint 32)"
}

# ---- 1, 2: execute and replay paths, mixed in one run --------------------------
bench_main() {
    say "setting up database bench ($NREPLAY completed keys for the replay scripts)"
    setup_db bench "$FEW_PARTS" >"$BENCH_DIR/parts_main"
    [ $EXT = 1 ] || sed -i '/idempotency\.idem_/d' "$S/replay_setup.sql"
    as_pg "${PSQL[@]}" -d bench -v nreplay="$NREPLAY" \
        -c "SELECT set_config('bench.body', \$\$$BODY\$\$, false), set_config('bench.resp', \$\$$RESP\$\$, false), set_config('bench.fp', '$FP', false)" \
        -f "$S/replay_setup.sql" >/dev/null
    bench_tombstones
    MAIN=(floor_execute.sql floor_roundtrip.sql plpgsql_execute.sql)
    [ $EXT = 1 ] && MAIN+=(ext_execute.sql ext_execute_merged.sql)
    [ $EXT = 1 ] && [ -n "$TOMB_BYTES" ] && MAIN+=(ext_execute_no_tombstones.sql)
    MAIN+=(plain_replay.sql plpgsql_replay.sql)
    [ $EXT = 1 ] && MAIN+=(ext_replay.sql ext_replay_given_fp.sql)
    MAIN_NAMES=$(printf '%s\n' "${MAIN[@]}" | sed 's/\.sql$//' | paste -sd,)
    say "execute and replay paths: warm-up, then 1 client, then 8 clients, ${T_MAIN}s each"
    run_pgbench warmup bench 1 "$T_WARM" "${MAIN[@]}" >/dev/null
    run_pgbench main_1c bench 1 "$T_MAIN" "${MAIN[@]}"
    run_pgbench main_8c bench 8 "$T_MAIN" "${MAIN[@]}"
    latency "1 client" "$MAIN_NAMES" main_1c
    latency "8 clients" "$MAIN_NAMES" main_8c
}

# ---- 3: scale --------------------------------------------------------------------
# The execute path at $FEW_PARTS and at $MANY_PARTS dated partitions and with
# $SCALE_KEYS live keys, each run mixing ext_execute with the floor
# (floor_execute) so that each database has its own ratio to the floor, and
# with ext_execute_merged (the execute path on the floor's footing); with
# synchronous_commit = off in these databases, so that the WAL flush of the
# commit does not hide what the claim costs.
bench_scale() {
    say "scale: $FEW_PARTS partitions (empty), $FEW_PARTS partitions and $SCALE_KEYS live keys, $MANY_PARTS partitions; synchronous_commit = off, each with the floor"
    setup_db s_base "$FEW_PARTS" synchronous_commit=off >"$BENCH_DIR/parts_base"
    setup_db s_keys "$FEW_PARTS" synchronous_commit=off >"$BENCH_DIR/parts_keys"
    setup_db s_parts "$MANY_PARTS" synchronous_commit=off >"$BENCH_DIR/parts_many"
    local t0 r i db
    t0=$(date +%s)
    as_pg "${PSQL[@]}" -d s_keys -v nkeys="$SCALE_KEYS" \
        -c "SELECT set_config('bench.resp', \$\$$RESP\$\$, false)" -f "$S/scale_load.sql" >/dev/null
    meta scale_load "$SCALE_KEYS live keys loaded in $(( $(date +%s) - t0 )) s by one INSERT ... SELECT FROM generate_series"
    meta scale_keys "$(val s_keys "SELECT count(*) FROM idempotency.keys WHERE expires_at > now()")"
    meta scale_keys_size "$(val s_keys "SELECT pg_size_pretty(sum(pg_total_relation_size(inhrelid))) FROM pg_inherits WHERE inhparent = 'idempotency.keys'::regclass")"
    meta parts_few "$(tail -n 1 "$BENCH_DIR/parts_base")"
    meta parts_many "$(tail -n 1 "$BENCH_DIR/parts_many")"
    meta scale_sync "databases s_base, s_keys and s_parts run with \`synchronous_commit = off\` (ALTER DATABASE); each run mixes ext_execute with floor_execute and ext_execute_merged (the execute path on the floor's footing: as many statements, the fingerprint sent), 1 client"
    psql_db postgres -c CHECKPOINT
    # pgbench runs against one database, so the three are measured in short
    # alternating rounds (the order rotates), all with 1 client, after a
    # warm-up run on each (as the main runs have one).
    DBS=(s_base s_keys s_parts)
    SCALE_SCRIPTS=(ext_execute.sql floor_execute.sql ext_execute_merged.sql)
    for db in "${DBS[@]}"; do
        run_pgbench "scale_warmup_$db" "$db" 1 "$T_WARM" "${SCALE_SCRIPTS[@]}" >/dev/null
    done
    for r in $(seq 1 "$SCALE_ROUNDS"); do
        for i in 0 1 2; do
            db=${DBS[$(( (i + r) % 3 ))]}
            run_pgbench "scale_${db}_$r" "$db" 1 "$T_SCALE" "${SCALE_SCRIPTS[@]}" >/dev/null
        done
    done
    for db in "${DBS[@]}"; do
        latency scale "$db,${db}_floor,${db}_merged" $(for r in $(seq 1 "$SCALE_ROUNDS"); do echo "scale_${db}_$r"; done)
    done
}

# ---- 4: contention ---------------------------------------------------------------
bench_contention() {
    say "contention: 32 clients on 16 hot keys, ${T_CONT}s"
    run_pgbench contention bench 32 "$T_CONT" contention.sql
    latency contention contention contention
    meta cont_actions "$(val bench "SELECT string_agg(action || '=' || n, ' ' ORDER BY action) FROM (SELECT action, count(*) n FROM bench_actions GROUP BY 1) a")"
    meta cont_keys "$(val bench "SELECT count(DISTINCT key) FROM bench_actions")"
    meta cont_business_rows "$(val bench "SELECT count(*) FROM payments WHERE tenant = 'hot'")"
    meta cont_duplicates "$(val bench "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) n FROM payments WHERE tenant = 'hot' GROUP BY idempotency_key) p")"
}

# ---- mismatch diagnostics: execute path with and without the request digest -------
bench_diagnostics() {
    if ! has_proc bench 'idempotency.idem_request_digest(text, text, text, jsonb, text, text, text[])'; then
        meta diag_missing "this build has no idem_request_digest: no diagnostics rows"
        return 0
    fi
    say "mismatch diagnostics: execute path without a digest, with one, on an endpoint with diagnostics off, ${T_DIAG}s"
    setup_db s_diag "$FEW_PARTS" >/dev/null
    psql_db s_diag -c "INSERT INTO idempotency.endpoints (endpoint, diagnostics) VALUES ('POST /quiet', false)" >/dev/null
    DIAG_SCRIPTS=(diag_none.sql diag_on.sql diag_endpoint_off.sql)
    local scripts=("${DIAG_SCRIPTS[@]}")
    run_pgbench diag_warmup s_diag 1 "$T_WARM" "${scripts[@]}" >/dev/null
    run_pgbench diag s_diag 1 "$T_DIAG" "${scripts[@]}"
    latency diagnostics diag_none,diag_on,diag_endpoint_off diag
    # what a key keeps: the stored size of the digest of the benchmark's body
    local bytes
    bytes=$(val s_diag "SELECT round(avg(pg_column_size(request_digest))) FROM idempotency.keys WHERE request_digest IS NOT NULL")
    meta diag_bytes "$bytes"
    meta diagnostics "a digest of the benchmark's $(printf '%s' "$BODY" | wc -c)-byte body (with method and path) takes $bytes bytes per key as stored (pg_column_size), $(val s_diag "SELECT pg_size_pretty($bytes::bigint * 1000000)") per million keys, with idempotency.diagnostics_max_bytes = $(val s_diag 'SHOW idempotency.diagnostics_max_bytes'); keys without a digest store nothing (a NULL)"
}

# ---- 5: fingerprint and expiry benchmarks of the other issues ----------------------
bench_fingerprint() {
    if [ ! -f "$BENCH_SRC/fp_setup.sql" ]; then
        meta fp_missing "test/bench/fp_setup.sql is not in this branch yet"
        return 0
    fi
    local s scripts=() names=""
    for s in fp_canonical_small fp_canonical_text_small fp_builtin_small fp_canonical_large fp_builtin_large; do
        if [ -f "$S/$s.sql" ]; then scripts+=("$s.sql"); names+=${names:+,}$s; fi
    done
    say "fingerprints: ${names//,/ }, ${T_FP}s"
    psql_db bench -f "$S/fp_setup.sql" >/dev/null
    run_pgbench fp bench 1 "$T_FP" "${scripts[@]}"
    latency fingerprint "$names" fp
}

bench_expiry() {
    if [ ! -f "$BENCH_SRC/expiry.sh" ] && [ ! -f "$BENCH_SRC/expiry.sql" ]; then
        meta expiry_missing "test/bench/expiry.sh (or expiry.sql) is not in this branch yet"
        return 0
    fi
    say "expiry: $EXPIRY_ROWS keys"
    psql_db postgres -c 'CREATE DATABASE s_expiry'
    psql_db s_expiry -c 'CREATE EXTENSION idempotency CASCADE' 2>/dev/null
    local rc
    set +e
    if [ -f "$BENCH_SRC/expiry.sh" ]; then
        as_pg env PGHOST="$SOCKET_DIR" PGPORT="$PORT" PGUSER="$PGOS_USER" PGDATABASE=s_expiry \
            BENCH_QUICK=$QUICK EXPIRY_ROWS="$EXPIRY_ROWS" bash "$BENCH_SRC/expiry.sh" >"$BENCH_DIR/expiry.out" 2>&1
    else
        as_pg psql -X -q -h "$SOCKET_DIR" -p "$PORT" -U "$PGOS_USER" -d s_expiry -v ON_ERROR_STOP=1 \
            -v rows="$EXPIRY_ROWS" -f "$S/expiry.sql" >"$BENCH_DIR/expiry.out" 2>&1
    fi
    rc=$?
    set -e
    [ $rc = 0 ] || echo "(exit status $rc)" >>"$BENCH_DIR/expiry.out"
    printf 'block\texpiry\t%s\n' "$BENCH_DIR/expiry.out" >>"$RESULTS"
    # its summary, when it prints one: "drop_vs_delete | ..." then a value
    # row; "drop partitions ... | seconds | rows | dead tuples"
    meta expiry_speedup "$(awk -F'|' '/drop_vs_delete/ {getline; getline; gsub(/ /, "", $1); print $1; exit}' "$BENCH_DIR/expiry.out")"
    meta expiry_drop_dead "$(awk -F'|' '/^ *drop partitions/ {gsub(/ /, "", $4); print $4; exit}' "$BENCH_DIR/expiry.out")"
    sed 's/^/    /' "$BENCH_DIR/expiry.out"
}

# ---- tombstones on and off, with 1 million of them and a 10-year endpoint ---------
# Database s_tomb: max_ttl 30 days (32 dated partitions of keys), one-day
# partitions of tombstones (idempotency.tombstone_partition_interval), so
# that the $TOMB_ROWS tombstones of POST /payments spread over about 30 of
# them, and synchronous_commit = off.  ext_execute (an endpoint that keeps
# tombstones) against ext_execute_no_tombstones (one that keeps none), with
# the floor in the same run; then the same after an endpoint at
# tombstone_ttl = '10 years' is added and maintenance made its windows.
TOMB_DB=0 DECADE=0 RT_DB=0
tomb_db() {
    [ $TOMB_DB = 1 ] && return 0
    say "tombstones: database s_tomb (max_ttl 30 days, 1-day tombstone partitions), $TOMB_ROWS tombstones"
    setup_db s_tomb 32 idempotency.tombstone_partition_interval=1d synchronous_commit=off >"$BENCH_DIR/parts_tomb"
    local t0
    t0=$(date +%s)
    tomb_load s_tomb "$TOMB_ROWS"
    # then a pass, as the worker makes one: it compacts the filters the
    # load grew generation by generation
    psql_db s_tomb -c 'SET client_min_messages = warning' -c 'SELECT count(*) FROM idempotency.idem_maintenance()' >/dev/null
    meta tomb_db "database s_tomb (\`synchronous_commit = off\`, \`idempotency.max_ttl = '30d'\`, \`idempotency.tombstone_partition_interval = '1d'\`): $(tail -n 1 "$BENCH_DIR/parts_tomb") dated partitions of idempotency.keys; $TOMB_ROWS tombstones of POST /payments (loaded in $(( $(date +%s) - t0 )) s by SQL, through the trigger tombstones_filter, then one maintenance pass, which compacts the filters that grew): $(tomb_parts_meta s_tomb)"
    meta tomb_rows "$TOMB_ROWS"
    TOMB_DB=1
}
tomb_decade() {
    [ $DECADE = 1 ] && return 0
    local i
    psql_db s_tomb -c "INSERT INTO idempotency.endpoints (endpoint, tombstone_ttl) VALUES ('POST /decade', '10 years')"
    # a pass makes at most 64 partitions of a table per transaction
    for i in 1 2 3; do
        psql_db s_tomb -c 'SET client_min_messages = warning' -c 'SELECT count(*) FROM idempotency.idem_maintenance()' >/dev/null
    done
    meta tomb_decade "then endpoint POST /decade at \`tombstone_ttl = '10 years'\` (a row in idempotency.endpoints) and three maintenance passes for its windows: $(tomb_parts_meta s_tomb)"
    DECADE=1
}
bench_tomb_onoff() {
    has_tombstones bench || { meta tomb_missing "this build keeps no tombstones: no tombstones rows"; return 0; }
    tomb_db
    local scripts=(ext_execute.sql ext_execute_no_tombstones.sql floor_execute.sql)
    local names=ext_execute,ext_execute_no_tombstones,floor_execute
    say "tombstones on against off, 1 client, ${T_TOMB}s; then with a 10-year endpoint"
    psql_db postgres -c CHECKPOINT >/dev/null
    run_pgbench tomb_warmup s_tomb 1 "$T_WARM" "${scripts[@]}" >/dev/null
    run_pgbench tomb s_tomb 1 "$T_TOMB" "${scripts[@]}"
    latency tombstones "$names" tomb
    tomb_decade
    psql_db postgres -c CHECKPOINT >/dev/null
    run_pgbench tomb10_warmup s_tomb 1 "$T_WARM" "${scripts[@]}" >/dev/null
    run_pgbench tomb10 s_tomb 1 "$T_TOMB" "${scripts[@]}"
    latency "tombstones, 10-year endpoint" "$names" tomb10
}

# ---- the one-round-trip workload of test/bench/roundtrip --------------------------
# Each request one stored-procedure call (floor_pay, ref_pay, ext_pay,
# ext_pay_notomb), so each script costs one round trip and the ratios compare
# the server's work alone.  Database s_rt: 33 dated key partitions (max_ttl
# 31 days), synchronous_commit = off, $RT_TOMBS tombstones of POST
# /v1/payments (the endpoint of ext_pay, which keeps tombstones), an endpoint
# at tombstone_ttl = '10 years', and POST /v1/payments-notomb (ext_pay_notomb)
# at tombstone_ttl = 0; $RT_RUNS runs of ${T_RT}s, 1 client, the four scripts
# mixed.  Latencies over all runs together (label "round trip") and per run
# (labels "round trip N", for the range of the ratios).
bench_roundtrip() {
    local rt=$BENCH_SRC/roundtrip i names=rt_floor,rt_ref,rt_ext,rt_ext_notomb prefixes=()
    if [ ! -f "$rt/ext.pgb" ]; then
        meta rt_missing "test/bench/roundtrip is not in this branch"
        return 0
    fi
    say "round trip: database s_rt (33 partitions, $RT_TOMBS tombstones, a 10-year endpoint), $RT_RUNS runs of ${T_RT}s"
    psql_db postgres -c 'CREATE DATABASE s_rt'
    psql_db postgres -c "ALTER DATABASE s_rt SET synchronous_commit = off"
    psql_db s_rt -c 'SET client_min_messages = warning' -c 'CREATE EXTENSION idempotency CASCADE'
    psql_db s_rt -f "$rt/reference.sql" -f "$rt/ext.sql" -f "$rt/ext_notomb.sql" >/dev/null
    psql_db s_rt -c "INSERT INTO idempotency.endpoints (endpoint, tombstone_ttl) VALUES ('POST /v1/payments-notomb', '0'), ('POST /decade', '10 years')" >/dev/null
    make_partitions s_rt 33 >"$BENCH_DIR/parts_rt"
    for i in 1 2; do
        psql_db s_rt -c 'SET client_min_messages = warning' -c 'SELECT count(*) FROM idempotency.idem_maintenance()' >/dev/null
    done
    tomb_load s_rt "$RT_TOMBS" 'POST /v1/payments'
    psql_db s_rt -c 'SET client_min_messages = warning' -c 'SELECT count(*) FROM idempotency.idem_maintenance()' >/dev/null
    meta rt_db "database s_rt (\`synchronous_commit = off\`, \`idempotency.max_ttl = '31d'\`): $(tail -n 1 "$BENCH_DIR/parts_rt") dated partitions of idempotency.keys; $RT_TOMBS tombstones of POST /v1/payments; endpoint POST /decade at \`tombstone_ttl = '10 years'\`, POST /v1/payments-notomb at \`tombstone_ttl = 0\`: $(tomb_parts_meta s_rt)"
    cp "$rt"/*.pgb "$S/"
    own_dir "$S"
    psql_db postgres -c CHECKPOINT >/dev/null
    run_pgbench rt_warmup s_rt 1 "$T_WARM" floor.pgb ref.pgb ext.pgb ext_notomb.pgb >/dev/null
    for i in $(seq 1 "$RT_RUNS"); do
        run_pgbench "rt$i" s_rt 1 "$T_RT" floor.pgb ref.pgb ext.pgb ext_notomb.pgb
        latency "round trip $i" "$names" "rt$i"
        prefixes+=("rt$i")
    done
    latency "round trip" "$names" "${prefixes[@]}"
    meta rt_runs "$RT_RUNS"
    RT_DB=1
}

# ---- relation locks of a claim of a new key -----------------------------------------
# In s_tomb with its 10-year endpoint (max_ttl 30 days, tombstones stored):
# test/bench/locks.sql counts from pg_locks the relations of schema
# idempotency the backend holds inside the transaction of each of
# $LOCK_CLAIMS claims of new keys per mode (a claim opens a tombstone
# partition whose filter answers "maybe", so the count varies by key).
bench_locks() {
    has_tombstones bench || { meta locks "this build keeps no tombstones: not measured"; return 0; }
    tomb_db
    tomb_decade
    local mode n most mean fewest slow over text=""
    while IFS='|' read -r mode n most mean fewest slow over; do
        [ -n "$over" ] || continue
        printf 'locks\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$n" "$most" "$mean" "$fewest" "$slow" "$over" >>"$RESULTS"
        text+="${text:+; }$mode mode ($([ "$mode" = atomic ] && echo 'claim + finish' || echo 'the claim')): at most $most, $mean on average, at least $fewest; $slow claims held a lock not fast-path, $over more than 8"
    done < <(psql_db s_tomb -At -v n="$LOCK_CLAIMS" -f "$S/locks.sql")
    [ -n "$text" ] || text="not measured: test/bench/locks.sql printed nothing"
    meta locks "relation locks of schema idempotency held by a claim of a new key of POST /payments in database s_tomb (max_ttl 30 days, endpoint POST /decade at tombstone_ttl 10 years, tombstones stored), from pg_locks inside its transaction, over $LOCK_CLAIMS claims per mode each in its own transaction: $text"
    say "locks per claim of a new key: $text"
}

# ---- bytes written per expired key --------------------------------------------------
# Databases s_bytes_on (tombstones kept, the default 30 days) and s_bytes_off
# (idempotency.tombstone_ttl = 0): $BYTES_ROWS keys expiring tomorrow, then
# the pass that drops their partition (test/bench/expiry_bytes.sql).
bench_bytes() {
    if ! has_tombstones bench || ! has_proc bench 'idempotency.idem_maintenance(timestamptz,boolean)'; then
        meta bytes_missing "this build keeps no tombstones: bytes per expired key not measured"
        return 0
    fi
    say "bytes per expired key: $BYTES_ROWS keys dropped by a pass, tombstones kept and off"
    local mode db line rows trows heap wal keys drops creates left
    for mode in on off; do
        db=s_bytes_$mode
        psql_db postgres -c "CREATE DATABASE $db"
        psql_db postgres -c "ALTER DATABASE $db SET idempotency.partition_interval = '1d'" \
            -c "ALTER DATABASE $db SET idempotency.max_ttl = '5d'"
        [ $mode = on ] || psql_db postgres -c "ALTER DATABASE $db SET idempotency.tombstone_ttl = '0'"
        psql_db "$db" -c 'SET client_min_messages = warning' -c 'CREATE EXTENSION idempotency CASCADE'
        learn_pass "$db"
        line=$(psql_db "$db" -At -v rows="$BYTES_ROWS" -f "$S/expiry_bytes.sql" | tail -n 1)
        IFS='|' read -r rows trows heap wal keys drops creates left <<<"$line"
        printf 'bytes\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$rows" "$trows" "$heap" "$wal" "$keys" >>"$RESULTS"
        meta "bytes_$mode" "database $db (tombstones $([ $mode = on ] && echo 'kept, idempotency.tombstone_ttl 30 days' || echo 'off, idempotency.tombstone_ttl = 0')): $rows keys expiring tomorrow; \`idem_maintenance(now() + interval '2 days', preview => false)\` after a CHECKPOINT dropped $drops partitions of keys ($((keys / 1048576)) MiB), made $creates, wrote $trows tombstones; idempotency.tombstones grew by $heap bytes (heap and index), WAL by $wal bytes; $left expired keys left"
        printf '    %s: %s keys, %s tombstones, heap and index +%s bytes, WAL %s bytes\n' "$db" "$rows" "$trows" "$heap" "$wal"
    done
}

# ---- BENCH_CALLGRIND=1: instruction counts ------------------------------------------
# Restarts the cluster under valgrind's callgrind and runs each script with
# 1 client for 100 and then 600 transactions; the difference of the two
# backends' instruction counts over 500 is the server-side cost of one
# transaction, free of connection start-up and stable on a noisy machine.
# full_page_writes is off under callgrind: the first change of a page after
# the restart's checkpoint would otherwise copy it into the WAL (its CRC and
# copy, some 2,000 instructions), paid by whichever script touches the page
# first, so that scripts sharing tables (ext_execute and
# ext_execute_no_tombstones, ext_pay and ext_pay_notomb) would be measured
# in favour of the later one.
CG_DIR=$BENCH_DIR/callgrind
# true while a profile written since the listing $1 lacks its totals line
cg_incomplete() {
    local f
    for f in $(comm -13 <(echo "$1") <(ls "$CG_DIR")); do
        case $f in cg.*) grep -q '^totals:' "$CG_DIR/$f" || return 0 ;; esac
    done
    return 1
}
# cg_run DB N SCRIPT RUN: prints the callgrind file of the client's backend
cg_run() {
    local db=$1 n=$2 script=$3 run=$4 before f t best=0 bestf="" tries=0 pm
    pm=$(head -n 1 "$BENCH_DIR/data/postmaster.pid")
    before=$(ls "$CG_DIR")
    as_pg pgbench -h "$SOCKET_DIR" -p "$PORT" -U "$PGOS_USER" -n -M prepared -c 1 -t "$n" \
        -D run="$run" -D n=0 -D nreplay="$NREPLAY" -D body="$BODY" -D resp="$RESP" -D fp="$FP" \
        -f "$S/$script" "$db" >"$CG_DIR/pgbench.out" 2>&1 \
        || { cat "$CG_DIR/pgbench.out" >&2; die "pgbench under callgrind failed"; }
    # a backend writes its profile when it exits: wait for pgbench's
    # backends to be gone, then for their profiles to be complete
    while [ "$(pgrep -c -P "$pm")" -gt "$CG_CHILDREN" ] || cg_incomplete "$before"; do
        tries=$((tries + 1)); [ $tries -gt 300 ] && die "callgrind profiles not written"
        sleep 0.2
    done
    for f in $(comm -13 <(echo "$before") <(ls "$CG_DIR")); do
        case $f in cg.*) ;; *) continue ;; esac
        t=$(awk '/^totals:/ {print $2}' "$CG_DIR/$f")
        if [ "$t" -gt "$best" ]; then best=$t; bestf=$f; fi
    done
    echo "$bestf"
}
# inclusive instructions of the functions that matter, from one profile
cg_functions() {
    callgrind_annotate --inclusive=yes --threshold=100 "$CG_DIR/$1" 2>/dev/null \
        | perl -ne 'if (/^\s*([\d,]+)\s+\(.*?\)\s+\S*:(idem_claim|idem_finish|IdemKeystoreRead|IdemKeystoreReadWithExpired|IdemTombstoneFind|IdemTombstoneHash|IdemTombFilterSkip|IdemKeystoreInsert|floor_pay|ext_pay|ext_pay_notomb|ExecConstraints|idem_canonical_json_sha256|idem_canonical_json_text_sha256|jsonb_in) \[/ && !$seen{$2}++) { my ($n, $fn) = ($1, $2); $n =~ s/,//g; $fn = "IdemKeystoreRead" if $fn eq "IdemKeystoreReadWithExpired"; print "$fn $n\n" }'
}
bench_callgrind() {
    command -v valgrind >/dev/null || { meta callgrind "valgrind is not installed: no instruction counts"; return 0; }
    say "instruction counts under callgrind (BENCH_CALLGRIND=1)"
    as_pg pg_ctl -D "$BENCH_DIR/data" -m fast -w stop >/dev/null
    own_dir "$CG_DIR"
    as_pg valgrind --tool=callgrind --callgrind-out-file="$CG_DIR/cg.%p" \
        postgres -D "$BENCH_DIR/data" -c autovacuum=off -c full_page_writes=off >"$CG_DIR/postmaster.log" 2>&1 &
    local i db script f1 f2 t1 t2 fn n1 n2
    CG_CHILDREN=0
    for i in $(seq 1 120); do as_pg pg_isready -q -h "$SOCKET_DIR" -p "$PORT" && break; sleep 1; done
    # the first connection after a start rebuilds the relation cache file:
    # connect once to each database before measuring; the key horizons and
    # tombstone filters are gone with the restart: a pass learns them again
    for db in bench s_base s_parts s_diag s_tomb s_rt; do
        psql_db "$db" -c 'SELECT 1' >/dev/null 2>&1 || continue
        if has_proc "$db" 'idempotency.idem_maintenance(timestamptz,boolean)'; then
            learn_pass "$db"
            sed -i "\$s/^$db\t/$db (restart under callgrind)\t/" "$BENCH_DIR/learned"
        fi
    done
    # then count the server's own processes, once those backends are gone
    local pm prev=-1 stable=0
    pm=$(head -n 1 "$BENCH_DIR/data/postmaster.pid")
    while [ $stable -lt 4 ]; do
        CG_CHILDREN=$(pgrep -c -P "$pm")
        if [ "$CG_CHILDREN" = "$prev" ]; then stable=$((stable + 1)); else stable=0; fi
        prev=$CG_CHILDREN
        sleep 0.5
    done
    local runs=()
    for script in "${MAIN[@]}"; do runs+=("bench:$script"); done
    if [ "$RT_DB" = 1 ]; then runs+=("s_rt:floor.pgb" "s_rt:ext.pgb" "s_rt:ext_notomb.pgb"); fi
    if [ $EXT = 1 ] && want scale; then runs+=("s_base:ext_execute.sql" "s_parts:ext_execute.sql"); fi
    for script in "${DIAG_SCRIPTS[@]}"; do runs+=("s_diag:$script"); done
    if [ $TOMB_DB = 1 ]; then runs+=("s_tomb:ext_execute.sql" "s_tomb:ext_execute_no_tombstones.sql"); fi
    for i in "${runs[@]}"; do
        db=${i%%:*}; script=${i#*:}
        RUN=$((RUN + 2))
        f1=$(cg_run "$db" 100 "$script" $((RUN - 1))); f2=$(cg_run "$db" 600 "$script" "$RUN")
        t1=$(awk '/^totals:/ {print $2}' "$CG_DIR/$f1"); t2=$(awk '/^totals:/ {print $2}' "$CG_DIR/$f2")
        script=${script%.sql}; script=${script%.pgb}
        printf '%s/%s\t%s\t%s\n' "$db" "$script" "$f1" "$f2" >>"$CG_DIR/profiles"
        printf 'ins\t%s\t%s\t%d\n' "$db" "$script" $(( (t2 - t1) / 500 )) >>"$RESULTS"
        join <(cg_functions "$f1" | sort) <(cg_functions "$f2" | sort) | while read -r fn n1 n2; do
            printf 'insfn\t%s\t%s\t%s\t%d\n' "$db" "$script" "$fn" $(( (n2 - n1) / 500 )) >>"$RESULTS"
        done
        printf '    %s/%s: %d instructions per transaction\n' "$db" "$script" $(( (t2 - t1) / 500 ))
    done
    as_pg pg_ctl -D "$BENCH_DIR/data" -m fast -w stop >/dev/null
}

# callgrind needs the database and the scripts of the main run (but for
# BENCH_ONLY=roundtrip,callgrind, which counts the round trip's alone)
MAIN=()
if want main || { want callgrind && ! { [ -n "$ONLY" ] && want roundtrip; }; }; then bench_main; fi
if [ $EXT = 1 ]; then
    want scale && bench_scale
    want contention && bench_contention
    want diagnostics && bench_diagnostics
fi
want fingerprint && bench_fingerprint
want expiry && bench_expiry
if [ $EXT = 1 ]; then
    want tombstones && bench_tomb_onoff
    want locks && bench_locks
    want bytes && bench_bytes
    want roundtrip && bench_roundtrip
fi

# ---- report ------------------------------------------------------------------------
meta date "$(date -u '+%Y-%m-%d %H:%M UTC')"
meta version "$(val bench 'SELECT version()')"
meta nproc "$(nproc)"
meta load "$(cut -d' ' -f1-3 /proc/loadavg)"
meta parts_main "$(tail -n 1 "$BENCH_DIR/parts_main")"
meta mode "$([ $QUICK = 1 ] && echo "BENCH_QUICK=1 (short runs, $SCALE_KEYS keys for the scale scenario, $EXPIRY_ROWS for expiry, $TOMB_ROWS tombstones instead of 1 million, $BYTES_ROWS expired keys for the bytes per key)" || echo full)"
meta durations "main runs ${T_MAIN}s each; scale ${SCALE_ROUNDS} rounds of ${T_SCALE}s per database; contention ${T_CONT}s; fingerprints ${T_FP}s; diagnostics ${T_DIAG}s; tombstones ${T_TOMB}s per run; round trip $RT_RUNS runs of ${T_RT}s"
meta settings "$(printf '%s' "$SETTINGS" | paste -sd';' | sed 's/;/; /g')"
[ "${BENCH_CALLGRIND:-0}" = 1 ] && bench_callgrind
learned_meta() {
    local db what out=""
    while IFS=$'\t' read -r db what; do out+="${out:+; }$db: $what"; done <"$BENCH_DIR/learned"
    printf '%s' "$out"
}
meta learned "every database had a maintenance pass before it was measured (its first since the server started, which learns key horizons and tombstone filters; later writes by SQL pass the triggers keys_horizon and tombstones_filter); what each pass learned, from its DEBUG1 messages: $(learned_meta)"
meta elapsed "$(( $(date +%s) - STARTED )) s"
echo
if [ -z "$ONLY" ]; then
    perl "$PROJECT_DIR/test/bench/report.pl" render "$RESULTS" "$PROJECT_DIR/test/bench/RESULTS.md"
    say "written to test/bench/RESULTS.md"
else
    meta mode "BENCH_ONLY=$ONLY"
    perl "$PROJECT_DIR/test/bench/report.pl" render "$RESULTS" "$BENCH_DIR/RESULTS.md"
    say "partial run (BENCH_ONLY=$ONLY): written to $BENCH_DIR/RESULTS.md"
fi
