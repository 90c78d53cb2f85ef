'use strict';
// Every answer of the middleware carries a code (Stripe's error.code, the
// problem's code), and each problem its own type URI; the options'
// intervals are checked when the middleware is built (a string PostgreSQL
// cannot read, 'soon', throws in idempotent() instead of failing every
// request).  Needs no database: the refusals come before the claim.

const test = require('node:test');
const assert = require('node:assert/strict');
const express = require('express');
const pg = require('pg');
const { idempotent, answer } = require('../../src/index.js');
const profiles = require('../../src/profiles.js');
const { listen } = require('../support');

const BASE = profiles.PROBLEM_TYPE_BASE;

test('every outcome has a code, and each problem its own type', () => {
  const types = new Set();
  for (const outcome of Object.keys(profiles.OUTCOMES)) {
    const s = answer('stripe', outcome).body.error;
    assert.ok(s.code, outcome);
    const p = answer('ietf', outcome).body;
    assert.equal(p.code, s.code, outcome);
    assert.equal(p.type, BASE + p.code, outcome);
    types.add(p.type);
  }
  assert.equal(types.size, Object.keys(profiles.OUTCOMES).length);
  const t = answer('ietf', 'unavailable', { code: 'handler_timeout' }).body;
  assert.deepEqual([t.code, t.type], ['handler_timeout', `${BASE}handler_timeout`]);
  assert.equal(answer('ietf', 'key_missing', { typeBase: 'https://api.example.com/problems/' }).body.type,
    'https://api.example.com/problems/idempotency_key_missing');
});

test('the refusals of the middleware carry a code', async () => {
  const pool = new pg.Pool({ host: '127.0.0.1', port: 1, max: 1, connectionTimeoutMillis: 500 }); // never reached
  const app = express();
  const ok = (req, res) => res.json({ ok: true });
  app.post('/stripe', idempotent({ pool, tenant: 't', required: true, limit: 20 }, ok));
  app.post('/ietf', idempotent({ pool, tenant: 't', required: true, limit: 20, profile: 'ietf',
    problemTypeBase: 'https://api.example.com/problems/' }, ok));
  const server = await listen(app);
  const base = `http://127.0.0.1:${server.address().port}`;
  try {
    const cases = [
      [{}, '{}', 'idempotency_key_missing'],
      [{ 'Idempotency-Key': 'a b' }, '{}', 'idempotency_key_invalid'],
      [{ 'Idempotency-Key': 'k1' }, '{"a":', 'request_body_invalid'],
      [{ 'Idempotency-Key': 'k2' }, JSON.stringify({ pad: 'x'.repeat(50) }), 'request_body_too_large'],
    ];
    for (const [headers, body, code] of cases) {
      const r = await fetch(`${base}/stripe`, { method: 'POST', headers: { 'Content-Type': 'application/json', ...headers }, body });
      assert.equal(r.status, 400, code);
      assert.equal((await r.json()).error.code, code);
      const p = await fetch(`${base}/ietf`, { method: 'POST', headers: { 'Content-Type': 'application/json', ...headers }, body });
      assert.equal(p.status, 400, code);
      const pb = await p.json();
      assert.deepEqual([pb.code, pb.type], [code, `https://api.example.com/problems/${code}`]);
    }
  } finally {
    await new Promise((r) => server.close(r));
    await pool.end();
  }
});

test('intervals are checked when the middleware is built', () => {
  const pool = new pg.Pool({ host: '127.0.0.1', port: 1 });
  for (const name of ['ttl', 'lease', 'wait']) {
    for (const bad of ['soon', 'thirty seconds', '', '1 fortnight', {}]) {
      assert.throws(() => idempotent({ pool, tenant: 't', [name]: bad }),
        (err) => err instanceof TypeError && err.message.includes(`options.${name}`), `${name}: ${bad}`);
    }
  }
  for (const good of ['30 seconds', '30s', '500 ms', '1 day', 'P1D', 'PT30S', '24h', '1 day 02:00:00', '1.5 hours',
    '2 mins', '1 week', 30, 0.5]) {
    idempotent({ pool, tenant: 't', ttl: good, lease: good, wait: good });
  }
  assert.throws(() => idempotent({ pool, tenant: 't', problemTypeBase: 5 }), TypeError);
  pool.end();
});
