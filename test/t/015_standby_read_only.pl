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
use IdemTest;

skip_unless_client_as_new('pg_basebackup', 'copy');

my $primary = idem_node('ro_primary', init => [ allows_streaming => 1 ], conf => qq{
idempotency.enable_worker = off
});
$primary->safe_psql('postgres', q{
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
