# The PL/Proxy layer (idempotency_plproxy): four shard databases and a proxy
# database in one cluster.  Every proxied function reaches the shard of
# hashtext(tenant) and no other; 16 clients racing duplicates through the
# proxy execute each key once; a re-partitioning that moves a tenant with
# idem_export_keys / idem_import_keys keeps its keys (a retry replays),
# while one moved without them executes again; RUN ON ALL reaches every
# shard for maintenance, counters and health.
#
# Skips where PL/Proxy is missing and cannot be installed (make test installs
# Debian's postgresql-NN-plproxy; none exists for PostgreSQL 18).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;
use IPC::Run;

my $major = server_major();
skip_unless_installed('PL/Proxy', env => 'IDEM_SKIP_PLPROXY', dir => '--sharedir',
	file => 'extension/plproxy.control',
	missing => "%s is missing; Debian's package is postgresql-$major-plproxy, and there is none for PostgreSQL 18");

my $node = idem_node('plproxy', extension => 0, conf => qq{
idempotency.maintenance_interval = 3600
max_connections = 120
});

my $nshards = 4;
my @shards = map { "shard$_" } 0 .. $nshards - 1;
my $host = $node->host;
my $port = $node->port;

open my $fh, '<', 'examples/plproxy_shard.sql' or die "examples/plproxy_shard.sql: $!";
my $shard_sql = do { local $/; <$fh> };
close $fh;
open $fh, '<', 'examples/plproxy_proxy.sql' or die "examples/plproxy_proxy.sql: $!";
my $proxy_sql = do { local $/; <$fh> };
close $fh;

for my $db (@shards)
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION idempotency CASCADE;\n$shard_sql");
}

sub partitions
{
	my @dbs = @_;
	return join(', ',
		map { "partition_$_ 'dbname=$dbs[$_] host=$host port=$port'" }
		  0 .. $#dbs);
}

$node->safe_psql('postgres', 'CREATE DATABASE proxy');
$node->safe_psql('proxy', qq{
CREATE EXTENSION plproxy;
CREATE EXTENSION idempotency_plproxy;
CREATE SERVER idempotency FOREIGN DATA WRAPPER plproxy OPTIONS (@{[ partitions(@shards) ]});
CREATE USER MAPPING FOR PUBLIC SERVER idempotency;
$proxy_sql
});

# the proxy's claim_result has the shards' shape
my $shape = q{SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum)
  FROM pg_attribute WHERE attrelid = 'idempotency.claim_result'::regclass AND attnum > 0};
is($node->safe_psql('proxy', $shape), $node->safe_psql('shard0', $shape),
	'claim_result on the proxy has the shape of the shards\' type');

# one tenant per shard: partition number = hashtext(tenant) & (shards - 1)
my %tenant_of;
for my $i (0 .. 199)
{
	my $p = $node->safe_psql('proxy', "SELECT hashtext('tenant-$i') & " . ($nshards - 1));
	$tenant_of{$p} //= "tenant-$i";
	last if keys %tenant_of == $nshards;
}
is(scalar(keys %tenant_of), $nshards, 'a tenant for every shard');

