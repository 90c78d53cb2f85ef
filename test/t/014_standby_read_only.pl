# On a hot standby every transaction is read-only: claims and every other
# call that writes a key are refused with 25006 and say that the server is
# a standby (a claim that would only replay too), while idem_lookup reads
# the keys the primary wrote (doc/operations.md "Read-only transactions and
# standbys").
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# The program that copies the cluster must be as new as its server (the
# PostgreSQL 17 of scripts/pg17.sh is driven by PostgreSQL 15's clients).
my ($server_major) = PostgreSQL::Test::Cluster->new('version_probe')->config_data('--version') =~ /(\d+)/;
my ($client_major) = `pg_basebackup --version` =~ /(\d+)/;
plan skip_all =>
  "pg_basebackup $client_major cannot copy a PostgreSQL $server_major server"
  if $client_major < $server_major;

my $primary = PostgreSQL::Test::Cluster->new('ro_primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.enable_worker = off
});
$primary->start;
$primary->safe_psql('postgres', q{
	CREATE EXTENSION idempotency CASCADE;
	BEGIN;
	SELECT idempotency.idem_claim('acme', 'pay', 'k1', sha256('a'));
	SELECT idempotency.idem_finish('acme', 'pay', 'k1', 201, '{"id": 1}');
	COMMIT;
});
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('ro_standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);

my ($rc, $out, $err) = $standby->psql('postgres',
	q{SELECT action FROM idempotency.idem_claim('acme', 'pay', 'k1', sha256('a'))},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  25006: cannot execute idem_claim\(\) in a read-only transaction\nDETAIL:  The server is a standby: keys are claimed and finished on the primary only\./,
	'a claim that would replay is refused on the standby, which the detail names');
($rc, $out, $err) = $standby->psql('postgres',
	q{SELECT action FROM idempotency.idem_claim('acme', 'pay', 'k2', sha256('a'))});
like($err, qr/cannot execute idem_claim\(\) in a read-only transaction/, 'so is a new key');
($rc, $out, $err) = $standby->psql('postgres',
	q{SELECT idempotency.idem_finish('acme', 'pay', 'k2', 200, '{}')});
like($err, qr/cannot execute idem_finish\(\) in a read-only transaction/, 'and a finish');
is($standby->safe_psql('postgres',
		q{SELECT state || ' ' || response_status FROM idempotency.idem_lookup('acme', 'pay', 'k1')}),
	'completed 201', 'idem_lookup reads the key on the standby');

$standby->stop;
$primary->stop;
done_testing();
