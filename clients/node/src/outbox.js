'use strict';
// The outbox sender: runOutbox(options) leases due operations of the
// extension's outbox (idempotency.idem_outbox_lease, each lease in its own
// short transaction), sends each with its own Idempotency-Key and a fresh
// X-Request-Id, classifies the outcome by the shared retry rules
// (retry.js), and records it (idem_outbox_record): succeeded, failed,
// attention, or retry at now + Retry-After or the full-jitter backoff.
// stop() leases no more, waits for the sends in flight (bounded) and gives
// back what was leased and not sent.  Keys are never logged: an operation
// is named by its id and a short hash of its key.

const { randomUUID, createHash } = require('node:crypto');
const { classify, parseRetryAfter, nextDelay, isTimeout } = require('./retry');

const SQL_LEASE = `SELECT l.id::text AS id, l.key, l.method, l.url, l.body, l.headers, l.attempts,
       l.lease_token::text AS lease_token, l.first_attempt_at, pg_catalog.clock_timestamp() AS db_now
  FROM idempotency.idem_outbox_lease($1::integer, $2::float8 * interval '1 millisecond') l`;
// retry_at is reckoned on the database's clock, as the lease's due times are
const SQL_RECORD = `SELECT idempotency.idem_outbox_record($1::bigint, $2::bigint, $3, $4::integer, $5,
       pg_catalog.clock_timestamp() + $6::float8 * interval '1 millisecond', $7::jsonb, $8) AS ok`;
const SQL_RELEASE = 'SELECT idempotency.idem_outbox_release($1::bigint, $2::bigint) AS ok';

// headers the sender sets itself, whatever the operation's headers say
const OWN_HEADERS = new Set(['idempotency-key', 'x-request-id', 'content-length', 'host', 'connection']);

const DEFAULTS = Object.freeze({
  concurrency: 4, leaseMs: 30000, maxAttempts: 10, maxTotalMs: 24 * 3600 * 1000, timeoutMs: 10000,
  pollMs: 1000, baseMs: 1000, capMs: 300000, maxResponseBytes: 65536, stopTimeoutMs: null,
});

// A short, stable name of a key for the logs: never the key itself.
const keyHash = (key) => createHash('sha256').update(String(key)).digest('hex').slice(0, 12);

function defaultLogger(level, message, fields) {
  const extra = fields && Object.keys(fields).length ? ` ${JSON.stringify(fields)}` : '';
  process.stderr.write(`idempotency-outbox ${level}: ${message}${extra}\n`);
}

function outboxOptions(options) {
  const o = { ...DEFAULTS, fetch: globalThis.fetch, credentials: null, logger: defaultLogger, random: Math.random,
    ...options };
  if (!o.pool || typeof o.pool.query !== 'function') throw new TypeError('runOutbox: options.pool (a pg.Pool) is required');
  for (const name of ['concurrency', 'leaseMs', 'maxAttempts', 'maxTotalMs', 'timeoutMs', 'pollMs', 'baseMs', 'capMs',
    'maxResponseBytes']) {
    if (!(Number.isInteger(o[name]) && o[name] >= 1)) throw new TypeError(`runOutbox: options.${name} is an integer >= 1`);
  }
  if (o.concurrency > 10000) throw new TypeError('runOutbox: options.concurrency is at most 10000');
  if (o.leaseMs < o.timeoutMs + 1000) {
    throw new TypeError('runOutbox: options.leaseMs must exceed timeoutMs by at least 1000 ms (an attempt, and the ' +
      'recording of its outcome, must end before its lease lapses and another sender takes the operation over)');
  }
  if (typeof o.fetch !== 'function') throw new TypeError('runOutbox: no fetch (Node 18 or later, or options.fetch)');
  if (o.credentials !== null && typeof o.credentials !== 'function') {
    throw new TypeError('runOutbox: options.credentials is a function');
  }
  if (o.stopTimeoutMs === null) o.stopTimeoutMs = o.timeoutMs + 5000;
  return o;
}

