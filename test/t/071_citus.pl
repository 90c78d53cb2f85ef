# The groundwork of the Citus mode (README "Scaling out"): a coordinator and
# two workers with shared_preload_libraries = 'citus,idempotency' start,
# take both extensions, and a claim on the coordinator works, on the
# coordinator's own local table of keys (no Citus mode yet).
#
# Citus is built once into a cache by scripts/citus.sh and copied into the
# private PostgreSQL copy by make test; the test skips where that could not
# be done (no source release, a server Citus does not support).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

plan skip_all => "Citus is not available: $ENV{IDEM_SKIP_CITUS}"
  if $ENV{IDEM_SKIP_CITUS};

my $coord = PostgreSQL::Test::Cluster->new('citus_coordinator');
my $sharedir = $coord->config_data('--sharedir');
plan skip_all =>
  "Citus is not installed for this server ($sharedir/extension/citus.control is missing; make test builds it with scripts/citus.sh)"
  unless -e "$sharedir/extension/citus.control";

my @workers = map { PostgreSQL::Test::Cluster->new("citus_worker$_") } 1 .. 2;
for my $node ($coord, @workers)
{
	$node->init;
	# citus must come first; the nodes reach each other over their sockets
	$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'citus,idempotency'
idempotency.maintenance_interval = 3600
citus.node_conninfo = 'sslmode=prefer'
max_connections = 40
});
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

# a claim on the coordinator: atomic, then its replay; lease mode
my $fp = q{sha256(convert_to('request', 'UTF8'))};
is($coord->safe_psql('postgres', qq{
BEGIN;
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments', 'k1', $fp);
SELECT idempotency.idem_finish('acme', 'POST /payments', 'k1', 201, '{"id": 1}');
COMMIT;
SELECT action || ' ' || response_status || ' ' || response_json::text
  FROM idempotency.idem_claim('acme', 'POST /payments', 'k1', $fp);
SELECT action || ' ' || (lease_token IS NOT NULL)
  FROM idempotency.idem_claim('acme', 'POST /payments', 'k2', $fp, lease => '1 minute');
}),
	"execute\n\nreplay 201 {\"id\": 1}\nexecute true",
	'a claim on the coordinator executes, then replays; lease mode too');

# the keys are the coordinator's local table: Citus does not distribute it
is($coord->safe_psql('postgres', q{
SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = 'idempotency.keys'::regclass}),
	'0', 'idempotency.keys is a local table of the coordinator');
is($coord->safe_psql('postgres',
	q{SELECT count(*) FROM idempotency.keys WHERE tenant = 'acme'}),
	'2', 'which holds the claims');

# Citus propagated CREATE EXTENSION to the workers
is($_->safe_psql('postgres', q{SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'}),
	'1', 'the worker ' . $_->name . ' has the extension too')
  for @workers;

# and so is every node's: the same request claimed on a worker executes
# again there (the double execution README "Scaling out" warns of)
is($workers[0]->safe_psql('postgres', qq{
SELECT action FROM idempotency.idem_claim('acme', 'POST /payments', 'k2', $fp, lease => '1 minute')}),
	'execute', 'a worker does not see the coordinator\'s keys: the same key executes there too');

$_->stop for @workers, $coord;
done_testing();