# every per-key function, through the proxy, for the tenant of each shard
my $fp = q{sha256(convert_to('request', 'UTF8'))};
for my $s (0 .. $nshards - 1)
{
	my $t = $tenant_of{$s};
	my $out = $node->safe_psql('proxy', qq{
SELECT action || ' ' || (lease_token IS NOT NULL)
  FROM idempotency.idem_claim('$t', 'ep', 'k1', $fp, lease => '1 hour');
SELECT action FROM idempotency.idem_claim('$t', 'ep', 'k2', $fp, lease => '1 hour');
SELECT action FROM idempotency.idem_claim('$t', 'ep', 'k3', $fp, lease => '1 hour');
SELECT action FROM idempotency.idem_claim('$t', 'ep', 'k4', $fp, lease => '1 hour');
SELECT action FROM idempotency.idem_claim('$t', 'ep', 'k5', $fp, lease => '1 hour');
});
	is($out, "execute true\nexecute\nexecute\nexecute\nexecute", "shard $s: claims through the proxy");

	# the lease tokens, read on the shard itself
	my %tok = map { split /\|/ } split /\n/, $node->safe_psql("shard$s",
		"SELECT key, lease_token FROM idempotency.keys WHERE tenant = '$t'");
	is(join(',', sort keys %tok), 'k1,k2,k3,k4,k5', "shard $s: the claims are on shard $s");

	$out = $node->safe_psql('proxy', qq{
SELECT idempotency.idem_heartbeat('$t', 'ep', 'k1', $tok{k1}, '2 hours') > now() + interval '90 minutes';
SELECT state || ' ' || lease_held FROM idempotency.idem_lookup('$t', 'ep', 'k1');
SELECT idempotency.idem_finish('$t', 'ep', 'k1', 201, '{"n": 1}', lease_token => $tok{k1});
SELECT idempotency.idem_finish_bytes('$t', 'ep', 'k2', 200, '\\x00ff', lease_token => $tok{k2});
SELECT idempotency.idem_finish_ref('$t', 'ep', 'k3', 200, 's3://bucket/k3', lease_token => $tok{k3});
SELECT idempotency.idem_release('$t', 'ep', 'k4', $tok{k4});
SELECT count(*) FROM idempotency.idem_lookup('$t', 'ep', 'k4');
SELECT idempotency.idem_fail('$t', 'ep', 'k5', 'unknown', 'timeout', $tok{k5});
SELECT action || ' ' || error_code FROM idempotency.idem_claim('$t', 'ep', 'k5', $fp);
SELECT idempotency.idem_resolve('$t', 'ep', 'k5', 200, '{"resolved": true}');
SELECT action || ' ' || response_status || ' ' || response_json::text
  FROM idempotency.idem_claim('$t', 'ep', 'k1', $fp);
SELECT action || ' ' || encode(response_body, 'hex') FROM idempotency.idem_claim('$t', 'ep', 'k2', $fp);
SELECT action || ' ' || response_body_ref FROM idempotency.idem_claim('$t', 'ep', 'k3', $fp);
SELECT action || ' ' || response_json::text FROM idempotency.idem_claim('$t', 'ep', 'k5', $fp);
SELECT idempotency.idem_fingerprint('GET', '/x', '{"a": 1}') = $fp,
       idempotency.idem_fingerprint('GET', '/x', '{"a": 1, "b": 2}', '{/b}')
       = idempotency.idem_fingerprint('GET', '/x', '{"a": 1}');
});
	is($out, join("\n",
		't', 'in_progress true', '', '', '', '', '0', '', 'pending outcome_pending', '',
		'replay 201 {"n": 1}', 'replay 00ff', 'replay s3://bucket/k3',
		'replay {"resolved": true}', 'f|t'),
		"shard $s: heartbeat, lookup, finish, finish_bytes, finish_ref, release, fail, resolve, fingerprint");
	is($node->safe_psql("shard$s", qq{
SELECT string_agg(key || ':' || state, ',' ORDER BY key) FROM idempotency.keys WHERE tenant = '$t'}),
		'k1:completed,k2:completed,k3:completed,k5:completed',
		"shard $s: the shard holds what the proxy did");
}
# mismatch diagnostics through the proxy: the digest is made and compared
# on the tenant's shard, under that shard's secret
is($node->safe_psql('proxy', q{
SELECT action FROM idempotency.idem_claim('diag-t', 'ep-diag', 'd1', sha256('\\x01'), lease => '1 hour',
    digest => idempotency.idem_request_digest('diag-t', 'ep-diag', 'd1', '{"amount": 1, "note": "a"}'));
SELECT action || ' ' || (mismatch->'changed')::text || ' ' || (mismatch->'removed')::text
  FROM idempotency.idem_claim('diag-t', 'ep-diag', 'd1', sha256('\\x02'),
    digest => idempotency.idem_request_digest('diag-t', 'ep-diag', 'd1', '{"amount": 2}'));
SELECT max(diagnosed) FROM idempotency.idem_stats() WHERE endpoint = 'ep-diag';
}), qq{execute\nmismatch ["/amount"] ["/note"]\n1},
	'a mismatch through the proxy names the members that differ');

# and no shard holds another shard's tenant
my $stray = 0;
for my $s (0 .. $nshards - 1)
{
	my $others = join(',', map { "'$tenant_of{$_}'" } grep { $_ != $s } 0 .. $nshards - 1);
	$stray += $node->safe_psql("shard$s",
		"SELECT count(*) FROM idempotency.keys WHERE tenant IN ($others)");
}
is($stray, 0, 'no key landed on another shard than its tenant\'s');

