'use strict';
// A client that goes away while the handlers run: their run is ended at
// once, the transaction rolled back (its connection closed, the pool's slot
// given back), the claim freed (lease mode: marked unknown, or released
// after noSideEffect()), the heartbeat stopped; and the handlers' deadline
// that applies when the options give none.  Needs IDEM_TEST_PGPORT
// (clients/test.sh sets it).

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const express = require('express');
const { idempotent } = require('../../src/index.js');
const pg = require('pg');
const { conn, skip, serve } = require('../support');

const logged = [];
const runs = {};
const started = {};
let heartbeats = 0;
const poolQueries = [];
const pids = {};
const log = (m) => logged.push(m);

function app(env) {
  // count the heartbeats the middleware sends through the pool
  const query = env.pool.query.bind(env.pool);
  env.pool.query = (...args) => {
    if (/idem_heartbeat/.test(String(args[0]))) heartbeats++;
    poolQueries.push(String(args[0]));
    return query(...args);
  };
  const a = express();
  const handler = async (req, res) => {
    const { key, client } = req.idempotency;
    runs[key] = (runs[key] || 0) + 1;
    pids[key] = client.processID;
    await client.query('INSERT INTO dc_charges (idem_key) VALUES ($1)', [key]);
    if (req.get('x-no-side-effect')) req.idempotency.noSideEffect();
    if (req.get('x-hang')) {
      started[key]();
      if (req.get('x-hang') === 'query') await client.query('SELECT pg_sleep(60)'); // a query that takes long
      await new Promise(() => {}); // waits for something that never comes
    }
    res.json({ key, run: runs[key] });
  };
  // a pool of one client: a request after the disconnect needs the slot back
  a.post('/atomic', idempotent({ pool: env.small, tenant: 't', log }, handler));
  a.post('/sleeps', idempotent({ pool: env.pool, tenant: 't', wait: '10 seconds', log }, handler));
  a.post('/lease', idempotent({ pool: env.pool, tenant: 't', lease: '2 seconds', heartbeatMs: 100, log }, handler));
  return a;
}

const env = serve({
  max: 4,
  sql: ['CREATE TABLE IF NOT EXISTS dc_charges (idem_key text)'],
  before: (e) => { e.small = new pg.Pool({ ...conn, max: 1 }); },
  app,
  after: (e) => e.small.end(),
});

