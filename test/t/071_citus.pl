# The Citus mode (doc/scaling.md, "Citus: set-up"): a coordinator and two
# workers with shared_preload_libraries = 'citus,idempotency';
# idempotency.citus_distribute('payments') distributes the keys by tenant,
# then claims are delegated to the tenant's worker, racing duplicates execute
# once, a claim for a tenant whose shard is elsewhere is refused (IK421), a
# shard move carries the keys (and waits for a lease claim in progress),
# maintenance partitions the whole cluster from the coordinator, tombstones
# of expired keys answer on the tenant's worker (written as the
# coordinator's pass drops a partition, a key committed while the drop
# waited included, and as a worker's pass purges the default partition),
# and an endpoint policy change reaches a worker backend that had cached it.  Then
# online: a move in the default transfer mode (logical replication) with a
# claim holding its lock when it starts and claims arriving while it runs,
# citus_rebalance_start() under claims, and a worker killed with kill -9
# during claims: no key executes twice, every retry replays.
#
# Citus is built once into a cache by scripts/citus.sh and copied into the
# private PostgreSQL copy by make test; the test skips where that could not
# be done (no source release, a server Citus does not support).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;
use IPC::Run;

skip_unless_installed('Citus', env => 'IDEM_SKIP_CITUS', dir => '--sharedir',
	file => 'extension/citus.control',
	missing => '%s is missing; make test builds it with scripts/citus.sh');

my $coord = PostgreSQL::Test::Cluster->new('citus_coordinator');

my @workers = map { PostgreSQL::Test::Cluster->new("citus_worker$_") } 1 .. 2;
for my $node ($coord, @workers)
{
	# logical replication: online shard moves (the default transfer mode)
	$node->init(allows_streaming => 'logical');
	# citus must come first; the nodes reach each other over their sockets
	$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'citus,idempotency'
idempotency.maintenance_interval = 3600
citus.node_conninfo = 'sslmode=prefer'
max_connections = 40
});
	# how a node reaches itself (a shard move copies through it)
	$node->append_conf('postgresql.conf', "citus.local_hostname = '" . $node->host . "'");
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION citus');
}

$coord->safe_psql('postgres',
	"SELECT citus_set_coordinator_host('" . $coord->host . "', " . $coord->port . ')');
$coord->safe_psql('postgres',
	"SELECT citus_add_node('" . $_->host . "', " . $_->port . ')')
  for @workers;
is($coord->safe_psql('postgres',
	"SELECT count(*) FROM pg_dist_node WHERE noderole = 'primary' AND isactive"),
	'3', 'the coordinator and two workers form a cluster');

$coord->safe_psql('postgres', 'CREATE EXTENSION idempotency CASCADE');
is($coord->safe_psql('postgres',
	q{SELECT extname FROM pg_extension WHERE extname IN ('citus', 'idempotency') ORDER BY 1}),
	"citus\nidempotency", 'both extensions in the coordinator');
