#!/usr/bin/env node
'use strict';
// idempotency-outbox: the outbox sender (../outbox.js) as a command.  Runs
// until SIGTERM or SIGINT, then stops leasing, finishes the sends in flight
// (bounded), gives back what it leased and did not send, and exits 0.  Bad
// arguments: a message on stderr, exit 2.

const { parseArgs } = require('node:util');
const { runOutbox, DEFAULTS } = require('../outbox');

const HELP = `Usage: idempotency-outbox --database URL [options]

Sends the operations of the idempotency extension's outbox (added with
idempotency.idem_outbox_add), each with its own Idempotency-Key, retrying
by the client rules, until SIGTERM or SIGINT.

  --database URL          the database (postgresql://user@host:port/db); or the
                          environment's DATABASE_URL
  --concurrency N         sends at a time (default ${DEFAULTS.concurrency})
  --lease-ms MS           lease of an operation (default ${DEFAULTS.leaseMs}); longer than
                          --timeout-ms by 1000 at least
  --timeout-ms MS         timeout of one attempt (default ${DEFAULTS.timeoutMs})
  --max-attempts N        attempts of an operation (default ${DEFAULTS.maxAttempts})
  --max-total-ms MS       time from the first attempt (default ${DEFAULTS.maxTotalMs})
  --base-ms MS            backoff: first interval (default ${DEFAULTS.baseMs})
  --cap-ms MS             backoff: largest interval (default ${DEFAULTS.capMs})
  --poll-ms MS            pause when nothing is due (default ${DEFAULTS.pollMs})
  --max-response-bytes N  response body kept (default ${DEFAULTS.maxResponseBytes})
  --quiet                 log the start, warnings and errors only
  --help                  this text

Logs go to stderr, one line each; keys are never logged (an operation is
named by its id and a hash of its key).
`;

const NUMBERS = {
  concurrency: 'concurrency', 'lease-ms': 'leaseMs', 'timeout-ms': 'timeoutMs', 'max-attempts': 'maxAttempts',
  'max-total-ms': 'maxTotalMs', 'base-ms': 'baseMs', 'cap-ms': 'capMs', 'poll-ms': 'pollMs',
  'max-response-bytes': 'maxResponseBytes',
};

class UsageError extends Error {}

// The command line as runOutbox's options and the database URL.
function parseCommandLine(argv, env) {
  const options = { database: { type: 'string' }, help: { type: 'boolean' }, quiet: { type: 'boolean' } };
  for (const name of Object.keys(NUMBERS)) options[name] = { type: 'string' };
  let values;
  try {
    ({ values } = parseArgs({ args: argv, options, strict: true, allowPositionals: false }));
  } catch (err) {
    throw new UsageError(err.message);
  }
  if (values.help) return { help: true };
  const database = values.database || env.DATABASE_URL;
  if (!database) throw new UsageError('--database URL is required (or DATABASE_URL in the environment)');
  const out = { database, quiet: !!values.quiet, options: {} };
  for (const [flag, name] of Object.entries(NUMBERS)) {
    if (values[flag] === undefined) continue;
    if (!/^[1-9]\d{0,11}$/.test(values[flag])) throw new UsageError(`--${flag} takes a positive integer, not "${values[flag]}"`);
    out.options[name] = Number(values[flag]);
  }
  return out;
}

function main() {
  let args;
  try {
    args = parseCommandLine(process.argv.slice(2), process.env);
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    process.stderr.write(`idempotency-outbox: ${err.message}\nTry idempotency-outbox --help.\n`);
    process.exit(2);
  }
  if (args.help) { process.stdout.write(HELP); return; }
  // a signal before the sender runs ends the process at once (nothing leased)
  let stop = () => process.exit(0);
  process.once('SIGTERM', () => stop('SIGTERM'));
  process.once('SIGINT', () => stop('SIGINT'));
  const pg = require('pg');
  const concurrency = args.options.concurrency || DEFAULTS.concurrency;
  const pool = new pg.Pool({ connectionString: args.database, max: Math.min(concurrency + 2, 50),
    application_name: 'idempotency-outbox' });
  const logger = (level, message, fields) => {
    if (args.quiet && level === 'info') return;
    process.stderr.write(`idempotency-outbox ${level}: ${message}${fields ? ` ${JSON.stringify(fields)}` : ''}\n`);
  };
  let handle;
  try {
    handle = runOutbox({ ...args.options, pool, logger });
  } catch (err) {
    process.stderr.write(`idempotency-outbox: ${err.message}\nTry idempotency-outbox --help.\n`);
    process.exit(2);
  }
  logger('notice', 'started', { pid: process.pid, concurrency });
  stop = (signal) => {
    logger('info', `${signal}: stopping`);
    handle.stop().then(() => pool.end()).then(() => process.exit(0), (err) => {
      logger('error', 'stopping failed', { error: err.message });
      process.exit(1);
    });
  };
}

if (require.main === module) main();

module.exports = { parseCommandLine, UsageError, HELP };
