# The shared tables of tombstone filters (src/tombstone_filter.c) and of key
# horizons (src/horizon.c) at capacity: with a handful of entries
# (idempotency.tombstone_filter_entries, idempotency.horizon_entries), each
# is driven past full by several databases, room is freed (passes that drop
# partitions, dropped databases), the server restarts (and stops at once),
# and no key executes twice: an expired key whose tombstone is in the table
# answers 422 to another payload, a live key replays.
#
# The filter defect of issue 36: a partition that received a tombstone while
# it had no entry (the table full) was answered "maybe"; once another
# database's pass freed entries, the next tombstone written into it made it
# a fresh entry holding only the new hash, and a claim of the first key with
# another fingerprint executed.  The same after a restart, where learning
# found no room for a partition that held tombstones.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;
use IPC::Run;

my $node = idem_node('capacity', conf => qq{
idempotency.enable_worker = off
idempotency.tombstone_partition_interval = '1d'
idempotency.partition_interval = '1d'
idempotency.max_ttl = '30d'
idempotency.tombstone_filter_entries = 6
idempotency.horizon_entries = 3
});

# a tombstone of (t, $endpoint, $key) with payload sha256('a'), expiring
# $days days from now, written by SQL into database $db
sub tombstone
{
	my ($db, $endpoint, $key, $days) = @_;
	$node->safe_psql($db, qq{
INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)
VALUES (idempotency.idem_tombstone_hash('t', '$endpoint', '$key'), sha256('a'),
        now() - interval '1 hour', now() + interval '$days days')});
	return;
}

# the action a claim of ($endpoint, $key) with payload sha256($payload) gets
# in $db (rolled back)
sub claim
{
	my ($db, $endpoint, $key, $payload) = @_;
	return $node->safe_psql($db, qq{
BEGIN;
SELECT action FROM idempotency.idem_claim('t', '$endpoint', '$key', sha256('$payload'));
ROLLBACK;});
}

sub pass
{
	my ($db, $at) = @_;
	my $sql = defined $at
	  ? "SELECT count(*) FROM idempotency.idem_maintenance(now() + interval '$at', preview => false)"
	  : 'SELECT count(*) FROM idempotency.idem_maintenance()';
	$node->safe_psql($db, $sql);
	return;
}

# the tombstone partitions of $db a claim of a new key reads (their index
# scanned by the claim's transaction)
sub opened
{
	my ($db) = @_;
	my $scans = q{SELECT i.indexrelid AS idx, pg_stat_get_xact_numscans(i.indexrelid) AS n
FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
WHERE c.relkind = 'r' AND c.relnamespace = 'idempotency'::regnamespace
  AND c.relname ~ '^tombstones_'};
	return $node->safe_psql($db, qq{
BEGIN;
CREATE TEMP TABLE scans0 ON COMMIT DROP AS $scans;
SELECT action FROM idempotency.idem_claim('t', 'POST /new', 'new-' || (extract(epoch from clock_timestamp()) * 1000000)::bigint, sha256('a')) \\g /dev/null
SELECT count(*) FROM ($scans) s LEFT JOIN scans0 s0 USING (idx) WHERE s.n > coalesce(s0.n, 0);
ROLLBACK;});
}

for my $db (qw(a b c))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency CASCADE');
}

# Tombstone partitions begin about 30 days ahead (tombstone_ttl), one a day.
# --- the defect: a tombstone written while its partition had no entry ---
# a and b learn; b's tombstones in five partitions fill the table
pass('a');
pass('b');
tombstone('b', 'POST /b', "b$_", 31 + 2 * $_) for 0 .. 4;
# K1 lands in a partition without an entry: no room
tombstone('a', 'POST /x', 'K1', 50);
is(claim('a', 'POST /x', 'K1', 'b'), 'mismatch', 'table full: K1 with another payload answers 422');
# b's pass ahead drops its five partitions and frees their entries
pass('b', '41 days');
is($node->safe_psql('b', 'SELECT count(*) FROM idempotency.tombstones'), '0',
	"b's partitions are dropped");
# K2 lands in K1's partition, now that there is room
tombstone('a', 'POST /x', 'K2', 50);
is(claim('a', 'POST /x', 'K2', 'b'), 'mismatch', 'K2 with another payload answers 422');
is(claim('a', 'POST /x', 'K1', 'b'), 'mismatch',
	'room freed, a later tombstone in the same partition: K1 with another payload still answers 422');
pass('a');
is(claim('a', 'POST /x', 'K1', 'b'), 'mismatch', 'after the next pass of a: K1 still answers 422');
is(claim('a', 'POST /x', 'K2', 'b'), 'mismatch', 'and K2');
is(opened('a'), '0', 'learned again from its rows: a new key opens no tombstone partition of a');

