# The maintenance worker on its own: premake, retention, stale leases and
# resolvers, the outbox's retention, databases without the extension, DROP
# DATABASE while it runs, SIGTERM, and coming back after a crash.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('worker', conf => qq{
idempotency.maintenance_interval = 1
max_worker_processes = 16
restart_after_crash = on
});

my $launcher_q = q{SELECT pid FROM pg_stat_activity
                   WHERE backend_type = 'idempotency maintenance launcher'};
ok($node->poll_query_until('postgres', "SELECT count(*) = 1 FROM ($launcher_q) l"),
	'the launcher runs');

# premake, by the worker alone: max_ttl (7 days) plus one day is covered
ok( $node->poll_query_until('postgres', q{
	SELECT count(*) >= 8 FROM pg_inherits
	WHERE inhparent = 'idempotency.keys'::regclass
	  AND inhrelid <> 'idempotency.keys_default'::regclass}),
	'the worker makes the partitions');
is( $node->safe_psql('postgres', q{
	SELECT count(*) FROM generate_series(0, 7) d
	WHERE NOT EXISTS (SELECT 1 FROM idempotency.keys_default LIMIT 0)
	  AND to_regclass('idempotency.keys_p'
	      || to_char((now() AT TIME ZONE 'UTC')::date + d, 'YYYYMMDD') || 't0000') IS NULL}),
	'0', 'a partition for each of the next eight days');
ok($node->wait_for_log(qr/LOG:  idempotency maintenance created partition "keys_p\d{8}t0000"\n/),
	'each partition made is logged in a message of its own');

# retention: a partition whose range has ended goes, with its rows
$node->safe_psql('postgres', q{
	CREATE TABLE idempotency.keys_p20200101t0000 (LIKE idempotency.keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
	ALTER TABLE idempotency.keys ATTACH PARTITION idempotency.keys_p20200101t0000
	    FOR VALUES FROM ('2020-01-01 00:00+00') TO ('2020-01-02 00:00+00');
	INSERT INTO idempotency.keys_p20200101t0000 (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
	VALUES ('t', 'e', 'old', '\x00', 'completed', '2019-12-31', '2020-01-01 12:00+00');
});
ok( $node->poll_query_until('postgres',
		"SELECT to_regclass('idempotency.keys_p20200101t0000') IS NULL"),
	'the worker drops a partition whose range has ended');
ok( $node->wait_for_log(
		qr/LOG:  idempotency maintenance dropped partition "keys_p20200101t0000", whose range has ended/),
	'and logs it');

# the outbox: operations finished longer than idempotency.outbox_retention
# ago go, in statements of 1,000 (each in a transaction of the worker's
# own), with their attempts; one that needs attention stays
$node->safe_psql('postgres', q{
	BEGIN;
	INSERT INTO idempotency.outbox (key, method, url, body, state, next_attempt_at, finished_at, attempts)
	SELECT 'done-' || i, 'POST', 'https://a.example/', '{}', 'succeeded', now(), now() - interval '8 days', 1
	FROM generate_series(1, 1500) i;
	INSERT INTO idempotency.outbox (key, method, url, body, state, next_attempt_at, finished_at, attempts)
	VALUES ('stuck', 'POST', 'https://a.example/', '{}', 'attention', now(), now() - interval '30 days', 10);
	INSERT INTO idempotency.outbox_attempts (outbox_id, attempt, outcome)
	SELECT id, 1, state FROM idempotency.outbox;
	COMMIT;
});
ok( $node->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM idempotency.outbox}),
	'the worker deletes the outbox\'s finished operations after the retention');
is( $node->safe_psql('postgres', q{
	SELECT string_agg(o.key || ':' || o.state || ':' || a.outcome, ' ')
	FROM idempotency.outbox o JOIN idempotency.outbox_attempts a ON a.outbox_id = o.id}),
	'stuck:attention:attention', 'with their attempts; attention stays');
ok( $node->wait_for_log(
		qr/LOG:  idempotency maintenance deleted 1500 operations of the outbox finished longer than idempotency.outbox_retention ago\n/),
	'the pass logs how many it deleted');

