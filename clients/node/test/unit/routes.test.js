'use strict';
// Public APIs only: the handlers given to idempotent() run again on a
// retry, the middleware in front of a route's handlers hands over once
// with Express's next; the endpoint is the route template behind the mount
// paths (sub-applications: app.mountpath; routers: options.mountPath), one
// endpoint for every account of a mount path with a parameter.
// Needs IDEM_TEST_PGPORT (clients/test.sh sets it).

const test = require('node:test');
const assert = require('node:assert/strict');
const express = require('express');
const pg = require('pg');
const { idempotent } = require('../../src/index.js');

const { conn, skip, listen, serve } = require('../support');

const runs = {};
const logged = [];

function app() {
  const a = express();
  const opts = { pool: env.pool, tenant: 't', log: (m) => logged.push(m) };
  const handler = async (req, res) => {
    const key = req.idempotency.key;
    runs[key] = (runs[key] || 0) + 1;
    if (req.get('x-fail-once') && runs[key] === 1) {
      await req.idempotency.client.query("DO $$BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END$$");
    }
    res.json({ endpoint: req.idempotency.endpoint, run: runs[key] });
  };
  // sub-application mounted at a path with a parameter
  const sub = express();
  sub.post('/charges', idempotent(opts, handler));
  a.use('/accounts/:acct', sub);
  // router mounted at a path with a parameter: mountPath names it
  const router = express.Router();
  router.post('/refunds', idempotent({ ...opts, mountPath: '/accounts/:acct' }, handler));
  router.post('/unnamed', idempotent(opts, handler));
  a.use('/accounts/:acct', router);
  // the middleware in front of the handler: next, once
  a.post('/front', idempotent(opts), handler);
  a.use((err, req, res, next) => { res.status(500).json({ error: { message: err.message } }); });
  return a;
}

const env = serve({ max: 4, app });

let n = 0;
const newKey = () => `rt${process.pid}-${Date.now()}-${++n}`;
const post = (path, key, headers = {}) => fetch(env.base + path, {
  method: 'POST', headers: { 'Idempotency-Key': key, 'Content-Type': 'application/json', ...headers }, body: '{"a":1}',
});

test('a sub-application mounted at /accounts/:acct: one endpoint, the same key on two accounts is a mismatch', { skip }, async () => {
  const key = newKey();
  const r1 = await post('/accounts/a1/charges', key);
  assert.equal(r1.status, 200);
  assert.equal((await r1.json()).endpoint, 'POST /accounts/:acct/charges');
  const r2 = await post('/accounts/a2/charges', key);
  assert.equal(r2.status, 400);
  assert.equal((await r2.json()).error.type, 'idempotency_error');
  assert.equal(runs[key], 1);
});

test('a router mounted at /accounts/:acct: named by options.mountPath, or refused with a log line naming the fix', { skip }, async () => {
  const key = newKey();
  const r1 = await post('/accounts/a1/refunds', key);
  assert.equal((await r1.json()).endpoint, 'POST /accounts/:acct/refunds');
  const r2 = await post('/accounts/a1/unnamed', newKey());
  assert.equal(r2.status, 500);
  assert.equal((await r2.json()).error.code, 'idempotency_not_configured');
  assert.ok(logged.some((l) => /mounted under \/accounts\/a1.*options\.mountPath/.test(l)), logged.join('\n'));
});

test('handlers given to idempotent() run again after a serialization failure', { skip }, async () => {
  const key = newKey();
  const r = await post('/accounts/a1/charges', key, { 'x-fail-once': '1' });
  assert.equal(r.status, 200);
  assert.equal((await r.json()).run, 2);
});

test("the middleware in front of the handler hands over once: a serialization failure reaches the application's error handler, rolled back", { skip }, async () => {
  const key = newKey();
  const r1 = await post('/front', key);
  assert.equal((await r1.json()).endpoint, 'POST /front');
  const k2 = newKey();
  const r2 = await post('/front', k2, { 'x-fail-once': '1' });
  assert.equal(r2.status, 500);
  assert.equal(runs[k2], 1);
  const r3 = await post('/front', k2, { 'x-fail-once': '1' });
  assert.equal(r3.status, 200);
});

test('no router internals: the sources use no layer or stack of Express', () => {
  const src = require('node:fs').readFileSync(require.resolve('../../src/index.js'), 'utf8');
  assert.doesNotMatch(src, /handleRequest|handleError|route\.stack|\._router|router\.stack/);
});

test('a handler that never answers: at deadlineMs its transaction is rolled back, its connection freed, 503 handler_timeout', { skip }, async () => {
  const a = express();
  const small = new pg.Pool({ ...conn, max: 1 });
  const hung = {};
  a.post('/hang', idempotent({ pool: small, tenant: 't', deadlineMs: 300, log: (m) => logged.push(m) }, async (req, res) => {
    await req.idempotency.client.query('SELECT 1');
    if (req.get('x-hang')) { hung[req.idempotency.key] = true; await new Promise(() => {}); }
    res.json({ ok: true });
  }));
  const s = await listen(a);
  const url = `http://127.0.0.1:${s.address().port}/hang`;
  try {
    const key = newKey();
    const r1 = await fetch(url, { method: 'POST', headers: { 'Idempotency-Key': key, 'x-hang': '1' } });
    assert.equal(r1.status, 503);
    assert.equal((await r1.json()).error.code, 'handler_timeout');
    assert.ok(logged.some((l) => /^handler_timeout: /.test(l)));
    // the pool's only connection is usable again, and the key is free
    const r2 = await fetch(url, { method: 'POST', headers: { 'Idempotency-Key': key } });
    assert.equal(r2.status, 200);
    assert.equal(r2.headers.get('idempotent-replayed'), null);
  } finally {
    await new Promise((r) => s.close(r));
    await small.end();
  }
});

test('a hung handler whose connection the server ends: the run is given up, the client closed, the request runs again', { skip }, async () => {
  const a = express();
  const small = new pg.Pool({ ...conn, max: 1 });
  let runsHere = 0;
  a.post('/hang2', idempotent({ pool: small, tenant: 't', log: () => {} }, async (req, res) => {
    runsHere++;
    const pid = (await req.idempotency.client.query('SELECT pg_backend_pid() AS p')).rows[0].p;
    if (runsHere === 1) {
      setTimeout(() => env.admin.query('SELECT pg_terminate_backend($1)', [pid]).catch(() => {}), 200);
      await new Promise(() => {}); // hangs, as a handler waiting for something that never comes
    }
    res.json({ run: runsHere });
  }));
  const s = await listen(a);
  try {
    const r = await fetch(`http://127.0.0.1:${s.address().port}/hang2`,
      { method: 'POST', headers: { 'Idempotency-Key': newKey(), 'Content-Type': 'application/json' }, body: '{}' });
    assert.equal(r.status, 200);
    assert.deepEqual(await r.json(), { run: 2 });
  } finally {
    await new Promise((r) => s.close(r));
    await small.end();
  }
});
