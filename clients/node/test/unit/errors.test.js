'use strict';
// What a developer sees when something is wrong: intervals as PostgreSQL
// reads them, options it cannot read, a response above the size cap, a
// database that cannot be reached, a 5xx in lease mode; each answered in
// the profile's format with a stable code and logged with the fix.
// Needs IDEM_TEST_PGPORT (clients/test.sh sets it); skipped without it.

const test = require('node:test');
const assert = require('node:assert/strict');
const express = require('express');
const pg = require('pg');
const { idempotent } = require('../../src/index.js');

const { conn, skip, listen, serve } = require('../support');

let deadPool;
const logged = [];
const runs = {};
const log = (message, err) => logged.push(`${message} ${err ? err.message : ''}`);

function app() {
  const a = express();
  const handler = (answer) => async (req, res) => {
    const key = req.idempotency.key;
    runs[key] = (runs[key] || 0) + 1;
    await req.idempotency.client.query('INSERT INTO err_charges (idem_key) VALUES ($1)', [key]);
    answer(req, res, runs[key]);
  };
  const ok = (req, res) => res.json({ ok: true });
  for (const ttl of ['24 hours', '1 day', 'P1D', '24h', 86400]) {
    a.post(`/ttl/${encodeURIComponent(String(ttl))}`, idempotent({ pool: env.pool, tenant: 't', ttl, log }), handler(ok));
  }
  // one the middleware's own look lets by ('tomorrow' throws in idempotent())
  a.post('/bad-interval', idempotent({ pool: env.pool, tenant: 't', ttl: '1 hour 1 hour', log }), handler(ok));
  a.post('/big', idempotent({ pool: env.pool, tenant: 't', log }), handler((req, res) => res.json({ pad: 'x'.repeat(500) })));
  a.post('/dead', idempotent({ pool: deadPool, tenant: 't', retries: 1, log }), handler(ok));
  a.post('/lease503', idempotent({ pool: env.pool, tenant: 't', lease: '10 seconds', log }),
    handler((req, res, n) => (n === 1 ? res.status(503).json({ down: true }) : res.json({ n }))));
  a.post('/ietf-big', idempotent({ pool: env.pool, tenant: 't', profile: 'ietf', log }), handler((req, res) => res.json({ pad: 'x'.repeat(500) })));
  return a;
}

const env = serve({
  max: 5,
  sql: ['CREATE TABLE IF NOT EXISTS err_charges (idem_key text)'],
  app,
  before: async ({ admin }) => {
    deadPool = new pg.Pool({ ...conn, port: 1, max: 1, connectionTimeoutMillis: 2000 });
    for (const e of ['POST /big', 'POST /ietf-big']) {
      await admin.query('INSERT INTO idempotency.endpoints (endpoint, max_response_bytes) VALUES ($1, 200) ON CONFLICT DO NOTHING', [e]);
    }
  },
  after: () => deadPool.end(),
});

let n = 0;
const newKey = () => `e${process.pid}-${Date.now()}-${++n}`;
const post = (path, key) => fetch(env.base + path, {
  method: 'POST', headers: { 'Idempotency-Key': key, 'Content-Type': 'application/json' }, body: '{"a":1}',
});
const count = async (key) => Number((await env.admin.query('SELECT count(*) AS n FROM err_charges WHERE idem_key = $1', [key])).rows[0].n);

test('ttl as PostgreSQL reads it: 24 hours, 1 day, P1D, 24h, a number of seconds', { skip }, async () => {
  for (const ttl of ['24 hours', '1 day', 'P1D', '24h', '86400']) {
    const key = newKey();
    const r = await post(`/ttl/${encodeURIComponent(ttl)}`, key);
    assert.equal(r.status, 200, ttl);
    const { rows } = await env.admin.query(
      "SELECT extract(epoch FROM expires_at - created_at)::int AS s FROM idempotency.keys WHERE key = $1", [key]);
    assert.equal(rows[0].s, 86400, ttl);
  }
});

test('an interval PostgreSQL cannot read: 500 idempotency_not_configured, logged', { skip }, async () => {
  const key = newKey();
  const r = await post('/bad-interval', key);
  assert.equal(r.status, 500);
  const e = (await r.json()).error;
  assert.equal(e.code, 'idempotency_not_configured');
  assert.equal(e.type, 'api_error');
  assert.ok(logged.some((l) => /idempotency_not_configured: the options ttl, lease and wait/.test(l)), logged.join('\n'));
  assert.equal(await count(key), 0);
});

test('a response above the size cap: 500 response_too_large in the profile format, rolled back, logged', { skip }, async () => {
  const key = newKey();
  const r = await post('/big', key);
  assert.equal(r.status, 500);
  assert.equal((await r.json()).error.code, 'response_too_large');
  assert.equal(await count(key), 0);
  assert.ok(logged.some((l) => /^response_too_large: .*max_response_bytes/.test(l)));
  const r2 = await post('/ietf-big', newKey());
  assert.equal(r2.status, 500);
  assert.equal(r2.headers.get('content-type'), 'application/problem+json');
  assert.equal((await r2.json()).code, 'response_too_large');
});

test('a database that cannot be reached: 503 database_unavailable, logged', { skip }, async () => {
  const r = await post('/dead', newKey());
  assert.equal(r.status, 503);
  assert.equal(r.headers.get('retry-after'), '1');
  assert.equal((await r.json()).error.code, 'database_unavailable');
  assert.ok(logged.some((l) => /^database_unavailable: .*connection settings/.test(l)));
});

test('lease mode: a 5xx answer is not stored and gives the key back, the retry runs', { skip }, async () => {
  const key = newKey();
  const r1 = await post('/lease503', key);
  assert.equal(r1.status, 503);
  const r2 = await post('/lease503', key);
  assert.equal(r2.status, 200);
  assert.deepEqual(await r2.json(), { n: 2 });
  assert.equal(await count(key), 1);
  const { rows } = await env.admin.query('SELECT state FROM idempotency.keys WHERE key = $1', [key]);
  assert.equal(rows[0].state, 'completed');
});

test('the default log writes one line on stderr', { skip }, async () => {
  const { idempotent: make } = require('../../src/index.js');
  const a = express();
  a.post('/x', make({ pool: deadPool, tenant: 't', retries: 0 }), (req, res) => res.json({}));
  const s = await listen(a);
  const lines = [];
  const write = process.stderr.write;
  process.stderr.write = (chunk, ...rest) => { lines.push(String(chunk)); return write.call(process.stderr, chunk, ...rest); };
  try {
    const r = await fetch(`http://127.0.0.1:${s.address().port}/x`, { method: 'POST', headers: { 'Idempotency-Key': newKey() } });
    assert.equal(r.status, 503);
  } finally {
    process.stderr.write = write;
    await new Promise((r) => s.close(r));
  }
  assert.ok(lines.some((l) => l.startsWith('idempotency: database_unavailable')), lines.join(''));
});
