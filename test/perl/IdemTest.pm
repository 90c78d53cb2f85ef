# What the TAP tests (test/t/*.pl) share: a cluster with the extension, the
# checks that skip a test where what it needs is missing, a script file for
# pgbench, the processes of a server, the invariants of a load of claims
# against a business table, the count of the partitions of keys, and a
# logical replica's subscription.
#
# The Makefile puts test/perl on prove's include path (PG_PROVE_FLAGS), so a
# test says "use IdemTest;" after PostgreSQL::Test::Cluster.
package IdemTest;

use strict;
use warnings;
use Exporter 'import';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

our @EXPORT = qw(idem_node server_major skip_unless_client_as_new
  skip_unless_installed write_script child_pids wait_until_gone
  claim_load_checks key_partitions subscribe_all);

# SQL: the number of partitions of idempotency.keys, the default one included
our $KEY_PARTITIONS =
  q{SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency.keys'::regclass};

# A cluster named $name, initialized and started with the library preloaded
# and CREATE EXTENSION idempotency CASCADE run in its database postgres.
# Options:
#   conf => '...'          more lines of postgresql.conf
#   init => [ ... ]        the arguments of init (allows_streaming => 1, ...)
#   preload => 'list'      shared_preload_libraries ('idempotency' by
#                          default; 0 or '' for none)
#   extension => 0         no CREATE EXTENSION
#   install_path => '...'  another installation (PostgreSQL::Test::Cluster)
sub idem_node
{
	my ($name, %opt) = @_;
	my $preload = exists $opt{preload} ? $opt{preload} : 'idempotency';
	my $node = PostgreSQL::Test::Cluster->new($name,
		defined $opt{install_path} ? (install_path => $opt{install_path}) : ());
	$node->init(@{ $opt{init} || [] });
	my $conf = $preload ? "shared_preload_libraries = '$preload'\n" : '';
	$conf .= $opt{conf} if defined $opt{conf};
	$node->append_conf('postgresql.conf', $conf) if $conf ne '';
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION idempotency CASCADE')
	  unless exists $opt{extension} && !$opt{extension};
	return $node;
}

# The major version of the server under test (pg_config in PATH, as
# PostgreSQL::Test::Cluster finds it).
sub server_major
{
	my ($version) = run_command([ 'pg_config', '--version' ]);
	my ($major) = $version =~ /(\d+)/;
	return $major;
}

# Skip the whole test where the client program $program (pg_dump,
# pg_basebackup) is older than the server: it refuses a newer server (the
# PostgreSQL 17 of scripts/pg17.sh is driven by PostgreSQL 15's clients).
# $verb says what it would do ("dump", "copy").
sub skip_unless_client_as_new
{
	my ($program, $verb) = @_;
	my $server = server_major();
	my ($client) = `$program --version` =~ /(\d+)/;
	plan skip_all => "$program $client cannot $verb a PostgreSQL $server server"
	  if $client < $server;
	return;
}

# Skip the whole test where something it needs is not installed: first when
# make test said why in the environment variable $opt{env} ("$what is not
# available: REASON"), then when the file $opt{file} is missing from the
# installation's folder $opt{dir} (a pg_config option: --sharedir,
# --pkglibdir): "$what is not installed for this server ($opt{missing})",
# where $opt{missing} may name the path as %s.
sub skip_unless_installed
{
	my ($what, %opt) = @_;
	plan skip_all => "$what is not available: $ENV{$opt{env}}"
	  if defined $opt{env} && $ENV{ $opt{env} };
	return unless defined $opt{file};
	my ($dir) = run_command([ 'pg_config', $opt{dir} ]);
	chomp $dir;
	my $path = "$dir/$opt{file}";
	plan skip_all => "$what is not installed for this server ("
	  . sprintf($opt{missing} // '%s is missing', $path) . ')'
	  unless -e $path;
	return;
}

# Write $text to $dir/$name.sql (a pgbench script); returns the path.
sub write_script
{
	my ($dir, $name, $text) = @_;
	my $path = "$dir/$name.sql";
	open my $fh, '>', $path or die "could not write $path: $!";
	print $fh $text;
	close $fh;
	return $path;
}

# The pids of a process's children (a postmaster's: its backends and
# auxiliary processes).
sub child_pids
{
	my ($ppid) = @_;
	my @pids;
	for my $stat (glob '/proc/[0-9]*/stat')
	{
		open my $fh, '<', $stat or next;
		my $line = <$fh>;
		close $fh;
		push @pids, $1 if defined $line && $line =~ /^(\d+) \(.*\) \S+ (\d+) / && $2 == $ppid;
	}
	return @pids;
}

# Wait up to $seconds until none of the processes @$pids is left; returns
# whether they are all gone.
sub wait_until_gone
{
	my ($pids, $seconds) = @_;
	for (1 .. $seconds * 10)
	{
		return 1 unless grep { kill 0, $_ } @$pids;
		select(undef, undef, undef, 0.1);
	}
	return !grep { kill 0, $_ } @$pids;
}

# The invariants of a load of claims (tenant 't', endpoints 'POST /atomic'
# and others) whose executions each insert a row (id, endpoint, key) into a
# business table biz and finish with the response {"id": id}: each a query
# giving the number of rows that break it, by name.
sub claim_load_checks
{
	return (
		'no business row lacks its completed key' => q{
		SELECT count(*) FROM biz b
		WHERE NOT EXISTS (SELECT 1 FROM idempotency.keys k
		                  WHERE k.tenant = 't' AND k.endpoint = b.endpoint AND k.key = b.key
		                    AND k.state = 'completed')},
		'no completed key lacks its business row' => q{
		SELECT count(*) FROM idempotency.keys k
		WHERE k.state = 'completed'
		  AND NOT EXISTS (SELECT 1 FROM biz b WHERE b.endpoint = k.endpoint AND b.key = k.key)},
		'no key has two business rows' => q{
		SELECT count(*) FROM (SELECT 1 FROM biz GROUP BY endpoint, key HAVING count(*) > 1) d},
		'an atomic-mode key is completed or absent' => q{
		SELECT count(*) FROM idempotency.keys WHERE endpoint = 'POST /atomic' AND state <> 'completed'},
		'every key answers a claim as its state says' => q{
		SELECT count(*)
		FROM idempotency.keys k
		LEFT JOIN biz b ON b.endpoint = k.endpoint AND b.key = k.key,
		LATERAL idempotency.idem_claim(k.tenant, k.endpoint, k.key, k.fingerprint) c
		WHERE NOT coalesce(CASE k.state
		    WHEN 'completed' THEN c.action = 'replay' AND (c.response_json->>'id')::bigint = b.id
		    WHEN 'unknown' THEN c.action = 'pending'
		    WHEN 'in_progress' THEN c.action = 'in_progress'
		    END, false)},
	);
}

# The number of partitions of idempotency.keys in $db (postgres), the
# default one included.
sub key_partitions
{
	my ($node, $db) = @_;
	return $node->safe_psql($db // 'postgres', $KEY_PARTITIONS);
}

# Subscribe $green (database postgres) to every table of $blue's, as
# doc/operations.md's blue/green switch-over does: a publication FOR ALL
# TABLES with publish_via_partition_root, green's own diagnostics secret
# removed so that it takes blue's with the initial copy, and a wait until
# that copy is done (one passing test).
sub subscribe_all
{
	my ($blue, $green) = @_;

	$blue->safe_psql('postgres', q{
SET client_min_messages = warning;
CREATE PUBLICATION blue FOR ALL TABLES WITH (publish_via_partition_root = true);
});
	$green->safe_psql('postgres', 'DELETE FROM idempotency.diagnostics_secret');
	my $blue_connstr = $blue->connstr . ' dbname=postgres';
	$green->safe_psql('postgres',
		"CREATE SUBSCRIPTION green CONNECTION '$blue_connstr' PUBLICATION blue");
	ok( $green->poll_query_until('postgres',
			q{SELECT count(*) = 0 FROM pg_subscription_rel WHERE srsubstate NOT IN ('r', 's')}),
		'the initial copy is done');
	return;
}

1;