// The request of one attempt: the operation's headers, the credentials'
// headers, the key as Idempotency-Key and a fresh X-Request-Id.
function requestOf(op, extraHeaders, timeoutMs) {
  const headers = {};
  for (const [k, v] of Object.entries({ ...op.headers, ...extraHeaders })) {
    if (!OWN_HEADERS.has(k.toLowerCase())) headers[k] = String(v);
  }
  const hasBody = op.body !== null && op.method !== 'GET';
  if (hasBody && !Object.keys(headers).some((k) => k.toLowerCase() === 'content-type')) {
    headers['Content-Type'] = 'application/json';
  }
  const requestId = randomUUID();
  headers['Idempotency-Key'] = op.key;
  headers['X-Request-Id'] = requestId;
  const init = { method: op.method, headers, redirect: 'manual', signal: AbortSignal.timeout(timeoutMs) };
  if (hasBody) init.body = JSON.stringify(op.body);
  return { init, requestId };
}

// At most `limit` bytes of a response's body, as text (NUL characters,
// which PostgreSQL's text cannot hold, replaced); the rest is not read.
async function readBounded(res, limit) {
  if (!res.body) return '';
  const reader = res.body.getReader();
  const chunks = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    size += value.length;
    if (size >= limit) { reader.cancel().catch(() => {}); break; }
  }
  const bytes = Buffer.concat(chunks).subarray(0, limit);
  return new TextDecoder('utf-8').decode(bytes).replace(/\u0000/g, '\ufffd');
}

// One attempt: the answer ({ status, headers, body, retryAfter }) or the
// error of an attempt without a whole answer in time ({ error }).
async function sendOnce(o, op) {
  let extra = {};
  try {
    if (o.credentials) extra = (await o.credentials({ refresh: false, operation: publicOp(op) })) || {};
  } catch (error) {
    // not sent: an attempt without an answer, retried within the bounds
    return { requestId: null, error: new Error(`the credentials hook failed: ${error.message}`, { cause: error }) };
  }
  const { init, requestId } = requestOf(op, extra, o.timeoutMs);
  try {
    const res = await o.fetch(op.url, init);
    const body = await readBounded(res, o.maxResponseBytes);
    const headers = {};
    res.headers.forEach((v, k) => { headers[k] = v; });
    return { requestId, status: res.status, headers, body, retryAfter: res.headers.get('retry-after') };
  } catch (error) {
    return { requestId, error };
  }
}

// What the hooks and the logs may see of an operation: not its key.
const publicOp = (op) => ({ id: op.id, method: op.method, url: op.url, attempts: op.attempts, keyHash: keyHash(op.key) });

// The operation's outcome after an attempt, by the shared rules: the final
// state, or 'retry' after delayMs.
async function decide(o, op, a) {
  const kind = classify(a.error || a.status);
  if (kind === 'success') return { kind, outcome: 'succeeded' };
  if (kind === 'fatal' || kind === 'new_key') return { kind, outcome: 'failed' };
  if (kind === 'refresh') {
    if (!o.credentials) return { kind, outcome: 'attention' };
    try {
      await o.credentials({ refresh: true, operation: publicOp(op) });
    } catch (err) {
      o.logger('warn', 'the credentials hook failed to refresh', { id: op.id, error: err.message });
    }
  }
  const retryAfter = a.error ? null : parseRetryAfter(a.retryAfter, Date.now());
  const elapsed = Date.now() + op.skewMs - new Date(op.first_attempt_at).getTime();
  const delayMs = nextDelay(retryAfter, op.attempts, elapsed, o);
  return delayMs === null ? { kind, outcome: 'attention' } : { kind, outcome: 'retry', delayMs };
}

function errorText(err) {
  const cause = err.cause && (err.cause.code || err.cause.message);
  return `${isTimeout(err) ? 'timeout' : 'network'}: ${err.message}${cause ? ` (${cause})` : ''}`;
}

