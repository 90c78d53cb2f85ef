'use strict';
// idempotentFunction(options, fn): a worker's or queue consumer's function
// run once per message key (as AWS Powertools' idempotent_function).  The
// key comes from the message (options.key, by default msg.id: never a hash
// of the body); the claim (idem_claim) and fn(msg, { client }) run in one
// transaction on one pooled client, fn's JSON result is stored with
// idem_finish and the transaction committed: a redelivery replays the
// stored result without calling fn.  Lease mode (options.lease) is for work
// outside the database: the claim commits a lease, a heartbeat keeps it,
// and the result is stored with the lease's token.

const SQL_CLAIM = `SELECT action, error_code, retry_after, response_json, lease_token::text AS lease_token
  FROM idempotency.idem_claim($1, $2, $3, idempotency.idem_fingerprint('CALL', $2, $4::jsonb),
       $5::interval, $6::interval, $7::interval)`;
// the tenant: the option, else the session's bound tenant, else 'default'
const SQL_TENANT = "SELECT coalesce(nullif(current_setting('idempotency.tenant', true), ''), 'default') AS t";
const SQL_FINISH = 'SELECT idempotency.idem_finish($1, $2, $3, 200, $4::jsonb, NULL, $5::bigint)';
const SQL_HEARTBEAT = 'SELECT idempotency.idem_heartbeat($1, $2, $3, $4::bigint, $5::interval)';
const SQL_FAIL = "SELECT idempotency.idem_fail($1, $2, $3, 'unknown', $4, $5::bigint)";
const SQL_RELEASE = 'SELECT idempotency.idem_release($1, $2, $3, $4::bigint)';
const SQL_LEASE_MS = "SELECT extract(epoch FROM $1::interval) * 1000 AS ms";

// A claim that did not let fn run: code is the claim's error code
// (idempotency_key_reuse: another payload under this key; request_in_progress:
// a duplicate still runs, retryable, retryAfter seconds; outcome_pending: an
// earlier run failed or its outcome is unknown; key_expired).
class IdempotentFunctionError extends Error {
  constructor(code, message, { retryable = false, retryAfter = null, key = null } = {}) {
    super(message);
    this.name = 'IdempotentFunctionError';
    this.code = code;
    this.retryable = retryable;
    this.retryAfter = retryAfter;
    this.key = key;
  }
}

const MESSAGES = {
  mismatch: 'this key was used with a different payload: a new message needs a new key',
  in_progress: 'a delivery of this message is still running: retry later',
  pending: 'an earlier run of this message failed or its outcome is unknown: an operator must resolve the key',
  expired: 'this key expired: a redelivery that must run again needs a new key',
};

function claimError(c, key) {
  const message = MESSAGES[c.action] || `unexpected claim action ${c.action}`;
  return new IdempotentFunctionError(c.error_code || c.action, message,
    { retryable: c.action === 'in_progress', retryAfter: c.retry_after, key });
}

function functionOptions(options) {
  const o = { key: (msg) => msg && msg.id, payload: (msg) => msg, tenant: null, ttl: null, lease: null, wait: null,
    heartbeatMs: null, ...options };
  if (!o.pool || typeof o.pool.connect !== 'function') {
    throw new TypeError('idempotentFunction: options.pool (a pg.Pool) is required');
  }
  if (typeof o.endpoint !== 'string' || !o.endpoint) {
    throw new TypeError('idempotentFunction: options.endpoint (a string naming the function) is required');
  }
  for (const name of ['key', 'payload']) {
    if (typeof o[name] !== 'function') {
      throw new TypeError(`idempotentFunction: options.${name} is a function of the message`);
    }
  }
  for (const name of ['ttl', 'lease', 'wait']) {
    if (typeof o[name] === 'number') o[name] = `${o[name]} seconds`;
    if (o[name] !== null && typeof o[name] !== 'string') {
      throw new TypeError(`idempotentFunction: options.${name} is an interval ('30 seconds') or a number of seconds`);
    }
  }
  return o;
}

