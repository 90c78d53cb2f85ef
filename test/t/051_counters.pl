# Counters under concurrency: pgbench runs claims (with repeated keys, some
# with another request body) and finishes from several clients; every
# transaction also writes what its claim answered into a ledger table.  The
# counters must agree with the ledger exactly, per endpoint and in total.
# Then, with idempotency.stats_max_endpoints = 2, a third endpoint is counted
# in the totals and in the "untracked" row.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;
use IPC::Run;

my $node = idem_node('counters', conf => qq{
idempotency.maintenance_interval = 3600
max_connections = 30
});
$node->safe_psql('postgres', q{
CREATE TABLE ledger (endpoint text, action text);
-- one request: claim; execute -> finish; record the answer
CREATE FUNCTION bench_op(k int, variant int) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    ep text := 'POST /bench-' || (k % 3);
    a text;
BEGIN
    SELECT action INTO a
    FROM idempotency.idem_claim('t', ep, 'k' || k,
        sha256(convert_to('k' || k || CASE WHEN variant = 1 THEN ' other body' ELSE '' END, 'UTF8')));
    IF a = 'execute' THEN
        PERFORM pg_sleep(0.005);  -- the handler's work: duplicates meet it in progress
        PERFORM idempotency.idem_finish('t', ep, 'k' || k, 201, jsonb_build_object('k', k));
    END IF;
    INSERT INTO ledger VALUES (ep, a);
END $$;
SELECT idempotency.idem_stats_reset();
});

my $dir = PostgreSQL::Test::Utils::tempdir;
my $script = write_script($dir, 'claims', "\\set k random(1, 150)\n\\set v random(1, 10)\nSELECT bench_op(:k, :v);\n");

my ($out, $err) = ('', '');
my $ok = IPC::Run::run(
	[ 'pgbench', '-n', '-h', $node->host, '-p', $node->port,
	  '-c', '6', '-j', '3', '-t', '250', '-f', $script, 'postgres' ],
	'>', \$out, '2>', \$err);
ok($ok, 'pgbench ran') or diag($err);
like($out, qr/number of transactions actually processed: 1500\/1500/, 'every transaction committed')
  or diag($out);
like($out, qr/number of failed transactions: 0/, 'none failed') if $out =~ /failed transactions/;

is($node->safe_psql('postgres', 'SELECT count(*) FROM ledger'), '1500', 'the ledger has every request');

# the answers were mixed: duplicates replayed, other bodies refused
my $mix = $node->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE action = 'execute') > 0
	   AND count(*) FILTER (WHERE action = 'replay') > 0
	   AND count(*) FILTER (WHERE action = 'mismatch') > 0
	   AND count(*) FILTER (WHERE action = 'in_progress') > 0 FROM ledger});
is($mix, 't', 'the workload executed, replayed, met claims in progress and refused');
note($node->safe_psql('postgres', 'SELECT action, count(*) FROM ledger GROUP BY 1 ORDER BY 1'));

# per endpoint, counters = ledger
my $diff = $node->safe_psql('postgres', q{
	WITH l AS (
	    SELECT endpoint,
	           count(*) AS claims,
	           count(*) FILTER (WHERE action = 'execute') AS executes,
	           count(*) FILTER (WHERE action = 'replay') AS replays,
	           count(*) FILTER (WHERE action = 'in_progress') AS in_progress,
	           count(*) FILTER (WHERE action = 'mismatch') AS mismatches,
	           count(*) FILTER (WHERE action = 'pending') AS pending
	    FROM ledger GROUP BY endpoint),
	k AS (SELECT endpoint, count(*) AS rows FROM idempotency.keys GROUP BY endpoint)
	SELECT coalesce(l.endpoint, s.endpoint) || ': ' ||
	       row(l.claims, l.executes, l.replays, l.in_progress, l.mismatches, l.pending, l.executes, k.rows)::text
	       || ' <> ' ||
	       row(s.claims, s.executes, s.replays, s.in_progress, s.mismatches, s.pending, s.finishes, s.executes)::text
	FROM l
	FULL JOIN (SELECT * FROM idempotency.stats WHERE endpoint IS NOT NULL) s USING (endpoint)
	LEFT JOIN k USING (endpoint)
	WHERE row(l.claims, l.executes, l.replays, l.in_progress, l.mismatches, l.pending, l.executes, k.rows)
	      IS DISTINCT FROM
	      row(s.claims, s.executes, s.replays, s.in_progress, s.mismatches, s.pending, s.finishes, s.executes)});
is($diff, '', 'per endpoint, the counters agree exactly with the ledger and the table');

is($node->safe_psql('postgres', q{
	SELECT claims || ' ' || (claims = executes + replays + in_progress + mismatches + pending)
	FROM idempotency.stats WHERE endpoint IS NULL AND NOT untracked}),
	'1500 true', 'in total, every claim is counted once, with exactly one answer');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.stats WHERE untracked}),
	'0', 'no endpoint went untracked');

# a bounded table of endpoints
$node->append_conf('postgresql.conf', 'idempotency.stats_max_endpoints = 2');
$node->restart;
is($node->safe_psql('postgres', 'SHOW idempotency.stats_max_endpoints'), '2', 'the bound is set');
is($node->safe_psql('postgres', q{SELECT claims FROM idempotency.stats WHERE endpoint IS NULL}),
	'0', 'counters start from zero at server start');
for my $ep ('e1', 'e2', 'e3', 'e3')
{
	$node->safe_psql('postgres', qq{
		SELECT idempotency.idem_claim('t', '$ep', 'k-' || idempotency.idem_token(), sha256('x'), lease => '1 min')});
}
is($node->safe_psql('postgres', q{
	SELECT string_agg(coalesce(endpoint, CASE WHEN untracked THEN '(untracked)' ELSE '(total)' END)
	                  || '=' || claims || '/' || executes, ' ' ORDER BY endpoint IS NULL, untracked DESC, endpoint)
	FROM idempotency.stats}),
	'e1=1/1 e2=1/1 (untracked)=2/2 (total)=4/4',
	'an endpoint beyond the bound is counted in the untracked row and the totals');

$node->stop;
done_testing();
