'use strict';
// The outbox sender (src/outbox.js) against the extension's outbox and a
// plain node:http server on loopback that answers from a script: what an
// attempt sends (the operation's key as Idempotency-Key, a fresh
// X-Request-Id), the outcome recorded for each kind of answer, Retry-After,
// the credentials hook, a bounded stored body, rolled-back enqueues, stop().

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const pg = require('pg');
const { conn, skip } = require('../support');
const { runOutbox } = require('../../src/index.js');
const { keyHash } = require('../../src/outbox.js');

const env = { pool: null, server: null, base: null, requests: [], script: new Map() };

test.before(async () => {
  if (skip) return;
  env.pool = new pg.Pool({ ...conn, max: 6 });
  await env.pool.query('DELETE FROM idempotency.outbox');
  env.server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => { body += d; });
    req.on('end', () => {
      const name = req.url.slice(1);
      env.requests.push({ name, headers: req.headers, body, at: Date.now() });
      const steps = env.script.get(name) || [{ status: 200 }];
      const n = env.requests.filter((r) => r.name === name).length;
      const step = steps[Math.min(n, steps.length) - 1];
      if (step.reset) { req.socket.destroy(); return; }
      res.writeHead(step.status, step.headers || { 'Content-Type': 'application/json' });
      res.end(step.body !== undefined ? step.body : JSON.stringify({ ok: name }));
    });
  });
  await new Promise((r) => env.server.listen(0, '127.0.0.1', r));
  env.base = `http://127.0.0.1:${env.server.address().port}`;
});
test.after(async () => {
  if (skip) return;
  await new Promise((r) => env.server.close(r));
  await env.pool.end();
});

const add = async (name, steps, headers = {}) => {
  if (steps) env.script.set(name, steps);
  const { rows } = await env.pool.query("SELECT idempotency.idem_outbox_add('POST', $1, $2::jsonb, $3::jsonb) AS key",
    [`${env.base}/${name}`, JSON.stringify({ name }), JSON.stringify(headers)]);
  return rows[0].key;
};
const row = async (key) => (await env.pool.query('SELECT * FROM idempotency.outbox WHERE key = $1', [key])).rows[0];
const attempts = async (key) => (await env.pool.query(`SELECT a.* FROM idempotency.outbox_attempts a
  JOIN idempotency.outbox o ON o.id = a.outbox_id WHERE o.key = $1 ORDER BY a.attempt, a.started_at`, [key])).rows;
const sent = (name) => env.requests.filter((r) => r.name === name);