# atomic mode cannot span proxied calls: a claim without a lease commits on
# its shard at the end of the call, unfinished, which the shard refuses
my ($rc, $stdout, $stderr) = $node->psql('proxy', qq{
SELECT action FROM idempotency.idem_claim('$tenant_of{0}', 'ep', 'atomic', $fp)},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($stderr, qr/IK500.*neither finished nor released/s,
	'an atomic claim through the proxy fails at the shard\'s commit (IK500)');
is($node->safe_psql('shard0', "SELECT count(*) FROM idempotency.keys WHERE key = 'atomic'"),
	'0', 'and leaves no key');

# 16 clients race duplicates through the proxy: 8 tenants x 10 keys
my $dir = PostgreSQL::Test::Utils::tempdir;
my $script = "$dir/race.sql";
open $fh, '>', $script or die "could not write $script: $!";
print $fh "\\set t random(0, 7)\n\\set k random(1, 10)\n",
  "INSERT INTO answers SELECT (app.create_payment('race-' || :t, 'key-' || :k, 100)).action;\n";
close $fh;
$node->safe_psql('proxy', 'CREATE TABLE answers (action text)');
my ($out, $err) = ('', '');
my $ok = IPC::Run::run(
	[ 'pgbench', '-n', '-h', $host, '-p', $port,
	  '-c', '16', '-j', '4', '-t', '40', '-f', $script, 'proxy' ],
	'>', \$out, '2>', \$err,
	IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
ok($ok, 'pgbench through the proxy ran') or diag($err);
like($out, qr/number of transactions actually processed: 640\/640/, 'every call answered')
  or diag($out . $err);

my ($business, $keys, $doubles, $misplaced) = (0, 0, 0, 0);
for my $s (0 .. $nshards - 1)
{
	my ($b, $d, $m) = split /\|/, $node->safe_psql("shard$s", qq{
SELECT count(*),
       count(*) - count(DISTINCT (tenant, idempotency_key)),
       count(*) FILTER (WHERE hashtext(tenant) & @{[ $nshards - 1 ]} <> $s)
FROM app.payments WHERE tenant LIKE 'race-%'});
	$business += $b;
	$doubles += $d;
	$misplaced += $m;
	$keys += $node->safe_psql("shard$s", qq{
SELECT count(*) FROM idempotency.keys
WHERE tenant LIKE 'race-%' AND endpoint = 'POST /payments' AND state = 'completed'});
}
is($doubles, 0, 'no key executed twice (business rows per key)');
is($business, $keys, 'one business row per completed key');
is($node->safe_psql('proxy', q{SELECT count(*) FILTER (WHERE action = 'execute') || ' '
  || count(*) FILTER (WHERE action IN ('execute', 'replay', 'in_progress')) FROM answers}),
	"$business 640", 'one execute answered per business row; every other answer a replay or in_progress');
is($misplaced, 0, 'every business row on its tenant\'s shard');
cmp_ok($keys, '>', 60, 'the race used most of the 80 keys');

# a re-partitioning: partitions 0 and 1 swap databases.  Tenant A (of
# partition 0) is moved with its keys; tenant B (of partition 1) is not.
my ($ta, $tb) = ($tenant_of{0}, $tenant_of{1});
$node->safe_psql('proxy', qq{
SELECT (app.create_payment('$ta', 'pay-1', 500)).action;
SELECT (app.create_payment('$tb', 'pay-1', 500)).action;
CREATE TABLE moving AS SELECT idempotency.idem_export_keys('$ta') AS doc;
});
my $moving = $node->safe_psql('proxy', 'SELECT count(*) FROM moving');
is($moving, 5, 'the export through the proxy holds every key of the tenant');
my @swapped = @shards;
@swapped[ 0, 1 ] = @swapped[ 1, 0 ];
$node->safe_psql('proxy',
	'ALTER SERVER idempotency OPTIONS ('
	  . join(', ', map { "SET partition_$_ 'dbname=$swapped[$_] host=$host port=$port'" } 0 .. $#swapped)
	  . ')');
is($node->safe_psql('proxy', qq{
SELECT outcome || '=' || rows FROM idempotency.idem_import_keys('$ta', (SELECT jsonb_agg(doc) FROM moving))
WHERE outcome IN ('inserted', 'unchanged')}),
	"inserted=$moving\nunchanged=0", 'the import reaches the tenant\'s new shard');
is($node->safe_psql('proxy', qq{
SELECT outcome || '=' || rows FROM idempotency.idem_import_keys('$ta', (SELECT jsonb_agg(doc) FROM moving))
WHERE outcome IN ('inserted', 'unchanged')}),
	"inserted=0\nunchanged=$moving", 'run twice, the import changes nothing');
is($node->safe_psql('shard1', qq{
SELECT string_agg(key || ':' || state, ',' ORDER BY endpoint, key) FROM idempotency.keys WHERE tenant = '$ta'}),
	'pay-1:completed,k1:completed,k2:completed,k3:completed,k5:completed',
	'the moved keys are on the new shard');
is($node->safe_psql('proxy', qq{
SELECT action || ' ' || response_status || ' ' || (response_json->>'amount_cents')
FROM app.create_payment('$ta', 'pay-1', 500)}),
	'replay 201 500', 'after the move, a retry of the moved tenant replays');
is($node->safe_psql('proxy', qq{
SELECT action FROM idempotency.idem_claim('$ta', 'ep', 'k1', $fp)}),
	'replay', 'and so do its other keys');
is($node->safe_psql('shard1', "SELECT count(*) FROM app.payments WHERE tenant = '$ta'"),
	'0', 'no business write on the new shard');
# tenant B was moved without its keys: its retry executes again
is($node->safe_psql('proxy', qq{
SELECT action FROM app.create_payment('$tb', 'pay-1', 500)}),
	'execute', 'a tenant moved without its keys executes a retry again');
is($node->safe_psql('shard0', "SELECT count(*) FROM app.payments WHERE tenant = '$tb'")
	 + $node->safe_psql('shard1', "SELECT count(*) FROM app.payments WHERE tenant = '$tb'"),
	2, 'which is a second business write: what the import prevents');

# RUN ON ALL: maintenance, counters, health reach every shard
$node->safe_psql('proxy', 'SELECT count(*) FROM idempotency.idem_maintenance()');
my $parts = 0;
for my $s (0 .. $nshards - 1)
{
	$parts++ if key_partitions($node, "shard$s") > 1;
}
is($parts, $nshards, 'a maintenance pass through the proxy made partitions on every shard');
is($node->safe_psql('proxy', q{
SELECT count(DISTINCT shard) FROM idempotency.idem_stats() WHERE endpoint IS NULL AND NOT untracked}),
	$nshards, 'idem_stats answers for every shard');
my $claims = 0;
$claims += $node->safe_psql("shard$_",
	'SELECT claims FROM idempotency.stats WHERE endpoint IS NULL AND NOT untracked')
  for 0 .. $nshards - 1;
is($node->safe_psql('proxy',
	'SELECT claims FROM idempotency.stats WHERE endpoint IS NULL AND NOT untracked'),
	$claims, 'the proxy\'s stats add up the shards\' counters');
is($node->safe_psql('proxy', q{
SELECT count(DISTINCT shard) || ' ' || sum(live_keys) FILTER (WHERE endpoint = 'ep')
FROM idempotency.health}),
	"$nshards " . ($nshards * 4 + 4), 'health answers for every shard and endpoint');
is($node->safe_psql('proxy', 'SELECT count(*) FROM idempotency.idem_stats_reset()'),
	$nshards, 'idem_stats_reset resets every shard');

# the counter of 0.4.0 through the proxy: idem_counters and the views have
# it, idem_stats and idem_health keep the columns of 0.3.0
my $withheld = 0;
$withheld += $node->safe_psql("shard$_",
	'SELECT diagnoses_withheld FROM idempotency.stats WHERE endpoint IS NULL AND NOT untracked')
  for 0 .. $nshards - 1;
is($node->safe_psql('proxy', q{
SELECT (SELECT diagnoses_withheld FROM idempotency.stats WHERE endpoint IS NULL AND NOT untracked)
    || ' ' || (SELECT sum(diagnoses_withheld) FROM idempotency.idem_counters() WHERE endpoint IS NULL AND NOT untracked)}),
	"$withheld $withheld", 'diagnoses_withheld: the proxy\'s stats and idem_counters add up the shards\'');
# health per shard and endpoint, as each shard's own view shows it (a claim
# on every shard since the reset, so that the endpoint is counted)
$node->safe_psql('proxy', qq{SELECT action FROM idempotency.idem_claim('$tenant_of{$_}', 'ep', 'after-reset', $fp, lease => '1 hour')})
  for 0 .. $nshards - 1;
my $health_row = q{endpoint || ':' || coalesce(diagnoses_withheld::text, 'null')};
my @want_health;
for my $s (0 .. $nshards - 1)
{
	my $db = $swapped[$s];
	push @want_health, map { "$db:$port $_" } split /\n/,
	  $node->safe_psql($db, "SELECT $health_row FROM idempotency.health ORDER BY endpoint");
}
is(join("\n", sort split /\n/, $node->safe_psql('proxy', "SELECT shard || ' ' || $health_row FROM idempotency.health")),
	join("\n", sort @want_health), 'diagnoses_withheld: the proxy\'s health has each shard\'s');
my $columns = q{SELECT string_agg(p.proname || '(' || array_length(p.proallargtypes, 1) || ')', ' ' ORDER BY p.proname)
FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace
  AND p.proname IN ('idem_stats', 'idem_health', 'idem_counters')};
is($node->safe_psql('proxy', $columns), 'idem_counters(20) idem_health(14) idem_stats(19)',
	'idem_stats and idem_health keep the columns of 0.3.0');

# ALTER EXTENSION idempotency_plproxy UPDATE from 0.3.0, with objects of a
# user built on the proxy's functions and views: the update drops nothing,
# the functions keep their OIDs, the user's views still answer, and the
# updated database equals a fresh install of 0.4.0
$node->safe_psql('postgres', 'CREATE DATABASE proxy_old');
$node->safe_psql('proxy_old', qq{
CREATE EXTENSION plproxy;
CREATE EXTENSION idempotency_plproxy VERSION '0.3.0';
CREATE SERVER idempotency FOREIGN DATA WRAPPER plproxy OPTIONS (@{[ partitions(@swapped) ]});
CREATE USER MAPPING FOR PUBLIC SERVER idempotency;
CREATE VIEW public.claims_total AS
    SELECT claims FROM idempotency.stats WHERE endpoint IS NULL AND NOT untracked;
CREATE VIEW public.live_by_shard AS
    SELECT shard, sum(live_keys) AS live FROM idempotency.health GROUP BY shard;
CREATE VIEW public.raw_counters AS
    SELECT shard, claims FROM idempotency.idem_stats() WHERE endpoint IS NULL AND NOT untracked;
CREATE VIEW public.raw_health AS SELECT shard, live_keys FROM idempotency.idem_health();
});
my $oids = q{SELECT string_agg(p.oid::regprocedure::text || '=' || p.oid, ' ' ORDER BY p.oid)
FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace};
my $oids_before = $node->safe_psql('proxy_old', $oids);
my ($rc, $out, $err) = $node->psql('proxy_old',
	q{ALTER EXTENSION idempotency_plproxy UPDATE TO '0.4.0'});
is($rc, 0, 'the update from 0.3.0 passes with user views on stats, health, idem_stats and idem_health')
  or diag($err);
my $oids_after = $node->safe_psql('proxy_old', $oids);
my $kept = join(' ', grep { index(" $oids_after ", " $_ ") >= 0 } split / /, $oids_before);
is($kept, $oids_before, 'every function of 0.3.0 keeps its OID');
is($node->safe_psql('proxy_old', q{
SELECT (SELECT claims FROM public.claims_total) = (SELECT claims FROM idempotency.stats WHERE endpoint IS NULL AND NOT untracked),
       (SELECT count(*) FROM public.live_by_shard), (SELECT count(*) FROM public.raw_counters),
       (SELECT count(DISTINCT shard) FROM public.raw_health)}),
	"t|$nshards|$nshards|$nshards", 'the user\'s views answer after the update');
my $catalog = q{
SELECT string_agg(d, E'\n' ORDER BY d) FROM (
    SELECT p.oid::regprocedure::text || ' ' || pg_get_functiondef(p.oid)
           || ' ' || coalesce(p.proacl::text, '') AS d
    FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace
    UNION ALL
    SELECT c.relname || ' ' || pg_get_viewdef(c.oid) || ' ' || coalesce(c.relacl::text, '')
    FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind = 'v') s};
is($node->safe_psql('proxy_old', $catalog), $node->safe_psql('proxy', $catalog),
	'the updated proxy equals a fresh install: functions, views and privileges');
is($node->safe_psql('proxy_old',
		'SELECT diagnoses_withheld FROM idempotency.stats WHERE endpoint IS NULL AND NOT untracked'),
	$withheld, 'after the update, stats has diagnoses_withheld');

$node->stop;
done_testing();
