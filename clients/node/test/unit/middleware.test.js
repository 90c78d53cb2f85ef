'use strict';
// The middleware against the extension: an Express 5 app on loopback,
// requests by fetch, the outcome read back from the database.  Needs
// IDEM_TEST_PGPORT (clients/test.sh sets it); skipped without it.

const test = require('node:test');
const assert = require('node:assert/strict');
const express = require('express');
const { idempotent } = require('../../src/index.js');

const { skip, serve } = require('../support');

const hooks = {}; // per-key test behaviour: hooks[key] = async (req, attempt) => ...
const runs = {}; // handler runs per key

function app() {
  const a = express();
  let delivery = 0;
  a.use((req, res, next) => { res.set('X-Delivery', String(++delivery)); next(); });
  const opts = (extra) => ({ pool: env.pool, tenant: (req) => req.get('x-tenant') || 'acme', wait: '10 seconds', ...extra });
  const handler = async (req, res) => {
    const key = req.get('idempotency-key') || `none-${Math.random()}`;
    runs[key] = (runs[key] || 0) + 1;
    const { client } = req.idempotency;
    const id = `ch_${runs[key]}_${key}`.slice(0, 60);
    await client.query('INSERT INTO charges (id, idem_key, amount) VALUES ($1, $2, $3)',
      [id, req.idempotency.key, Number(req.body && req.body.amount) || 0]);
    if (hooks[key]) await hooks[key](req, runs[key], res);
    if (res.headersSent || res.writableEnded) return;
    res.set('Request-Id', `req_${runs[key]}`);
    res.status(200).json({ id, object: 'charge', amount: Number(req.body.amount) });
  };
  a.post('/v1/charges', idempotent(opts({ exclude: ['/metadata/request_ts'] }), handler));
  a.post('/v1/hashed', idempotent(opts({ keyPolicy: 'hash' }), handler));
  a.post('/v1/required', idempotent(opts({ required: true }), handler));
  a.post('/ietf/orders', idempotent(opts({ profile: 'ietf', wait: '0 s' }), handler));
  a.post('/v1/nowait', idempotent(opts({ wait: '0 s' }), handler));
  a.post('/v1/lease', idempotent(opts({ lease: '2 seconds', heartbeatMs: 100 }), handler));
  a.post('/v1/charges/:id/capture', idempotent(opts(), handler));
  a.post('/v1/policy', idempotent(opts(), handler));
  a.post('/v1/expiring', idempotent(opts({ ttl: '1 second' }), handler));
  a.use((err, req, res, next) => { res.status(500).json({ error: { type: 'api_error', message: err.message } }); });
  return a;
}

const env = serve({
  max: 10,
  sql: [
    'CREATE TABLE IF NOT EXISTS charges (id text PRIMARY KEY, idem_key text, amount int)',
    "INSERT INTO idempotency.endpoints (endpoint, lease) VALUES ('POST /v1/policy', '30 seconds') ON CONFLICT DO NOTHING",
  ],
  app,
});

let n = 0;
const newKey = () => `k${process.pid}-${Date.now()}-${++n}`;
const post = (path, key, body, headers = {}) => fetch(env.base + path, {
  method: 'POST',
  headers: { ...(key !== null ? { 'Idempotency-Key': key } : {}), 'Content-Type': 'application/json', ...headers },
  body: typeof body === 'string' ? body : JSON.stringify(body),
});
const rows = async (key) => (await env.admin.query('SELECT id FROM charges WHERE idem_key = $1 ORDER BY id', [key])).rows.map((r) => r.id);

