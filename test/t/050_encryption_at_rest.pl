# Encryption at rest: with idempotency.encryption_key set, a stored body's
# plaintext is in none of the files of idempotency.keys (every partition and
# its TOAST table) nor in the WAL, after a checkpoint; without the key it is
# (which shows that the search would find it).  Replays give the plaintext
# back; a wrong key is an error.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('encryption');

# markers that appear nowhere else
my $run = sprintf('%08x%08x', int(rand(2**32)), int(rand(2**32)));
my %mark = map { $_ => "MARK${_}x$run" } qw(A B C D);

# store one body: small ones stay in the heap, large ones go to TOAST (the
# random base64 after the marker does not compress)
sub store
{
	my ($key, $marker, $large) = @_;
	my $body = $large
	  ? "to_jsonb('$marker' || encode(gen_random_bytes(1000) || gen_random_bytes(1000) || gen_random_bytes(1000), 'base64'))"
	  : "jsonb_build_object('card', '$marker')";
	$node->safe_psql('postgres', qq{
		BEGIN;
		SELECT idempotency.idem_claim('t1', 'POST /enc', '$key', sha256('$key'));
		SELECT idempotency.idem_finish('t1', 'POST /enc', '$key', 201, $body);
		COMMIT;});
}

# the files of every partition of idempotency.keys and of their TOAST tables
sub table_files
{
	my $paths = $node->safe_psql('postgres', q{
		SELECT pg_relation_filepath(r)
		FROM (SELECT inhrelid AS r FROM pg_inherits
		      WHERE inhparent = 'idempotency.keys'::regclass
		      UNION ALL
		      SELECT c.reltoastrelid FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		      WHERE i.inhparent = 'idempotency.keys'::regclass AND c.reltoastrelid <> 0) s});
	my @files;
	for my $p (split /\n/, $paths)
	{
		push @files, grep { -f $_ } glob($node->data_dir . "/$p*");
	}
	return @files;
}

sub wal_files
{
	return grep { -f $_ && m{/[0-9A-F]{24}$} } glob($node->data_dir . '/pg_wal/*');
}

sub found_in
{
	my ($marker, @files) = @_;
	for my $f (@files)
	{
		my $content = slurp_file($f);
		return 1 if index($content, $marker) >= 0;
	}
	return 0;
}

# without a key: the plaintext is in the table's files and in the WAL
store('k-a', $mark{A}, 0);
store('k-b', $mark{B}, 1);
$node->safe_psql('postgres', 'CHECKPOINT');
my @files = table_files();
ok(scalar(@files) >= 2, 'the table has heap and TOAST files to search');
ok(found_in($mark{A}, @files), 'without a key, a small body is in plaintext in the heap');
ok(found_in($mark{B}, @files), 'without a key, a large body is in plaintext in TOAST');
ok(found_in($mark{A}, wal_files()), 'without a key, the plaintext is in the WAL');

# with a key
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.encryption_key = 'k3y-for-the-tap-test'});
$node->reload;
store('k-c', $mark{C}, 0);
store('k-d', $mark{D}, 1);
$node->safe_psql('postgres', 'CHECKPOINT');
@files = table_files();
is($node->safe_psql('postgres',
	q{SELECT string_agg(key || ':' || body_encrypted, ',' ORDER BY key) FROM idempotency.keys}),
	'k-a:false,k-b:false,k-c:true,k-d:true', 'bodies stored with the key are marked encrypted');
ok(!found_in($mark{C}, @files), 'with a key, a small body is not in plaintext in the heap');
ok(!found_in($mark{D}, @files), 'with a key, a large body is not in plaintext in TOAST');
ok(!found_in($mark{C}, wal_files()), 'with a key, the plaintext is not in the WAL');
ok(!found_in($mark{D}, wal_files()), 'with a key, the large plaintext is not in the WAL');

# replays decrypt; old rows stay readable
is($node->safe_psql('postgres',
	q{SELECT response_json->>'card' FROM idempotency.idem_claim('t1', 'POST /enc', 'k-c', sha256('k-c'))}),
	$mark{C}, 'a replay gives the plaintext back');
like($node->safe_psql('postgres',
	q{SELECT response_json #>> '{}' FROM idempotency.idem_claim('t1', 'POST /enc', 'k-d', sha256('k-d'))}),
	qr/^$mark{D}/, 'a large body too');
is($node->safe_psql('postgres',
	q{SELECT response_json->>'card' FROM idempotency.idem_claim('t1', 'POST /enc', 'k-a', sha256('k-a'))}),
	$mark{A}, 'a body stored before the key was set stays readable');

# an import with the key set stores a plain body encrypted, as a finish
# does: k-a's row (stored before the key, plain) exported and imported
# under another tenant
my $import = q{
	SELECT string_agg(outcome || ':' || rows, ',' ORDER BY outcome) FROM idempotency.idem_import_keys(
	    (SELECT jsonb_agg(jsonb_set(e, '{tenant}', '"t2"'))
	     FROM idempotency.idem_export_keys('t1') e WHERE e->>'key' = 'k-a'))};
is($node->safe_psql('postgres', $import), 'expired:0,inserted:1,kept:0,unchanged:0',
	'a plain row exported and imported under another tenant');
is($node->safe_psql('postgres',
	q{SELECT body_encrypted FROM idempotency.keys WHERE tenant = 't2' AND key = 'k-a'}),
	't', 'an imported plain body is stored encrypted when the key is set');
$node->safe_psql('postgres', 'CHECKPOINT');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.keys
	WHERE tenant = 't2' AND position(convert_to('MARKA', 'UTF8') IN response_body) > 0}),
	'0', 'and its plaintext is not in the stored column');
is($node->safe_psql('postgres',
	q{SELECT response_json->>'card' FROM idempotency.idem_claim('t2', 'POST /enc', 'k-a', sha256('k-a'))}),
	$mark{A}, 'its replay gives the plaintext back');
is($node->safe_psql('postgres', $import), 'expired:0,inserted:0,kept:0,unchanged:1',
	'imported again: unchanged (the bodies compared as a replay reads them)');

# a wrong key is an error, not garbage
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.encryption_key = 'another key'});
$node->reload;
my ($rc, $out, $err) = $node->psql('postgres',
	q{\set VERBOSITY verbose
	  SELECT response_json FROM idempotency.idem_claim('t1', 'POST /enc', 'k-c', sha256('k-c'))});
isnt($rc, 0, 'a replay with the wrong key fails');
like($err, qr/IK501: stored response cannot be decrypted/, 'with IK501');
is($out, '', 'and returns nothing');

$node->stop;
done_testing();
