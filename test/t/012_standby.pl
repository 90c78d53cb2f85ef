# Nothing runs on a standby: the launcher starts only once recovery is over,
# so a promoted standby starts maintaining.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
# The program that copies the cluster must be as new as its server (the
# PostgreSQL 17 of scripts/pg17.sh is driven by PostgreSQL 15's clients).
my ($server_major) = $primary->config_data('--version') =~ /(\d+)/;
my ($client_major) = `pg_basebackup --version` =~ /(\d+)/;
plan skip_all =>
  "pg_basebackup $client_major cannot copy a PostgreSQL $server_major server"
  if $client_major < $server_major;

$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.maintenance_interval = 1
});
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION idempotency CASCADE');
$primary->backup('b');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);

my $launcher = q{SELECT count(*) FROM pg_stat_activity
                 WHERE backend_type LIKE 'idempotency maintenance%'};
ok($primary->poll_query_until('postgres', "SELECT ($launcher) > 0"), 'the primary runs the launcher');
sleep 2;    # a few intervals
is($standby->safe_psql('postgres', $launcher), '0', 'the standby runs no maintenance process');
like($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), qr/t/, 'still a standby');

# after promotion the new primary maintains its keys
$primary->stop;
$standby->promote;
$standby->safe_psql('postgres', q{
	INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state,
	    lease_token, locked_until, created_at, expires_at)
	VALUES ('acme', 'pay', 'promoted', decode(repeat('ab', 32), 'hex'), 'in_progress',
	    7, now() - interval '1 minute', now() - interval '2 minutes', now() + interval '1 hour')});
ok( $standby->poll_query_until('postgres',
		"SELECT state = 'unknown' FROM idempotency.keys WHERE key = 'promoted'"),
	'once promoted, it runs maintenance passes');

$standby->stop;
done_testing();
