# A bounded fuzz test of the canonicalizers.  With a fixed seed, Perl makes
# 30,000 texts: JSON documents generated at random (odd numbers, names
# and strings with escapes, repeated member names, nesting near and past the
# fast path's depth), the RFC 8785 conformance inputs (test/data/rfc8785),
# and mutations of both (bytes flipped, inserted, deleted, copied, cut off,
# members repeated, numbers swapped for extreme ones, deep wrapping).  The
# server then puts each text through every path, in a UTF-8 database and in
# a SQL_ASCII one (which also takes invalid UTF-8), and checks that:
# - the only errors are the documented ones (doc/fingerprints.md);
# - nothing crashes the server;
# - the output is canonical: canonicalizing it again, as text and as jsonb,
#   gives it back;
# - the text and the jsonb paths agree (same bytes or same SQLSTATE), except
#   that only the text path sees repeated member names (22030); with an
#   exclusion list too;
# - the SHA-256 functions hash exactly the canonical bytes (or raise the same
#   error), and idem_fingerprint frames them as the README says.
use strict;
use warnings;
use FindBin;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $COUNT = 30000;
srand(20261201);

# ---------- the texts ----------

my @numbers = (
	'0', '-0', '-0.0', '0e0', '-0e-0', '1', '-1', '0.1', '1.0', '4.50', '1e21', '1e+21', '1.0e+21',
	'1e-7', '1E-6', '1e20', '9007199254740991', '9007199254740993', '18446744073709551616',
	'123456789012345678901234567890', '0.000000000000000000000000001', '333333333.33333329',
	'5e-324', '-5e-324', '4.9406564584124654e-324', '2.4703282292062328e-324',
	'2.4703282292062327e-324', '2.2250738585072014e-308', '1.7976931348623157e308',
	'-1.7976931348623157e308', '1.7976931348623158e308', '1.7976931348623159e308', '1e308', '1e309',
	'1e400', '-1e400', '1e-400', '1e999', '1e1000', '1e-999', '1e-1000', '1E+999999999',
	'1e-999999999', '1e2147483648', '0.' . ('0' x 400) . '1', '1' . ('0' x 400),
	'9' x 600, '1.' . ('5' x 600), '1e0000000000000000001',
);
my @names = ('a', 'b', 'A', '', ' ', '1', '10', '2', '*', '~', '/', 'a/b', '~0', '\\u20ac', '\\ud83d\\ude02',
	'\\ufb33', '\\u00f6', "\xc3\xb6", "\xe2\x82\xac", "\xf0\x9f\x98\x82", "\xef\xac\xb3", '\\r', '\\n',
	'\\u0080', '\\u007f', '</script>', '\\"', '\\\\', '\\/', 'aa', 'ab', 'a\\u0000', 'key');
my @strings = (@names, 'Euro Sign', '\\b\\f\\t', '\\u0001\\u001f', "\x7f", "\xc2\x80", '\\udbff\\udfff',
	'\\uDBFF\\uDFFF', "\xf4\x8f\xbf\xbf", 'x' x 300);
my @tokens = (
	'{', '}', '[', ']', ':', ',', '"', '\\', '\\u0000', '\\ud800', '\\udc00', '\\ud800\\u0041',
	'\\ud83d\\ude02', '\\uDBFF\\uDFFF', '\\u00e9', '\\uFB33', '\\u', '\\x', '\\u12', 'true', 'false',
	'null', 'tru', 'nul', 'True', 'NaN', 'Infinity', '-Infinity', '"a":1,', ',"a":2', '"a":', '{"a":1,"a":2}',
	'[]', '{}', '""', '"\\/"', ' ', "\t", "\n", "\r", "\x0b", "\x0c", "\x01", "\x1f", "\x7f",
	"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x82", "\xef\xbf\xbf", "\xed\xa0\x80", "\xed\xbf\xbf",
	"\xc0\xaf", "\xe0\x80\xaf", "\xff", "\xfe", "\xf4\x90\x80\x80", "\xf8\x88\x80\x80\x80", "\x80", "\xc3",
	"\xe2\x82", '00', '01', '.5', '5.', '+1', '1e', '1e+', '-', '--1', '0x10', '1_000', @numbers);

sub pick { return $_[ int(rand(@_)) ]; }

# white space as jsonb's parser and the text path skip it (and some they do not)
sub ws
{
	my $r = rand();
	return '' if $r < 0.75;
	return pick(' ', "\n", "\t", "\r", '  ', " \n ") if $r < 0.98;
	return pick("\x0b", "\x0c", "\xc2\xa0");
}

