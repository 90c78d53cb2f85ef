# The README's first command, as a new user runs it: "make run" in a fresh
# copy of the sources builds, starts a cluster, creates the extension, runs
# the walkthrough and leaves the cluster running; "make stop" stops it.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;

# make test stages the copy (on Debian's PostgreSQL 15, which make run uses)
plan skip_all => 'make run is tested by make test (STAGE names its copy of the sources)'
  unless $ENV{STAGE};
my $src = "$ENV{STAGE}/project";
my $dir = PostgreSQL::Test::Utils::tempdir('make_run');
system_or_bail('cp', '-r', "$src/.", $dir);

my ($stdout, $stderr);
my $ok = IPC::Run::run([ 'make', '-C', $dir, 'run' ], '>', \$stdout, '2>', \$stderr);
ok($ok, 'make run succeeds') or diag("stdout:\n$stdout\nstderr:\n$stderr");
like($stdout, qr/The cluster is running/, 'make run says the cluster is running');
like($stdout, qr/Idempotent-Replayed/, 'the walkthrough shows a replayed response');
like($stdout, qr/idempotency_key_reuse/, 'the walkthrough shows the 422 for a changed request');

# connect the way make run says
my ($psql_cmd) = $stdout =~ /^\s+(psql -h .*)$/m;
ok(defined $psql_cmd, 'make run prints how to connect');
my $count = '';
if (defined $psql_cmd)
{
	my @cmd = split /\s+/, $psql_cmd;
	IPC::Run::run([ @cmd, '-X', '-A', '-t', '-c', 'SELECT count(*) FROM payments' ], '>', \$count);
	chomp $count;
}
is($count, '2', 'the demo database has one payment per tenant');

$ok = IPC::Run::run([ 'make', '-C', $dir, 'stop' ], '>', \$stdout, '2>', \$stderr);
ok($ok, 'make stop succeeds') or diag($stderr);
like($stdout, qr/server stopped/, 'the cluster is stopped');

done_testing();
