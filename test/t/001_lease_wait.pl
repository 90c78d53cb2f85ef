# A duplicate that waits for a leased claim replays it once the holder
# finishes, and an atomic-mode duplicate with a wait replays the committed
# first request; both without executing twice.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;
use IPC::Run;

my $node = idem_node('lease_wait');

my $fp = "sha256('\\x61'::bytea)";
my $token = $node->safe_psql('postgres',
	"SELECT lease_token FROM idempotency.idem_claim('acme', 'POST /charges', 'k1', $fp, lease => '1 min')");
ok($token =~ /^\d+$/, 'lease claim returns a token');

# the duplicate waits up to 20 s for the lease holder
my ($out, $err) = ('', '');
my $h = IPC::Run::start(
	[ 'psql', '-X', '-A', '-t', '-d', $node->connstr('postgres'), '-c',
	  "SELECT action || ' ' || http_status || ' ' || (response_json->>'charge') FROM idempotency.idem_claim('acme', 'POST /charges', 'k1', $fp, wait => '20 s')" ],
	'>', \$out, '2>', \$err);

# it is really waiting: no answer yet
sleep 1;
$h->pump_nb;
is($out, '', 'the duplicate is still waiting while the lease is held');

$node->safe_psql('postgres',
	"SELECT idempotency.idem_finish('acme', 'POST /charges', 'k1', 201, '{\"charge\": \"ch_1\"}', lease_token => $token)");
$h->finish;
chomp $out;
is($out, 'replay 201 ch_1', 'the waiting duplicate replays the finished response');
is($err, '', 'no error');

# without a finish, the wait runs out: 409 with the time left on the lease
$token = $node->safe_psql('postgres',
	"SELECT lease_token FROM idempotency.idem_claim('acme', 'POST /charges', 'k2', $fp, lease => '1 min')");
my $res = $node->safe_psql('postgres',
	"SELECT action, http_status, retry_after BETWEEN 50 AND 60 FROM idempotency.idem_claim('acme', 'POST /charges', 'k2', $fp, wait => '300 ms')");
is($res, 'in_progress|409|t', 'a wait that runs out answers in_progress with Retry-After');

$node->stop;
done_testing();
