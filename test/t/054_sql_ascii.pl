# In a SQL_ASCII database the canonicalizers and idem_fingerprint refuse
# non-ASCII text (22021): such a database does not say which characters its
# bytes above 0x7F stand for, so they have no UTF-8 form, and writing them
# as they are would give invalid UTF-8 and fingerprints no client can
# reproduce.  ASCII text is canonicalized as anywhere else.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('sqlascii', preload => 0, extension => 0);
$node->safe_psql('postgres',
	q{CREATE DATABASE ascii ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0});
$node->safe_psql('ascii', 'CREATE EXTENSION idempotency CASCADE');
is($node->safe_psql('ascii', 'SHOW server_encoding'), 'SQL_ASCII', 'the database is SQL_ASCII');

# a byte above 0x7F: 0xE9 (é in Latin-1, not UTF-8), and 0xC3 0xA9 (é in UTF-8)
my $latin1 = q{convert_from('\xe9'::bytea, 'SQL_ASCII')};
my $utf8 = q{convert_from('\xc3a9'::bytea, 'SQL_ASCII')};

my %calls = (
	'a string value (idem_canonical_json)' =>
	  qq{SELECT idempotency.idem_canonical_json(jsonb_build_object('a', $latin1))},
	'a member name (idem_canonical_json)' =>
	  qq{SELECT idempotency.idem_canonical_json(jsonb_build_object($utf8, 1))},
	'idem_canonical_json_sha256' =>
	  qq{SELECT idempotency.idem_canonical_json_sha256(to_jsonb($latin1))},
	'idem_canonical_json_text' =>
	  qq{SELECT idempotency.idem_canonical_json_text('{"a": "' || $utf8 || '"}')},
	'idem_fingerprint (body)' =>
	  qq{SELECT idempotency.idem_fingerprint('POST', '/p', jsonb_build_object('a', $latin1))},
	'idem_fingerprint (path)' =>
	  qq{SELECT idempotency.idem_fingerprint('POST', '/p/' || $latin1, NULL)},);

for my $what (sort keys %calls)
{
	my ($rc, $out, $err) = $node->psql('ascii', "\\set VERBOSITY verbose\n$calls{$what}");
	isnt($rc, 0, "$what: refused");
	like($err, qr/22021: non-ASCII characters cannot be canonicalized in a SQL_ASCII database/,
		"$what: with 22021");
	is($out, '', "$what: nothing returned");
}

# excluded members are never written: their names may be anything
is($node->safe_psql('ascii',
	qq{SELECT idempotency.idem_canonical_json(jsonb_build_object('b', 1, 'a', 'x', 'c', $latin1), '{/c}')}),
	'{"a":"x","b":1}', 'ASCII text is canonicalized; an excluded non-ASCII member does not matter');
is($node->safe_psql('ascii',
	q{SELECT encode(idempotency.idem_fingerprint('delete', '/v1/payments/pay_42', NULL), 'hex')}),
	'c847947c832340081e23099ac6e355afd6788e720e8028b8ce127a924ebad0c1',
	'an ASCII fingerprint is the one of the README');

$node->stop;
done_testing();