// The claim's terms of one message: tenant, key, payload (JSON text).
async function termsOf(o, msg, client) {
  const key = o.key(msg);
  if (key === undefined || key === null || key === '') {
    throw new TypeError('idempotentFunction: the message has no key (options.key returned nothing; msg.id by default)');
  }
  let tenant = typeof o.tenant === 'function' ? await o.tenant(msg) : o.tenant;
  if (tenant == null) tenant = (await client.query(SQL_TENANT)).rows[0].t;
  const payload = JSON.stringify(o.payload(msg));
  return { tenant, key: String(key), payload: payload === undefined ? null : payload };
}

const resultJson = (result) => {
  const text = JSON.stringify(result);
  return text === undefined ? null : text;
};

// Atomic mode: claim, fn and finish in one transaction on one client.
async function runAtomic(o, fn, msg) {
  const client = await o.pool.connect();
  let broken;
  try {
    const t = await termsOf(o, msg, client);
    await client.query('BEGIN');
    try {
      const c = (await client.query(SQL_CLAIM, [t.tenant, o.endpoint, t.key, t.payload, o.ttl, null, o.wait])).rows[0];
      if (c.action === 'replay') { await client.query('ROLLBACK'); return c.response_json; }
      if (c.action !== 'execute') throw claimError(c, t.key);
      const result = await fn(msg, { client, key: t.key, tenant: t.tenant, replayed: false });
      await client.query(SQL_FINISH, [t.tenant, o.endpoint, t.key, resultJson(result), c.lease_token]);
      await client.query('COMMIT');
      return result;
    } catch (err) {
      try { await client.query('ROLLBACK'); } catch (e) { broken = e; }
      throw err;
    }
  } finally {
    client.release(broken);
  }
}

// Lease mode: the claim commits a lease; fn runs outside any transaction
// of the claim, the heartbeat keeping the lease; the result is stored with
// the lease's token.  fn's failure marks the key unknown (duplicates get
// outcome_pending), or releases it when fn called noSideEffect().
async function runLeased(o, fn, msg) {
  let t;
  let c;
  const client = await o.pool.connect();
  try {
    t = await termsOf(o, msg, client);
    c = (await client.query(SQL_CLAIM, [t.tenant, o.endpoint, t.key, t.payload, o.ttl, o.lease, o.wait])).rows[0];
    if (o.heartbeatMs === null) {
      o.heartbeatMs = Math.max(100, Number((await client.query(SQL_LEASE_MS, [o.lease])).rows[0].ms) / 3);
    }
  } finally {
    client.release();
  }
  if (c.action === 'replay') return c.response_json;
  if (c.action !== 'execute') throw claimError(c, t.key);
  const args = [t.tenant, o.endpoint, t.key];
  const beat = setInterval(() => {
    o.pool.query(SQL_HEARTBEAT, [...args, c.lease_token, o.lease]).catch(() => {});
  }, o.heartbeatMs);
  let sideEffectFree = false;
  let result;
  try {
    const noSideEffect = () => { sideEffectFree = true; };
    result = await fn(msg, { key: t.key, tenant: t.tenant, leaseToken: c.lease_token, noSideEffect });
  } catch (err) {
    clearInterval(beat);
    if (sideEffectFree) await o.pool.query(SQL_RELEASE, [...args, c.lease_token]).catch(() => {});
    else await o.pool.query(SQL_FAIL, [...args, String(err && err.message).slice(0, 500), c.lease_token]).catch(() => {});
    throw err;
  }
  clearInterval(beat);
  await o.pool.query(SQL_FINISH, [...args, resultJson(result), c.lease_token]);
  return result;
}

// Wraps fn(msg, context): the returned async function runs it once per key.
function idempotentFunction(options, fn) {
  const o = functionOptions(options);
  if (typeof fn !== 'function') throw new TypeError('idempotentFunction: the second argument is the function to run');
  return (msg) => (o.lease ? runLeased(o, fn, msg) : runAtomic(o, fn, msg));
}

module.exports = { idempotentFunction, IdempotentFunctionError };
