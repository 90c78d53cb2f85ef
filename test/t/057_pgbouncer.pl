# The extension behind PgBouncer in transaction pooling mode (Debian's
# pgbouncer), as doc/operations.md's "Connection poolers" describes it:
# claims and finishes; a duplicate that waits (the claim's wait) while the
# first request holds another server connection; a lease claimed on one
# server connection and heartbeaten and finished from others; tenant
# binding (a pool per tenant whose connect_query binds each server
# connection works; SET LOCAL binds the server connection for good, so the
# next client of the pool, another tenant, is refused; a session-level SET
# leaks to the next client or is lost); protocol-level prepared statements
# (named ones break before PgBouncer 1.21, unnamed ones work; so do
# psycopg's own unless prepare_threshold=None); and one keyed request
# through each HTTP client's middleware (when node and the Python packages
# are there).  Skips when pgbouncer is not installed.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;
use IPC::Run;
use Cwd ();

my ($pgbouncer) = grep { -x $_ } ('/usr/sbin/pgbouncer', '/usr/bin/pgbouncer');
plan skip_all => "pgbouncer is not available: $ENV{IDEM_SKIP_PGBOUNCER}"
  if $ENV{IDEM_SKIP_PGBOUNCER};
plan skip_all => 'pgbouncer is not installed (Debian: apt-get install pgbouncer)'
  unless $pgbouncer;
my ($bversion) = `$pgbouncer --version` =~ /PgBouncer (\d+\.\d+)/;
my $protocol_prepared = $bversion >= 1.21;
note("PgBouncer $bversion");

my $node = idem_node('pgbouncer', conf => "idempotency.maintenance_interval = 3600\n");
$node->safe_psql('postgres', q{
	CREATE ROLE app LOGIN IN ROLE idempotency_client;
	GRANT SET ON PARAMETER idempotency.tenant TO app;
	CREATE TABLE orders (id bigserial PRIMARY KEY, amount int);
	GRANT INSERT, SELECT ON orders TO app;
	GRANT USAGE ON SEQUENCE orders_id_seq TO app;});

# PgBouncer on loopback, in front of the cluster's socket, one pool per
# alias: "shared" (one server connection), "two" (two), "acme" and "globex"
# (bound to their tenant by connect_query), "prep" (one)
my $dir = PostgreSQL::Test::Utils::tempdir;
my $bport = PostgreSQL::Test::Cluster::get_free_port();
my $server = 'host=' . $node->host . ' port=' . $node->port . ' dbname=postgres';
open my $fh, '>', "$dir/users.txt" or die $!;
print $fh qq{"app" ""\n};
close $fh;
open $fh, '>', "$dir/pgbouncer.ini" or die $!;
print $fh <<"INI";
[databases]
shared = $server pool_size=1
leak = $server pool_size=1
lost = $server pool_size=2
two = $server pool_size=2
acme = $server pool_size=1 connect_query='SET idempotency.tenant = ''acme'''
globex = $server pool_size=1 connect_query='SET idempotency.tenant = ''globex'''
prep = $server pool_size=1
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bport
unix_socket_dir =
auth_type = trust
auth_file = $dir/users.txt
pool_mode = transaction
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
print $fh "max_prepared_statements = 50\n" if $protocol_prepared;
close $fh;
my $bouncer = IPC::Run::start([ $pgbouncer, "$dir/pgbouncer.ini" ], '>', \my $bout, '2>', \my $berr);
END { $bouncer->kill_kill if $bouncer; }
$SIG{TERM} = $SIG{INT} = sub { die "killed\n" };    # END stops PgBouncer

sub connstr { return "host=127.0.0.1 port=$bport user=app dbname=$_[0]"; }

# psql through PgBouncer: (stdout, stderr) of the script $sql on alias $db
sub bq
{
	my ($db, $sql) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'psql', '-X', '-A', '-t', '-q', '-v', 'ON_ERROR_STOP=1', '-v', 'VERBOSITY=verbose',
			'-d', connstr($db) ],
		'<', \$sql, '>', \$out, '2>', \$err);
	$out =~ s/^\n//mg;    # the empty lines of void results
	chomp $out;
	return wantarray ? ($out, $err) : $out;
}