// Send one leased operation and record its outcome.
async function processOne(o, op, counts) {
  const a = await sendOnce(o, op);
  const d = await decide(o, op, a);
  const final = d.outcome !== 'retry';
  const args = [op.id, op.lease_token, d.outcome, a.error ? null : a.status, a.error ? errorText(a.error) : null,
    final ? null : d.delayMs, final && !a.error ? JSON.stringify(a.headers) : null, final && !a.error ? a.body : null];
  const fields = { id: op.id, key_hash: keyHash(op.key), attempt: op.attempts, request_id: a.requestId,
    status: a.error ? null : a.status, kind: d.kind, outcome: d.outcome };
  if (a.error) fields.error = errorText(a.error);
  if (!final) fields.delay_ms = d.delayMs;
  let recorded;
  try {
    recorded = (await o.pool.query(SQL_RECORD, args)).rows[0].ok;
  } catch (err) {
    o.logger('error', 'could not record an attempt (its lease lapses; another sender sends it again, with the same key)',
      { ...fields, error: err.message });
    return;
  }
  counts[recorded ? d.outcome : 'lost'] = (counts[recorded ? d.outcome : 'lost'] || 0) + 1;
  if (!recorded) o.logger('warn', 'the lease was lost before the outcome was recorded (another sender took over)', fields);
  else o.logger(final && d.outcome !== 'succeeded' ? 'warn' : 'info', `attempt ${d.outcome}`, fields);
}

async function lease(o, n) {
  const { rows } = await o.pool.query(SQL_LEASE, [n, o.leaseMs]);
  const localNow = Date.now();
  for (const r of rows) r.skewMs = new Date(r.db_now).getTime() - localNow;
  return rows;
}

async function releaseAll(o, ops) {
  for (const op of ops) {
    try {
      await o.pool.query(SQL_RELEASE, [op.id, op.lease_token]);
    } catch (err) {
      o.logger('warn', 'could not release a lease (it lapses)', { id: op.id, error: err.message });
    }
  }
}

// A pause of ms, ended early by stop().
function pause(s, ms) {
  return new Promise((resolve) => {
    const t = setTimeout(done, ms);
    function done() { clearTimeout(t); s.wake = null; resolve(); }
    s.wake = done;
  });
}

async function loop(o, s) {
  while (!s.stopping) {
    const free = o.concurrency - s.inFlight.size;
    if (free <= 0) { await Promise.race([...s.inFlight, new Promise((r) => { s.wake = r; })]); continue; }
    let ops;
    try {
      ops = await lease(o, free);
    } catch (err) {
      o.logger('error', 'could not lease operations', { error: err.message, code: err.code });
      await pause(s, o.pollMs);
      continue;
    }
    if (s.stopping) { await releaseAll(o, ops); break; }
    for (const op of ops) {
      const p = processOne(o, op, s.counts)
        .catch((err) => o.logger('error', 'an attempt failed', { id: op.id, error: err.message }))
        .finally(() => s.inFlight.delete(p));
      s.inFlight.add(p);
    }
    if (ops.length === 0) await pause(s, o.pollMs);
  }
  await drain(o, s);
}

// Waits for the sends in flight, at most stopTimeoutMs; those still running
// keep their lease until it lapses.
async function drain(o, s) {
  if (!s.inFlight.size) return;
  let timer;
  const late = new Promise((r) => { timer = setTimeout(r, o.stopTimeoutMs, 'late'); });
  const r = await Promise.race([Promise.all([...s.inFlight]), late]);
  clearTimeout(timer);
  if (r === 'late') o.logger('warn', 'stopped with sends in flight; their leases lapse', { in_flight: s.inFlight.size });
}

const poolsWatched = new WeakSet();

// Runs the sender on options.pool until stop(); returns { stop, done, counts }.
function runOutbox(options) {
  const o = outboxOptions(options);
  if (!poolsWatched.has(o.pool) && typeof o.pool.on === 'function') {
    poolsWatched.add(o.pool);
    o.pool.on('error', (err) => o.logger('warn', 'idle database client lost', { error: err.message }));
  }
  const s = { stopping: false, inFlight: new Set(), wake: null, counts: {} };
  const done = loop(o, s);
  return {
    done,
    counts: s.counts,
    stop() {
      s.stopping = true;
      if (s.wake) s.wake();
      return done;
    },
  };
}

module.exports = { runOutbox, keyHash, DEFAULTS };