test('execute, then a retry gets the first response byte for byte', { skip }, async () => {
  const key = newKey();
  const r1 = await post('/v1/charges', key, { amount: 1000 });
  const b1 = await r1.text();
  assert.equal(r1.status, 200);
  assert.equal(r1.headers.get('idempotent-replayed'), null);
  const r2 = await post('/v1/charges', key, '{ "amount" : 1000.0 }');
  assert.equal(r2.status, 200);
  assert.equal(await r2.text(), b1);
  assert.equal(r2.headers.get('idempotent-replayed'), 'true');
  assert.equal(r2.headers.get('request-id'), 'req_1');
  // set before the middleware: per delivery, not stored
  assert.equal(Number(r2.headers.get('x-delivery')), Number(r1.headers.get('x-delivery')) + 1);
  assert.equal(r2.headers.get('content-type'), r1.headers.get('content-type'));
  assert.deepEqual(await rows(key), [JSON.parse(b1).id]);
  assert.equal(runs[key], 1);
});

test('the same key with another request: stripe 400 idempotency_error, ietf 422', { skip }, async () => {
  const key = newKey();
  assert.equal((await post('/v1/charges', key, { amount: 1 })).status, 200);
  const r = await post('/v1/charges', key, { amount: 2 });
  assert.equal(r.status, 400);
  assert.equal(r.headers.get('stripe-should-retry'), 'false');
  const e = (await r.json()).error;
  assert.equal(e.type, 'idempotency_error');
  // mismatch diagnostics: the member that differs is named, its values never
  assert.deepEqual(e.mismatch.changed, ['/amount']);
  assert.match(e.message, /changed: \/amount/);
  assert.doesNotMatch(JSON.stringify(e), /"amount":|: ?[12][,}]/);
  const k2 = newKey();
  assert.equal((await post('/ietf/orders', `"${k2}"`, { amount: 1, note: 'a' })).status, 200);
  const r2 = await post('/ietf/orders', k2, { amount: 1, items: [1] });
  assert.equal(r2.status, 422);
  assert.equal(r2.headers.get('content-type'), 'application/problem+json');
  const p2 = await r2.json();
  assert.equal(p2.status, 422);
  assert.deepEqual(p2.mismatch.added, ['/items']);
  assert.deepEqual(p2.mismatch.removed, ['/note']);
  assert.equal(p2.mismatch.path, false);
  assert.equal(runs[key], 1);
});

test('form bodies: excluded members do not count, others do', { skip }, async () => {
  const key = newKey();
  const form = (s) => post('/v1/charges', key, s, { 'Content-Type': 'application/x-www-form-urlencoded' });
  const r1 = await form('amount=500&currency=usd&metadata[request_ts]=1');
  assert.equal(r1.status, 200);
  const r2 = await form('currency=usd&metadata[request_ts]=2&amount=500');
  assert.equal(r2.status, 200);
  assert.equal(r2.headers.get('idempotent-replayed'), 'true');
  assert.equal((await form('amount=501&currency=usd&metadata[request_ts]=1')).status, 400);
  assert.equal(runs[key], 1);
});

test('an endpoint whose policy has a lease, without the lease option: finished in the same transaction', { skip }, async () => {
  const key = newKey();
  const r1 = await post('/v1/policy', key, { amount: 11 });
  assert.equal(r1.status, 200);
  const r2 = await post('/v1/policy', key, { amount: 11 });
  assert.equal(r2.headers.get('idempotent-replayed'), 'true');
  assert.equal(runs[key], 1);
});

test('an expired key on an endpoint that answers its reuse with a conflict: 409 key_expired, another body refused', { skip }, async () => {
  await env.admin.query("INSERT INTO idempotency.endpoints (endpoint, on_expired_reuse) VALUES ('POST /v1/expiring', 'conflict') "
    + "ON CONFLICT (endpoint) DO UPDATE SET on_expired_reuse = 'conflict'");
  const key = newKey();
  assert.equal((await post('/v1/expiring', key, { amount: 12 })).status, 200);
  await new Promise((r) => setTimeout(r, 1200));
  const r1 = await post('/v1/expiring', key, { amount: 12 });
  assert.deepEqual([r1.status, (await r1.json()).error.code, r1.headers.get('stripe-should-retry')], [409, 'key_expired', 'false']);
  const r2 = await post('/v1/expiring', key, { amount: 13 });
  assert.deepEqual([r2.status, (await r2.json()).error.code], [400, 'idempotency_key_reuse']);
  assert.equal(runs[key], 1);
});