# A client that stays connected: session($db), then ask($s, $sql) runs
# $sql and waits for its answer (or, with $nowait, only sends it)
sub session
{
	my ($db) = @_;
	my %s = (in => '', out => '', err => '');
	$s{h} = IPC::Run::start([ 'psql', '-X', '-A', '-t', '-q', '-d', connstr($db) ],
		'<', \$s{in}, '>', \$s{out}, '2>', \$s{err});
	return \%s;
}
my $n = 0;
sub ask
{
	my ($s, $sql, $nowait) = @_;
	my $mark = $s->{mark} = 'done_' . ++$n;
	$s->{out} = '';
	$s->{in} .= "$sql\n\\echo $mark\n";
	if ($nowait)
	{
		$s->{h}->pump while length $s->{in};    # sent, not answered
		return;
	}
	return answer($s);
}
sub answer
{
	my ($s) = @_;
	my $mark = $s->{mark};
	my $t = IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default);
	$s->{h}->pump until $s->{out} =~ /\Q$mark\E/ || $t->is_expired;
	$s->{raw} = $s->{out};
	(my $out = $s->{out}) =~ s/\n?\Q$mark\E\n//;
	$out =~ s/^\n//mg;
	chomp $out;
	return $out;
}

# PgBouncer answers
my $up;
for (1 .. 100)
{
	my ($o) = bq('shared', 'SELECT 1');
	last if ($up = $o eq '1');
	select(undef, undef, undef, 0.1);
}
ok($up, 'PgBouncer answers') or diag(slurp_file("$dir/pgbouncer.log"));

my $fp = q{sha256('\x61'::bytea)};
my $claim = sub {
	my ($tenant, $key, $opts) = @_;
	return "SELECT action || coalesce(' ' || http_status, '') FROM idempotency.idem_claim('$tenant', 'POST /orders', '$key', $fp"
	  . ($opts ? ", $opts" : '') . ')';
};
# a request: its claim and finish in one transaction, after the statements $pre
my $request = sub {
	my ($tenant, $key, $pre) = @_;
	return "BEGIN;\n" . ($pre // '') . $claim->($tenant, $key) . ";\n"
	  . "SELECT idempotency.idem_finish('$tenant', 'POST /orders', '$key', 201, '{}');\nCOMMIT;";
};

# claims and finishes: one transaction each, on the pool's only server connection
is(bq('shared', "BEGIN;\n" . $claim->('acme', 'k1') . ";\n"
		  . q{SELECT idempotency.idem_finish('acme', 'POST /orders', 'k1', 201, '{"id": 1}');} . "\nCOMMIT;"),
	'execute', 'a claim and its finish through PgBouncer');
is(bq('shared', $claim->('acme', 'k1')), 'replay 201', 'the retry from another client replays');

# a duplicate waits for the first request, which holds another server connection
my $first = session('two');
my $first_pid = ask($first, "BEGIN;\nSELECT pg_backend_pid();\n" . $claim->('acme', 'k2') . ';');
like($first_pid, qr/^\d+\nexecute$/, 'the first request claims in its transaction');
($first_pid) = $first_pid =~ /^(\d+)/;
my $dup = session('two');
ask($dup, 'SELECT pg_backend_pid(), (' . $claim->('acme', 'k2', q{wait => '60 s'}) . ');', 1);
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%wait =>%' AND pid <> $first_pid AND pid <> pg_backend_pid()"),
	'the duplicate waits on another server connection');
ask($first, q{SELECT idempotency.idem_finish('acme', 'POST /orders', 'k2', 201, '{"id": 2}');} . "\nCOMMIT;");
my $dup_answer = answer($dup);
like($dup_answer, qr/^(\d+)\|replay 201$/, 'the waiting duplicate replays once the first commits');
my ($dup_pid) = $dup_answer =~ /^(\d+)/;
isnt($dup_pid, $first_pid, 'on a server connection of its own');

# a lease: claimed on one server connection, heartbeaten and finished from
# other clients (the claim's server connection held by a transaction)
my ($lease_pid, $token) = split /\|/,
  bq('two', "SELECT pg_backend_pid(), lease_token FROM idempotency.idem_claim('acme', 'POST /orders', 'k3', $fp, lease => '1 min')");
