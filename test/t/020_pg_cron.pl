# Without shared_preload_libraries = 'idempotency': pg_cron runs the
# maintenance pass with the line the README shows.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

# pg_cron is packaged for Debian's PostgreSQL 15 only
skip_unless_installed('pg_cron', dir => '--pkglibdir', file => 'pg_cron.so', missing => 'no %s');

my $node = idem_node('cron', preload => 'pg_cron', extension => 0, conf => qq{
cron.database_name = 'postgres'
cron.use_background_workers = on
max_worker_processes = 16
});

$node->safe_psql('postgres', q{
	CREATE EXTENSION pg_cron;
	CREATE EXTENSION idempotency CASCADE;
	INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state,
	    lease_token, locked_until, created_at, expires_at)
	VALUES ('acme', 'pay', 'stale', decode(repeat('ab', 32), 'hex'), 'in_progress',
	    7, now() - interval '1 minute', now() - interval '2 minutes', now() + interval '1 hour');
});
is(key_partitions($node), '1', 'only the default partition before the first pass');

# the README's line, verbatim
$node->safe_psql('postgres',
	q{SELECT cron.schedule('idempotency-maintenance', '* * * * *', 'SELECT idempotency.idem_maintenance()')});

# pg_cron starts jobs on minute boundaries: wait for the first run
ok( $node->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM cron.job_run_details d JOIN cron.job j USING (jobid)
	WHERE j.jobname = 'idempotency-maintenance' AND d.status IN ('succeeded', 'failed')}),
	'pg_cron ran the job');
is( $node->safe_psql('postgres', q{
	SELECT d.status FROM cron.job_run_details d JOIN cron.job j USING (jobid)
	WHERE j.jobname = 'idempotency-maintenance' ORDER BY d.runid LIMIT 1}),
	'succeeded', 'the pass succeeded');
cmp_ok(key_partitions($node), '>=', 9, 'the pass made the partitions');
is($node->safe_psql('postgres', q{SELECT state FROM idempotency.keys WHERE key = 'stale'}),
	'unknown', 'and settled the stale lease');

$node->stop;
done_testing();
