# The secret of the scope locks outlives a restart.  A claim prepared with
# PREPARE TRANSACTION keeps its scope's lock across a restart of the server
# (PostgreSQL restores the locks of prepared transactions); a claim of the
# same scope after the restart must compute the same lock tag, so that it
# waits for the prepared transaction, answers in_progress when it may not
# wait, and replays the response once COMMIT PREPARED ran.  With a secret
# made anew at every start, the tags differ: the claim runs past the lock
# into the unique index, where it waits for the prepared transaction and
# then fails with 23505.  The secret is kept in the data directory's
# idempotency_lock.key (16 bytes, the owner's alone); a file of another
# size stops the server with a message that names it.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('prepared_lock', conf => qq{
max_prepared_transactions = 4
idempotency.enable_worker = off
});
my $file = $node->data_dir . '/idempotency_lock.key';
ok(-f $file, 'the first start made idempotency_lock.key');
is(-s $file, 16, 'it holds 16 bytes');
is((stat $file)[2] & 07777, 0600, 'only the server\'s owner may read it');
my $secret = -f $file ? slurp_file($file) : '';

my $claim = q{SELECT action FROM idempotency.idem_claim('t', 'POST /p', 'k-prepared', sha256('{}'::bytea))};
$node->safe_psql('postgres', qq{
BEGIN;
$claim;
SELECT idempotency.idem_finish('t', 'POST /p', 'k-prepared', 201, '{"id": 1}');
PREPARE TRANSACTION 'p1';
});
$node->restart;
is(-f $file ? slurp_file($file) : undef, $secret, 'the restart read the same secret');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'p1'}),
	'1', 'the prepared claim outlived the restart');

# A claim that may not wait: in_progress at once, as before the restart.
# With another tag it would wait in the unique index for the prepared
# transaction: statement_timeout turns that wait into an error.
my ($rc, $out, $err) = $node->psql('postgres', qq{
SET statement_timeout = '10s';
SELECT action FROM idempotency.idem_claim('t', 'POST /p', 'k-prepared', sha256('{}'::bytea), wait => '0');
});
is($rc, 0, 'a claim of the prepared scope after the restart ends without error') or diag($err);
is($out, 'in_progress', 'it answers in_progress: it saw the prepared transaction\'s lock');

# A claim that waits, in the background: it waits on the lock, and replays
# once the prepared transaction commits.
my $bg = $node->background_psql('postgres', on_error_stop => 0);
$bg->query_until(qr/started/, q{
\echo started
SELECT action, http_status FROM idempotency.idem_claim('t', 'POST /p', 'k-prepared', sha256('{}'::bytea), wait => '60 s');
});
ok($node->poll_query_until('postgres', q{
SELECT count(*) > 0 FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query LIKE '%k-prepared%'}), 'the waiting claim waits on a lock');
$node->safe_psql('postgres', q{COMMIT PREPARED 'p1'});
my $res = $bg->query_safe('SELECT 1');
$bg->quit;
like($res, qr/^replay\|201$/m, 'the waiting claim replays once the prepared transaction committed');
like($node->safe_psql('postgres', $claim), qr/^replay$/, 'after COMMIT PREPARED the key replays');

# A secret file of another size stops the server with a message naming it.
$node->stop;
open my $fh, '>>', $file or die "$file: $!";
print $fh "x";
close $fh;
my $started = $node->start(fail_ok => 1);
ok(!$started, 'a lock secret of 17 bytes stops the server');
like(slurp_file($node->logfile), qr/file "idempotency_lock\.key" holds 17 bytes instead of 16/,
	'the log names the file and its size');
unlink $file;
$node->start;
isnt(slurp_file($file), $secret, 'with the file removed, the next start makes a new secret');

done_testing();
