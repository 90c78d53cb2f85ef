# idempotency.encryption_key never reaches the server log, SHOW or
# pg_settings: set with ALTER SYSTEM and a reload (the way the README
# recommends), changed, refused (a value ALTER SYSTEM does not accept, a
# SET by a role that may not), set with SET and set_config() under
# log_statement = 'all', and at log_min_messages = debug5.  The key still
# encrypts: a body stored after the reload is encrypted and replays.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('keylog');
$node->safe_psql('postgres', 'CREATE ROLE plain LOGIN');

# keys that appear nowhere else
my $run = sprintf('%08x%08x', int(rand(2**32)), int(rand(2**32)));
my @keys = map { "SeCrEtKeY${_}x$run" } (1 .. 8);

# Reload, and wait until the postmaster has read the files: the same reload
# changes work_mem, which a new session then shows.
my $reloads = 4;
sub reload_and_wait
{
	$reloads++;
	$node->safe_psql('postgres', "ALTER SYSTEM SET work_mem = '${reloads}MB'");
	$node->reload;
	$node->poll_query_until('postgres', "SELECT current_setting('work_mem') = '${reloads}MB'")
	  or die "the reload was not seen";
}

sub log_content { return slurp_file($node->logfile); }

# ALTER SYSTEM and a reload, as the README recommends
$node->safe_psql('postgres', "ALTER SYSTEM SET idempotency.encryption_key = '$keys[0]'");
reload_and_wait();
is($node->safe_psql('postgres', 'SHOW idempotency.encryption_key'), '(set)',
	'SHOW says that a key is set, not which');
is($node->safe_psql('postgres', q{SELECT current_setting('idempotency.encryption_key')}), '(set)',
	'current_setting() too');
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM pg_settings WHERE name = 'idempotency.encryption_key'}), '0',
	'pg_settings does not list it');

# the key is in use: a body is stored encrypted and replays
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT idempotency.idem_claim('t1', 'POST /k', 'k1', sha256('k1'));
	SELECT idempotency.idem_finish('t1', 'POST /k', 'k1', 201, '{"card": "4242"}');
	COMMIT;});
is($node->safe_psql('postgres', q{SELECT body_encrypted FROM idempotency.keys WHERE key = 'k1'}),
	't', 'a body stored after the reload is encrypted');
is($node->safe_psql('postgres',
	q{SELECT response_json->>'card' FROM idempotency.idem_claim('t1', 'POST /k', 'k1', sha256('k1'))}),
	'4242', 'and replays');

# another key, by a reload
$node->safe_psql('postgres', "ALTER SYSTEM SET idempotency.encryption_key = '$keys[1]'");
reload_and_wait();

# values that are refused: ALTER SYSTEM refuses a newline, a plain role may
# not set the key
my ($rc, $out, $err) = $node->psql('postgres',
	"ALTER SYSTEM SET idempotency.encryption_key = E'$keys[2]\\n'");
isnt($rc, 0, 'ALTER SYSTEM refuses a value with a newline');
($rc, $out, $err) = $node->psql('postgres',
	"SET idempotency.encryption_key = '$keys[3]'", extra_params => [ '-U', 'plain' ]);
like($err, qr/permission denied/, 'a plain role may not set the key');

# SET and set_config() while every statement is logged
$node->safe_psql('postgres', "ALTER SYSTEM SET log_statement = 'all'");
reload_and_wait();
$node->safe_psql('postgres', "SET idempotency.encryption_key = '$keys[4]'; SELECT 'logged$run'");
$node->safe_psql('postgres', "SELECT set_config('idempotency.encryption_key', '$keys[5]', false)");

# everything logged, then ALTER SYSTEM and reloads again
$node->safe_psql('postgres', "ALTER SYSTEM SET log_min_messages = 'debug5'");
reload_and_wait();
$node->safe_psql('postgres', "ALTER SYSTEM SET idempotency.encryption_key = '$keys[6]'");
reload_and_wait();
$node->safe_psql('postgres', "ALTER SYSTEM SET idempotency.encryption_key = '$keys[7]'");
reload_and_wait();
$node->safe_psql('postgres', 'ALTER SYSTEM RESET idempotency.encryption_key');
reload_and_wait();
$node->safe_psql('postgres', "ALTER SYSTEM RESET log_min_messages");
$node->safe_psql('postgres', "ALTER SYSTEM RESET log_statement");
reload_and_wait();
is($node->safe_psql('postgres', 'SHOW idempotency.encryption_key'), '',
	'SHOW shows an empty value once the key is reset');

# the log holds what was logged, but no key
my $log = log_content();
like($log, qr/logged$run/, 'statements were logged (log_statement = all)');
like($log, qr/DEBUG/, 'debug messages were logged (log_min_messages = debug5)');
like($log, qr/must not contain a newline/, 'the refused ALTER SYSTEM was logged');
like($log, qr/permission denied to set parameter/, 'the refused SET was logged');
for my $i (0 .. $#keys)
{
	ok(index($log, $keys[$i]) < 0, 'key ' . ($i + 1) . ' is not in the server log');
}

$node->stop;
done_testing();