test('a body the fingerprint refuses is a 400, not a 500', { skip }, async () => {
  const key = newKey();
  const r = await post('/v1/charges', key, '{"amount": 1e400}');
  assert.equal(r.status, 400);
  assert.equal((await r.json()).error.type, 'invalid_request_error');
  assert.equal(runs[key], undefined);
});

test('the route template names the endpoint; the concrete path is fingerprinted', { skip }, async () => {
  const key = newKey();
  assert.equal((await post('/v1/charges/ch_1/capture', key, { amount: 1 })).status, 200);
  const r = await post('/v1/charges/ch_2/capture', key, { amount: 1 });
  assert.equal(r.status, 400);
  const lk = await env.admin.query("SELECT state FROM idempotency.idem_lookup('acme', 'POST /v1/charges/:id/capture', $1)", [key]);
  assert.equal(lk.rows[0].state, 'completed');
});

test('a duplicate while the first runs: waits and replays, or 409 with Retry-After', { skip }, async () => {
  for (const [path, expectStatus] of [['/v1/charges', 200], ['/v1/nowait', 409]]) {
    const key = newKey();
    let release;
    const gate = new Promise((r) => { release = r; });
    let started;
    const running = new Promise((r) => { started = r; });
    hooks[key] = async () => { started(); await gate; };
    const first = post(path, key, { amount: 7 });
    await running;
    const second = post(path, key, { amount: 7 });
    if (expectStatus === 409) {
      const r = await second;
      assert.equal(r.status, 409);
      assert.ok(Number(r.headers.get('retry-after')) >= 1);
      assert.equal(r.headers.get('stripe-should-retry'), 'true');
      release();
      assert.equal((await first).status, 200);
    } else {
      setTimeout(release, 200);
      const [a, b] = await Promise.all([first, second]);
      assert.equal(a.status, 200);
      assert.equal(b.status, 200);
      assert.equal(b.headers.get('idempotent-replayed'), 'true');
      assert.equal(await b.text(), await a.text());
    }
    assert.equal(runs[key], 1);
    assert.equal((await rows(key)).length, 1);
  }
});

test('a handler that throws: rolled back, key given back, the retry executes', { skip }, async () => {
  const key = newKey();
  hooks[key] = async (req, run) => { if (run === 1) throw new Error('boom'); };
  const r1 = await post('/v1/charges', key, { amount: 3 });
  assert.equal(r1.status, 500);
  assert.deepEqual(await rows(key), []);
  const r2 = await post('/v1/charges', key, { amount: 3 });
  assert.equal(r2.status, 200);
  assert.equal((await rows(key)).length, 1);
});

test('an answer of 5xx is not stored; 4xx is', { skip }, async () => {
  const key = newKey();
  hooks[key] = async (req, run, res) => { if (run === 1) res.status(502).json({ error: 'upstream' }); else res.status(402).json({ error: 'card_declined' }); };
  assert.equal((await post('/v1/charges', key, { amount: 4 })).status, 502);
  assert.deepEqual(await rows(key), []);
  assert.equal((await post('/v1/charges', key, { amount: 4 })).status, 402);
  const r = await post('/v1/charges', key, { amount: 4 });
  assert.equal(r.status, 402);
  assert.equal(r.headers.get('idempotent-replayed'), 'true');
  assert.equal(runs[key], 2);
});

test('serialization failure and deadlock: the whole request runs again', { skip }, async () => {
  for (const code of ['40001', '40P01']) {
    const key = newKey();
    hooks[key] = async (req, run) => {
      if (run === 1) await req.idempotency.client.query(`DO $$BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '${code}'; END$$`);
    };
    const r = await post('/v1/charges', key, { amount: 5 });
    assert.equal(r.status, 200);
    assert.equal(runs[key], 2);
    assert.deepEqual(await rows(key), [(await r.json()).id]);
  }
});