# --- a restart: learning finds no room for a partition holding tombstones ---
tombstone('a', 'POST /y', 'K3', 55);
$node->stop('immediate');
$node->start;
is(claim('a', 'POST /y', 'K3', 'b'), 'mismatch', 'after an immediate stop, before learning: K3 answers 422');
# c's tombstones take the table before a learns
pass('c');
tombstone('c', 'POST /c', "c$_", 31 + 2 * $_) for 0 .. 2;
pass('a');
is(claim('a', 'POST /y', 'K3', 'b'), 'mismatch', 'learned without room: K3 answers 422');
pass('c', '37 days');
tombstone('a', 'POST /y', 'K4', 55);
is(claim('a', 'POST /y', 'K3', 'b'), 'mismatch',
	'room freed after learning, a later tombstone in the same partition: K3 still answers 422');
is(claim('a', 'POST /x', 'K1', 'b'), 'mismatch', 'K1 too');

# --- dropped databases free their entries ---
for my $round (1 .. 3)
{
	my $db = "d$round";
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency CASCADE');
	pass($db);
	tombstone($db, 'POST /d', "d$_", 31 + 2 * $_) for 0 .. 4;
	is(claim($db, 'POST /d', 'd1', 'b'), 'mismatch', "$db: its tombstone answers 422");
	$node->safe_psql('postgres', "DROP DATABASE $db");
	tombstone('a', 'POST /z', "Z$round", 45);
	is(claim('a', 'POST /z', "Z$round", 'b'), 'mismatch', "after $db is dropped: Z$round answers 422");
}
pass('a');
is(opened('a'), '0', 'the entries of the dropped databases were freed: a learns again and a new key opens no tombstone partition');
is(claim('a', 'POST /x', 'K1', 'b') . claim('a', 'POST /y', 'K3', 'b') . claim('a', 'POST /z', 'Z1', 'b'),
	'mismatch' x 3, 'K1, K3 and Z1 answer 422');

# --- learning while a writer is between the filter's trigger and its row ---
# e's tombstones pass a trigger of its own after tombstones_filter, which
# waits for an advisory lock: the row is written after learning has read
# the partition.  After an immediate stop, f's tombstones fill the table,
# then e's writer passes tombstones_filter without room, f's pass frees
# entries, and e learns while the writer waits.
$node->safe_psql('postgres', 'CREATE DATABASE e');
$node->safe_psql('postgres', 'CREATE DATABASE f');
$node->safe_psql($_, 'CREATE EXTENSION idempotency CASCADE') for qw(e f);
pass('e');
$node->safe_psql('e', q{
SET idempotency.ddl_guard = off;
CREATE FUNCTION public.zz_pause() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_lock(42);
    PERFORM pg_advisory_unlock(42);
    RETURN NEW;
END $$;
CREATE TRIGGER zz_pause BEFORE INSERT ON idempotency.tombstones
    FOR EACH ROW EXECUTE FUNCTION public.zz_pause();});
$node->stop('immediate');
$node->start;
pass('f');
tombstone('f', 'POST /f', "f$_", 31 + 2 * $_) for 0 .. 3;
my ($hold_in, $hold_out, $w_out, $w_err) = ('', '', '', '');
my $hold = IPC::Run::start([ 'psql', '-X', '-A', '-t', '-d', $node->connstr('e') ],
	'<', \$hold_in, '>', \$hold_out, '2>', \$hold_out);
$hold_in .= "SELECT pg_advisory_lock(42);\n";
$hold->pump while length $hold_in;
ok($node->poll_query_until('e',
		q{SELECT count(*) = 1 FROM pg_locks WHERE locktype = 'advisory' AND granted}),
	'the advisory lock is held');
my $writer = IPC::Run::start(
	[ 'psql', '-X', '-A', '-t', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('e'), '-c', q{
INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)
VALUES (idempotency.idem_tombstone_hash('t', 'POST /e', 'K5'), sha256('a'),
        now() - interval '1 hour', now() + interval '30 days')} ],
	'>', \$w_out, '2>', \$w_err);
ok($node->poll_query_until('e',
		q{SELECT count(*) = 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted}),
	'the writer waits after tombstones_filter');
pass('f', '41 days');
pass('e');
$hold_in .= "SELECT pg_advisory_unlock(42);\n\\q\n";
$hold->finish;
$writer->finish;
is($w_err, '', 'the writer wrote its tombstone');
is(claim('e', 'POST /e', 'K5', 'b'), 'mismatch',
	'learned while the writer waited: K5 with another payload answers 422');
pass('e');
is(claim('e', 'POST /e', 'K5', 'b'), 'mismatch', 'after the next pass: K5 answers 422');
is(opened('e'), '0', 'learned again: a new key opens no tombstone partition of e');