is($_->safe_psql('postgres', q{SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'}),
	'1', 'Citus carried CREATE EXTENSION to the worker ' . $_->name)
  for @workers;

# every node's maintenance made its own partitions before Citus mode
$_->safe_psql('postgres', 'SELECT count(*) FROM idempotency.idem_maintenance()')
  for $coord, @workers;

my $fp = q{sha256(convert_to('request', 'UTF8'))};

# a distribution column of another collation cannot be colocated with keys
$coord->safe_psql('postgres', q{
CREATE TABLE payments (tenant text, k text, amount int);
SELECT create_distributed_table('payments', 'tenant');
});
my ($ret, $out, $err) = $coord->psql('postgres',
	q{\set VERBOSITY verbose
SELECT idempotency.citus_distribute('payments')});
like($err, qr/42804: the distribution column "tenant" of public.payments is text COLLATE "default", not text COLLATE "C".*HINT:.*ALTER TABLE public.payments ALTER COLUMN tenant TYPE text COLLATE "C"/s,
	'a tenant column that is not text COLLATE "C" is refused, saying what to change');
$coord->safe_psql('postgres', q{
SELECT undistribute_table('payments');
ALTER TABLE payments ALTER COLUMN tenant TYPE text COLLATE "C";
SELECT create_distributed_table('payments', 'tenant');
SELECT idempotency.citus_distribute('payments');
});
is($coord->safe_psql('postgres', q{
SELECT string_agg(logicalrelid::text || ' ' || partmethod::text || ' ' ||
                  (colocationid = (SELECT colocationid FROM pg_dist_partition
                                   WHERE logicalrelid = 'payments'::regclass))::text, ', '
                  ORDER BY logicalrelid::text)
FROM pg_dist_partition
WHERE logicalrelid IN ('idempotency.keys'::regclass, 'idempotency.endpoints'::regclass)}),
	'idempotency.endpoints n false, idempotency.keys h true',
	'keys are distributed colocated with payments, endpoints are a reference table');
is($coord->safe_psql('postgres', q{
SELECT count(*) FROM pg_dist_object o JOIN pg_proc p ON p.oid = o.objid
WHERE o.classid = 'pg_proc'::regclass AND o.force_delegation
  AND o.distribution_argument_index = 0 AND p.pronamespace = 'idempotency'::regnamespace}),
	$coord->safe_psql('postgres', q{
SELECT count(*) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace
  AND proname IN ('idem_claim', 'idem_finish', 'idem_finish_bytes', 'idem_finish_ref', 'idem_fail',
                  'idem_release', 'idem_heartbeat', 'idem_lookup', 'idem_resolve')}),
	'the per-key functions are distributed by tenant with force_delegation');
is($coord->safe_psql('postgres', 'SELECT idempotency.citus_distribute(\'payments\')'), '',
	'citus_distribute a second time changes nothing');

# where a tenant's keys are: the worker that holds its shard
sub node_of
{
	my ($tenant) = @_;
	my $port = $coord->safe_psql('postgres', qq{
SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
WHERE p.shardid = get_shard_id_for_distribution_column('idempotency.keys', '$tenant')});
	my ($w) = grep { $_->port == $port } @workers;
	return $w;
}
my $home = node_of('acme');
my ($away) = grep { $_ != $home } @workers;

# the application's unchanged transaction, delegated to the tenant's worker
is($coord->safe_psql('postgres', qq{
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments', 'k1', $fp);
INSERT INTO payments VALUES ('acme', 'k1', 100);
SELECT idempotency.idem_finish('acme', 'POST /payments', 'k1', 201, '{"id": 1}');
COMMIT;
SELECT action || ' ' || response_status || ' ' || response_json::text
  FROM idempotency.idem_claim('acme', 'POST /payments', 'k1', $fp);
}),
	"execute\n\nreplay 201 {\"id\": 1}",
	'BEGIN; claim; INSERT; finish; COMMIT from the coordinator executes on the worker, then replays');
is($home->safe_psql('postgres', q{SELECT state FROM idempotency.keys WHERE tenant = 'acme' AND key = 'k1'}),
	'completed', 'the key is in the tenant\'s shard');

# forms Citus does not delegate run on the coordinator, which refuses them
($ret, $out, $err) = $coord->psql('postgres', qq{\\set VERBOSITY verbose
SELECT (idempotency.idem_claim('acme', 'POST /payments', 'k1', $fp)).action});
like($err, qr/IK421: the keys of tenant "acme" are not on this node.*HINT:.*as a statement of its own/s,
	'a claim that is not delegated is refused on the coordinator (IK421)');
# (a worker delegates the plain call form as the coordinator does)
($ret, $out, $err) = $away->psql('postgres', qq{\\set VERBOSITY verbose
SELECT (idempotency.idem_claim('acme', 'POST /payments', 'k1', $fp)).action});
like($err, qr/IK421: the keys of tenant "acme" are not on this node/,
	'a claim on the worker without the tenant\'s shard is refused (IK421)');
is($away->safe_psql('postgres', qq{
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments', 'k1', $fp)}),
	'replay', 'the plain call form on that worker is delegated to the tenant\'s worker');
is($home->safe_psql('postgres', qq{
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments', 'k1', $fp)}),
	'replay', 'on the worker with the shard, the claim replays');

# 16 clients race duplicates of 8 keys of 4 tenants from the coordinator
my $dir = PostgreSQL::Test::Utils::tempdir;
my $script = "$dir/race.sql";
open(my $fh, '>', $script) or die $!;
print $fh "\\set ON_ERROR_STOP 1\n";
for my $t (1 .. 4)
{
	for my $k (1 .. 8)
	{
		print $fh qq{BEGIN;
SELECT action = 'execute' AS exec FROM idempotency.idem_claim('race-$t', 'POST /payments', 'key-$k', $fp) \\gset
\\if :exec
INSERT INTO payments VALUES ('race-$t', 'key-$k', 1);
SELECT idempotency.idem_finish('race-$t', 'POST /payments', 'key-$k', 201, '{}');
\\endif
COMMIT;
};
	}
}
close $fh;
my @runs;
for my $c (1 .. 16)
{
	my ($o, $e) = ('', '');
	my $h = IPC::Run::start(
		[ 'psql', '-X', '-q', '-A', '-t', '-d', $coord->connstr('postgres'), '-f', $script ],
		'>', \$o, '2>', \$e);
	push @runs, [ $h, \$o, \$e ];
}
my $failed = 0;
for my $r (@runs)
{
	$r->[0]->finish;
	$failed++ if $r->[0]->result != 0 || ${ $r->[2] } ne '';
	diag(${ $r->[2] }) if ${ $r->[2] } ne '';
}
is($failed, 0, '16 clients ran their transactions without an error');
is($coord->safe_psql('postgres', q{
SELECT count(*) || ' ' || count(DISTINCT (tenant, k)) FROM payments WHERE tenant LIKE 'race-%'}),
	'32 32', 'each of the 32 raced keys executed exactly once');
is($coord->safe_psql('postgres', q{
SELECT count(*) FROM idempotency.keys WHERE tenant LIKE 'race-%' AND state = 'completed'}),
	'32', 'and each is completed');

# lease mode through the delegated functions
my $token = $coord->safe_psql('postgres', qq{
SELECT lease_token FROM idempotency.idem_claim('acme', 'POST /payments', 'lease1', $fp, lease => '1 minute')});
like($token, qr/^-?\d+$/, 'a lease claim from the coordinator returns a token');
is($coord->safe_psql('postgres', qq{
SELECT idempotency.idem_heartbeat('acme', 'POST /payments', 'lease1', $token, '1 minute');
SELECT idempotency.idem_finish('acme', 'POST /payments', 'lease1', 200, '{"lease": 1}', lease_token => $token);
SELECT state FROM idempotency.idem_lookup('acme', 'POST /payments', 'lease1');
}) =~ s/^[^\n]+\n//r, "\ncompleted", 'heartbeat, finish and lookup of a lease, delegated');

# a backend of the tenant's worker that has resolved the tenant's shard
# before the move (the form Citus does not delegate runs on this node)
my $htimer = IPC::Run::timer(60);
my ($ho, $he, $hin) = ('', '', '');
my $hsess = IPC::Run::start(
	[ 'psql', '-X', '-q', '-A', '-t', '-d', $home->connstr('postgres') ],
	'<', \$hin, '>', \$ho, '2>', \$he, $htimer);
$hin .= "\\set VERBOSITY verbose\nSELECT (idempotency.idem_claim('acme', 'POST /payments', 'k1', $fp)).action;\n";
$hsess->pump until $ho =~ /\n/ || $he ne '' || $htimer->is_expired;
is($ho . $he, "replay\n", 'a backend of the tenant\'s worker replays the key locally');


# claim's transaction on the worker, and carries its key
my $shard = $coord->safe_psql('postgres',
	q{SELECT get_shard_id_for_distribution_column('idempotency.keys', 'acme')});
my ($co, $ce) = ('', '');
my $ctimer = IPC::Run::timer(60);
my $claim = IPC::Run::start(
	[ 'psql', '-X', '-q', '-A', '-t', '-d', $coord->connstr('postgres') ],
	'<', \my $cin, '>', \$co, '2>', \$ce, $ctimer);
$cin = qq{BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments', 'moving', $fp, lease => '1 minute');
SELECT 'claimed';
};
$claim->pump until $co =~ /claimed/ || $ce ne '' || $ctimer->is_expired;
my ($mo, $me) = ('', '');
my $move = IPC::Run::start(
	[ 'psql', '-X', '-q', '-A', '-t', '-d', $coord->connstr('postgres'), '-c',
	  "SELECT citus_move_shard_placement($shard, '" . $home->host . "', " . $home->port . ", '"
	  . $away->host . "', " . $away->port . ", shard_transfer_mode => 'block_writes')" ],
	'>', \$mo, '2>', \$me);
ok($home->poll_query_until('postgres',
	q{SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND mode = 'ExclusiveLock'}),
	'the move waits for the shard lock the lease claim holds on the worker');
$cin .= "COMMIT;\n";
$claim->finish;
$move->finish;
is($ce . $me, '', 'the claim committed and the move finished');
is(node_of('acme')->port, $away->port, 'the tenant\'s shard is on the other worker now');
is($coord->safe_psql('postgres', qq{
SELECT action || ' ' || response_status || ' ' || response_json::text
  FROM idempotency.idem_claim('acme', 'POST /payments', 'k1', $fp);
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments', 'moving', $fp);
SELECT state FROM idempotency.idem_lookup('acme', 'POST /payments', 'moving');}),
	"replay 201 {\"id\": 1}\nin_progress\nin_progress",
	'after the move a retry replays, and the lease claimed during the move is still held');
($ret, $out, $err) = $home->psql('postgres', qq{\\set VERBOSITY verbose
SELECT (idempotency.idem_claim('acme', 'POST /payments', 'k1', $fp)).action});
like($err, qr/IK421/,
	'the old worker, where the old shard waits for its deferred drop, refuses the tenant');
$hin .= "SELECT (idempotency.idem_claim('acme', 'POST /payments', 'k1', $fp)).action;\n";
$hsess->pump until $he =~ /IK421/ || $ho =~ /\n.*\n/ || $htimer->is_expired;
$hin .= "\\q\n";
$hsess->finish;
like($ho . $he, qr/^replay\n[^\n]*IK421: the keys of tenant "acme" are not on this node/s,
	'the same backend, which had cached the shard, refuses the tenant after the move');
$coord->safe_psql('postgres', 'CALL citus_cleanup_orphaned_resources()');

# tombstones (doc/tombstones.md) are distributed by tenant, colocated with
# the keys; keys of a tenant that live one second, in the dated partition
# that covers now
is($coord->safe_psql('postgres', q{
SELECT partmethod::text || ' ' || (colocationid = (SELECT colocationid FROM pg_dist_partition
                                                   WHERE logicalrelid = 'idempotency.keys'::regclass))::text
FROM pg_dist_partition WHERE logicalrelid = 'idempotency.tombstones'::regclass}),
	'h true', 'tombstones are distributed by tenant, colocated with the keys');
$coord->safe_psql('postgres', q{
INSERT INTO idempotency.endpoints (endpoint, tombstone_ttl, on_expired_reuse)
VALUES ('POST /tomb', '90 days', 'execute'), ('POST /strict', '90 days', 'conflict')});
my $tt = 'tomb';
my $tnode = node_of($tt);
my %tfp = map { $_ => qq{sha256(convert_to('$_', 'UTF8'))} } qw(a b);
# a claim from the coordinator, delegated to the tenant's worker, rolled
# back (an execute is not finished): "action status"
my $tclaim = sub {
	my ($endpoint, $k, $body) = @_;
	return $coord->safe_psql('postgres', qq{
BEGIN;
SELECT action || ' ' || coalesce(http_status::text, '-')
FROM idempotency.idem_claim('$tt', '$endpoint', '$k', $tfp{$body});
ROLLBACK;});
};
for my $k ([ 'POST /tomb', 't1' ], [ 'POST /strict', 't2' ])
{
	$coord->safe_psql('postgres', qq{
BEGIN;
SELECT action FROM idempotency.idem_claim('$tt', '$k->[0]', '$k->[1]', $tfp{a}, ttl => '1 s');
SELECT idempotency.idem_finish('$tt', '$k->[0]', '$k->[1]', 201, '{}');
COMMIT;});
}

# The window of a drop (iso_tombstone_window on one server): a key of the
# partition a pass drops is claimed and finished in a transaction still
# open when the pass starts, and commits while the pass waits for it on the
# worker.  The partitions that pass would make are made first (a pass with
# a longer max_ttl), so that it waits at the drop and nowhere before: the
# worker writes the tombstones under the drop's lock, so the key committed
# meanwhile leaves one too (a pass that wrote them before taking that lock
# would miss it).
$coord->safe_psql('postgres',
	q{SET idempotency.max_ttl = '9d'; SELECT count(*) FROM idempotency.idem_maintenance()});
my ($wo, $we) = ('', '');
my $wtimer = IPC::Run::timer(120);
my $wheld = IPC::Run::start(
	[ 'psql', '-X', '-q', '-A', '-t', '-d', $coord->connstr('postgres') ],
	'<', \my $win2, '>', \$wo, '2>', \$we, $wtimer);
$win2 = qq{BEGIN;
SELECT action FROM idempotency.idem_claim('$tt', 'POST /tomb', 'w1', $tfp{a}, ttl => '1 s');
SELECT idempotency.idem_finish('$tt', 'POST /tomb', 'w1', 201, '{}');
SELECT 'claimed';
};
$wheld->pump until $wo =~ /claimed/ || $we ne '' || $wtimer->is_expired;
is($wo =~ s/\n+/ /gr, 'execute claimed ', 'a key of the partition about to be dropped is claimed and finished, uncommitted');
my ($po, $pe) = ('', '');
my $pass = IPC::Run::start(
	[ 'psql', '-X', '-q', '-A', '-t', '-d', $coord->connstr('postgres'), '-c', q{
SELECT count(*) FILTER (WHERE kind = 'create'),
       count(*) FILTER (WHERE kind = 'drop' AND object LIKE 'keys_p%') > 0,
       coalesce(sum(rows) FILTER (WHERE kind = 'tombstone' AND object LIKE 'keys_p%'), 0) >= 2
FROM idempotency.idem_maintenance(now() + interval '1 day', preview => false)} ],
	'>', \$po, '2>', \$pe, IPC::Run::timeout(300));
ok( $tnode->poll_query_until('postgres', q{
SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND backend_type = 'client backend'}),
	'the pass waits on the tenant\'s worker for the open transaction');
$win2 .= "COMMIT;\n\\q\n";
$wheld->finish;
is($we, '', 'the open transaction commits while the pass waits');
$pass->finish;
is($po . $pe, "0|t|t\n", 'the coordinator\'s pass a day on makes no partition, drops the one of those keys and counts their tombstones');

# the dropped keys left their tombstones, with their tenant, in the shard
# colocated with the tenant's keys on its worker (the worker wrote them as
# the drop reached its shard); claims there answer from them
is($coord->safe_psql('postgres', qq{
SELECT count(*) FROM idempotency.keys WHERE tenant = '$tt'}), '0', 'the keys of the dropped partition are gone');
is($tclaim->('POST /tomb', 't1', 'b'), 'mismatch 422',
	'an expired key reused with another payload answers 422 on the tenant\'s worker');
is($tclaim->('POST /tomb', 'w1', 'b'), 'mismatch 422',
	'so does the key committed while the pass waited to drop its partition');
is($tnode->safe_psql('postgres', qq{
SELECT count(*) FROM idempotency.tombstones WHERE tenant = '$tt'}),
	'3', 'the tombstones are on the tenant\'s worker, with the tenant');
is($tclaim->('POST /strict', 't2', 'b'), 'mismatch 422', 'so does one of an endpoint with on_expired_reuse = conflict');
is($tclaim->('POST /strict', 't2', 'a'), 'expired 409',
	'the same payload on that endpoint answers 409 key_expired, as without Citus');

# maintenance: the coordinator makes and drops partitions cluster-wide; a
# worker's pass makes none
is($away->safe_psql('postgres',
	q{SELECT count(*) FROM idempotency.idem_maintenance() WHERE kind IN ('create', 'drop')}),
	'0', 'a worker\'s maintenance neither makes nor drops partitions');
my $made = $coord->safe_psql('postgres', q{
SELECT string_agg(kind, ',' ORDER BY kind) FILTER (WHERE kind = 'create') IS NOT NULL,
       string_agg(kind, ',' ORDER BY kind) FILTER (WHERE kind = 'drop') IS NOT NULL
FROM idempotency.idem_maintenance(now() + interval '40 days', preview => false)});
is($made, 't|t', 'the coordinator\'s pass 40 days on makes and drops partitions');
is($coord->safe_psql('postgres', q{
SELECT bool_and(result::int > 0)
FROM run_command_on_workers($$SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
  WHERE c.relname ~ ('^keys_p' || to_char(now() + interval '41 days', 'YYYYMMDD'))$$)}),
	't', 'the new partitions reach the shards of every worker');
is($coord->safe_psql('postgres', q{
SELECT bool_and(result::int = 0)
FROM run_command_on_workers($$SELECT count(*) FROM pg_class
  WHERE relname ~ ('^keys_p' || to_char(now(), 'YYYYMMDD'))$$)}),
	't', 'the dropped ones leave every worker');

# the same payload executes again; the key lives one second, in the default
# partition (the pass above dropped the partition that covers now): a
# worker's pass purges it and leaves its tombstone in the same statement
like($coord->safe_psql('postgres', qq{
BEGIN;
SELECT action FROM idempotency.idem_claim('$tt', 'POST /tomb', 't1', $tfp{a}, ttl => '1 s');
SELECT idempotency.idem_finish('$tt', 'POST /tomb', 't1', 201, '{}');
COMMIT;}), qr/^execute\n/,
	'the same payload executes again (on_expired_reuse = execute), as without Citus');
sleep 2;
is($tnode->safe_psql('postgres', q{
SELECT string_agg(kind || ' ' || rows, ', ' ORDER BY kind) FROM idempotency.idem_maintenance()
WHERE object = 'keys_default'}),
	'purge 1, tombstone 1', 'the worker\'s pass purges the expired key of the default partition, leaving its tombstone');
is($tclaim->('POST /tomb', 't1', 'b'), 'mismatch 422',
	'the key purged from the default partition answers 422 with another payload');

# an endpoint policy change reaches a worker backend that had cached the old
# one: a session on the tenant's worker claims (which caches the policy),
# the coordinator changes the policy, the same session claims again
my $timer = IPC::Run::timer(60);
my ($eo, $ee, $win) = ('', '', '');
my $wsess = IPC::Run::start(
	[ 'psql', '-X', '-q', '-A', '-t', '-d', $away->connstr('postgres') ],
	'<', \$win, '>', \$eo, '2>', \$ee, $timer);
$coord->safe_psql('postgres',
	q{INSERT INTO idempotency.endpoints (endpoint, ttl) VALUES ('POST /policy', '2 hours')});
my $ttl_query = sub {
	my ($k) = @_;
	return qq{SELECT round(extract(epoch FROM c.expires_at - now()) / 60) FROM idempotency.idem_claim('acme', 'POST /policy', '$k', $fp, lease => '1 minute') c;\n};
};
$win .= $ttl_query->('p1');
$wsess->pump until $eo =~ /\n/ || $ee ne '' || $timer->is_expired;
$coord->safe_psql('postgres',
	q{UPDATE idempotency.endpoints SET ttl = '3 hours' WHERE endpoint = 'POST /policy'});
$win .= $ttl_query->('p2');
$wsess->pump until $eo =~ /\n.*\n/ || $ee ne '' || $timer->is_expired;
$win .= "\\q\n";
$wsess->finish;
is($eo . $ee, "120\n180\n", 'the worker backend claimed with the old policy (2 hours), then with the new one (3 hours)');

# mismatch diagnostics: a digest made on the coordinator is read on the
# tenant's worker, since citus_distribute gives every node the coordinator's
# secret (a worker's own secret would refuse it with IK400)
is($coord->safe_psql('postgres', q{
SELECT count(DISTINCT r.result) FROM run_command_on_all_nodes(
    $$SELECT encode(sha256(secret), 'hex') FROM idempotency.diagnostics_secret$$) r WHERE r.success}),
	'1', 'every node has the same diagnostics secret');
my $digest = sub {
	my ($body) = @_;
	return qq{idempotency.idem_request_digest('acme', 'POST /payments', 'd1', '$body')};
};
is($coord->safe_psql('postgres', qq{
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments', 'd1',
    sha256(convert_to('{"amount": 1}', 'UTF8')), digest => } . $digest->('{"amount": 1}') . qq{);
SELECT idempotency.idem_finish('acme', 'POST /payments', 'd1', 201, '{"id": 9}');
COMMIT;
SELECT action || ' ' || (mismatch -> 'changed')::text
  FROM idempotency.idem_claim('acme', 'POST /payments', 'd1',
    sha256(convert_to('{"amount": 2}', 'UTF8')), digest => } . $digest->('{"amount": 2}') . qq{);
}),
	"execute\n\nmismatch [\"/amount\"]",
	'a reused key with another amount names /amount, with digests made on the coordinator');

# stats and health across nodes, as README "Citus" shows them
is($coord->safe_psql('postgres', q{
SELECT sum(s.executes)
FROM run_command_on_all_nodes($$SELECT coalesce(json_agg(s), '[]') FROM idempotency.stats s$$) r,
     json_to_recordset(r.result::json) AS s(endpoint text, claims bigint, executes bigint, replays bigint)
WHERE r.success AND s.endpoint = 'POST /payments'}),
	'36', 'the executes of all nodes add up: k1, 32 raced keys, a lease, the lease claimed during the move and d1');
is($coord->safe_psql('postgres', q{
SELECT live_keys FROM idempotency.health WHERE endpoint = 'POST /policy'}),
	'2', 'health on the coordinator counts the keys of every shard');


# ---------------------------------------------------------------------
# Online shard moves (the default transfer mode, logical replication; the
# partitions of keys have a replica identity, the application's colocated
# table needs one too), the rebalancer, and a worker killed with kill -9.
# Each phase puts claims of one tenant on the coordinator, several clients
# racing the same keys; a client that meets an error goes on with its next
# key; afterwards every key is retried until it replays.
# ---------------------------------------------------------------------
$coord->safe_psql('postgres', 'ALTER TABLE payments REPLICA IDENTITY FULL');

# a script claiming keys PREFIX-1 .. PREFIX-N of a tenant, printing "key
# action" per key: in atomic mode (claim, business row and finish in one
# transaction), or with $lease every other key in lease mode (the claim
# commits; business row and finish, an update of the key, commit together)
sub claims_script
{
	my ($tenant, $prefix, $n, $rotate, $lease) = @_;
	my $path = "$dir/$prefix-$rotate.sql";
	open(my $sfh, '>', $path) or die $!;
	for my $j (0 .. $n - 1)
	{
		my $i = ($j + $rotate) % $n + 1;
		my $k = "$prefix-$i";
		if ($lease && $i % 2 == 0)
		{
			print $sfh qq{\\set exec false
\\set action error
SELECT action, action = 'execute' AS exec, coalesce(lease_token, 0) AS token FROM idempotency.idem_claim('$tenant', 'POST /payments', '$k', $fp, lease => '5 minutes') \\gset
\\if :exec
BEGIN;
INSERT INTO payments VALUES ('$tenant', '$k', 1);
SELECT idempotency.idem_finish('$tenant', 'POST /payments', '$k', 201, '{"k": "$k"}', lease_token => :token) \\gset
COMMIT;
\\endif
\\echo $k :action
};
			next;
		}
		print $sfh qq{\\set exec false
\\set action error
BEGIN;
SELECT action, action = 'execute' AS exec FROM idempotency.idem_claim('$tenant', 'POST /payments', '$k', $fp) \\gset
\\if :exec
INSERT INTO payments VALUES ('$tenant', '$k', 1);
SELECT idempotency.idem_finish('$tenant', 'POST /payments', '$k', 201, '{"k": "$k"}') \\gset
\\endif
COMMIT;
\\echo $k :action
};
	}
	close $sfh;
	return $path;
}

# start clients on the coordinator, each with the keys in another order
sub start_clients
{
	my ($tenant, $prefix, $n, $clients, $lease) = @_;
	my @started;
	for my $c (1 .. $clients)
	{
		my ($o, $e) = ('', '');
		my $h = IPC::Run::start(
			[ 'psql', '-X', '-q', '-A', '-t', '-d', $coord->connstr('postgres'),
			  '-f', claims_script($tenant, $prefix, $n, $c * 7, $lease) ],
			'>', \$o, '2>', \$e, IPC::Run::timeout(300));
		push @started, [ $h, \$o, \$e ];
	}
	return \@started;
}

# wait for them; the actions they saw, and their errors
sub finish_clients
{
	my ($started) = @_;
	my (%actions, @errors);
	for my $r (@$started)
	{
		$r->[0]->finish;
		$actions{$2}++ while ${ $r->[1] } =~ /^(\S+) (\S+)$/mg;
		push @errors, grep { /\b(?:ERROR|FATAL):|psql: error/ } split /\n/, ${ $r->[2] };
	}
	return (\%actions, \@errors);
}

# retry every key once from one client; the actions seen
sub retry_all
{
	my ($tenant, $prefix, $n, $lease) = @_;
	my ($actions, $errors) = finish_clients(start_clients($tenant, $prefix, $n, 1, $lease));
	diag(join("\n", @$errors)) if @$errors;
	return join(' ', map { "$_=$actions->{$_}" } sort keys %$actions);
}

# the business rows of the keys: "rows distinct-keys"
sub executions
{
	my ($tenant, $prefix) = @_;
	return $coord->safe_psql('postgres', qq{
SELECT count(*) || ' ' || count(DISTINCT k) FROM payments WHERE tenant = '$tenant' AND k LIKE '$prefix-%'});
}

# Move 1: a claim holds its lock when the move starts (its transaction has
# claimed, inserted and finished, not committed), and claims arrive while
# the move runs.
my $n = 30;
my $ot = 'online';
my $from = node_of($ot);
my ($to) = grep { $_ != $from } @workers;
my $oshard = $coord->safe_psql('postgres',
	qq{SELECT get_shard_id_for_distribution_column('idempotency.keys', '$ot')});
my ($ho2, $he2) = ('', '');
my $htimer2 = IPC::Run::timer(120);
my $held = IPC::Run::start(
	[ 'psql', '-X', '-q', '-A', '-t', '-d', $coord->connstr('postgres') ],
	'<', \my $hin2, '>', \$ho2, '2>', \$he2, $htimer2);
$hin2 = qq{BEGIN;
SELECT action FROM idempotency.idem_claim('$ot', 'POST /payments', 'held', $fp);
INSERT INTO payments VALUES ('$ot', 'held', 1);
SELECT idempotency.idem_finish('$ot', 'POST /payments', 'held', 201, '{"held": true}');
SELECT 'claimed';
};
$held->pump until $ho2 =~ /claimed/ || $he2 ne '' || $htimer2->is_expired;
is($ho2 =~ s/\n+/ /gr, 'execute claimed ', 'a claim holds its lock, uncommitted');
my ($mo2, $me2) = ('', '');
my $online_move = IPC::Run::start(
	[ 'psql', '-X', '-q', '-A', '-t', '-d', $coord->connstr('postgres'), '-c',
	  "SELECT citus_move_shard_placement($oshard, '" . $from->host . "', " . $from->port . ", '"
	  . $to->host . "', " . $to->port . ')' ],
	'>', \$mo2, '2>', \$me2, IPC::Run::timeout(300));
ok( $coord->poll_query_until('postgres', q{
SELECT count(*) > 0 FROM pg_stat_activity WHERE query LIKE 'SELECT citus_move_shard_placement%' AND state = 'active'}),
	'the move in the default transfer mode runs');
my $racing = start_clients($ot, 'mv', $n, 4, 1);
# the held claim commits while the move runs
$hin2 .= "COMMIT;\n\\q\n";
$held->finish;
is($he2, '', 'the claim held when the move started commits');
$online_move->finish;
my ($racing_actions, $racing_errors) = finish_clients($racing);
is($me2, '', 'citus_move_shard_placement in the default mode moves the shard of keys')
  or diag($me2);
is(node_of($ot)->port, $to->port, 'the tenant\'s shard is on the other worker now');
note('claims during the move: ' . join(' ', map { "$_=$racing_actions->{$_}" } sort keys %$racing_actions)
	  . '; errors: ' . scalar(@$racing_errors));
diag(join("\n", @$racing_errors)) if @$racing_errors;
retry_all($ot, 'mv', $n, 1);
is(retry_all($ot, 'mv', $n, 1), "replay=$n", 'after the move, every key of the racing claims replays');
is(executions($ot, 'mv'), "$n $n", 'each of them executed exactly once');
is($coord->safe_psql('postgres', qq{
SELECT action || ' ' || response_json::text FROM idempotency.idem_claim('$ot', 'POST /payments', 'held', $fp)}),
	'replay {"held": true}', 'the claim held when the move started replays');
is($coord->safe_psql('postgres', qq{SELECT count(*) FROM payments WHERE tenant = '$ot' AND k = 'held'}),
	'1', 'and executed once');
$coord->safe_psql('postgres', 'CALL citus_cleanup_orphaned_resources()');

# The rebalancer: three other shard groups moved onto one worker (blocking
# writes, for speed) make the cluster uneven; citus_rebalance_start() then
# moves shards in the default mode while claims race.
my $rt = 'rebalanced';
my $rw = node_of($rt);
my ($rother) = grep { $_ != $rw } @workers;
for my $sh (split /\n/, $coord->safe_psql('postgres', qq{
SELECT s.shardid FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n USING (groupid)
WHERE s.logicalrelid = 'payments'::regclass AND n.nodeport = } . $rother->port . qq{
  AND s.shardid <> get_shard_id_for_distribution_column('payments', '$rt')
ORDER BY 1 LIMIT 3}))
{
	$coord->safe_psql('postgres', "SELECT citus_move_shard_placement($sh, '" . $rother->host . "', "
		  . $rother->port . ", '" . $rw->host . "', " . $rw->port . ", shard_transfer_mode => 'block_writes')");
}
$coord->safe_psql('postgres', 'CALL citus_cleanup_orphaned_resources()');
my $job = $coord->safe_psql('postgres', 'SELECT citus_rebalance_start()');
like($job, qr/^\d+$/, 'citus_rebalance_start() starts a rebalance job');
ok( $coord->poll_query_until('postgres', qq{
SELECT count(*) > 0 FROM pg_dist_background_task WHERE job_id = $job AND status IN ('running', 'done')}),
	'the rebalancer moves a shard');
$racing = start_clients($rt, 'rb', $n, 4, 1);
# bounded: a job whose tasks keep failing would be retried for ever
$coord->safe_psql('postgres', q{SET statement_timeout = '300s'; SELECT citus_rebalance_wait()});
($racing_actions, $racing_errors) = finish_clients($racing);
is($coord->safe_psql('postgres', qq{
SELECT state || ' ' || (SELECT count(*) > 0 FROM pg_dist_background_task t
                         WHERE t.job_id = j.job_id AND t.status = 'done')
FROM pg_dist_background_job j WHERE job_id = $job}),
	'finished true', 'the rebalancer moved shards and finished');
note('claims during the rebalance: ' . join(' ', map { "$_=$racing_actions->{$_}" } sort keys %$racing_actions)
	  . '; errors: ' . scalar(@$racing_errors));
diag(join("\n", @$racing_errors)) if @$racing_errors;
retry_all($rt, 'rb', $n, 1);
is(retry_all($rt, 'rb', $n, 1), "replay=$n", 'after the rebalance, every key replays');
is(executions($rt, 'rb'), "$n $n", 'each executed exactly once');
$coord->safe_psql('postgres', 'CALL citus_cleanup_orphaned_resources()');

# A worker killed with kill -9 during claims: claims of its tenants fail
# with an error naming the lost connection, the other worker's tenants go
# on; after its restart every key replays or executes once.
my $kt = 'killed';
my $victim = node_of($kt);
my ($survivor) = grep { $_ != $victim } @workers;
my ($st) = grep { node_of($_) == $survivor } map { "survives-$_" } 1 .. 20;
$racing = start_clients($kt, 'kl', 200, 3);
ok( $coord->poll_query_until('postgres',
		qq{SELECT count(*) >= 10 FROM payments WHERE tenant = '$kt'}),
	'claims run on the worker about to be killed');
# the whole node dies at once, as with a machine: the postmaster and its
# children (those still attached to its shared memory would make the
# restart fail)
my @victim_children = child_pids($victim->{_pid});
$victim->kill9;
kill 'KILL', @victim_children;
wait_until_gone(\@victim_children, 10);
($racing_actions, $racing_errors) = finish_clients($racing);
ok(@$racing_errors > 0, 'claims in flight fail when the worker dies (' . scalar(@$racing_errors) . ' errors)');
note("the first: $racing_errors->[0]") if @$racing_errors;
($ret, $out, $err) = $coord->psql('postgres', qq{
SELECT action FROM idempotency.idem_claim('$kt', 'POST /payments', 'while-down', $fp)});
like($err, qr/connection to the remote node [^ ]+:\d+ failed|could not connect|server closed the connection/,
	'a claim of its tenant while it is down fails, naming the node') or diag($err);
is($coord->safe_psql('postgres', qq{
SELECT action FROM idempotency.idem_claim('$st', 'POST /payments', 'while-down', $fp, lease => '1 minute')}),
	'execute', 'a tenant of the other worker claims meanwhile');
$victim->start;
retry_all($kt, 'kl', 200);
is(retry_all($kt, 'kl', 200), 'replay=200', 'after the restart every key replays');
is(executions($kt, 'kl'), '200 200', 'each executed exactly once');

$_->stop for @workers, $coord;
done_testing();
