# The Citus mode made by 0.3.0, updated to 0.4.0 (doc/tombstones.md, "In
# the Citus mode"): a coordinator and one worker distributed by 0.3.0's
# citus_distribute keep no tombstone (0.3.0 did not distribute them); after
# ALTER EXTENSION idempotency UPDATE (which Citus carries to the worker),
# citus_distribute called again distributes the tombstones colocated with
# the keys, deleting those written before the Citus mode (they name no
# tenant), and an expired key reused with another payload then answers 422
# on the worker.  Each node then has what a fresh install of 0.4.0
# distributed the same way has (a second database on the same nodes),
# shards included (doc/scaling.md, "Citus: updating").
#
# Skipped where Citus is not installed, as 071_citus.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

skip_unless_installed('Citus', env => 'IDEM_SKIP_CITUS', dir => '--sharedir',
	file => 'extension/citus.control',
	missing => '%s is missing; make test builds it with scripts/citus.sh');

my $coord = PostgreSQL::Test::Cluster->new('citus_update_coordinator');
my $worker = PostgreSQL::Test::Cluster->new('citus_update_worker');
for my $node ($coord, $worker)
{
	$node->init;
	$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'citus,idempotency'
idempotency.maintenance_interval = 3600
citus.node_conninfo = 'sslmode=prefer'
max_connections = 40
});
	$node->append_conf('postgresql.conf', "citus.local_hostname = '" . $node->host . "'");
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION citus');
}
$coord->safe_psql('postgres',
	"SELECT citus_set_coordinator_host('" . $coord->host . "', " . $coord->port . ')');
$coord->safe_psql('postgres',
	"SELECT citus_add_node('" . $worker->host . "', " . $worker->port . ')');