# a claim in lease mode whose holder goes away: its lease ends in a second
sub put_lease
{
	my ($endpoint, $key) = @_;
	is( $node->safe_psql('postgres', qq{
		SELECT action FROM idempotency.idem_claim('acme', '$endpoint', '$key',
		    decode(repeat('ab', 32), 'hex'), lease => '1 second')}),
		'execute', "claim $key in lease mode");
}

sub claim_again
{
	my ($endpoint, $key) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT action || ':' || coalesce(error_code, '-') || ':'
		       || coalesce(convert_from(response_body, 'UTF8'), '-')
		FROM idempotency.idem_claim('acme', '$endpoint', '$key',
		    decode(repeat('ab', 32), 'hex'))});
}

# a stale lease becomes unknown; the log names the key's hash (idem_key_hash),
# never the key
my $secret = 'k-7f3a9c-secret';
put_lease('pay', $secret);
ok( $node->poll_query_until('postgres',
		"SELECT state = 'unknown' FROM idempotency.keys WHERE key = '$secret'"),
	'a stale lease becomes unknown');
my $hash = $node->safe_psql('postgres', "SELECT idempotency.idem_key_hash('acme', 'pay', '$secret')");
my @lines = grep { /lease expired/ } split /\n/, slurp_file($node->logfile);
ok((grep { /tenant "acme", endpoint "pay", key hash $hash / } @lines),
	'the warning names tenant, endpoint and the key hash');
ok(!(grep { /\Q$secret\E/ } @lines), 'the warning does not show the key');
is(claim_again('pay', $secret), 'pending:outcome_pending:-',
	'a duplicate gets outcome_pending, not a second execution');
ok( $node->wait_for_log(
		qr/LOG:  idempotency maintenance marked 1 stale lease of endpoint "pay" unknown\n/),
	'the pass logs how many stale leases of an endpoint became unknown');

# resolvers: an answer completes the key, NULL fails it, an error leaves it
$node->safe_psql('postgres', q{
	CREATE TABLE payments (idem_key text PRIMARY KEY, amount int);
	INSERT INTO payments VALUES ('pay-found', 1200);
	CREATE FUNCTION find_payment(tenant text, endpoint text, key text)
	RETURNS jsonb LANGUAGE plpgsql SET search_path = public AS $$
	DECLARE p payments;
	BEGIN
	    IF key = 'pay-broken' THEN
	        RAISE EXCEPTION 'ledger offline';
	    END IF;
	    SELECT * INTO p FROM payments WHERE idem_key = key;
	    IF NOT FOUND THEN
	        RETURN NULL;
	    END IF;
	    RETURN jsonb_build_object('status', 201, 'body', jsonb_build_object('amount', p.amount));
	END $$;
	INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
	VALUES ('charge', 'resolve', 'find_payment(text,text,text)');
});
put_lease('charge', $_) for qw(pay-found pay-missing pay-broken);
ok( $node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM idempotency.keys
	WHERE endpoint = 'charge' AND state <> 'in_progress'}),
	'the resolver settles the stale leases');
is( $node->safe_psql('postgres', q{
	SELECT string_agg(key || ':' || state || ':' || coalesce(response_status::text, '-') || ':'
	                  || coalesce(convert_from(response_body, 'UTF8'), '-') || ':'
	                  || coalesce(fail_reason, '-'), ' ' ORDER BY key)
	FROM idempotency.keys WHERE endpoint = 'charge'}),
	'pay-broken:in_progress:-:-:- pay-found:completed:201:{"amount": 1200}:- '
	  . 'pay-missing:failed:-:-:resolver found no business record',
	'completed with the business result, failed without a record, unchanged on error');
is( $node->safe_psql('postgres',
		"SELECT leases_expired || '/' || resolved FROM idempotency.stats WHERE endpoint = 'charge'"),
	'2/2', 'counters: two leases expired, two settled by the resolver');
