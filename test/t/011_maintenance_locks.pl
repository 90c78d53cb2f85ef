# Two passes never overlap, and a pass that cannot get a DDL lock quickly
# skips that step instead of making claims queue behind it.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('locks', conf => qq{
idempotency.enable_worker = off
});

# a pass in an open transaction holds the maintenance lock until it ends
my $s1 = $node->background_psql('postgres');
$s1->query_safe('BEGIN');
$s1->query_safe('SELECT count(*) FROM idempotency.idem_maintenance()');
ok( $node->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM pg_locks
	WHERE locktype = 'advisory' AND objsubid = x'494D'::int AND granted}),
	'a pass holds the maintenance lock');
is( $node->safe_psql('postgres',
		"SELECT kind || ':' || coalesce(object, '-') FROM idempotency.idem_maintenance()"),
	'busy:-', 'a second pass returns at once and says so');
# pg_advisory_lock keys do not collide with it
is($node->safe_psql('postgres', 'SELECT pg_try_advisory_lock(0) AND pg_try_advisory_lock(0, 0)'),
	't', 'user advisory locks do not collide with the maintenance lock');
$s1->query_safe('COMMIT');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.idem_maintenance() WHERE kind = 'busy'"),
	'0', 'once it committed, the next pass runs');

# a session that holds a lock conflicting with ATTACH: the creation steps are
# skipped after the short lock_timeout, logged, and retried by the next pass
$s1->query_safe('BEGIN');
$s1->query_safe('LOCK TABLE ONLY idempotency.keys IN SHARE UPDATE EXCLUSIVE MODE');
my $offset = -s $node->logfile;
# (the partitions of idempotency.tombstones, which that lock does not
# concern, are left out)
my $res = $node->safe_psql('postgres', q{
	SELECT kind, count(*) FROM idempotency.idem_maintenance(now() + interval '30 days', preview => false)
	WHERE object IS NULL OR object NOT LIKE 'tombstones%'
	GROUP BY kind ORDER BY kind});
like($res, qr/^skipped\|\d+$/m, 'steps that cannot get their lock are skipped');
unlike($res, qr/^create\|/m, 'and nothing is created meanwhile');
ok($node->wait_for_log(qr/idempotency maintenance skipped creating partition "keys_p/, $offset),
	'the skip is logged');
# claims (inserts through the parent) were never blocked by the pass
$node->safe_psql('postgres', q{
	INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
	VALUES ('t', 'e', 'during', '\x00', 'completed', now(), now() + interval '1 hour')});
$s1->query_safe('COMMIT');
$res = $node->safe_psql('postgres', q{
	SELECT kind, count(*) FROM idempotency.idem_maintenance(now() + interval '30 days', preview => false)
	GROUP BY kind ORDER BY kind});
like($res, qr/^create\|\d+$/m, 'the next pass makes them');
unlike($res, qr/^skipped/m, 'without skipping');
$s1->quit;

# A claim that comes while a pass moves its key out of the default partition
# waits for the pass and then finds the key where it went.
$node->safe_psql('postgres', q{
	DROP EXTENSION idempotency;
	CREATE EXTENSION idempotency;
	BEGIN;
	SELECT action FROM idempotency.idem_claim('acme', 'pay', 'moved', sha256('\x01'));
	SELECT idempotency.idem_finish('acme', 'pay', 'moved', 201, '{"id": 1}');
	COMMIT;
});
is($node->safe_psql('postgres', q{SELECT tableoid::regclass FROM idempotency.keys WHERE key = 'moved'}),
	'idempotency.keys_default', 'the key waits in the default partition');
$s1 = $node->background_psql('postgres');
$s1->query_safe('BEGIN');
like($s1->query_safe(q{SELECT string_agg(kind || ':' || rows, ',') FROM idempotency.idem_maintenance()
                       WHERE rows > 0}),
	qr/create:1/, 'a pass moves it into a new partition (not committed yet)');
my ($out, $err) = ('', '');
my $claim = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $node->connstr('postgres'), '-c',
	  q{SELECT action || ':' || convert_from(response_body, 'UTF8') FROM idempotency.idem_claim('acme', 'pay', 'moved', sha256('\x01'))} ],
	'>', \$out, '2>', \$err);
ok( $node->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM pg_stat_activity
	WHERE wait_event_type = 'Lock' AND query LIKE '%idem_claim%'}),
	'a duplicate claim waits for the pass');
$s1->query_safe('COMMIT');
$claim->finish;
is($out, "replay:{\"id\": 1}\n", 'and replays the key from its new partition');
is($err, '', 'without an error');
$s1->quit;

$node->stop;
done_testing();
