'use strict';
// Nothing is stored for an answer given before the handlers began (Stripe's
// rule: results are saved only once the endpoint began executing), so that
// the corrected request with the same key executes: a body-parser error
// (express.json() before the idempotent route: the middleware never sees
// the request), a body the middleware itself refuses (express.json() among
// the handlers, or the middleware in front of them: it reads the body
// first), and an error a handler passes on.
// Needs IDEM_TEST_PGPORT (clients/test.sh sets it).

const test = require('node:test');
const assert = require('node:assert/strict');
const express = require('express');
const { idempotent } = require('../../src/index.js');

const { skip, serve } = require('../support');

const runs = {};

function app() {
  const a = express();
  const opts = { pool: env.pool, tenant: 't', log: () => {} };
  const handler = (req, res) => {
    const key = req.get('idempotency-key');
    runs[key] = (runs[key] || 0) + 1;
    res.status(201).json({ amount: req.body.amount, run: runs[key] });
  };
  const validate = (req, res, next) => (Number.isInteger(req.body.amount) ? next()
    : next(Object.assign(new Error('amount must be an integer'), { status: 422 })));
  a.post('/parser-before', express.json(), idempotent(opts, handler));
  a.post('/parser-among', idempotent(opts, express.json(), handler));
  a.post('/front', idempotent(opts), express.json(), handler);
  a.post('/validated', express.json(), idempotent(opts, validate, handler));
  a.use((err, req, res, next) => {
    res.status(err.status || 500).json({ error: { message: err.message, type: err.type || 'app_error' } });
  });
  return a;
}

const env = serve({ max: 4, app });

let n = 0;
const newKey = () => `bh${process.pid}-${Date.now()}-${++n}`;
const post = (path, key, body) => fetch(env.base + path, {
  method: 'POST', headers: { 'Idempotency-Key': key, 'Content-Type': 'application/json' }, body,
});
const stored = async (key) => (await env.admin.query('SELECT state FROM idempotency.keys WHERE key = $1', [key])).rows.length;

async function refusedThenCorrected(path, bad, expect) {
  const key = newKey();
  const r1 = await post(path, key, bad);
  assert.equal(r1.status, expect.status, path);
  const b1 = await r1.json();
  expect.check(b1);
  assert.equal(await stored(key), 0, `${path}: the refusal was stored under the key`);
  const r2 = await post(path, key, '{"amount": 5}');
  assert.equal(r2.status, 201, `${path}: the corrected request with the same key`);
  assert.deepEqual(await r2.json(), { amount: 5, run: 1 });
  const r3 = await post(path, key, '{"amount": 5}');
  assert.deepEqual([r3.status, r3.headers.get('idempotent-replayed')], [201, 'true']);
  assert.equal(runs[key], 1);
}

test('a body-parser error (express.json() before the idempotent route) is not stored; the corrected request executes', { skip }, async () => {
  await refusedThenCorrected('/parser-before', '{"amount":', {
    status: 400, check: (b) => assert.equal(b.error.type, 'entity.parse.failed'),
  });
});

test('a malformed body refused by the middleware (express.json() among the handlers) is not stored', { skip }, async () => {
  const check = (b) => assert.equal(b.error.code, 'request_body_invalid');
  await refusedThenCorrected('/parser-among', '{"amount":', { status: 400, check });
  await refusedThenCorrected('/front', '{"amount":', { status: 400, check });
});

test('an error a handler passes on (a validator among the handlers) is not stored', { skip }, async () => {
  await refusedThenCorrected('/validated', '{"amount": "lots"}', {
    status: 422, check: (b) => assert.equal(b.error.message, 'amount must be an integer'),
  });
});