is(claim_again('charge', 'pay-found'), 'replay:-:{"amount": 1200}',
	'a duplicate of the resolved key replays the business result');
is(claim_again('charge', 'pay-missing'), 'pending:outcome_pending:-',
	'a duplicate of the failed key gets outcome_pending');
ok($node->wait_for_log(qr/resolver of endpoint "charge" failed .*ledger offline/),
	'a raising resolver is logged');
ok( $node->wait_for_log(
		qr/LOG:  idempotency maintenance completed 1 stale lease of endpoint "charge" with its resolver's answer\n/)
	  && $node->wait_for_log(
		qr/LOG:  idempotency maintenance marked 1 stale lease of endpoint "charge" failed because its resolver found no business record\n/)
	  && $node->wait_for_log(
		qr/LOG:  idempotency maintenance left 1 stale lease of endpoint "charge" in progress because its resolver failed or did not answer\n/),
	'the pass logs the resolver outcomes per endpoint');
ok( $node->poll_query_until('postgres', "SELECT count(*) = 1 FROM ($launcher_q) l"),
	'and the worker goes on');

# a database without the extension: nothing to do, nothing made
$node->safe_psql('postgres', 'CREATE DATABASE plain');
my $offset = -s $node->logfile;
sleep 3;    # a few rounds of the launcher
is($node->safe_psql('plain', "SELECT count(*) FROM pg_namespace WHERE nspname = 'idempotency'"),
	'0', 'nothing is made in a database without the extension');
unlike(slurp_file($node->logfile, $offset), qr/(ERROR|FATAL):.*idempotency/i,
	'and no error is logged for it');

# a new database with the extension, an endpoint whose resolver runs $body
# (PL/pgSQL statements), and one stale lease of that endpoint
sub db_with_stale_lease
{
	my ($db, $endpoint, $body) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, qq{
		CREATE EXTENSION idempotency CASCADE;
		CREATE FUNCTION public.resolver(tenant text, endpoint text, key text)
		RETURNS jsonb LANGUAGE plpgsql AS \$\$ BEGIN $body END \$\$;
		INSERT INTO idempotency.endpoints (endpoint, on_lease_expiry, resolver)
		VALUES ('$endpoint', 'resolve', 'public.resolver(text,text,text)');
		INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state,
		    lease_token, locked_until, created_at, expires_at)
		VALUES ('acme', '$endpoint', 'k', decode(repeat('ab', 32), 'hex'), 'in_progress', 7,
		    now() - interval '1 minute', now() - interval '2 minutes', now() + interval '1 hour');
	});
}

# DROP DATABASE never fails nor hangs while the worker visits every second,
# even when it comes while a worker is connected: here a slow resolver keeps
# each pass in the database busy for a second.
for my $i (1 .. 3)
{
	db_with_stale_lease("victim$i", 'slow',
		q{PERFORM pg_catalog.pg_sleep(1); RAISE EXCEPTION 'not yet';});
	ok( $node->poll_query_until('postgres', qq{
		SELECT count(*) > 0 FROM pg_stat_activity
		WHERE backend_type = 'idempotency maintenance worker' AND datname = 'victim$i'}),
		"a worker is connected to victim$i");
	my ($ret, $out, $err) = $node->psql('postgres', "DROP DATABASE victim$i");
	is($ret, 0, "DROP DATABASE victim$i succeeds while the worker is in it");
	diag($err) if $ret;
}

# a resolver that hangs is cancelled after idempotency.resolver_timeout (2 s
# by default): the worker logs it, the key stays in_progress, passes go on
$offset = -s $node->logfile;
db_with_stale_lease('hang', 'hang',
	q{PERFORM pg_catalog.pg_sleep(600); RETURN '{"status": 200}';});
ok($node->wait_for_log(qr/resolver of endpoint "hang" did not answer within 2000 ms/, $offset),
	'a hanging resolver is cancelled after resolver_timeout');
is($node->safe_psql('hang', "SELECT state FROM idempotency.keys WHERE endpoint = 'hang'"),
	'in_progress', 'and its key stays in_progress');
