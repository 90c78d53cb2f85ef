# Key horizons across a crash (src/horizon.c): after a restart no horizon is
# known until maintenance has read every row version, so claims probe every
# partition meanwhile; a key written before the crash, and one written by a
# transaction prepared before it and committed after, are found both
# before and after that learning, as is a key in the default partition,
# and once learned a new key of a one-day endpoint opens at most two dated
# partitions again.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('horizons', conf => qq{
idempotency.enable_worker = off
idempotency.max_ttl = '30d'
idempotency.partition_interval = '1d'
max_prepared_transactions = 5
});
my $fp = q{sha256('a')};

sub claim
{
	my ($endpoint, $key, $ttl) = @_;
	return $node->safe_psql('postgres',
		"SELECT action FROM idempotency.idem_claim('t', '$endpoint', '$key', $fp, ttl => '$ttl')");
}

# the dated partitions of keys a claim of a new key opens
sub opened
{
	my ($endpoint) = @_;
	return $node->safe_psql('postgres', qq{
BEGIN;
SELECT action FROM idempotency.idem_claim('t', '$endpoint', 'probe-' || (extract(epoch from clock_timestamp()) * 1000000)::bigint, $fp, ttl => '1 day') \\g /dev/null
SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE l.pid = pg_backend_pid() AND c.relkind = 'r' AND c.relname ~ '^keys_p';
ROLLBACK;});
}

$node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.idem_maintenance()');
cmp_ok(key_partitions($node), '>=', 30, 'thirty days of partitions ahead');
cmp_ok(opened('POST /a'), '<=', 2, 'learned at the first pass: a new key opens at most two dated partitions');

# a key of 20 days, committed; another of 25 days, prepared
$node->safe_psql('postgres', qq{
BEGIN;
SELECT idempotency.idem_claim('t', 'POST /a', 'long', $fp, ttl => '20 days');
SELECT idempotency.idem_finish('t', 'POST /a', 'long', 201, '{}');
COMMIT;
BEGIN;
SELECT idempotency.idem_claim('t', 'POST /b', 'prepared', $fp, ttl => '25 days');
SELECT idempotency.idem_finish('t', 'POST /b', 'prepared', 201, '{}');
PREPARE TRANSACTION 'p1';});
# and a key beyond the dated partitions, in the default partition
$node->safe_psql('postgres', qq{
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
VALUES ('t', 'POST /d', 'in-default', $fp, 'completed', now(), now() + interval '40 days')});
is($node->safe_psql('postgres', q{SELECT tableoid::regclass FROM idempotency.keys WHERE key = 'in-default'}),
	'idempotency.keys_default', 'a key of 40 days is in the default partition');

$node->stop('immediate');
$node->start;

is(claim('POST /a', 'long', '1 day'), 'replay', 'before learning: the 20-day key is found');
cmp_ok(opened('POST /c'), '>=', 30, 'before learning: every partition is probed');

$node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.idem_maintenance()');
$node->safe_psql('postgres', q{COMMIT PREPARED 'p1'});
is(claim('POST /b', 'prepared', '1 day'), 'replay',
	'the key of the transaction prepared before the crash is found after learning');
is(claim('POST /a', 'long', '1 day'), 'replay', 'after learning: the 20-day key is found');
is(claim('POST /d', 'in-default', '1 day'), 'replay',
	'after learning: the key in the default partition is found');
cmp_ok(opened('POST /c'), '<=', 2, 'after learning: a new key of another endpoint opens at most two again');
cmp_ok(opened('POST /a'), '>=', 20, 'the endpoint of the 20-day key opens its 20 days');