like($token, qr/^\d+$/, 'a lease claim returns its token');
my $holder = session('two');
is(ask($holder, "BEGIN;\nSELECT pg_backend_pid();"), $lease_pid,
	'a transaction of another client holds the server connection that claimed (PgBouncer reuses the last used)');
my ($hb_pid, $hb) = split /\|/,
  bq('two', "SELECT pg_backend_pid(), idempotency.idem_heartbeat('acme', 'POST /orders', 'k3', $token, '2 min') > now() + '90 s'");
is($hb, 't', 'the heartbeat from another client extends the lease');
isnt($hb_pid, $lease_pid, 'from another server connection');
bq('two', qq{SELECT idempotency.idem_finish('acme', 'POST /orders', 'k3', 201, '{"id": 3}', lease_token => $token)});
ask($holder, 'COMMIT;');
is(bq('two', $claim->('acme', 'k3')), 'replay 201', 'the lease finished from a third client replays');

# tenant binding: a pool per tenant, bound by its connect_query
is(bq('acme', $request->('acme', 'k4')), 'execute', "the pool bound to acme claims acme's keys");
my ($o, $e) = bq('acme', $claim->('globex', 'k4'));
like($e, qr/IK401: this session may not act for tenant "globex"/, "and no other tenant's");
is(bq('globex', $request->('globex', 'k4')), 'execute', "the pool bound to globex claims globex's");

# SET LOCAL binds the server connection for good: the next client of the
# pool, another tenant, gets the first one's binding
is(bq('shared', $request->('acme', 'k5', "SET LOCAL idempotency.tenant = 'acme';\n")),
	'execute', 'SET LOCAL idempotency.tenant in the transaction: the claim runs');
# (each refusal a statement of its own: a client that leaves in a
# transaction makes PgBouncer close that server connection)
($o, $e) = bq('shared', q{SELECT set_config('idempotency.tenant', 'globex', true)});
like($e, qr/55P02: parameter "idempotency.tenant" cannot be changed once it has bound the session/,
	"the next client's set_config(..., true) (SET LOCAL) of another tenant is refused");
is(bq('shared', 'SHOW idempotency.tenant'), 'acme', 'the server connection stays bound to the first tenant');
($o, $e) = bq('shared', $claim->('globex', 'k5'));
like($e, qr/IK401: this session may not act for tenant "globex"/, 'the next client cannot claim for its own tenant');

# a session-level SET leaks to the next client of the server connection...
bq('leak', q{SET idempotency.default_ttl = '2 h'});
is(bq('leak', $request->('acme', 'k6')), 'execute', 'the next client claims');
is($node->safe_psql('postgres', q{SELECT expires_at - created_at FROM idempotency.keys WHERE key = 'k6'}),
	'02:00:00', "with the previous client's session-level SET: its key is kept 2 hours, not 1 day");
# ...or is lost when the client's next transaction gets another one
my $setter = session('lost');
ask($setter, q{SET idempotency.default_ttl = '2 h';});
my $other = session('lost');
ask($other, "BEGIN;\nSELECT 1;");
is(ask($setter, 'SHOW idempotency.default_ttl;'), '1d',
	"the same client's next statement, on another server connection, no longer has it")
  or diag("out: $setter->{raw} err: $setter->{err}");
ask($other, 'COMMIT;');
$_->{h}->finish for $first, $dup, $holder, $setter, $other;

# prepared statements: pgbench's named ones (-M prepared) from two clients
# on one server connection; unnamed ones (-M extended) work
my $script = write_script($dir, 'claim',
	"\\set k random(1, 1000000)\nSELECT action FROM idempotency.idem_claim('acme', 'POST /prepared', 'p' || :k, $fp, lease => '1 min');\n");
my @pgbench = ('pgbench', '-n', '-h', '127.0.0.1', '-p', $bport, '-U', 'app', '-c', '2', '-j', '1', '-t', '5',
	'-f', $script);