# 0.3.0, and a tombstone on the coordinator before the Citus mode (as a
# pass would write it)
$coord->safe_psql('postgres', q{CREATE EXTENSION idempotency VERSION '0.3.0' CASCADE});
is($worker->safe_psql('postgres',
	q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'0.3.0', 'Citus carried CREATE EXTENSION VERSION 0.3.0 to the worker');
$_->safe_psql('postgres', 'SELECT count(*) FROM idempotency.idem_maintenance()')
  for $coord, $worker;
my %fp = map { $_ => qq{sha256(convert_to('$_', 'UTF8'))} } qw(a b);
$coord->safe_psql('postgres', qq{
INSERT INTO idempotency.tombstones
VALUES (idempotency.idem_tombstone_hash('old', 'POST /x', 'k0'), $fp{a}, now(), now() + interval '30 days')});

$coord->safe_psql('postgres', q{
CREATE TABLE payments (tenant text COLLATE "C" NOT NULL, k text, amount int);
SELECT create_distributed_table('payments', 'tenant');
SELECT idempotency.citus_distribute('payments');
});
is($coord->safe_psql('postgres', q{
SELECT string_agg(logicalrelid::text, ', ' ORDER BY logicalrelid::text) FROM pg_dist_partition
WHERE logicalrelid IN ('idempotency.keys'::regclass, 'idempotency.tombstones'::regclass)}),
	'idempotency.keys', '0.3.0 distributes the keys, not the tombstones');

# a key that expires and is dropped in the Citus mode of 0.3.0: no tombstone
my $claim = sub {
	my ($k, $body, $ttl) = @_;
	my $ttl_arg = $ttl ? ", ttl => '$ttl'" : '';
	return $coord->safe_psql('postgres', qq{
BEGIN;
SELECT action || ' ' || coalesce(http_status::text, '-')
FROM idempotency.idem_claim('acme', 'POST /x', '$k', $fp{$body}$ttl_arg);
ROLLBACK;});
};
my $done = sub {
	my ($k) = @_;
	$coord->safe_psql('postgres', qq{
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /x', '$k', $fp{a}, ttl => '1 s');
SELECT idempotency.idem_finish('acme', 'POST /x', '$k', 201, '{}');
COMMIT;});
};
$done->('k1');
# it expires (ttl 1 s) before it is claimed again below, however fast the
# update is
sleep 2;

# the update, carried to the worker; then citus_distribute again
$coord->safe_psql('postgres', 'ALTER EXTENSION idempotency UPDATE');
is($worker->safe_psql('postgres',
	q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'0.4.0', 'Citus carried the update to the worker');
is($claim->('k1', 'b'), 'execute -',
	'updated, but before citus_distribute again: no tombstone is kept in the Citus mode (a key still expired in its partition is not read either)');
my ($ret, $out, $err) = $coord->psql('postgres', q{SELECT idempotency.citus_distribute('payments')});
is($ret, 0, 'citus_distribute again after the update');
like($err, qr/NOTICE:  deleted 1 tombstones written before the Citus mode/,
	'it deletes the tombstone written before the Citus mode, with a notice');
is($coord->safe_psql('postgres', q{
SELECT partmethod::text || ' ' || (colocationid = (SELECT colocationid FROM pg_dist_partition
                                                   WHERE logicalrelid = 'idempotency.keys'::regclass))::text
FROM pg_dist_partition WHERE logicalrelid = 'idempotency.tombstones'::regclass}),
	'h true', 'and distributes the tombstones by tenant, colocated with the keys');
is($coord->safe_psql('postgres', q{SELECT idempotency.citus_distribute('payments')}), '',
	'a third call changes nothing');

# The updated database equals a fresh install of 0.4.0 distributed the same
# way (the database "fresh" on the same nodes), shards included: columns,
# replica identities, indexes and triggers of every relation of the schema
# on each node, shards shown by Citus (their shard ids and the dates of
# partitions left out of the names; each line once, since 0.3.0 and 0.4.0
# make different partitions).
for my $node ($coord, $worker)
{
	$node->safe_psql('postgres', 'CREATE DATABASE fresh');
	$node->safe_psql('fresh', 'CREATE EXTENSION citus');
}
$coord->safe_psql('fresh',
	"SELECT citus_set_coordinator_host('" . $coord->host . "', " . $coord->port . ')');
$coord->safe_psql('fresh',
	"SELECT citus_add_node('" . $worker->host . "', " . $worker->port . ')');
$coord->safe_psql('fresh', 'CREATE EXTENSION idempotency CASCADE');
$_->safe_psql('fresh', 'SELECT count(*) FROM idempotency.idem_maintenance()')
  for $coord, $worker;
$coord->safe_psql('fresh', q{
CREATE TABLE payments (tenant text COLLATE "C" NOT NULL, k text, amount int);
SELECT create_distributed_table('payments', 'tenant');
SELECT idempotency.citus_distribute('payments');
});
my $describe = q{
SET citus.override_table_visibility = off;
WITH rel AS (
    SELECT c.oid,
           regexp_replace(regexp_replace(c.relname, '_[0-9]{6,}$', '_N'), '_p[0-9]{8}t[0-9]{4}', '_pDATE') AS name
    FROM pg_class c
    WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'p')
)
SELECT DISTINCT r.name || ' ' || d.what
FROM rel r,
LATERAL (
    SELECT 'column ' || a.attnum || ' ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
           || coalesce(' ' || co.collname, '') || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END AS what
    FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation
    WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'replica identity ' || c.relreplident::text
           || coalesce(' ' || (SELECT regexp_replace(regexp_replace(i.relname, '_[0-9]{6,}$', '_N'), '_p[0-9]{8}t[0-9]{4}', '_pDATE')
                               FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
                               WHERE x.indrelid = r.oid AND x.indisreplident), '')
    FROM pg_class c WHERE c.oid = r.oid
    UNION ALL
    SELECT 'index ' || regexp_replace(regexp_replace(pg_get_indexdef(x.indexrelid), '_[0-9]{6,}', '_N', 'g'), '_p[0-9]{8}t[0-9]{4}', '_pDATE', 'g')
    FROM pg_index x WHERE x.indrelid = r.oid
    UNION ALL
    SELECT 'trigger ' || regexp_replace(t.tgname, '_[0-9]{6,}$', '_N') || ' ' || t.tgenabled::text
           || CASE WHEN t.tgparentid <> 0 THEN ' clone' ELSE '' END || ' ' || t.tgfoid::regproc::text || ' ' || t.tgtype
    FROM pg_trigger t WHERE t.tgrelid = r.oid AND NOT t.tgisinternal
) d
ORDER BY 1;
};
# a trigger on a shard is named after the table's with the shard id, its
# clones on the partitions of that shard after the shard's
my $misnamed = q{
SET citus.override_table_visibility = off;
SELECT count(*) || ' ' || count(*) FILTER (WHERE t.tgname <> regexp_replace(t.tgname, '_[0-9]+$', '') || '_' ||
           coalesce((SELECT substring(p.relname FROM '_([0-9]+)$') FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
                     WHERE i.inhrelid = c.oid),
                    substring(c.relname FROM '_([0-9]+)$')))
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relname ~ '_[0-9]{6,}$' AND NOT t.tgisinternal;
};
for my $node ($coord, $worker)
{
	my $fresh = $node->safe_psql('fresh', $describe);
	my $updated = $node->safe_psql('postgres', $describe);
	like($updated, qr/^keys_N trigger keys_horizon_N A idempotency\.idem_keys_horizon_trigger/m,
		'the shards of keys have the trigger keys_horizon on ' . $node->name)
	  if $node == $worker;
	is($updated, $fresh, 'on ' . $node->name . ', the updated database has what a fresh install distributed has, shards included');
	my ($n, $bad) = split / /, $node->safe_psql('postgres', $misnamed);
	is($bad, '0', "on " . $node->name . ", the $n triggers of shards are named as Citus names them");
}

# now a key dropped by the coordinator's pass leaves its tombstone on the worker
$done->('k2');
$coord->safe_psql('postgres', q{
SELECT count(*) FROM idempotency.idem_maintenance(now() + interval '1 day', preview => false)});
is($claim->('k2', 'b'), 'mismatch 422',
	'an expired key reused with another payload answers 422 on the worker');
is($claim->('k1', 'b'), 'mismatch 422', 'so does the one claimed before the update');
is($claim->('k2', 'a'), 'execute -', 'the same payload executes again');
is($worker->safe_psql('postgres', q{SELECT count(*) FROM idempotency.tombstones WHERE tenant = 'acme'}),
	'2', 'their tombstones are on the worker, with their tenant');

$_->stop for $worker, $coord;
done_testing();