test('a killed backend: the process lives on, the request runs again on another connection', { skip }, async () => {
  const key = newKey();
  hooks[key] = async (req, run) => {
    if (run === 1) {
      const pid = (await req.idempotency.client.query('SELECT pg_backend_pid() AS p')).rows[0].p;
      await env.admin.query('SELECT pg_terminate_backend($1)', [pid]);
      await req.idempotency.client.query('SELECT 1');
    }
  };
  const r = await post('/v1/charges', key, { amount: 6 });
  assert.equal(r.status, 200);
  assert.equal(runs[key], 2);
  assert.equal((await rows(key)).length, 1);
  assert.equal((await env.pool.query('SELECT 1 AS one')).rows[0].one, 1);
});

test('keys: missing (optional or required), refused, mapped by hashing', { skip }, async () => {
  const r0 = await post('/v1/charges', null, { amount: 1 });
  assert.equal(r0.status, 200);
  const r1 = await post('/v1/required', null, { amount: 1 });
  assert.equal(r1.status, 400);
  assert.equal((await r1.json()).error.type, 'invalid_request_error');
  // two Idempotency-Key headers are refused, also under the hash policy
  const two = await new Promise((resolve, reject) => {
    const r = require('node:http').request(env.base + '/v1/hashed', {
      method: 'POST',
      headers: { 'Idempotency-Key': ['a', 'b'], 'Content-Type': 'application/json' },
    }, (res) => { res.resume(); resolve(res.statusCode); });
    r.on('error', reject);
    r.end('{"amount": 1}');
  });
  assert.equal(two, 400);
  const r2 = await post('/v1/charges', 'order:1', { amount: 1 });
  assert.equal(r2.status, 400);
  const key = `order:${newKey()}`;
  assert.equal((await post('/v1/hashed', key, { amount: 1 })).status, 200);
  const r3 = await post('/v1/hashed', key, { amount: 1 });
  assert.equal(r3.headers.get('idempotent-replayed'), 'true');
  assert.equal(r3.headers.get('idempotency-key'), key);
  assert.equal(runs[key], 1);
});

test('lease mode: heartbeat, unknown after a throw, release when nothing happened', { skip }, async () => {
  const key = newKey();
  hooks[key] = async (req) => {
    const look = async () => (await env.admin.query("SELECT locked_until FROM idempotency.idem_lookup('acme', 'POST /v1/lease', $1)", [req.idempotency.key])).rows[0].locked_until;
    const first = await look();
    for (let i = 0; i < 200 && (await look()).getTime() <= first.getTime(); i++) await new Promise((r) => setTimeout(r, 50));
    assert.ok((await look()) > first, 'the heartbeat moved the lease');
    throw new Error('card network timed out');
  };
  assert.equal((await post('/v1/lease', key, { amount: 8 })).status, 500);
  const st = await env.admin.query("SELECT state FROM idempotency.idem_lookup('acme', 'POST /v1/lease', $1)", [key]);
  assert.equal(st.rows[0].state, 'unknown');
  const r = await post('/v1/lease', key, { amount: 8 });
  assert.equal(r.status, 409);
  assert.equal(r.headers.get('stripe-should-retry'), 'false');
  assert.equal((await r.json()).error.code, 'outcome_pending');

  const k2 = newKey();
  hooks[k2] = async (req, run) => { if (run === 1) { req.idempotency.noSideEffect(); throw new Error('validation'); } };
  assert.equal((await post('/v1/lease', k2, { amount: 9 })).status, 500);
  assert.equal((await post('/v1/lease', k2, { amount: 9 })).status, 200);
  const r3 = await post('/v1/lease', k2, { amount: 9 });
  assert.equal(r3.headers.get('idempotent-replayed'), 'true');
  assert.equal(runs[k2], 2);
});