# Tombstone filters across a crash (src/tombstone_filter.c): a pass as of 30 days
# ahead drops the keys' partitions and keeps their tombstones; after a
# restart, until maintenance has learned the filters, every tombstone
# partition is probed, and afterwards a new key opens none while an expired
# key with another payload still answers 422.
# (on node $_[0], default $node; endpoint $_[1], default POST /c)
sub tombstone_partitions_opened
{
	my ($on, $endpoint) = @_;
	$on //= $node;
	$endpoint //= 'POST /c';
	# a partition read is one whose index the claim scanned (the
	# transaction's own counts, before and after: a claim holds no lock of
	# a tombstone partition once it returns)
	my $scans = q{SELECT i.indexrelid AS idx, pg_stat_get_xact_numscans(i.indexrelid) AS n
FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
WHERE c.relkind = 'r' AND c.relnamespace = 'idempotency'::regnamespace
  AND c.relname ~ '^tombstones_'};
	return $on->safe_psql('postgres', qq{
BEGIN;
CREATE TEMP TABLE scans0 ON COMMIT DROP AS $scans;
SELECT action FROM idempotency.idem_claim('t', '$endpoint', 'new-' || (extract(epoch from clock_timestamp()) * 1000000)::bigint, $fp) \\g /dev/null
SELECT count(*) FROM ($scans) s LEFT JOIN scans0 s0 USING (idx) WHERE s.n > coalesce(s0.n, 0);
ROLLBACK;});
}
$node->safe_psql('postgres', q{
SET idempotency.tombstone_partition_interval = '1d';
SELECT count(*) FROM idempotency.idem_maintenance(now() + interval '30 days', preview => false)});
cmp_ok($node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.tombstones'), '>=', 2,
	'the expired keys left tombstones');
is(tombstone_partitions_opened(), '0', 'learned: a new key opens no tombstone partition');

$node->stop('immediate');
$node->start;
cmp_ok(tombstone_partitions_opened(), '>=', 2, 'before learning: every tombstone partition with rows is opened');
is($node->safe_psql('postgres',
		q{SELECT action FROM idempotency.idem_claim('t', 'POST /a', 'long', sha256('b'))}),
	'mismatch', 'before learning: an expired key with another payload finds its tombstone');
$node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.idem_maintenance()');
is($node->safe_psql('postgres',
		q{SELECT action FROM idempotency.idem_claim('t', 'POST /b', 'prepared', sha256('b'))}),
	'mismatch', 'after learning: the tombstone written before the crash is found');
is(tombstone_partitions_opened(), '0', 'after learning: a new key opens no tombstone partition');

# One client exhausting the shared table of horizons (4,096 entries): the
# endpoints that find no entry share their database's horizon, and a key of
# each is still found.
$node->safe_psql('postgres', q{
SET idempotency.max_claims_per_transaction = 5000;
DO $$
BEGIN
    FOR i IN 1 .. 4200 LOOP
        PERFORM idempotency.idem_claim('t', 'POST /many/' || i, 'k', sha256('a'), ttl => '1 day');
        PERFORM idempotency.idem_finish('t', 'POST /many/' || i, 'k', 201, '{}');
    END LOOP;
END $$;
BEGIN;
SELECT idempotency.idem_claim('t', 'POST /many/last', 'long', sha256('a'), ttl => '20 days');
SELECT idempotency.idem_finish('t', 'POST /many/last', 'long', 201, '{}');
COMMIT;});
is($node->safe_psql('postgres', q{
SELECT count(*) FILTER (WHERE (idempotency.idem_claim('t', 'POST /many/' || i, 'k', sha256('a'))).action = 'replay')
FROM generate_series(1, 4200) i}), '4200', 'with the table of horizons full, every key is found');
is($node->safe_psql('postgres',
		q{SELECT action FROM idempotency.idem_claim('t', 'POST /many/last', 'long', sha256('a'))}),
	'replay', 'and a 20-day key of an endpoint without an entry too');

$node->stop;

# Tombstone filters out of memory: with 96 kB, the filter of a partition
# holding many tombstones cannot grow; it is logged once, the partition is
# probed by every claim, and its tombstones answer.
my $small = idem_node('filters_small', conf => qq{
idempotency.enable_worker = off
idempotency.tombstone_filter_memory = '96kB'
});
$small->safe_psql('postgres', q{
SELECT count(*) FROM idempotency.idem_maintenance();
INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)
SELECT idempotency.idem_tombstone_hash('t', 'POST /s', 'k' || i), sha256('a'),
       now() - interval '1 day', now() + interval '20 days'
FROM generate_series(1, 50000) i;});
is($small->safe_psql('postgres', q{
SELECT count(*) FILTER (WHERE (idempotency.idem_claim('t', 'POST /s', 'k' || i, sha256('b'))).action = 'mismatch')
FROM generate_series(1, 50000, 997) i}), '51', 'the tombstones of a partition whose filter is full answer');
ok($small->log_contains('the tombstone filters are full'), 'a full filter memory is logged');
$small->stop;