sub gen_value
{
	my ($depth) = @_;
	my $r = rand();
	if ($depth < 6 && $r < 0.35)
	{
		my $n = int(rand(6));
		if (rand() < 0.5)
		{
			my @m;
			for (1 .. $n)
			{
				my $name = rand() < 0.15 && @m ? (pick(@m) =~ /("(?:[^"\\]|\\.)*")/)[0] : '"' . pick(@names) . '"';
				push @m, ws() . $name . ws() . ':' . ws() . gen_value($depth + 1) . ws();
			}
			return '{' . ws() . join(',', @m) . '}';
		}
		return '[' . ws() . join(',', map { ws() . gen_value($depth + 1) . ws() } 1 .. $n) . ']';
	}
	return pick(@numbers) if $r < 0.55;
	return gen_number() if $r < 0.7;
	return pick('true', 'false', 'null') if $r < 0.8;
	return '"' . join('', map { pick(@strings) } 0 .. int(rand(3))) . '"';
}

# a random double, written in one of several ways
sub gen_number
{
	my $x = (rand() - 0.5) * 10**(int(rand(40)) - 20);
	my $f = pick('%.17g', '%.15g', '%g', '%.3e', '%.0f', '%.20f', '%d');
	my $s = sprintf($f, $x);
	$s =~ s/^(-?)\./${1}0./;
	$s = '0' if $s !~ /^-?\d+(\.\d+)?([eE][-+]?\d+)?$/;
	return $s;
}

sub nest
{
	my ($text, $n) = @_;
	return rand() < 0.5 ? ('[' x $n) . $text . (']' x $n)
	  : ('{"a":' x $n) . $text . ('}' x $n);
}

sub mutate
{
	my ($t) = @_;
	my $len = length($t);
	my $pos = int(rand($len + 1));
	my $op = int(rand(9));
	if ($op == 0 && $len)
	{
		substr($t, int(rand($len)), 1) = chr(1 + int(rand(255)));
	}
	elsif ($op <= 2)
	{
		substr($t, $pos, 0) = pick(@tokens);
	}
	elsif ($op == 3 && $len)
	{
		substr($t, $pos, 1 + int(rand(8))) = '' if $pos < $len;
	}
	elsif ($op == 4)
	{
		$t = substr($t, 0, $pos);
	}
	elsif ($op == 5)
	{
		# repeat a member of some object, after itself
		my @m;
		push @m, [ $-[0], $+[0] ] while $t =~ /"(?:[^"\\]|\\.)*"\s*:\s*(?:"(?:[^"\\]|\\.)*"|[-\w.+]+)/g;
		if (@m)
		{
			my ($s, $e) = @{ pick(@m) };
			substr($t, $e, 0) = ',' . substr($t, $s, $e - $s);
		}
	}
	elsif ($op == 6)
	{
		# a number swapped for an extreme one
		my @m;
		push @m, [ $-[0], $+[0] ] while $t =~ /-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?/g;
		if (@m)
		{
			my ($s, $e) = @{ pick(@m) };
			substr($t, $s, $e - $s) = pick(@numbers);
		}
	}
	elsif ($op == 7 && $len)
	{
		# a span copied elsewhere
		my $s = int(rand($len));
		substr($t, $pos, 0) = substr($t, $s, 1 + int(rand(20)));
	}
	else
	{
		$t = nest($t, pick(1, 2, 62, 63, 64, 65, 66, 100));
	}
	return $t;
}

my @seeds;
for my $name (qw(arrays french structures unicode values weird))
{
	push @seeds, slurp_file("$FindBin::RealBin/../data/rfc8785/input/$name.json");
}
# nesting near and past the fast path's limit (64) and far past the stack's
push @seeds, nest('1', $_) for (63, 64, 65, 128);
push @seeds, nest('{}', 63), nest('[]', 64), ('[' x 200000) . (']' x 200000),
  ('{"a":' x 100000) . '1' . ('}' x 100000);

my @texts = @seeds;
while (@texts < $COUNT)
{
	my $r = rand();
	my $t = $r < 0.4 ? gen_value(0) : $r < 0.6 ? pick(@seeds[0 .. 5]) : $texts[ int(rand(@texts)) ];
	$t = ws() . $t . ws() if rand() < 0.2;
	# mutate most of them, a few several times
	my $n = rand() < 0.3 ? 0 : 1 + int(rand(3));
	$t = mutate($t) for 1 .. $n;
	# keep the deep ones few
	next if length($t) > 100000 && rand() < 0.9;
	push @texts, $t;
}