let n = 0;
const newKey = () => `dc${process.pid}-${Date.now()}-${++n}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const count = async (key) => Number((await env.admin.query('SELECT count(*) AS n FROM dc_charges WHERE idem_key = $1', [key])).rows[0].n);
const keyState = async (key) => {
  const { rows } = await env.admin.query('SELECT state FROM idempotency.keys WHERE key = $1', [key]);
  return rows.length ? rows[0].state : null;
};

// Sends the request, waits until the handler hangs, then drops the connection.
async function disconnectMidHandler(path, key, headers = {}, holdMs = 0) {
  const hanging = new Promise((r) => { started[key] = r; });
  const req = http.request({
    host: '127.0.0.1', port: env.port, method: 'POST', path,
    headers: { 'Idempotency-Key': key, 'Content-Type': 'application/json', 'x-hang': '1', ...headers },
  });
  req.on('error', () => {});
  req.end('{"amount":1}');
  await hanging;
  await sleep(holdMs);
  req.destroy();
  for (let i = 0; i < 100 && !logged.some((l) => l.startsWith('client_disconnected') && l.includes('while the handlers ran')); i++) await sleep(20);
}

// The key's state once it is no longer in_progress (or after 5 s).
async function settledState(key) {
  for (let i = 0; i < 100; i++) {
    const st = await keyState(key);
    if (st !== 'in_progress') return st;
    await sleep(50);
  }
  return keyState(key);
}

const post = (path, key) => fetch(env.base + path, {
  method: 'POST', headers: { 'Idempotency-Key': key, 'Content-Type': 'application/json' }, body: '{"amount":1}',
});

test('atomic mode: a client that disconnects mid-handler leaves the key free, the connection back in the pool', { skip }, async () => {
  const key = newKey();
  logged.length = 0;
  await disconnectMidHandler('/atomic', key);
  assert.ok(logged.some((l) => /^client_disconnected: the client disconnected while the handlers ran; the transaction was rolled back/.test(l)),
    logged.join('\n'));
  assert.equal(await settledState(key), null, 'the claim was rolled back');
  assert.equal(await count(key), 0, 'the handler\'s writes were rolled back');
  // the pool's only client: given back (closed, so the pool makes a new one)
  assert.equal(env.small.waitingCount, 0);
  assert.equal(env.small.idleCount, env.small.totalCount, 'the hung handler\'s client is still checked out');
  const r = await post('/atomic', key);
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('idempotent-replayed'), null);
  assert.deepEqual(await r.json(), { key, run: 2 });
  assert.equal(await count(key), 1);
});

test('a disconnect while the handler is inside a long query: its backend is ended, the claim free at once', { skip }, async () => {
  const key = newKey();
  logged.length = 0;
  await disconnectMidHandler('/sleeps', key, { 'x-hang': 'query' }, 200);
  const t0 = Date.now();
  const r = await post('/sleeps', key);
  assert.equal(r.status, 200);
  assert.deepEqual(await r.json(), { key, run: 2 });
  assert.ok(Date.now() - t0 < 5000, `the retry waited ${Date.now() - t0} ms for the claim`);
  const { rows } = await env.admin.query("SELECT count(*) AS n FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)' AND state = 'active'");
  assert.equal(Number(rows[0].n), 0, 'the handler\'s query still runs');
});

// the backends of env.pool's clients that run a claim now
const claimsRunning = async () => (await env.admin.query(
  "SELECT pid FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%idem_claim(%' AND pid <> pg_backend_pid()")).rows.map((r) => r.pid);

test('a disconnect while the claim waits for a running duplicate: the claim query is cancelled on the server, its connection closed', { skip }, async () => {
  const key = newKey();
  logged.length = 0;
  poolQueries.length = 0;
  // the first request holds the key: its handler hangs
  const hanging = new Promise((r) => { started[key] = r; });
  const first = http.request({
    host: '127.0.0.1', port: env.port, method: 'POST', path: '/sleeps',
    headers: { 'Idempotency-Key': key, 'Content-Type': 'application/json', 'x-hang': '1' },
  });
  first.on('error', () => {});
  first.end('{"amount":1}');
  await hanging;
  // the duplicate's claim waits for it (wait: 10 seconds) ...
  const second = http.request({
    host: '127.0.0.1', port: env.port, method: 'POST', path: '/sleeps',
    headers: { 'Idempotency-Key': key, 'Content-Type': 'application/json' },
  });
  second.on('error', () => {});
  second.end('{"amount":1}');
  let waiting = [];
  for (let i = 0; i < 100 && waiting.length === 0; i++) { await sleep(20); waiting = await claimsRunning(); }
  assert.equal(waiting.length, 1, 'the duplicate\'s claim does not wait');
  // ... and its client goes away
  second.destroy();
  const t0 = Date.now();
  while (Date.now() - t0 < 3000 && !logged.some((l) => l.includes('before the handlers ran'))) await sleep(20);
  assert.ok(logged.some((l) => /^client_disconnected: the client disconnected before the handlers ran/.test(l)), logged.join('\n'));
  assert.ok(Date.now() - t0 < 2000, `the disconnect was noticed after ${Date.now() - t0} ms (the claim waited on)`);
  // the claim's query was cancelled and its backend is gone (the client
  // closed, not given back to the pool)
  let gone = false;
  for (let i = 0; i < 50 && !gone; i++) {
    const { rows } = await env.admin.query('SELECT count(*) AS n FROM pg_stat_activity WHERE pid = $1', [waiting[0]]);
    gone = Number(rows[0].n) === 0;
    if (!gone) await sleep(20);
  }
  assert.ok(gone, 'the backend of the claim given up still runs');
  assert.deepEqual(await claimsRunning(), []);
  assert.equal(runs[key], 1, 'the duplicate ran its handler');
  assert.ok(!poolQueries.some((q) => /pg_terminate_backend/.test(q)), 'a backend was terminated, not cancelled');
  // the first request goes away too: its handler's query cancelled, its backend gone
  const firstPid = pids[key];
  first.destroy();
  for (let i = 0; i < 100 && !logged.some((l) => l.includes('while the handlers ran')); i++) await sleep(20);
  assert.equal(await settledState(key), null);
  const { rows } = await env.admin.query('SELECT count(*) AS n FROM pg_stat_activity WHERE pid = $1', [firstPid]);
  assert.equal(Number(rows[0].n), 0, 'the backend of the run given up was given back to the pool');
  assert.ok(!poolQueries.some((q) => /pg_terminate_backend/.test(q)), 'a backend was terminated, not cancelled');
});

test('lease mode: a disconnect mid-handler marks the key unknown and stops the heartbeat', { skip }, async () => {
  const key = newKey();
  logged.length = 0;
  const before = heartbeats;
  await disconnectMidHandler('/lease', key, {}, 350);
  assert.ok(heartbeats > before, 'no heartbeat while the handler ran');
  assert.equal(await settledState(key), 'unknown');
  const beats = heartbeats;
  await sleep(500); // five heartbeat periods
  assert.equal(heartbeats, beats, 'the heartbeat goes on after the disconnect');
  const r = await post('/lease', key);
  assert.equal(r.status, 409);
  assert.equal((await r.json()).error.code, 'outcome_pending');
  assert.equal(await count(key), 0);
});

test('lease mode after noSideEffect(): a disconnect mid-handler releases the key, the retry runs', { skip }, async () => {
  const key = newKey();
  logged.length = 0;
  await disconnectMidHandler('/lease', key, { 'x-no-side-effect': '1' });
  assert.equal(await settledState(key), null, `the key was not released: ${logged.join('; ')}`);
  const r = await post('/lease', key);
  assert.equal(r.status, 200);
  assert.deepEqual(await r.json(), { key, run: 2 });
  assert.equal(await count(key), 1);
});

test('deadlineMs: 60 s when the options give none, 0 turns it off, other values are refused', { skip }, async () => {
  const delays = [];
  const setTimeoutBefore = global.setTimeout;
  global.setTimeout = (fn, ms, ...rest) => { delays.push(ms); return setTimeoutBefore(fn, ms, ...rest); };
  try {
    const r = await post('/lease', newKey());
    assert.equal(r.status, 200);
  } finally {
    global.setTimeout = setTimeoutBefore;
  }
  assert.ok(delays.includes(60000), `no 60 s deadline armed (timers: ${delays.join(', ')})`);
  for (const ok of [0, null, Infinity, 1, 5000]) idempotent({ pool: env.pool, tenant: 't', deadlineMs: ok });
  for (const bad of [-1, NaN, '60s', 2 ** 31]) {
    assert.throws(() => idempotent({ pool: env.pool, tenant: 't', deadlineMs: bad }), /deadlineMs/, String(bad));
  }
});