// Runs a sender until every operation named is finished (or 15 s).
async function runUntilFinished(keys, options = {}) {
  const logs = [];
  const h = runOutbox({ pool: env.pool, concurrency: 4, leaseMs: 3000, timeoutMs: 1000, pollMs: 50, baseMs: 20, capMs: 100,
    maxAttempts: 4, logger: (level, message, fields) => logs.push({ level, message, fields }), ...options });
  const until = Date.now() + 15000;
  for (;;) {
    const { rows } = await env.pool.query("SELECT count(*)::int AS n FROM idempotency.outbox WHERE key = ANY($1) AND finished_at IS NULL", [keys]);
    if (rows[0].n === 0 || Date.now() > until) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  await h.stop();
  return logs;
}

test('each attempt sends the key as Idempotency-Key and a fresh X-Request-Id; retries until a definite answer', { skip }, async () => {
  const key = await add('flaky', [{ status: 503 }, { reset: true }, { status: 500 }, { status: 201 }], { 'X-Trace': 't1' });
  const logs = await runUntilFinished([key]);
  const r = await row(key);
  assert.equal(r.state, 'succeeded');
  assert.equal(r.response_status, 201);
  assert.equal(JSON.parse(r.response_body).ok, 'flaky');
  const reqs = sent('flaky');
  assert.equal(reqs.length, 4);
  assert.ok(reqs.every((q) => q.headers['idempotency-key'] === key), 'the same key at every attempt');
  const ids = reqs.map((q) => q.headers['x-request-id']);
  assert.equal(new Set(ids).size, 4, 'a fresh X-Request-Id per attempt');
  assert.ok(ids.every((id) => !id.includes(key) && !key.includes(id)));
  assert.ok(reqs.every((q) => q.headers['x-trace'] === 't1' && q.headers['content-type'] === 'application/json'));
  assert.deepEqual(JSON.parse(reqs[0].body), { name: 'flaky' });
  assert.deepEqual((await attempts(key)).map((a) => [a.status, a.outcome]),
    [[503, 'retry'], [null, 'retry'], [500, 'retry'], [201, 'succeeded']]);
  const text = JSON.stringify(logs);
  assert.ok(!text.includes(key), 'the key is never logged');
  assert.ok(text.includes(keyHash(key)));
});

test('422 and fatal answers are never retried; retries that run out need attention', { skip }, async () => {
  const k422 = await add('reuse', [{ status: 422 }]);
  const k400 = await add('bad', [{ status: 400 }]);
  const k503 = await add('down', [{ status: 503 }]);
  const k401 = await add('auth', [{ status: 401 }]);
  await runUntilFinished([k422, k400, k503, k401], { maxAttempts: 3 });
  assert.equal((await row(k422)).state, 'failed');
  assert.equal(sent('reuse').length, 1, '422 sent once');
  assert.equal((await attempts(k422)).length, 1);
  assert.equal((await row(k400)).state, 'failed');
  assert.equal(sent('bad').length, 1);
  assert.equal((await row(k503)).state, 'attention');
  assert.equal(sent('down').length, 3, 'bounded by maxAttempts');
  assert.equal((await row(k401)).state, 'attention', '401 without a credentials hook');
  assert.equal(sent('auth').length, 1);
});

test('Retry-After is followed: the next attempt starts after the answer plus its value', { skip }, async () => {
  const key = await add('slowdown', [{ status: 429, headers: { 'Retry-After': '1' } }, { status: 409, headers: { 'Retry-After': '1' } },
    { status: 200 }]);
  await runUntilFinished([key]);
  assert.equal((await row(key)).state, 'succeeded');
  const reqs = sent('slowdown');
  assert.equal(reqs.length, 3);
  assert.ok(reqs[1].at - reqs[0].at >= 1000 && reqs[2].at - reqs[1].at >= 1000, 'a second between the attempts');
  const a = await attempts(key);
  assert.ok(a[1].started_at.getTime() >= a[0].ended_at.getTime() + 1000 - 50, 'recorded in outbox_attempts too');
});

test('a credentials hook that throws: nothing sent, retried within the bounds', { skip }, async () => {
  const key = await add('nocreds', [{ status: 200 }]);
  await runUntilFinished([key], { maxAttempts: 2, credentials: async () => { throw new Error('vault down'); } });
  assert.equal((await row(key)).state, 'attention');
  assert.equal(sent('nocreds').length, 0);
  assert.deepEqual((await attempts(key)).map((a) => a.outcome), ['retry', 'attention']);
  assert.match((await attempts(key))[0].error, /credentials hook failed: vault down/);
});

test('401: the credentials hook refreshes, then the same key with the new credentials', { skip }, async () => {
  const key = await add('login', [{ status: 401 }, { status: 200 }]);
  let token = 'old';
  const calls = [];
  await runUntilFinished([key], {
    credentials: async ({ refresh, operation }) => {
      calls.push({ refresh, operation });
      if (refresh) token = 'new';
      return { Authorization: `Bearer ${token}` };
    },
  });
  assert.equal((await row(key)).state, 'succeeded');
  assert.deepEqual(sent('login').map((q) => q.headers.authorization), ['Bearer old', 'Bearer new']);
  assert.deepEqual(sent('login').map((q) => q.headers['idempotency-key']), [key, key]);
  assert.ok(calls.some((c) => c.refresh) && calls.every((c) => !JSON.stringify(c).includes(key)));
});

test('a rolled-back enqueue is never sent; the response body is stored bounded', { skip }, async () => {
  const c = await env.pool.connect();
  await c.query('BEGIN');
  await c.query("SELECT idempotency.idem_outbox_add('POST', $1, '{}')", [`${env.base}/rolledback`]);
  await c.query('ROLLBACK');
  c.release();
  const key = await add('big', [{ status: 200, body: 'x'.repeat(5000) }]);
  await runUntilFinished([key], { maxResponseBytes: 1000 });
  assert.equal((await row(key)).response_body.length, 1000);
  assert.equal(sent('rolledback').length, 0);
});

test('a timeout is retried with the same key; stop() gives back what it leased and did not send', { skip }, async () => {
  env.script.set('hang', [{ status: 200 }]);
  const key = await add('slowpoke', [{ status: 200 }]);
  // a server that answers after the sender's timeout
  const slow = http.createServer((req, res) => { setTimeout(() => res.end('late'), 1500); });
  await new Promise((r) => slow.listen(0, '127.0.0.1', r));
  const skey = (await env.pool.query("SELECT idempotency.idem_outbox_add('PUT', $1, 'null') AS key",
    [`http://127.0.0.1:${slow.address().port}/x`])).rows[0].key;
  await runUntilFinished([key, skey], { maxAttempts: 2, timeoutMs: 300, leaseMs: 2000 });
  slow.close();
  const a = await attempts(skey);
  assert.deepEqual(a.map((x) => x.outcome), ['retry', 'attention']);
  assert.match(a[0].error, /^timeout/);
  // stop() while operations are due: none stays leased
  const keys = [];
  for (let i = 0; i < 6; i++) keys.push(await add(`late${i}`, [{ status: 200 }]));
  const h = runOutbox({ pool: env.pool, concurrency: 2, pollMs: 50, logger: () => {} });
  await h.stop();
  const { rows } = await env.pool.query('SELECT state, attempts FROM idempotency.outbox WHERE key = ANY($1)', [keys]);
  assert.deepEqual(rows.map((r) => [r.state, r.attempts]), keys.map(() => ['pending', 0]), 'leased, given back, not sent');
  assert.equal(env.requests.filter((r) => r.name.startsWith('late')).length, 0);
  const leases = await env.pool.query('SELECT count(*)::int AS n FROM idempotency.outbox_attempts a ' +
    'JOIN idempotency.outbox o ON o.id = a.outbox_id WHERE o.key = ANY($1)', [keys]);
  assert.equal(leases.rows[0].n, 0);
});

test('stop() waits for the send in flight and records its outcome', { skip }, async () => {
  let arrived;
  const got = new Promise((r) => { arrived = r; });
  const slow = http.createServer((req, res) => { arrived(); setTimeout(() => res.end('{"late": true}'), 500); });
  await new Promise((r) => slow.listen(0, '127.0.0.1', r));
  const key = (await env.pool.query("SELECT idempotency.idem_outbox_add('POST', $1, '{}') AS key",
    [`http://127.0.0.1:${slow.address().port}/y`])).rows[0].key;
  const h = runOutbox({ pool: env.pool, pollMs: 50, logger: () => {} });
  await got;
  await h.stop();
  slow.close();
  const r = await row(key);
  assert.equal(r.state, 'succeeded');
  assert.equal(r.response_body, '{"late": true}');
});