my $dir = PostgreSQL::Test::Utils::tempdir;
my $file = "$dir/texts.txt";
open my $fh, '>', $file or die "could not write $file: $!";
for my $i (0 .. $#texts)
{
	utf8::downgrade($texts[$i]);
	print $fh $i + 1, "\t", unpack('H*', $texts[$i]), "\n";
}
close $fh;

# ---------- the checks, in the server ----------

my $node = idem_node('fuzz', init => [ extra => [ '--encoding=UTF8', '--locale=C' ] ], conf => qq{
idempotency.enable_worker = off
}, extension => 0);
$node->safe_psql('postgres',
	"CREATE DATABASE fuzz_ascii ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");

my $setup = q{
CREATE EXTENSION idempotency CASCADE;
SET search_path = public, idempotency;
CREATE TABLE texts (id int PRIMARY KEY, hex text NOT NULL);
CREATE TABLE problems (id int, check_name text, detail text);

-- what a text is as this database's text, or NULL where it cannot be
CREATE FUNCTION as_text(bytes bytea) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RETURN convert_from(bytes, current_setting('server_encoding'));
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
END $$;

-- one path's result, or the SQLSTATE of its error, as text
CREATE FUNCTION try_text(body text, ex text[], kind text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RETURN CASE kind
        WHEN 'text' THEN 'ok:' || CASE WHEN ex IS NULL THEN idem_canonical_json_text(body)
                                       ELSE idem_canonical_json_text(body, ex) END
        WHEN 'jsonb' THEN 'ok:' || CASE WHEN ex IS NULL THEN idem_canonical_json(body::jsonb)
                                        ELSE idem_canonical_json(body::jsonb, ex) END
        WHEN 'text_sha' THEN 'ok:' || encode(idem_canonical_json_text_sha256(body), 'hex')
        WHEN 'jsonb_sha' THEN 'ok:' || encode(idem_canonical_json_sha256(body::jsonb), 'hex')
        WHEN 'fingerprint' THEN 'ok:' || encode(idem_fingerprint('post', '/p', body::jsonb), 'hex')
        END;
EXCEPTION WHEN OTHERS THEN
    RETURN 'error:' || SQLSTATE;
END $$;

-- the documented SQLSTATEs of the canonicalizers: invalid JSON (22P02),
-- \u0000 or an escape the encoding cannot hold (22P05), a repeated member
-- name (22030), a number beyond a double's range (22003), nesting deeper
-- than the stack allows (54001); in a SQL_ASCII database, jsonb's refusal
-- of \u escapes above U+007F (0A000) and the canonicalizers' refusal of
-- bytes above 0x7F in names and strings (22021)
CREATE FUNCTION allowed(r text) RETURNS boolean LANGUAGE sql AS $$
    SELECT r LIKE 'ok:%' OR r IN ('error:22P02', 'error:22P05', 'error:22030', 'error:22003', 'error:54001')
        OR (r IN ('error:0A000', 'error:22021') AND current_setting('server_encoding') = 'SQL_ASCII')
$$;

CREATE FUNCTION sha_of(r text, prefix text DEFAULT '') RETURNS text LANGUAGE sql AS $$
    SELECT CASE WHEN r LIKE 'ok:%'
                THEN 'ok:' || encode(sha256(convert_to(prefix, 'UTF8') || textsend(substr(r, 4))), 'hex')
                ELSE r END
$$;

CREATE FUNCTION check_text(id int, body text) RETURNS SETOF problems LANGUAGE plpgsql AS $$
DECLARE
    ex CONSTANT text[] := '{/a,/*/0,/1,/~1,/*/*/b}';
    t text := try_text(body, NULL, 'text');
    j text := try_text(body, NULL, 'jsonb');
    r text;
    again text;
BEGIN
    FOREACH r IN ARRAY ARRAY[t, j] LOOP
        IF NOT allowed(r) THEN
            RETURN QUERY SELECT id, 'undocumented error', r;
        END IF;
    END LOOP;
    -- only the text path sees repeated names
    IF t IS DISTINCT FROM j AND t <> 'error:22030' THEN
        RETURN QUERY SELECT id, 'text and jsonb disagree', left(t, 200) || ' <> ' || left(j, 200);
    END IF;
    r := try_text(body, NULL, 'text_sha');
    IF r IS DISTINCT FROM sha_of(t) THEN
        RETURN QUERY SELECT id, 'text sha256 is not the hash of the text canonical form', r || ' <> ' || sha_of(t);
    END IF;
    r := try_text(body, NULL, 'jsonb_sha');
    IF r IS DISTINCT FROM sha_of(j) THEN
        RETURN QUERY SELECT id, 'jsonb sha256 is not the hash of the jsonb canonical form', r || ' <> ' || sha_of(j);
    END IF;
    r := try_text(body, NULL, 'fingerprint');
    IF r IS DISTINCT FROM sha_of(j, E'idem-fingerprint-v1\nPOST\n/p\n') THEN
        RETURN QUERY SELECT id, 'fingerprint is not the framed canonical form', r;
    END IF;
    IF t LIKE 'ok:%' THEN
        again := try_text(substr(t, 4), NULL, 'text');
        IF again IS DISTINCT FROM t THEN
            RETURN QUERY SELECT id, 'text output not canonical', left(t, 200) || ' -> ' || left(again, 200);
        END IF;
        again := try_text(substr(t, 4), NULL, 'jsonb');
        IF again IS DISTINCT FROM t THEN
            RETURN QUERY SELECT id, 'text output not canonical as jsonb', left(t, 200) || ' -> ' || left(again, 200);
        END IF;
    END IF;
    IF id % 4 = 0 THEN
        t := try_text(body, ex, 'text');
        j := try_text(body, ex, 'jsonb');
        IF NOT allowed(t) OR NOT allowed(j) THEN
            RETURN QUERY SELECT id, 'undocumented error with exclusions', t || ' / ' || j;
        END IF;
        IF t IS DISTINCT FROM j AND t <> 'error:22030' THEN
            RETURN QUERY SELECT id, 'text and jsonb disagree with exclusions', left(t, 200) || ' <> ' || left(j, 200);
        END IF;
    END IF;
END $$;
};

# A text becomes a row in texts; what the database cannot hold as text
# (invalid UTF-8 in the UTF-8 database, NUL bytes anywhere) is left out.
my %stats;
for my $db ('postgres', 'fuzz_ascii')
{
	$node->safe_psql($db, $setup);
	$node->safe_psql($db, "COPY texts FROM '$file'");
	my $res = $node->safe_psql($db, q{
		SET search_path = public, idempotency;
		CREATE TABLE bodies AS SELECT id, as_text(decode(hex, 'hex')) AS body FROM texts;
		INSERT INTO problems SELECT p.* FROM bodies, LATERAL check_text(id, body) p WHERE body IS NOT NULL;
		SELECT count(*) FILTER (WHERE body IS NOT NULL) || ' '
		       || count(*) FILTER (WHERE try_text(body, NULL, 'text') LIKE 'ok:%')
		FROM bodies});
	my ($checked, $canonical) = split / /, $res;
	my $problems = $node->safe_psql($db, q{
		SELECT check_name || ' (' || count(*) || '), e.g. text ' || min(id) || ': '
		       || (array_agg(detail ORDER BY id))[1]
		FROM problems GROUP BY check_name ORDER BY 1});
	is($problems, '', "$db: $checked texts (of $COUNT) checked, $canonical canonicalized; no check fails");
	note($node->safe_psql($db, q{
		SET search_path = public, idempotency;
		SELECT string_agg(r || ' ' || n, ', ' ORDER BY r) FROM (
		    SELECT CASE WHEN r LIKE 'ok:%' THEN 'canonical' ELSE r END AS r, count(*) AS n
		    FROM (SELECT try_text(body, NULL, 'text') AS r
		          FROM bodies WHERE body IS NOT NULL AND id % 10 = 0) t GROUP BY 1) s})
		  . ' (text path, every tenth text)');
	# the fuzzing reached both outcomes in quantity
	ok($canonical > $COUNT / 10 && $checked - $canonical > $COUNT / 10,
		"$db: both canonical forms and errors are common");
	if ($problems ne '')
	{
		my @ids = $node->safe_psql($db, 'SELECT DISTINCT id FROM problems ORDER BY 1 LIMIT 5') =~ /(\d+)/g;
		diag("text $_: " . unpack('H*', substr($texts[ $_ - 1 ], 0, 300))) for @ids;
	}
	$stats{$db} = $checked;
}
ok($stats{fuzz_ascii} > $stats{postgres}, 'the SQL_ASCII database takes texts that are not UTF-8');

# no crash: the server is the same one, and never restarted
my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal|server process .* was terminated/, 'no backend crashed');
is($node->safe_psql('postgres', 'SELECT 1'), '1', 'the server is up');

$node->stop;
done_testing();
