#!/usr/bin/perl
# test/bench/report.pl: the report of "make bench" (scripts/bench.sh).
#
#   report.pl latency LABEL NAME,NAME,... LOGFILE...
#       Reads pgbench per-transaction logs (-l: "client_id transaction_no
#       time_us script_no epoch epoch_us"), maps script number i to the i-th
#       NAME and prints one line per script:
#       lat <TAB> LABEL <TAB> NAME <TAB> transactions <TAB> avg_ms <TAB> p99_ms
#   report.pl render RESULTS.tsv RESULTS.md
#       Prints the table of latencies and ratios and writes RESULTS.md.  The
#       lines of RESULTS.tsv are "lat" lines as above, "meta KEY VALUE" and
#       "block NAME FILE" (a file included verbatim).  test/bench/notes.md,
#       the hand-written analysis, is appended to RESULTS.md.
use strict;
use warnings;
use File::Basename qw(dirname);

sub latency
{
	my ($label, $names, @files) = @_;
	my @names = split /,/, $names;
	my %lat;
	for my $f (@files)
	{
		open my $fh, '<', $f or die "$f: $!\n";
		while (<$fh>)
		{
			my @c = split;
			next unless @c >= 6;
			my ($us, $script) = @c[2, 3];
			next if $us eq 'skipped' || $us eq 'failed';
			push @{ $lat{$script} }, $us;
		}
	}
	for my $i (0 .. $#names)
	{
		my $v = $lat{$i} or next;
		my @s = sort { $a <=> $b } @$v;
		my $sum = 0;
		$sum += $_ for @s;
		my $p99 = $s[ int(0.99 * @s + 0.999999) - 1 ];
		printf "lat\t%s\t%s\t%d\t%.4f\t%.4f\n", $label, $names[$i], scalar @s,
		  $sum / @s / 1000, $p99 / 1000;
	}
}

# What each script does, for the report.
my %WHAT = (
	floor_roundtrip => 'floor_execute plus one empty statement (SELECT 1): what one more round trip costs, since claim and finish are two statements where the floor has one',
	floor_execute => 'business insert + one plain INSERT of the key row (constant fingerprint, response) into an unpartitioned table with a unique index; no check',
	plpgsql_execute => 'PL/pgSQL reference: claim (sha256 of body::text, INSERT ... ON CONFLICT DO NOTHING RETURNING) + business insert + finish (UPDATE to completed)',
	ext_execute => 'extension, atomic mode: idem_claim (fingerprint: see below) + business insert + idem_finish',
	plain_replay => 'primary-key lookup of a stored response row (status, headers, body)',
	plpgsql_replay => 'PL/pgSQL reference claim of a completed key (sha256 of the body, then the stored response)',
	ext_replay => 'extension idem_claim of a completed key, returning the stored response',
	ext_execute_merged => 'extension claim with the fingerprint sent (as the floor\'s constant); business insert with idem_finish in its RETURNING clause: as many statements as the floor',
	ext_execute_no_tombstones => 'as ext_execute, on an endpoint that keeps no tombstones of expired keys (tombstone_ttl 0): no tombstone probe',
	ext_replay_given_fp => 'as ext_replay, with the fingerprint sent as a parameter instead of computed in the statement',
	diag_none => 'execute path (claim, business insert, finish) without a request digest: the baseline of the diagnostics rows',
	diag_on => 'the same with digest => idem_request_digest(tenant, endpoint, key, body::jsonb, method, path): computed, checked and kept with the key',
	diag_endpoint_off => 'the same on an endpoint with diagnostics off: idem_request_digest returns NULL, nothing is kept',
	contention => '32 clients, 16 hot keys renewed every second, idem_claim(..., wait => 2 s); business insert + idem_finish only on execute',
);

my @RATIOS = (
	# title, label, script, label, script, target
	[ 'Execute: extension / floor, 1 client', '1 client', 'ext_execute', '1 client', 'floor_execute', 1.10 ],
	[ 'Execute: extension / PL/pgSQL reference, 1 client', '1 client', 'ext_execute', '1 client', 'plpgsql_execute', 0.85 ],
	[ 'Execute on the floor\'s footing (4 statements, fingerprint sent) / floor, 1 client', '1 client', 'ext_execute_merged', '1 client', 'floor_execute', 1.10 ],
	[ 'Replay: extension / plain lookup, 1 client', '1 client', 'ext_replay', '1 client', 'plain_replay', 1.10 ],
	[ 'Execute with tombstones / without, 1 client', '1 client', 'ext_execute', '1 client', 'ext_execute_no_tombstones', undef ],
	[ 'Replay, fingerprint sent by the application / plain lookup, 1 client', '1 client', 'ext_replay_given_fp', '1 client', 'plain_replay', 1.10 ],
	[ 'Floor + one round trip / floor, 1 client', '1 client', 'floor_roundtrip', '1 client', 'floor_execute', undef ],
	[ 'Execute: PL/pgSQL reference / floor, 1 client', '1 client', 'plpgsql_execute', '1 client', 'floor_execute', undef ],
	[ 'Execute: extension / floor, 8 clients', '8 clients', 'ext_execute', '8 clients', 'floor_execute', undef ],
	[ 'Execute: extension / PL/pgSQL reference, 8 clients', '8 clients', 'ext_execute', '8 clients', 'plpgsql_execute', undef ],
	[ 'Replay: extension / plain lookup, 8 clients', '8 clients', 'ext_replay', '8 clients', 'plain_replay', undef ],
	[ 'Replay: extension / PL/pgSQL reference, 1 client', '1 client', 'ext_replay', '1 client', 'plpgsql_replay', undef ],
	[ 'Round trip: execute path / floor, endpoint keeping tombstones', 'round trip', 'rt_ext', 'round trip', 'rt_floor', 1.05 ],
	[ 'Round trip: execute path / floor, endpoint with tombstone_ttl = 0', 'round trip', 'rt_ext_notomb', 'round trip', 'rt_floor', undef ],
	[ 'Round trip: tombstones kept / none', 'round trip', 'rt_ext', 'round trip', 'rt_ext_notomb', 1.02 ],
	[ 'Round trip: execute path / the PL/pgSQL a user writes instead', 'round trip', 'rt_ext', 'round trip', 'rt_ref', 0.85 ],
	[ 'Scale: @KEYS@ live keys / empty table', 'scale', 's_keys', 'scale', 's_base', 1.20 ],
	[ 'Scale: @MANY@ partitions / @FEW@', 'scale', 's_parts', 'scale', 's_base', 1.20 ],
	[ 'Execute / floor at @FEW@ partitions, 1 client, synchronous_commit off', 'scale', 's_base', 'scale', 's_base_floor', 1.05 ],
	[ 'Execute / floor at @MANY@ partitions, 1 client, synchronous_commit off', 'scale', 's_parts', 'scale', 's_parts_floor', 1.05 ],
	[ 'Execute / floor with @KEYS@ live keys (@FEW@ partitions), 1 client, synchronous_commit off', 'scale', 's_keys', 'scale', 's_keys_floor', undef ],
	[ 'Execute on the floor\'s footing / floor at @FEW@ partitions, 1 client, synchronous_commit off', 'scale', 's_base_merged', 'scale', 's_base_floor', undef ],
	[ 'Execute on the floor\'s footing / floor at @MANY@ partitions, 1 client, synchronous_commit off', 'scale', 's_parts_merged', 'scale', 's_parts_floor', undef ],
	[ 'Tombstones on / off, @TOMBS@ tombstones, 1 client, synchronous_commit off', 'tombstones', 'ext_execute', 'tombstones', 'ext_execute_no_tombstones', 1.02 ],
	[ 'Tombstones on / off, the same with an endpoint at tombstone_ttl 10 years', 'tombstones, 10-year endpoint', 'ext_execute', 'tombstones, 10-year endpoint', 'ext_execute_no_tombstones', 1.02 ],
	[ 'Execute, tombstones kept / floor, @TOMBS@ tombstones, 10-year endpoint', 'tombstones, 10-year endpoint', 'ext_execute', 'tombstones, 10-year endpoint', 'floor_execute', undef ],
	[ 'Fingerprint, 300 B body: canonical / built-in', 'fingerprint', 'fp_canonical_small', 'fingerprint', 'fp_builtin_small', 1.00 ],
	[ 'Fingerprint, 300 B text body: canonical / built-in', 'fingerprint', 'fp_canonical_text_small', 'fingerprint', 'fp_builtin_small', undef ],
	[ 'Fingerprint, 64 KB body: canonical / built-in', 'fingerprint', 'fp_canonical_large', 'fingerprint', 'fp_builtin_large', 1.00 ],
	[ 'Execute with mismatch diagnostics / without, 1 client', 'diagnostics', 'diag_on', 'diagnostics', 'diag_none', undef ],
	[ 'Execute, endpoint with diagnostics off / without a digest, 1 client', 'diagnostics', 'diag_endpoint_off', 'diagnostics', 'diag_none', undef ],
);

sub render
{
	my ($tsv, $md) = @_;
	my (%lat, @lat, %meta, @blocks, %ins, @ins, %insfn, %locks, %bytes);
	open my $fh, '<', $tsv or die "$tsv: $!\n";
	while (<$fh>)
	{
		chomp;
		my @c = split /\t/, $_, -1;
		if ($c[0] eq 'lat')
		{
			$lat{"$c[1]|$c[2]"} = [ @c[ 3 .. 5 ] ];
			push @lat, [ @c[ 1 .. 5 ] ];
		}
		elsif ($c[0] eq 'meta') { $meta{ $c[1] } = $c[2] }
		elsif ($c[0] eq 'ins') { $ins{"$c[1]/$c[2]"} = $c[3]; push @ins, "$c[1]/$c[2]" }
		elsif ($c[0] eq 'insfn') { $insfn{"$c[1]/$c[2]"}{ $c[3] } = $c[4] }
		elsif ($c[0] eq 'block') { push @blocks, [ $c[1], $c[2] ] }
		elsif ($c[0] eq 'locks') { $locks{ $c[1] } = [ @c[ 2 .. 7 ] ] }
		elsif ($c[0] eq 'bytes') { $bytes{ $c[1] } = [ @c[ 2 .. 6 ] ] }
	}
	close $fh;
	my %subst = (
		'@KEYS@' => fmt_count($meta{scale_keys}),
		'@MANY@' => $meta{parts_many} // '?',
		'@FEW@'  => $meta{parts_few}  // '?',
		'@TOMBS@' => fmt_count($meta{tomb_rows}));

	my @out;
	push @out, '# Benchmark results', '',
	  'Written by `make bench` (scripts/bench.sh, test/bench/report.pl); do not edit by hand:',
	  'the analysis at the end comes from test/bench/notes.md.', '';
	push @out, "- date: $meta{date}", "- server: $meta{version}",
	  "- cores (nproc): $meta{nproc}; load average at the end: $meta{load}",
	  "- mode: $meta{mode}; $meta{durations}; took $meta{elapsed}",
	  "- cluster settings (same for every script): $meta{settings}",
	  "- pgbench: `-M prepared`, per-transaction logs (`-l`), scripts of one table row mixed in one run (`-f script\@1` each)";
	push @out, "- idempotency.keys in database bench (execute, replay, contention): $meta{parts_main} dated partitions and the default partition"
	  if defined $meta{parts_main};
	for my $k (qw(learned fingerprint partitions tombstones scale_load scale_keys_size scale_sync tomb_db tomb_decade rt_db rt_missing locks bytes_on bytes_off core_missing fp_missing expiry_missing diagnostics diag_missing tomb_missing bytes_missing))
	{
		push @out, "- $k: $meta{$k}" if defined $meta{$k};
	}
	push @out, '';

	push @out, '## Ratios', '',
	  'Ratio of the average latencies of two scripts measured in the same run (p99 ratio for information).', '',
	  '| comparison | ratio (avg) | ratio (p99) | target | result |',
	  '| --- | ---: | ---: | ---: | --- |';
	for my $r (@RATIOS)
	{
		my ($title, $l1, $s1, $l2, $s2, $target) = @$r;
		$title =~ s/(\@\w+\@)/$subst{$1}/g;
		my ($a, $b) = ($lat{"$l1|$s1"}, $lat{"$l2|$s2"});
		my $t = defined $target ? sprintf('≤ %.2f×', $target) : '—';
		if (!$a || !$b || $b->[1] == 0)
		{
			push @out, "| $title | | | $t | not measured |";
			next;
		}
		my $ratio = $a->[1] / $b->[1];
		my $p99 = $b->[2] > 0 ? $a->[2] / $b->[2] : 0;
		# the round-trip workload: the range of the per-run ratios too
		if ($l1 eq 'round trip')
		{
			my @r;
			for my $i (1 .. ($meta{rt_runs} // 0))
			{
				my ($x, $y) = ($lat{"round trip $i|$s1"}, $lat{"round trip $i|$s2"});
				push @r, $x->[1] / $y->[1] if $x && $y && $y->[1] > 0;
			}
			my ($lo, $hi);
			for my $x (@r)
			{
				$lo = $x if !defined $lo || $x < $lo;
				$hi = $x if !defined $hi || $x > $hi;
			}
			$title .= sprintf(' (%d runs together; each run %.2f-%.2f×)', scalar @r, $lo, $hi) if @r;
		}
		my $res = !defined $target ? 'information' : ($ratio <= $target ? 'met' : '**missed**');
		push @out, sprintf('| %s | %.2f× | %.2f× | %s | %s |', $title, $ratio, $p99, $t, $res);
	}
	if (defined $meta{expiry_speedup} && $meta{expiry_speedup} =~ /^[\d.]+$/)
	{
		push @out, sprintf('| Expiry: dropping partitions against a batched DELETE (times faster) | %s× | | ≥ 50× | %s |',
			$meta{expiry_speedup}, $meta{expiry_speedup} >= 50 ? 'met' : '**missed**');
	}
	if (defined $meta{expiry_drop_dead} && $meta{expiry_drop_dead} =~ /^\d+$/)
	{
		push @out, sprintf('| Expiry: dead tuples left by dropping partitions | %s | | 0 | %s |',
			$meta{expiry_drop_dead}, $meta{expiry_drop_dead} == 0 ? 'met' : '**missed**');
	}
	for my $mode (qw(on off))
	{
		my $b = $bytes{$mode} or next;
		my ($rows, $trows, $heap, $wal) = @$b;
		next unless $rows;
		push @out, sprintf('| Expiry: bytes written per expired key, tombstones %s (heap + index %.1f, WAL %.1f; %s keys) | %.1f B | | %s | information |',
			$mode eq 'on' ? 'kept' : 'off', $heap / $rows, $wal / $rows, fmt_count($rows), ($heap + $wal) / $rows,
			'—');
	}
	for my $mode (qw(atomic lease))
	{
		my $l = $locks{$mode} or next;
		my ($n, $most, $mean, $fewest, $slow, $over) = @$l;
		next unless defined $over && $over =~ /^\d+$/;
		push @out, sprintf('| Relation locks per claim of a new key, %s mode, max_ttl 30 days, a 10-year tombstone endpoint: most of %d claims (mean %s, fewest %s; %s over 8, %s with a lock not fast-path) | %d | | ≤ 8, all fast-path | %s |',
			$mode, $n, $mean, $fewest, $over, $slow, $most, $most <= 8 && $slow == 0 ? 'met' : '**missed**');
	}
	if (defined $meta{cont_duplicates})
	{
		push @out, sprintf('| Contention: duplicate executions | %s | | 0 | %s |',
			$meta{cont_duplicates}, $meta{cont_duplicates} eq '0' ? 'met' : '**missed**');
	}
	push @out, '';

	push @out, '## Latencies', '',
	  '| run | script | transactions | avg ms | p99 ms |', '| --- | --- | ---: | ---: | ---: |';
	for my $l (@lat)
	{
		my ($label, $script, $n, $avg, $p99) = @$l;
		my $name = $script;
		$name .= " ($meta{parts_few} partitions, empty)" if $script eq 's_base';
		$name .= " ($meta{parts_few} partitions, " . fmt_count($meta{scale_keys}) . ' live keys)' if $script eq 's_keys';
		$name .= " ($meta{parts_many} partitions, empty)" if $script eq 's_parts';
		$name = "floor_execute (in $1)" if $script =~ /^(s_\w+)_floor$/;
		$name = "ext_execute_merged (in $1)" if $script =~ /^(s_\w+)_merged$/;
		push @out, sprintf('| %s | %s | %d | %.3f | %.3f |', $label, $name, $n, $avg, $p99);
	}
	push @out, '';

	if (@ins)
	{
		push @out, '## Instruction counts (BENCH_CALLGRIND=1)', '',
		  'Server-side instructions per transaction under callgrind (difference of runs of 100 and 600',
		  'transactions of one client, so connection start-up is left out).  Stable on a noisy machine,',
		  'but blind to waits: WAL flushes, round trips and cache misses are not in them.', '',
		  'Columns after the total: inclusive counts of functions within it (lookup: IdemKeystoreRead;',
		  'tombstones: IdemTombstoneFind, the probe of the tombstones of expired keys;',
		  'insert: IdemKeystoreInsert; CHECK: ExecConstraints; jsonb_in: parsing the JSON parameters, in every',
		  'script that takes one).', '',
		  '| database/script | instructions | idem_claim | of which lookup | of which tombstones | idem_finish | of which insert | of which CHECK | canonical fingerprint | jsonb_in |',
		  '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |';
		for my $k (@ins)
		{
			my $f = $insfn{$k} // {};
			push @out, sprintf('| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |', $k, map { defined $_ ? fmt_int($_) : '' }
				$ins{$k}, $f->{idem_claim}, $f->{IdemKeystoreRead}, $f->{IdemTombstoneFind}, $f->{idem_finish}, $f->{IdemKeystoreInsert},
				($k =~ /ext_execute/ ? $f->{ExecConstraints} : undef),
				$f->{idem_canonical_json_sha256} // $f->{idem_canonical_json_text_sha256}, $f->{jsonb_in});
		}
		push @out, '', '| comparison | instruction ratio |', '| --- | ---: |';
		for my $r ([ 'Execute: extension / floor', 'bench/ext_execute', 'bench/floor_execute' ],
			[ 'Execute: extension / PL/pgSQL reference', 'bench/ext_execute', 'bench/plpgsql_execute' ],
			[ 'Execute on the floor\'s footing / floor', 'bench/ext_execute_merged', 'bench/floor_execute' ],
			[ 'Execute with tombstones / without', 'bench/ext_execute', 'bench/ext_execute_no_tombstones' ],
			[ 'Replay: extension / plain lookup', 'bench/ext_replay', 'bench/plain_replay' ],
			[ 'Replay, fingerprint sent / plain lookup', 'bench/ext_replay_given_fp', 'bench/plain_replay' ],
			[ "Scale: $subst{'@MANY@'} partitions / $subst{'@FEW@'}", 's_parts/ext_execute', 's_base/ext_execute' ],
			[ "Tombstones on / off, $subst{'@TOMBS@'} tombstones, 10-year endpoint (s_tomb)", 's_tomb/ext_execute', 's_tomb/ext_execute_no_tombstones' ],
			[ 'Execute with mismatch diagnostics / without', 's_diag/diag_on', 's_diag/diag_none' ],
			[ 'Execute, endpoint with diagnostics off / without a digest', 's_diag/diag_endpoint_off', 's_diag/diag_none' ],
			[ 'Round trip: ext_pay / floor_pay', 's_rt/ext', 's_rt/floor' ],
			[ 'Round trip: ext_pay_notomb / floor_pay', 's_rt/ext_notomb', 's_rt/floor' ],
			[ 'Round trip: ext_pay / ext_pay_notomb', 's_rt/ext', 's_rt/ext_notomb' ])
		{
			my ($t, $x, $y) = @$r;
			next unless $ins{$x} && $ins{$y};
			push @out, sprintf('| %s | %.2f× |', $t, $ins{$x} / $ins{$y});
		}
		# issue 39's target: the tombstone check at most 2% of the floor
		if ($ins{'s_rt/ext'} && $ins{'s_rt/ext_notomb'} && $ins{'s_rt/floor'})
		{
			push @out, sprintf('| Round trip: (ext_pay - ext_pay_notomb) / floor_pay | %.1f%% |',
				100 * ($ins{'s_rt/ext'} - $ins{'s_rt/ext_notomb'}) / $ins{'s_rt/floor'});
		}
		push @out, '';
	}

	if (defined $meta{cont_actions})
	{
		my @a = map { [ split /=/ ] } split / /, $meta{cont_actions};
		my $total = 0;
		$total += $_->[1] for @a;
		push @out, '## Contention', '',
		  "32 clients, 16 hot keys renewed every second ($meta{cont_keys} distinct keys raced for), claims with `wait => 2 s`:",
		  '',
		  '| action | claims | share |', '| --- | ---: | ---: |';
		push @out, sprintf('| %s | %d | %.1f%% |', $_->[0], $_->[1], 100 * $_->[1] / $total) for @a;
		push @out, '', "Business rows written: $meta{cont_business_rows}; duplicate executions (business rows beyond the first per key): $meta{cont_duplicates}.", '';
	}

	for my $b (@blocks)
	{
		my ($name, $file) = @$b;
		push @out, "## \u$name benchmark (output of its script)", '', '```';
		if (open my $bf, '<', $file)
		{
			while (<$bf>) { chomp; push @out, $_ }
		}
		push @out, '```', '';
	}

	push @out, '## What each script does', '';
	push @out, '- Every script that executes a request writes the same business row: one `INSERT INTO payments (id, tenant, amount, currency, idempotency_key)`.',
	  '- New keys: `\'k\' || hash_murmur2(u)` where `u` is unique per transaction (run, client and a per-client counter, computed by pgbench, so no script pays for it on the server); murmur2 is a bijection on 64-bit values, so keys never repeat and land at random places in the indexes, as UUID keys do.',
	  '- The request body (about 300 bytes) and the response body (about 80 bytes) are bound parameters, the same in every script.';
	for my $s (qw(floor_execute floor_roundtrip plpgsql_execute ext_execute plain_replay plpgsql_replay ext_replay contention))
	{
		push @out, "- `$s`: $WHAT{$s}";
	}
	push @out, '- scale: `ext_execute` mixed with `floor_execute` and `ext_execute_merged` in three databases measured in alternating rounds with 1 client (pgbench runs against one database at a time), `synchronous_commit = off`.',
	  "- tombstones: `ext_execute`, `ext_execute_no_tombstones` ($WHAT{ext_execute_no_tombstones}) and `floor_execute` mixed, 1 client, in database s_tomb, before and after an endpoint at `tombstone_ttl = '10 years'` is added.",
	  '- locks: test/bench/locks.sql, claims of new keys in s_tomb (each in its own transaction), counted from `pg_locks` inside the transaction.',
	  '- bytes: test/bench/expiry_bytes.sql, a maintenance pass dropping the partition of expired keys, measured with relation sizes and `pg_current_wal_lsn()` around it.',
	  '';

	my $notes = dirname($0) . '/notes.md';
	if (open my $nf, '<', $notes)
	{
		local $/;
		push @out, '## Analysis (test/bench/notes.md)', '', <$nf>;
	}

	my $text = join("\n", @out) . "\n";
	open my $o, '>', $md or die "$md: $!\n";
	print $o $text;
	close $o;

	# the terminal gets the tables only
	my $show = 1;
	for (@out)
	{
		$show = 0 if /^## What each script does/;
		print "$_\n" if $show;
	}
}

sub fmt_int
{
	my $n = reverse shift;
	$n =~ s/(\d{3})(?=\d)/$1,/g;
	return scalar reverse $n;
}

sub fmt_count
{
	my $n = shift // return '?';
	return sprintf('%g million', $n / 1e6) if $n >= 1e6;
	return $n;
}

my $mode = shift // '';
if ($mode eq 'latency') { latency(@ARGV) }
elsif ($mode eq 'render') { render(@ARGV) }
else { die "usage: report.pl latency LABEL NAMES LOGFILE... | render RESULTS.tsv RESULTS.md\n" }