$offset = -s $node->logfile;
ok($node->wait_for_log(qr/resolver of endpoint "hang" did not answer/, $offset),
	'the next pass tries it again');
$node->safe_psql('postgres', 'DROP DATABASE hang WITH (FORCE)');

# Between two steps the worker is in no transaction, so what a step asks
# of the catalog (the schema's version, the keys' mode) it asks inside its
# own.  A DDL statement run by the DELETE of the step before the filters'
# compaction (a trigger of the default partition of tombstones) makes the
# worker forget what it had cached when that step commits: the compaction
# read the catalog again outside any transaction, and the worker died of a
# segmentation fault (the server restarting with it).
$offset = -s $node->logfile;
my $pid = $node->safe_psql('postgres', $launcher_q);
$node->safe_psql('postgres', q{
	CREATE TABLE public.inval_probe (pass integer);
	CREATE FUNCTION public.inval_probe_touch() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		ALTER TABLE public.inval_probe ALTER COLUMN pass SET STATISTICS 100;
		INSERT INTO public.inval_probe VALUES (1);
		RETURN NULL;
	END$$;
	SET idempotency.ddl_guard = off;
	CREATE TRIGGER inval_probe AFTER DELETE ON idempotency.tombstones_default
	    FOR EACH STATEMENT EXECUTE FUNCTION public.inval_probe_touch();
});
ok($node->poll_query_until('postgres', 'SELECT count(*) >= 3 FROM public.inval_probe'),
	'three passes purge the default partition of tombstones and run the trigger');
unlike(slurp_file($node->logfile, $offset), qr/terminated by signal/,
	'no worker dies when what it cached is forgotten between two steps');
is($node->safe_psql('postgres', "SELECT count(*) FROM ($launcher_q) l WHERE pid = $pid"),
	'1', 'the launcher was not restarted');
$node->safe_psql('postgres', q{
	SET idempotency.ddl_guard = off;
	DROP TRIGGER inval_probe ON idempotency.tombstones_default;
	DROP FUNCTION public.inval_probe_touch();
	DROP TABLE public.inval_probe;
});

# SIGTERM stops the launcher; the postmaster starts it again
$pid = $node->safe_psql('postgres', $launcher_q);
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
ok( $node->poll_query_until('postgres',
		"SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $pid)"),
	'the launcher stops on SIGTERM');
ok( $node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM ($launcher_q) l WHERE pid <> $pid"),
	'and is started again');

# a crash (a backend killed with SIGKILL) restarts everything; passes resume
$pid = $node->safe_psql('postgres', $launcher_q);
kill 'KILL', $pid;
ok( $node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM ($launcher_q) l WHERE pid <> $pid"),
	'the launcher comes back after a crash restart');
put_lease('pay', 'after-crash');
ok( $node->poll_query_until('postgres',
		"SELECT state = 'unknown' FROM idempotency.keys WHERE key = 'after-crash'"),
	'and passes resume');

# an immediate shutdown and a start
$node->stop('immediate');
$node->start;
put_lease('pay', 'after-restart');
ok( $node->poll_query_until('postgres',
		"SELECT state = 'unknown' FROM idempotency.keys WHERE key = 'after-restart'"),
	'passes resume after an immediate shutdown');

# enable_worker = off stops the passes (reloadable)
$node->append_conf('postgresql.conf', 'idempotency.enable_worker = off');
$node->reload;
sleep 2;    # let a pass that was under way end
put_lease('pay', 'worker-off');
sleep 3;
is($node->safe_psql('postgres', "SELECT state FROM idempotency.keys WHERE key = 'worker-off'"),
	'in_progress', 'no pass runs with enable_worker = off');
$node->append_conf('postgresql.conf', 'idempotency.enable_worker = on');
$node->reload;
ok( $node->poll_query_until('postgres',
		"SELECT state = 'unknown' FROM idempotency.keys WHERE key = 'worker-off'"),
	'passes resume with enable_worker = on');

$node->stop;
done_testing();
