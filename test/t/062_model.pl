# A model-based test of the protocol: test/model/idem_model.py holds a
# reference model of claims (atomic and lease mode), finish, fail, release,
# heartbeat, resolve, lookup, expiry, maintenance passes and tombstones, and
# a driver (Hypothesis stateful testing, Debian's python3-hypothesis and
# python3-psycopg, which make test installs) that runs random sequences of
# those calls from three sessions, in autocommit mode and in transactions
# at the three isolation levels with savepoints, against this cluster.  It checks every
# answer, and after each maintenance pass and at the end of each sequence
# the rows of idempotency.keys and idempotency.tombstones and their
# partitions, against the model.  Nothing sleeps: claims pass wait => 0,
# or wait in a thread for a transaction that holds their scope until the
# driver ends it, a call that would wait for a row another session's open
# transaction changed meets lock_timeout (which the model expects), and
# keys expire either at once (a ttl of one microsecond) or long after the
# run, the times between being reached by passes as of a later or an
# earlier time.
#
# Between calls the driver also restarts the server (fast, or immediate: a
# crash), and a second database fills and frees the server's shared table
# of tombstone filters (test/model/model.conf makes it tiny where the
# server has idempotency.tombstone_filter_entries).
#
# A fixed budget: IDEM_MODEL_EXAMPLES sequences (default 50) of at most
# IDEM_MODEL_STEPS calls (default 60).  Every run prints its seed; a
# failing run prints the shortest sequence Hypothesis found and the seed, and
#   IDEM_MODEL_SEED=N TESTS=062_model make test
# replays it (IDEM_MODEL_SHRINK=0 reports the first failing sequence as it
# came, without shrinking it).  make model runs a longer budget for the
# seeds it is given (scripts/model.sh).
use strict;
use warnings;
use FindBin;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;
use IPC::Run;

my $python = '/usr/bin/python3';
my $driver = "$FindBin::Bin/../model/idem_model.py";

if (system($python, '-c', 'import hypothesis, psycopg') != 0)
{
	plan skip_all =>
	  'python3-hypothesis or python3-psycopg is not installed (make test installs them)';
}

# the settings make model uses too
my $conf = slurp_file("$FindBin::Bin/../model/model.conf");
my $node = idem_node('model', conf => $conf);

my %env = (
	PGHOST => $node->host,
	PGPORT => $node->port,
	PGDATABASE => 'postgres',
	PYTHONDONTWRITEBYTECODE => '1',
	# the driver restarts and crashes the server (pg_ctl of this build)
	IDEM_MODEL_PGCTL => 'pg_ctl',
	IDEM_MODEL_PGDATA => $node->data_dir,
	IDEM_MODEL_PGLOG => $node->logfile,
);
$env{$_} = $ENV{$_}
  for grep { defined $ENV{$_} }
  qw(IDEM_MODEL_SEED IDEM_MODEL_EXAMPLES IDEM_MODEL_STEPS IDEM_MODEL_SHRINK IDEM_MODEL_FILL_MAX);

my ($out, $err) = ('', '');
my $ok;
{
	local %ENV = (%ENV, %env);
	$ok = IPC::Run::run([ $python, $driver ], '>', \$out, '2>', \$err);
}
ok($ok, 'every sequence of calls answered as the model says') or diag("$out\n$err");
like($out, qr/^model: passed, seed \d+/m, 'the driver ran to its end') or diag("$out\n$err");
note($out);

$node->stop;
done_testing();