# --- horizons: three entries for three databases and their endpoints ---
# keys of 20 days on endpoints without an entry, in a and b
sub key20
{
	my ($db, $endpoint, $key) = @_;
	$node->safe_psql($db, qq{
BEGIN;
SELECT idempotency.idem_claim('t', '$endpoint', '$key', sha256('a'), ttl => '20 days');
SELECT idempotency.idem_finish('t', '$endpoint', '$key', 201, '{}');
COMMIT;});
	return;
}
pass('b');
key20('a', "POST /h$_", 'long') for 1 .. 4;
key20('b', "POST /h$_", 'long') for 1 .. 4;
key20('c', 'POST /h1', 'long');
for my $db (qw(a b c))
{
	my @eps = $db eq 'c' ? (1) : (1 .. 4);
	is(join(',', map { claim($db, "POST /h$_", 'long', 'a') } @eps), join(',', ('replay') x @eps),
		"horizons full: every key of $db replays");
	is(claim($db, 'POST /h1', 'long', 'b'), 'mismatch', "horizons full: another payload in $db answers 422");
}
$node->stop('immediate');
$node->start;
# c learns first after the restart, then the others
pass($_) for qw(c b a);
key20('c', "POST /h$_", 'later') for 2 .. 4;
for my $db (qw(a b c))
{
	is(join(',', map { claim($db, "POST /h$_", 'long', 'a') } 1 .. ($db eq 'c' ? 1 : 4)),
		join(',', ('replay') x ($db eq 'c' ? 1 : 4)), "after a restart: every key of $db replays");
}
is(join(',', map { claim('c', "POST /h$_", 'later', 'a') } 2 .. 4), 'replay,replay,replay',
	'keys written after learning, without an entry, replay');
$node->safe_psql('postgres', 'DROP DATABASE b');
pass('a');
key20('a', 'POST /h5', 'long');
is(claim('a', 'POST /h5', 'long', 'a'), 'replay', 'after b is dropped: a new endpoint of a replays');
is(join(',', map { claim('a', "POST /h$_", 'long', 'a') } 1 .. 4), 'replay,replay,replay,replay',
	'and every other key of a');

# --- horizons: a raise that finds no entry for its database ---
# g's rows of keys written by SQL pass a CHECK constraint of its own, checked
# after the trigger keys_horizon, whose function waits for an advisory lock
# for key K6.  After an immediate stop, h's endpoints fill the table; g's
# writer raises its horizon without room, h is dropped, g learns while the
# writer waits; the key is then found.
$node->safe_psql('postgres', 'CREATE DATABASE g');
$node->safe_psql('postgres', 'CREATE DATABASE h');
$node->safe_psql($_, 'CREATE EXTENSION idempotency CASCADE') for qw(g h);
pass('g');
$node->safe_psql('g', q{
SET idempotency.ddl_guard = off;
CREATE FUNCTION public.zz_pause(k text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF k = 'K6' THEN
        PERFORM pg_advisory_lock(43);
        PERFORM pg_advisory_unlock(43);
    END IF;
    RETURN true;
END $$;
ALTER TABLE idempotency.keys ADD CONSTRAINT zz_pause CHECK (public.zz_pause(key));});
$node->stop('immediate');
$node->start;
pass('h');
key20('h', "POST /h$_", 'long') for 1 .. 3;
($hold_in, $hold_out, $w_out, $w_err) = ('', '', '', '');
$hold = IPC::Run::start([ 'psql', '-X', '-A', '-t', '-d', $node->connstr('g') ],
	'<', \$hold_in, '>', \$hold_out, '2>', \$hold_out);
$hold_in .= "SELECT pg_advisory_lock(43);\n";
$hold->pump while length $hold_in;
ok($node->poll_query_until('g',
		q{SELECT count(*) = 1 FROM pg_locks WHERE locktype = 'advisory' AND granted}),
	'the advisory lock is held');
$writer = IPC::Run::start(
	[ 'psql', '-X', '-A', '-t', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('g'), '-c', q{
INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state, created_at, expires_at)
VALUES ('t', 'POST /g', 'K6', sha256('a'), 'completed', now(), now() + interval '20 days')} ],
	'>', \$w_out, '2>', \$w_err);
ok($node->poll_query_until('g',
		q{SELECT count(*) = 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted}),
	'the writer waits after keys_horizon, before its row');
$node->safe_psql('postgres', 'DROP DATABASE h');
pass('g');
$hold_in .= "SELECT pg_advisory_unlock(43);\n\\q\n";
$hold->finish;
$writer->finish;
is($w_err, '', 'the writer wrote its key');
is(claim('g', 'POST /g', 'K6', 'a'), 'replay', 'learned while the writer waited: K6 replays');
is(claim('g', 'POST /g', 'K6', 'b'), 'mismatch', 'and answers 422 to another payload');

$node->stop;
done_testing();
