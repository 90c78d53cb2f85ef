# Blue/green switch-over by logical replication (doc/operations.md,
# "Logical replication and blue/green switch-over").  The publisher (blue)
# publishes FOR ALL TABLES with publish_via_partition_root; the subscriber
# (green) has the extension installed, its own diagnostics secret removed
# before it subscribes, and a worker that runs no maintenance while it
# subscribes.  pgbench puts atomic and lease claims on few keys (so that
# retries and duplicates race) on blue, whose maintenance worker runs too;
# mid-load blue stops taking writes, green catches up, the subscription is
# dropped, the sequences are carried over, and the load and then a retry of
# every key go to green.  Then: green held every key blue held, byte for
# byte; every completed key replays its business row; no key executed twice;
# no business row lacks its key; and green's worker maintains its keys.
# Nothing is checked against a clock: the test waits for rows and states.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;
use IPC::Run;

my $nkeys = 120;    # keys per endpoint

my $blue = idem_node('blue', init => [ allows_streaming => 'logical' ], conf => qq{
idempotency.maintenance_interval = 1
max_connections = 30
max_worker_processes = 16
}, extension => 0);

my $green = idem_node('green', conf => qq{
idempotency.enable_worker = off
idempotency.maintenance_interval = 1
max_connections = 30
max_worker_processes = 16
}, extension => 0);

# The same schema on both; the business table has no unique constraint on
# the key, so that a second execution would show as a second row.
my $schema = q{
CREATE EXTENSION idempotency CASCADE;
CREATE TABLE biz (id bigserial PRIMARY KEY, endpoint text NOT NULL, key text NOT NULL);
};
$blue->safe_psql('postgres', $schema);
$green->safe_psql('postgres', $schema);
$blue->safe_psql('postgres',
	q{INSERT INTO idempotency.endpoints (endpoint, lease) VALUES ('POST /lease', '2 s')});
# green takes blue's diagnostics secret with the initial copy
subscribe_all($blue, $green);
# green's worker runs from now on, and leaves the replicated keys alone
$green->safe_psql('postgres', q{
ALTER SYSTEM SET idempotency.enable_worker = on;
SELECT pg_reload_conf();
});
is( $green->safe_psql('postgres', 'SELECT secret FROM idempotency.diagnostics_secret'),
	$blue->safe_psql('postgres', 'SELECT secret FROM idempotency.diagnostics_secret'),
	'green holds blue\'s diagnostics secret');

# A key whose expiry no partition covers yet lands in blue's default
# partition; the pass that makes its partition moves it there, as an
# INSERT into idempotency.keys that green can apply (a write into the new
# table before it was attached went out under the table's own name, which
# green has not, and stopped the subscription).
$blue->safe_psql('postgres', q{
SET idempotency.max_ttl = '30d';
BEGIN;
SELECT idempotency.idem_claim('t', 'POST /far', 'far-1', sha256('far'), ttl => '20 days');
SELECT idempotency.idem_finish('t', 'POST /far', 'far-1', 201, '{"far": 1}');
COMMIT;});
is($blue->safe_psql('postgres', q{SELECT tableoid::regclass FROM idempotency.keys WHERE key = 'far-1'}),
	'idempotency.keys_default', 'a key beyond the partitions made lands in the default partition');
# blue's worker runs too: a pass that cannot take a lock at once skips the
# partition (LOG "skipped creating partition") and the next pass makes it
my $far_part = 'idempotency.keys_default';
for (my $pass = 0; $pass < 30 && $far_part eq 'idempotency.keys_default'; $pass++)
{
	$blue->safe_psql('postgres', q{
SET idempotency.max_ttl = '30d';
SELECT count(*) FROM idempotency.idem_maintenance();});
	$far_part = $blue->safe_psql('postgres',
		q{SELECT tableoid::regclass FROM idempotency.keys WHERE key = 'far-1'});
}
isnt($far_part, 'idempotency.keys_default', 'a pass moves it into the partition it makes');
$blue->wait_for_catchup('green');
is($green->safe_psql('postgres', q{SELECT response_status FROM idempotency.keys WHERE key = 'far-1'}),
	'201', 'green receives the moved key');
# it has no business row: out of the checks below
$blue->safe_psql('postgres', q{DELETE FROM idempotency.keys WHERE key = 'far-1'});

my $dir = PostgreSQL::Test::Utils::tempdir;
my $key = q{'k' || :k};
my $fp = "sha256(convert_to($key, 'UTF8'))";

