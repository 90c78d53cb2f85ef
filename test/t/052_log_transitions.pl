# idempotency.log_transitions: one JSON LOG line per state change, with the
# key's hash and never the key itself, even when the server is set to log
# the statement of LOG messages and the change runs inside PL/pgSQL (whose
# context would quote the statement).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;
use JSON::PP;

my $node = idem_node('log_transitions', conf => qq{
idempotency.maintenance_interval = 3600
log_min_error_statement = log
# the test framework logs every statement; the key is in them
log_statement = none
});

my $key = sprintf('RAWKEY%08x', int(rand(2**32)));
my $fp = "sha256('request body'::bytea)";
my $tenant = 'tenant-log';
my $endpoint = 'POST /log';

# off (the default): nothing is logged
my $offset = -s $node->logfile;
$node->safe_psql('postgres', qq{
	BEGIN;
	SELECT idempotency.idem_claim('$tenant', '$endpoint', 'quiet-$key', $fp);
	SELECT idempotency.idem_finish('$tenant', '$endpoint', 'quiet-$key', 200);
	COMMIT;});
my $log = slurp_file($node->logfile, $offset);
unlike($log, qr/idempotency transition/, 'nothing is logged when the setting is off');

# on
$node->safe_psql('postgres', 'ALTER SYSTEM SET idempotency.log_transitions = on');
$node->reload;
$offset = -s $node->logfile;
$node->safe_psql('postgres', qq{
	DO \$\$
	BEGIN
	    PERFORM idempotency.idem_claim('$tenant', '$endpoint', '$key', $fp);
	    PERFORM idempotency.idem_finish('$tenant', '$endpoint', '$key', 201, '{"ok": true}');
	END
	\$\$;});
$node->safe_psql('postgres', qq{SELECT idempotency.idem_claim('$tenant', '$endpoint', '$key', $fp)});
my $token = $node->safe_psql('postgres', qq{
	SELECT lease_token FROM idempotency.idem_claim('$tenant', '$endpoint', '$key-2', $fp, lease => '1 min')});
$node->safe_psql('postgres', qq{SELECT idempotency.idem_fail('$tenant', '$endpoint', '$key-2', 'unknown', lease_token => $token)});
$node->safe_psql('postgres', qq{SELECT idempotency.idem_resolve('$tenant', '$endpoint', '$key-2', 200, '{}')});

$log = slurp_file($node->logfile, $offset);
my @events = map { decode_json($_) } ($log =~ /idempotency transition (\{.*\})$/mg);
is(scalar(@events), 6, 'one line per state change');

my $hash1 = $node->safe_psql('postgres', qq{SELECT idempotency.idem_key_hash('$tenant', '$endpoint', '$key')});
my $hash2 = $node->safe_psql('postgres', qq{SELECT idempotency.idem_key_hash('$tenant', '$endpoint', '$key-2')});
my $fpx = $node->safe_psql('postgres', qq{SELECT left(encode($fp, 'hex'), 8)});
my @seen = map {
	join(' ', $_->{key_hash} eq $hash1 ? 'k1' : $_->{key_hash} eq $hash2 ? 'k2' : '?',
		$_->{from} // '-', $_->{to} // '-', $_->{replayed} ? 'replayed' : 'new',
		$_->{response_status} // '-')
} @events;
is_deeply(\@seen, [
	'k1 - in_progress new -',
	'k1 in_progress completed new 201',
	'k1 completed completed replayed 201',
	'k2 - in_progress new -',
	'k2 in_progress unknown new -',
	'k2 unknown completed new 200' ], 'the lines tell the transitions, under the key hash');
is_deeply([ sort keys %{ $events[1] } ],
	[ sort qw(event tenant endpoint key_hash fingerprint_prefix from to replayed response_status elapsed_ms) ],
	'every field is there');
ok((grep { $_->{tenant} eq $tenant && $_->{endpoint} eq $endpoint } @events) == 6, 'tenant and endpoint');
ok((grep { $_->{fingerprint_prefix} eq $fpx } @events) == 6, 'the fingerprint prefix');
ok((grep { defined $_->{elapsed_ms} && $_->{elapsed_ms} =~ /^\d+$/ } @events) == 6, 'elapsed milliseconds');

# the raw key is nowhere in the log: neither in the lines nor in a
# statement or context printed with them
my $whole = slurp_file($node->logfile);
like($whole, qr/\Q$hash1\E/, 'the log holds the hash of the key');
unlike($whole, qr/\Q$key\E/, 'and never the key itself');
unlike($log, qr/STATEMENT|CONTEXT/, 'no statement or context is printed with the lines');

$node->stop;
done_testing();
