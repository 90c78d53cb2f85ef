# The maintenance launcher when no background worker slot is free: a WARNING
# with SQLSTATE 53400 and a hint naming max_worker_processes, given once for
# the whole streak of failed rounds, not once per round.  And a launcher that
# cannot even be registered at server start (every slot taken): a WARNING
# naming max_worker_processes too.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

# the launcher takes the only slot; logical replication asks for none
my $node = idem_node('slots', conf => qq{
idempotency.maintenance_interval = 1
max_worker_processes = 1
max_logical_replication_workers = 0
log_error_verbosity = verbose
});

ok($node->wait_for_log(qr/no free background worker slot/),
	'a worker that cannot start is logged');
like(
	slurp_file($node->logfile),
	qr/WARNING:  53400: idempotency maintenance launcher found no free background worker slot\n.*DETAIL:  The databases not yet visited wait for a later round\.  This warning is not repeated until a maintenance worker has started again\.\n.*HINT:  Increase max_worker_processes: each maintenance worker takes a slot for the time of its pass\./,
	'as a WARNING with SQLSTATE 53400 and a hint naming max_worker_processes');

# the launcher goes on trying every second (maintenance_interval), quietly
my $offset = -s $node->logfile;
sleep 5;
my $lines = () = slurp_file($node->logfile, $offset) =~ /idempotency/g;
is($lines, 0, 'the rounds that follow write nothing to the log');
my $warnings = () = slurp_file($node->logfile) =~ /no free background worker slot/g;
is($warnings, 1, 'one warning for the whole streak');

# no slot at all at server start: the launcher is never registered
$node->stop;
$node->append_conf('postgresql.conf', "max_worker_processes = 0\n");
$offset = -s $node->logfile;
$node->start;
like(
	slurp_file($node->logfile, $offset),
	qr/WARNING:  53400: idempotency maintenance launcher could not be registered\n.*DETAIL:  The background workers registered before it take every slot of max_worker_processes \(0\), so no maintenance pass runs until the server is restarted with more\.\n.*HINT:  Increase max_worker_processes: the launcher takes a slot/,
	'a launcher that cannot be registered is a WARNING naming max_worker_processes');
is( $node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity
	WHERE backend_type LIKE 'idempotency maintenance%'}),
	'0', 'and indeed no launcher runs');

$node->stop;
done_testing();
