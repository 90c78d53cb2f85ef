'use strict';
// Work after the commit: req.idempotency.afterCommit tasks start after the
// key is finished and committed and the response sent; a failing task is
// logged and changes nothing, a slow one holds no connection; 'finish'
// listeners of a run that was thrown away (a serialization failure) go
// with it.  Needs IDEM_TEST_PGPORT (clients/test.sh sets it).

const test = require('node:test');
const assert = require('node:assert/strict');
const express = require('express');
const { idempotent } = require('../../src/index.js');

const { skip, serve } = require('../support');

const logged = [];
const taskRuns = {};
const seenCommitted = {};
const finishRuns = {};
const handlerRuns = {};
let releaseSlow;
const slowReleased = new Promise((r) => { releaseSlow = r; });
let slowDone = false;

const count = async (key) => Number((await env.admin.query('SELECT count(*) AS n FROM bg_payments WHERE idem_key = $1', [key])).rows[0].n);

function app() {
  const a = express();
  // a pool of one client: a task that held it would block the next request
  const opts = { pool: env.pool, tenant: 't', log: (m, e) => logged.push(`${m}: ${e && e.message}`) };
  a.post('/pay/:kind', idempotent(opts, async (req, res) => {
    const { key, client } = req.idempotency;
    handlerRuns[key] = (handlerRuns[key] || 0) + 1;
    await client.query('INSERT INTO bg_payments (idem_key) VALUES ($1)', [key]);
    if (req.params.kind === 'failing') {
      req.idempotency.afterCommit(async () => {
        taskRuns[key] = (taskRuns[key] || 0) + 1;
        seenCommitted[key] = await count(key);
        throw new Error('the mail server is down');
      });
    } else if (req.params.kind === 'slow') {
      req.idempotency.afterCommit(async () => {
        taskRuns[key] = (taskRuns[key] || 0) + 1;
        await slowReleased;
        slowDone = true;
      });
    } else if (req.params.kind === 'finish') {
      res.on('finish', () => { finishRuns[key] = (finishRuns[key] || 0) + 1; });
      if (handlerRuns[key] === 1) {
        await client.query("DO $$BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END$$");
      }
    }
    res.json({ paid: key });
  }));
  return a;
}

const env = serve({
  max: 1, // a pool of one client: a task that held it would block the next request
  sql: ['CREATE TABLE IF NOT EXISTS bg_payments (idem_key text)'],
  app,
  after: () => releaseSlow(),
});

let n = 0;
const newKey = () => `bg${process.pid}-${Date.now()}-${++n}`;
const post = (path, key) => fetch(env.base + path, { method: 'POST', headers: { 'Idempotency-Key': key, 'Content-Type': 'application/json' }, body: '{}' });
const settle = () => new Promise((r) => setTimeout(r, 200));

test('a failing task: the payment committed, the response sent, the task run once and logged', { skip }, async () => {
  const key = newKey();
  const r = await post('/pay/failing', key);
  assert.equal(r.status, 200);
  assert.deepEqual(await r.json(), { paid: key });
  for (let i = 0; i < 50 && !logged.some((l) => /mail server/.test(l)); i++) await settle();
  assert.equal(seenCommitted[key], 1, 'the task ran before the commit');
  assert.ok(logged.some((l) => /^a task after the commit failed: the mail server is down/.test(l)), logged.join('\n'));
  const r2 = await post('/pay/failing', key);
  assert.equal(r2.headers.get('idempotent-replayed'), 'true');
  assert.equal(taskRuns[key], 1);
  assert.equal(await count(key), 1);
});

test('a slow task: the response is sent and the only pool client is free before it ends', { skip }, async () => {
  const key = newKey();
  const r = await post('/pay/slow', key);
  assert.equal(r.status, 200);
  assert.equal(slowDone, false);
  assert.equal(await count(key), 1);
  const r2 = await post('/pay/failing', newKey()); // needs the pool's only client
  assert.equal(r2.status, 200);
  assert.equal(slowDone, false);
  releaseSlow();
  for (let i = 0; i < 50 && !slowDone; i++) await settle();
  assert.equal(slowDone, true);
  assert.equal(taskRuns[key], 1);
});

test("'finish' listeners of a run thrown away for a retry do not run", { skip }, async () => {
  const key = newKey();
  const r = await post('/pay/finish', key);
  assert.equal(r.status, 200);
  await settle();
  assert.equal(handlerRuns[key], 2);
  assert.equal(finishRuns[key], 1);
  assert.equal(await count(key), 1);
});
