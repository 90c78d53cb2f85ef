# The bound on diagnosed mismatches per key, where a regression test cannot
# look: the one log line when a key reaches it (with the key's hash, never
# the key), the table of counts that fails closed when every entry holds a
# live key and makes room as keys expire (idempotency.diagnostics_tracked_keys
# = 100), and counts that start again at server start.
# Statements are not logged (they hold the key, as the application sent
# it), so that whatever holds the key in the log is the extension's.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('diagbound', conf => qq{
idempotency.enable_worker = off
idempotency.diagnostics_max_mismatches = 2
idempotency.diagnostics_tracked_keys = 100
log_statement = none
log_min_error_statement = panic
});
$node->safe_psql('postgres', q{
-- a claim of key k with the body {"n": n}: whether its answer names members
CREATE FUNCTION named(k text, n int, ttl interval DEFAULT NULL) RETURNS text
LANGUAGE sql AS $$
    SELECT CASE WHEN action = 'mismatch' THEN (mismatch IS NOT NULL)::text ELSE action END
    FROM idempotency.idem_claim('t', 'POST /pay', k,
        idempotency.idem_fingerprint('POST', '/pay', jsonb_build_object('n', n)), ttl => ttl,
        digest => idempotency.idem_request_digest('t', 'POST /pay', k, jsonb_build_object('n', n)))
$$;
CREATE FUNCTION store(k text, ttl interval DEFAULT NULL) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF named(k, 0, ttl) = 'execute' THEN
        PERFORM idempotency.idem_finish('t', 'POST /pay', k, 201, '{}');
    END IF;
END $$;
});

my $run = sprintf('%08x%08x', int(rand(2**32)), int(rand(2**32)));
my $key = "SeCrEtKeY$run";
my $hash = $node->safe_psql('postgres', "SELECT idempotency.idem_key_hash('t', 'POST /pay', '$key')");

# two diagnosed mismatches, then none, logged once
$node->safe_psql('postgres', "SELECT store('$key')");
is($node->safe_psql('postgres', "SELECT string_agg(named('$key', g), ',' ORDER BY g) FROM generate_series(1, 4) g"),
	'true,true,false,false', 'two mismatches name members, the next ones do not');
my @lines = grep { /mismatch diagnostics withheld/ } split /\n/, slurp_file($node->logfile);
is(scalar(@lines), 1, 'one log line when the key reaches the bound');
like($lines[0] // '', qr/tenant "t", endpoint "POST \/pay", key hash $hash\b/,
	'it names tenant, endpoint and the key hash');
ok(index(slurp_file($node->logfile), $key) < 0, 'the key is not in the server log');
is($node->safe_psql('postgres',
	q{SELECT diagnosed || '/' || diagnoses_withheld FROM idempotency.stats WHERE endpoint = 'POST /pay'}),
	'2/2', 'stats count the diagnosed and the withheld');

# 99 more keys fill the table (100 entries); they expire in 10 seconds
$node->safe_psql('postgres', q{
SELECT store('fill-' || g, interval '10 seconds') FROM generate_series(1, 99) g;
SELECT count(*) FILTER (WHERE named('fill-' || g, 1) = 'true') FROM generate_series(1, 99) g;
});
$node->safe_psql('postgres', "SELECT store('late')");
is($node->safe_psql('postgres', "SELECT named('late', 1)"), 'false',
	'a key that finds the table full of live keys gets no names (fails closed)');
sleep(11);
is($node->safe_psql('postgres', "SELECT named('late', 1)"), 'true',
	'once keys expired, their entries make room');

# counts start again at server start
$node->restart;
is($node->safe_psql('postgres', "SELECT named('$key', 1)"), 'true',
	'after a restart the key is diagnosed again');

$node->stop;
done_testing();
