# Every SQL example of the documentation runs, so that the documents cannot
# drift from the code.  The ```sql blocks of README.md, CHANGELOG.md,
# CONTRIBUTING.md and doc/*.md run in the order they appear, each file in a
# fresh database of its own, in one psql session per file that stops at the
# first error; a failure names the file and line of the block.
#
# Markers, as HTML comments (not shown when the Markdown is rendered):
#   <!-- norun: REASON -->   the next ```sql block is not run (a reason is
#                            required, e.g. it needs Citus or several servers)
#   <!-- sql-setup           SQL run at that place, before the next block
#   ...                      (the tables and psql variables an example
#   -->                      assumes)
# The extension is created first, unless the file's own blocks create it.
#
# The reference (doc/reference.md) is also checked against the installed
# extension: every function with its arguments, result and privileges,
# every view and table, every setting, and every SQLSTATE the code raises.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my @files = ('README.md', 'CHANGELOG.md', 'CONTRIBUTING.md', sort glob('doc/*.md'));
for my $f (@files)
{
	die "$f not found (the test runs from the top of the source tree)\n" unless -f $f;
}

# Read one Markdown file into a list of steps: [kind, line, text], kind
# 'sql' (a block shown), 'setup' (a hidden block) or 'norun' (with reason).
sub parse_markdown
{
	my ($file) = @_;
	open my $fh, '<', $file or die "cannot open $file: $!";
	my @lines = <$fh>;
	close $fh;
	my (@steps, $fence, $fence_indent, $block, $block_line, $setup,
		$setup_line, $norun, $norun_line);
	for my $n (1 .. @lines)
	{
		my $line = $lines[ $n - 1 ];
		if (defined $setup)
		{
			if ($line =~ /^\s*-->\s*$/)
			{
				push @steps, [ 'setup', $setup_line, $setup ];
				undef $setup;
			}
			else { $setup .= $line; }
			next;
		}
		if (defined $fence)
		{
			if ($line =~ /^(\s*)```\s*$/)
			{
				push @steps, [ $norun ? 'norun' : 'sql', $block_line, $block, $norun ]
				  if $fence eq 'sql';
				undef $fence;
				undef $norun;
			}
			elsif ($fence eq 'sql')
			{
				$line =~ s/^ {0,$fence_indent}//;
				$block .= $line;
			}
			next;
		}
		if ($line =~ /^(\s*)```\s*(\S*)\s*$/)
		{
			($fence_indent, $fence) = (length $1, $2);
			die "$file:$norun_line: a norun marker must be followed by a ```sql block\n"
			  if $norun && $fence ne 'sql';
			($block, $block_line) = ('', $n);
			next;
		}
		if ($line =~ /^\s*<!--\s*norun:(.*?)-->\s*$/)
		{
			my $reason = $1;
			$reason =~ s/^\s+|\s+$//g;
			die "$file:$n: a norun marker needs a reason\n" if $reason eq '';
			($norun, $norun_line) = ($reason, $n);
			next;
		}
		if ($line =~ /^\s*<!--\s*sql-setup\s*$/)
		{
			($setup, $setup_line) = ('', $n);
			next;
		}
		die "$file:$norun_line: a norun marker must be followed by a ```sql block\n"
		  if $norun && $line !~ /^\s*$/;
	}
	die "$file: a code block is not closed\n" if defined $fence;
	die "$file:$setup_line: a sql-setup comment is not closed\n" if defined $setup;
	return @steps;
}

my $node = idem_node('doc', conf => qq{
idempotency.enable_worker = off
}, extension => 0);

my ($shown, $skipped, $dbno) = (0, 0, 0);
for my $file (@files)
{
	my @steps = parse_markdown($file);
	my @run = grep { $_->[0] ne 'norun' } @steps;
	for my $s (grep { $_->[0] eq 'norun' } @steps)
	{
		note("$file:$s->[1]: not run: $s->[3]");
		$skipped++;
	}
	next unless grep { $_->[0] eq 'sql' } @run;
	$shown += grep { $_->[0] eq 'sql' } @run;

	my $db = 'doc_' . ++$dbno;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	my $script = "\\set ON_ERROR_STOP 1\n";
	$script .= "CREATE EXTENSION idempotency CASCADE;\n"
	  unless grep { $_->[2] =~ /CREATE\s+EXTENSION\s+(IF\s+NOT\s+EXISTS\s+)?idempotency\b/i } @run;
	for my $s (@run)
	{
		my $what = $s->[0] eq 'sql' ? 'block' : 'sql-setup comment';
		$script .= "\\echo '\@\@ $what at $file:$s->[1]'\n$s->[2]\n";
	}
	my ($stdout, $stderr);
	my $ok = IPC::Run::run(
		[ 'psql', '-X', '-q', '-d', $node->connstr($db), '-f', '-' ],
		'<', \$script, '>', \$stdout, '2>', \$stderr);
	my @at = $stdout =~ /^\@\@ (.*)$/mg;
	my $where = @at ? $at[-1] : "$file, before its first block";
	ok($ok, "the SQL examples of $file run (" . scalar(@run) . ' blocks)')
	  or diag("failed in the $where:\n$stderr");
}
# the parser found the examples: a count far below this means it missed them
cmp_ok($shown, '>=', 12, "$shown SQL examples were run ($skipped not run, each with its reason)");

# Links between the documents: each relative link names a file that
# exists and, after '#', one of its headings (as GitHub makes anchors).
my %anchors;
sub anchors_of
{
	my ($file) = @_;
	return $anchors{$file} if $anchors{$file};
	open my $in, '<', $file or die "$file: $!";
	my ($fence, %a) = (0);
	while (my $line = <$in>)
	{
		$fence = !$fence if $line =~ /^\s*```/;
		next if $fence || $line !~ /^#+ (.*?)\s*$/;
		my $slug = lc $1;
		$slug =~ s/[^\w\- ]//g;
		$slug =~ s/ /-/g;
		$a{$slug} = 1;
	}
	close $in;
	return $anchors{$file} = \%a;
}
my $links = 0;
for my $file (@files)
{
	open my $in, '<', $file or die "$file: $!";
	my ($fence, $n) = (0, 0);
	while (my $line = <$in>)
	{
		$n++;
		$fence = !$fence if $line =~ /^\s*```/;
		next if $fence;
		while ($line =~ /\]\(([^)\s]*)\)/g)
		{
			my $target = $1;
			next if $target =~ m{^[a-z]+:};    # http:, https:, mailto:
			my ($path, $anchor) = $target =~ /^([^#]*)(?:#(.*))?$/;
			my $dir = $file =~ m{^(.*)/} ? $1 : '.';
			my $dest = $path eq '' ? $file : "$dir/$path";
			$dest =~ s{^\./}{};
			1 while $dest =~ s{[^/.]+/\.\./}{};
			$links++;
			ok(-e $dest, "$file:$n: the link to $target names a file that exists")
			  or next;
			next unless defined $anchor && -f $dest;
			ok(anchors_of($dest)->{$anchor}, "$file:$n: the link to $target names a heading of $dest");
		}
	}
	close $in;
}
cmp_ok($links, '>=', 50, "$links links between the documents were checked");

# The reference against the installed extension.
open my $fh, '<', 'doc/reference.md' or die "doc/reference.md: $!";
my $ref = do { local $/; <$fh> };
close $fh;
$node->safe_psql('postgres', 'CREATE DATABASE doc_ref');
$node->safe_psql('doc_ref', 'CREATE EXTENSION idempotency CASCADE');

# functions: "| `name(arguments)` | `result` | roles |", arguments as
# pg_get_function_arguments gives them without the casts of defaults
my $functions = $node->safe_psql('doc_ref', q{
	SELECT p.proname || '(' ||
	       regexp_replace(regexp_replace(pg_get_function_arguments(p.oid),
	           '(DEFAULT [^,]*?)::[a-z ]+(\[\])?(,|$)', '\1\3', 'g'),
	           ', OUT .*$|^OUT .*$', '') || ')'
	       || E'\t' || pg_get_function_result(p.oid)
	       || E'\t' || CASE
	            WHEN has_function_privilege('idempotency_client', p.oid, 'EXECUTE') THEN 'idempotency_client'
	            WHEN has_function_privilege('idempotency_admin', p.oid, 'EXECUTE') THEN 'idempotency_admin'
	            ELSE 'owner' END
	FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
	WHERE n.nspname = 'idempotency' ORDER BY 1});
my %documented;
while ($ref =~ /^\| `(\w+\([^`]*\))` \| `([^`]+)` \| ([^|]+?) \|/mg)
{
	$documented{$1} = "$2\t$3";
}
my %installed;
for my $row (split /\n/, $functions)
{
	my ($sig, $result, $role) = split /\t/, $row;
	$installed{$sig} = 1;
	my $doc = $documented{$sig};
	ok(defined $doc, "doc/reference.md lists $sig");
	next unless defined $doc;
	my ($dresult, $droles) = split /\t/, $doc;
	is($dresult, $result, "doc/reference.md gives the result of $sig");
	like($droles, qr/\Q$role\E/, "doc/reference.md says who may call $sig ($role)");
}
ok($installed{$_}, "doc/reference.md lists $_, which the extension has")
  for sort keys %documented;

# views and tables: "| `idempotency.name` | view |" or "| table |"
my $relations = $node->safe_psql('doc_ref', q{
	SELECT c.relname || E'\t' || CASE c.relkind WHEN 'v' THEN 'view' ELSE 'table' END
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = 'idempotency' AND c.relkind IN ('r', 'p', 'v') AND NOT c.relispartition
	ORDER BY 1});
for my $row (split /\n/, $relations)
{
	my ($name, $kind) = split /\t/, $row;
	ok(scalar($ref =~ qr/^\| `idempotency\.\Q$name\E` \| $kind \|/m), "doc/reference.md lists the $kind idempotency.$name");
}

# settings: every idempotency.* the server knows (encryption_key is hidden
# from pg_settings), who may set it, and none the server does not know
my %set_by = (user => 'any role', superuser => 'superuser',
	sighup => 'server configuration (reload)', postmaster => 'server configuration (restart)');
my @settings = split /\n/, $node->safe_psql('doc_ref', q{
	SELECT name || E'\t' || context FROM pg_settings WHERE name LIKE 'idempotency.%'
	UNION SELECT E'idempotency.encryption_key\tsuperuser' ORDER BY 1});
cmp_ok(scalar(@settings), '>=', 17, 'the server lists the settings');
my %known;
for my $row (@settings)
{
	my ($name, $context) = split /\t/, $row;
	$known{$name} = 1;
	ok(scalar($ref =~ qr/^\| `\Q$name\E` \| [^|]+ \| \Q$set_by{$context}\E \|/m),
		"doc/reference.md lists the setting $name, set by $set_by{$context}");
}
my ($settings_section) = $ref =~ /^## Settings\n(.*?)^## /ms;
ok(defined $settings_section, 'doc/reference.md has a section Settings');
while (($settings_section // '') =~ /^\| `(idempotency\.[a-z_]+)` \| /mg)
{
	ok($known{$1}, "the setting $1 in doc/reference.md exists");
}

# SQLSTATEs: the IK codes of src/util.h and every standard condition
# raised in src/*.c and sql/parts/*.sql, in the tables of errors
my %codes;
for my $src (glob('src/*.c'), glob('src/*.h'), glob('sql/parts/*.sql'))
{
	open my $in, '<', $src or die "$src: $!";
	my $text = do { local $/; <$in> };
	close $in;
	$codes{"IK$1$2$3"} = $src while $text =~ /MAKE_SQLSTATE\('I','K','(\d)','(\d)','(\d)'\)/g;
	$codes{ lc($1) =~ s/^e_r_i_e_//r } = $src while $text =~ /errcode\(ERRCODE_(?!IDEM_)([A-Z0-9_]+)\)/g;
	$codes{$1} = $src while $text =~ /ERRCODE = '([0-9A-Z]{5}|[a-z_]+)'/g;
}
cmp_ok(scalar(keys %codes), '>=', 20, 'the sources raise errors');
for my $code (sort keys %codes)
{
	ok(scalar($ref =~ qr/^\| `\Q$code\E`|^\| `[0-9A-Z]{5}` `\Q$code\E`|^\| `\Q$code\E` `/m),
		"doc/reference.md lists the SQLSTATE $code (raised in $codes{$code})");
}

$node->stop;
done_testing();