# atomic mode: claim, business insert and finish in one transaction
my $atomic_body = qq{BEGIN;
SELECT (action = 'execute')::int AS exec FROM idempotency.idem_claim('t', 'POST /atomic', $key, $fp, wait => '1 s') \\gset
\\if :exec
INSERT INTO biz (endpoint, key) VALUES ('POST /atomic', $key) RETURNING id AS bid \\gset
SELECT idempotency.idem_finish('t', 'POST /atomic', $key, 201, jsonb_build_object('id', :bid));
\\endif
END;
};

# lease mode: the claim commits; business insert and finish commit together
my $lease_body = qq{SELECT (action = 'execute')::int AS exec, coalesce(lease_token, 0) AS token FROM idempotency.idem_claim('t', 'POST /lease', $key, $fp, wait => '1 s') \\gset
\\if :exec
SELECT pg_sleep(0.01);
BEGIN;
SELECT idempotency.idem_heartbeat('t', 'POST /lease', $key, :token, interval '2 s');
INSERT INTO biz (endpoint, key) VALUES ('POST /lease', $key) RETURNING id AS bid \\gset
SELECT idempotency.idem_finish('t', 'POST /lease', $key, 201, jsonb_build_object('id', :bid), lease_token => :token);
COMMIT;
\\endif
};

# a lease released (its row deleted) and claimed again
my $release_body = qq{SELECT (action = 'execute')::int AS exec, coalesce(lease_token, 0) AS token FROM idempotency.idem_claim('t', 'POST /release', $key, $fp, lease => '2 s', wait => '1 s') \\gset
\\if :exec
SELECT idempotency.idem_release('t', 'POST /release', $key, lease_token => :token);
\\endif
$atomic_body};
$release_body =~ s{'POST /atomic'}{'POST /release'}g;

my $random = "\\set k random(1, $nkeys)\n";
my $atomic = write_script($dir, 'atomic', $random . $atomic_body);
my $lease = write_script($dir, 'lease', $random . $lease_body);
my $release = write_script($dir, 'release', $random . $release_body);

# the load on blue: bounded by count and by time
my ($out, $err) = ('', '');
my $load;
{
	local $ENV{PGAPPNAME} = 'blue-load';
	$load = IPC::Run::start(
		[
			'pgbench', '-n', '-c', '6', '-j', '2', '-T', '30',
			'-f', "$atomic\@2", '-f', "$lease\@2", '-f', "$release\@1",
			'-h', $blue->host, '-p', $blue->port, 'postgres'
		],
		'>', \$out, '2>', \$err);
}

# mid-load: once some keys are completed and replicated
ok( $green->poll_query_until('postgres',
		q{SELECT count(*) >= 40 FROM idempotency.keys WHERE state = 'completed'}
		  . q{ AND EXISTS (SELECT FROM biz WHERE endpoint = 'POST /release')}),
	'green receives completed keys while blue is loaded') or diag($err);
is(key_partitions($green), '1', 'green has only the default partition of keys while it subscribes');
is($blue->safe_psql('postgres',
		q{SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = 'blue-load'}), 't',
	'the switch-over comes mid-load');

# The switch-over: blue stops taking writes (new transactions read only,
# sessions ended), green catches up, the subscription goes, the sequences
# follow.
$blue->safe_psql('postgres', q{
ALTER SYSTEM SET default_transaction_read_only = on;
SELECT pg_reload_conf();
});
$blue->safe_psql('postgres', q{
SELECT count(pg_terminate_backend(pid)) >= 0 FROM pg_stat_activity
WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()});
$load->finish;    # pgbench reports its aborted clients: expected
$blue->safe_psql('postgres', q{
SELECT count(pg_terminate_backend(pid)) >= 0 FROM pg_stat_activity
WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()});
$blue->wait_for_catchup('green');

my $keys_sql = q{SELECT string_agg(concat_ws(' ', tenant, endpoint, key, state, lease_token,
                                            response_status, md5(response_body), expires_at),
                                  E'\n' ORDER BY tenant, endpoint, key)
                 FROM idempotency.keys};
my $blue_keys = $blue->safe_psql('postgres', $keys_sql);
my $blue_completed = $blue->safe_psql('postgres',
	q{SELECT count(*) FROM idempotency.keys WHERE state = 'completed'});
