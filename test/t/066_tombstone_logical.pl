# Tombstones reach a logical replica.  Maintenance writes the tombstones of
# a partition of keys it drops straight into the partitions of
# idempotency.tombstones, through the table access method
# (src/tombstone_direct.c), not by an INSERT: those writes must be decoded
# and applied like any insert.  The publisher publishes FOR ALL TABLES with
# publish_via_partition_root; a pass there drops a partition of 3,000
# expired keys (written as runs) and one key whose fingerprint is not a
# SHA-256 (a row of its own); the subscriber then holds every row of
# tombstones the publisher holds, byte for byte.  Nothing is checked
# against a clock: the test waits for the subscriber to catch up.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $conf = qq{
idempotency.enable_worker = off
idempotency.partition_interval = '1d'
idempotency.max_ttl = '7d'
};
my $blue = idem_node('blue', init => [ allows_streaming => 'logical' ], conf => $conf);
my $green = idem_node('green', conf => $conf);

# partitions for today on, on both
for my $node ($blue, $green)
{
	$node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.idem_maintenance(now(), preview => false)});
}
subscribe_all($blue, $green);

# keys of today's partition, expiring within a second
$blue->safe_psql('postgres', q{
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
SELECT 'acme', 'pay', 'p' || i, sha256(convert_to('a' || i, 'UTF8')), 'completed',
       now(), now() + interval '1 second'
FROM generate_series(1, 3000) i;
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
VALUES ('acme', 'pay', 'short', '\x0102030405', 'completed', now(), now() + interval '1 second');
});
is( $blue->safe_psql('postgres', q{
SELECT kind || ' ' || rows FROM idempotency.idem_maintenance(now() + interval '2 days', preview => false)
WHERE kind = 'tombstone'}),
	'tombstone 3001', 'the pass on the publisher leaves a tombstone of each key it drops');
is( $blue->safe_psql('postgres', q{
SELECT count(*) FILTER (WHERE octet_length(scope_hash) < 16) > 0
       AND count(*) FILTER (WHERE octet_length(scope_hash) = 16) = 1
FROM idempotency.tombstones}),
	't', 'as runs, and a row of its own for the short fingerprint');

$blue->wait_for_catchup('green');
my $rows = q{
SELECT count(*) || ' ' || md5(string_agg(encode(scope_hash, 'hex') || ':' || encode(fingerprint, 'hex')
                              || ':' || expired_at || ':' || expires_at, ','
                              ORDER BY scope_hash, fingerprint, expires_at))
FROM idempotency.tombstones};
my $blue_rows = $blue->safe_psql('postgres', $rows);
is($green->safe_psql('postgres', $rows), $blue_rows,
	'the subscriber holds every row of tombstones the publisher wrote');

done_testing();