my ($pout, $perr) = ('', '');
my $extended = IPC::Run::run([ @pgbench, '-M', 'extended', 'prep' ], '>', \$pout, '2>', \$perr);
ok($extended, 'unnamed prepared statements (pgbench -M extended) work') or diag($perr);
($pout, $perr) = ('', '');
my $prepared = IPC::Run::run([ @pgbench, '-M', 'prepared', 'prep' ], '>', \$pout, '2>', \$perr);
if ($protocol_prepared)
{
	ok($prepared, "named prepared statements (pgbench -M prepared) work with PgBouncer ${bversion}'s max_prepared_statements")
	  or diag($perr);
}
else
{
	like($perr, qr/prepared statement "\w+" (already exists|does not exist)/,
		"named prepared statements (pgbench -M prepared) break with PgBouncer $bversion")
	  or diag("pgbench: $perr");
}

# the HTTP clients' middlewares through PgBouncer
my $clients = $ENV{IDEM_CLIENTS_DIR};
my $pooler = Cwd::getcwd() . '/test/pooler';
SKIP:
{
	skip 'the Node client: no clients/ folder named by IDEM_CLIENTS_DIR', 3
	  unless $clients && -d "$clients/node";
	skip "the Node client: $ENV{IDEM_SKIP_NODE}", 3 if $ENV{IDEM_SKIP_NODE};
	skip 'the Node client: node or its packages (npm ci in clients/node) are missing', 3
	  unless -d "$clients/node/node_modules/express" && system('node --version >/dev/null 2>&1') == 0;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'node', "$pooler/client.js", 'postgresql://app@127.0.0.1:' . $bport . '/acme' ],
		'>', \$out, '2>', \$err);
	like($out, qr/^first 201 (\{"id":\d+\})$/m, 'Express: the keyed request executes through PgBouncer')
	  or diag("$out$err");
	my ($body) = $out =~ /^first 201 (.*)$/m;
	$body //= 'none';
	like($out, qr/^retry 201 \Q$body\E$/m, 'its retry replays the same answer');
	like($out, qr/^runs 1$/m, 'the handler ran once');
}
SKIP:
{
	skip 'the Python client: no clients/ folder named by IDEM_CLIENTS_DIR', 5
	  unless $clients && -d "$clients/python";
	skip "the Python client: $ENV{IDEM_SKIP_PYTHON}", 5 if $ENV{IDEM_SKIP_PYTHON};
	skip 'the Python client: python3-psycopg-pool, python3-starlette or python3-httpx is missing', 5
	  unless system('/usr/bin/python3 -c "import psycopg_pool, starlette, httpx" 2>/dev/null') == 0;
	my ($out, $err) = ('', '');
	IPC::Run::run([ '/usr/bin/python3', "$pooler/client.py", connstr('acme') ],
		'>', \$out, '2>', \$err);
	like($out, qr/^first 201 (\{"id":\d+\})$/m, 'ASGI: the keyed request executes through PgBouncer')
	  or diag("$out$err");
	my ($body) = $out =~ /^first 201 (.*)$/m;
	$body //= 'none';
	like($out, qr/^retry 201 \Q$body\E$/m, 'its retry replays the same answer');
	like($out, qr/^runs 1$/m, 'the handler ran once');

	# psycopg's own prepared statements: what the README's prepare_threshold=None avoids
	($out, $err) = ('', '');
	IPC::Run::run([ '/usr/bin/python3', "$pooler/prepare_threshold.py", connstr('two') ], '>', \$out, '2>', \$err);
	if ($protocol_prepared)
	{
		like($out, qr/^default: ok$/m, "psycopg's prepared statements work with PgBouncer ${bversion}'s max_prepared_statements")
		  or diag("$out$err");
	}
	else
	{
		like($out, qr/^default: InvalidSqlStatementName: prepared statement "_pg3_\d+" does not exist$/m,
			"psycopg's prepared statement (prepare_threshold 5) is missing on the next server connection")
		  or diag("$out$err");
	}
	like($out, qr/^none: ok$/m, 'with prepare_threshold=None nothing is prepared, and it works') or diag("$out$err");
}

$bouncer->kill_kill;
undef $bouncer;
$node->stop;
done_testing();