my $blue_biz = $blue->safe_psql('postgres', 'SELECT count(*) FROM biz');
# blue's worker skips its passes while blue is read only (it failed on
# every pass, and exited with an error, before)
ok(eval { $blue->wait_for_log(qr/idempotency maintenance skipped database "postgres": its transactions are read only/); 1 },
	'blue\'s worker skips its passes while blue is read only');
unlike(slurp_file($blue->logfile),
	qr/background worker "idempotency maintenance worker" \(PID \d+\) exited with exit code 1/,
	'and no pass of blue\'s worker failed');
cmp_ok($blue_completed, '>=', 40, "blue completed $blue_completed keys before the switch-over");
is($green->safe_psql('postgres', $keys_sql), $blue_keys, 'green holds every key of blue, as blue holds it');
is($green->safe_psql('postgres', 'SELECT count(*) FROM biz'), $blue_biz, 'and every business row');

$green->safe_psql('postgres', 'DROP SUBSCRIPTION green');
my $setvals = $blue->safe_psql('postgres', q{
SELECT string_agg(format('SELECT setval(%L, %s);', format('%I.%I', schemaname, sequencename), last_value), ' ')
FROM pg_sequences WHERE last_value IS NOT NULL});
$green->safe_psql('postgres', $setvals) if $setvals ne '';

# green is the primary now: the load again, then a retry of every key
($out, $err) = ('', '');
ok( IPC::Run::run(
		[
			'pgbench', '-n', '-c', '4', '-j', '2', '-t', '100',
			'-f', "$atomic\@1", '-f', "$lease\@1", '-h', $green->host, '-p', $green->port, 'postgres'
		],
		'>', \$out, '2>', \$err),
	'the load on green fails nowhere') or diag($err);

$green->safe_psql('postgres', 'CREATE SEQUENCE sweep_a; CREATE SEQUENCE sweep_l');
my $sweep_a = write_script($dir, 'sweep_a', "SELECT nextval('sweep_a') AS k \\gset\n" . $atomic_body);
my $sweep_l = write_script($dir, 'sweep_l', "SELECT nextval('sweep_l') AS k \\gset\n" . $lease_body);
for my $script ($sweep_a, $sweep_l)
{
	($out, $err) = ('', '');
	ok( IPC::Run::run(
			[
				'pgbench', '-n', '-c', '2', '-t', $nkeys / 2, '-f', $script,
				'-h', $green->host, '-p', $green->port, 'postgres'
			],
			'>', \$out, '2>', \$err),
		"the retry of every key ($script) fails nowhere") or diag($err);
}

my %checks = (
	claim_load_checks(),
	'no key lacks its row' => qq{
		SELECT count(*) FROM generate_series(1, $nkeys) k,
		     unnest(ARRAY['POST /atomic', 'POST /lease']) e
		WHERE NOT EXISTS (SELECT FROM idempotency.keys WHERE tenant = 't' AND endpoint = e AND key = 'k' || k)},
);
for my $name (sort keys %checks)
{
	is($green->safe_psql('postgres', $checks{$name}), '0', "on green: $name");
}

# every key completed on blue replays on green what it replayed on blue
my $blue_done = $blue->safe_psql('postgres', q{
	SELECT string_agg(format('(%L, %L, %L)', endpoint, key, md5(response_body)), ',')
	FROM idempotency.keys WHERE state = 'completed'});
is( $green->safe_psql('postgres', qq{
	SELECT count(*) FROM (VALUES $blue_done) v(endpoint, key, body)
	LEFT JOIN idempotency.keys k ON k.tenant = 't' AND k.endpoint = v.endpoint AND k.key = v.key
	WHERE k.state IS DISTINCT FROM 'completed' OR md5(k.response_body) IS DISTINCT FROM v.body}),
	'0', 'every key completed on blue is completed on green with the same response');

# green's worker maintains its keys now: dated partitions, rows moved
ok( $green->poll_query_until('postgres', "SELECT ($IdemTest::KEY_PARTITIONS) > 1"),
	'once the subscription is gone, green\'s worker makes partitions');
like(slurp_file($green->logfile),
	qr/idempotency maintenance skipped: subscription "green" replicates the extension's tables/,
	'green\'s worker said why it left the keys alone while it subscribed');
is($green->safe_psql('postgres', $checks{'no key has two business rows'}), '0',
	'no key has two business rows after maintenance');

$blue->stop;
$green->stop;
done_testing();