# Runs of tombstones across a crash: a drop that leaves 3,000 tombstones
# writes them as runs (rows of many entries, src/tombstone_write.c); after a
# restart, learning puts every entry of every run into the filters, so that
# each expired key with another payload still answers 422 and a new key
# opens no tombstone partition.
my $runs = idem_node('runs', conf => qq{
idempotency.enable_worker = off
idempotency.partition_interval = '1d'
});
$runs->safe_psql('postgres', q{
SELECT count(*) FROM idempotency.idem_maintenance();
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
SELECT 't', 'POST /r', 'r' || i, sha256('a'), 'completed', now(), now() + interval '1 second'
FROM generate_series(1, 3000) i;
SELECT pg_sleep(1.2);
SELECT count(*) FROM idempotency.idem_maintenance(now() + interval '2 days', preview => false);});
cmp_ok($runs->safe_psql('postgres',
		'SELECT count(*) FROM idempotency.tombstones WHERE octet_length(scope_hash) < 16'),
	'>', 0, 'the drop of 3,000 keys wrote runs');
sub runs_mismatches
{
	return $runs->safe_psql('postgres', q{
SET idempotency.max_claims_per_transaction = 5000;
BEGIN;
SELECT count(*) FILTER (WHERE (idempotency.idem_claim('t', 'POST /r', 'r' || i, sha256('b'))).action = 'mismatch')
FROM generate_series(1, 3000) i;
ROLLBACK;});
}
is(runs_mismatches(), '3000', 'every key of the runs answers 422 with another payload');
is(tombstone_partitions_opened($runs, 'POST /r'), '0', 'a new key opens no tombstone partition');
$runs->stop('immediate');
$runs->start;
is(runs_mismatches(), '3000', 'before learning: every key of the runs answers 422');
$runs->safe_psql('postgres', 'SELECT count(*) FROM idempotency.idem_maintenance()');
is(tombstone_partitions_opened($runs, 'POST /r'), '0', 'after learning: a new key opens no tombstone partition');
is(runs_mismatches(), '3000', 'after learning: every key of the runs still answers 422');

# Compaction of the filters: 20,000 tombstones written by SQL grow the
# filter of the runs' partition by doubling (four generations and more); the
# next pass makes it one generation again from the partition's rows (runs
# included), and every tombstone still answers.
$runs->safe_psql('postgres', q{
INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)
SELECT idempotency.idem_tombstone_hash('t', 'POST /r', 's' || i), sha256('a'),
       now() - interval '1 day', r.expires_at
FROM generate_series(1, 20000) i,
     (SELECT max(expires_at) AS expires_at FROM idempotency.tombstones
      WHERE octet_length(scope_hash) < 16) r;});
is($runs->safe_psql('postgres', q{
SELECT count(DISTINCT tableoid) FROM idempotency.tombstones}), '1',
	'they share the partition of the runs');
my ($ret, $out, $err) = $runs->psql('postgres',
	'SET client_min_messages = debug1; SELECT count(*) FROM idempotency.idem_maintenance()');
is($ret, 0, 'the pass after the load succeeds');
like($err, qr/tombstone filters compacted/, 'the pass compacts the filters that grew');
is($runs->safe_psql('postgres', q{
SET idempotency.max_claims_per_transaction = 5000;
BEGIN;
SELECT count(*) FILTER (WHERE (idempotency.idem_claim('t', 'POST /r', 's' || i, sha256('b'))).action = 'mismatch')
FROM generate_series(1, 20000, 7) i;
ROLLBACK;}), '2858', 'after compaction: the tombstones written by SQL answer 422');
is(runs_mismatches(), '3000', 'after compaction: every key of the runs answers 422');
is(tombstone_partitions_opened($runs, 'POST /r'), '0', 'after compaction: a new key opens no tombstone partition');
$runs->stop;

done_testing();
