'use strict';
// End-to-end: the outbox and its sender.  Operations are enqueued with
// idem_outbox_add in transactions (some rolled back) and sent by two
// idempotency-outbox processes, killed with SIGKILL at random moments and
// restarted, to a test server (Express with this package's middleware,
// keys enforced by the extension in the same database) that injects faults
// by a plan carried in each operation's URL: 500 before its commit, 500
// after it, 503, 429 and 409 with Retry-After, 422, 400, a reset before or
// after the commit, an answer slower than the sender's timeout.  One
// operation's lease is taken and left to lapse (a frozen sender).  Then:
// each committed operation executed exactly once (the table executed),
// none rolled back ever sent, every operation in the state the rules give,
// 422 never retried, Retry-After honoured, the lapsed lease taken over with
// the same key, and the senders exit 0 on SIGTERM.  Loopback only.

const { spawn } = require('node:child_process');
const path = require('node:path');
const assert = require('node:assert/strict');
const express = require('express');
const pg = require('pg');
const { idempotent } = require('../../src/index.js');

const { conn } = require('../support.js');
const DB_URL = `postgresql://${encodeURIComponent(conn.user)}@${conn.host}:${conn.port}/${encodeURIComponent(conn.database)}`;
const BIN = path.join(__dirname, '../../src/bin/idempotency-outbox.js');
const SENDER_ARGS = ['--database', DB_URL, '--concurrency', '3', '--lease-ms', '2500', '--timeout-ms', '1000',
  '--max-attempts', '4', '--base-ms', '50', '--cap-ms', '400', '--poll-ms', '100', '--quiet'];
const TIME_BUDGET_MS = 40000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The plans (one fault per attempt, the last one repeated) and the state
// each must end in (rolled_back: enqueued in a transaction rolled back).
const PLANS = [
  ['ok', 'succeeded'], ['ok', 'succeeded'], ['ok', 'rolled_back'], ['ok', 'succeeded'], ['ok', 'succeeded'],
  ['503,ok', 'rolled_back'], ['ok', 'succeeded'], ['ok', 'succeeded'], ['ok', 'succeeded'], ['422', 'rolled_back'],
  ['500before,ok', 'succeeded'], ['after500,ok', 'succeeded'], ['503,ok', 'succeeded'], ['429,ok', 'succeeded'],
  ['409,429,ok', 'succeeded'], ['reset_before,ok', 'succeeded'], ['reset_after,ok', 'succeeded'],
  ['slow,ok', 'succeeded'], ['after500,reset_after,ok', 'succeeded'], ['500before,503,ok', 'succeeded'],
  ['422', 'failed'], ['400', 'failed'], ['503', 'attention'], ['reset_before', 'attention'], ['ok', 'rolled_back'],
];

// The server: every request it sees, and the answers it gave.
const seen = [];
const counts = new Map();

function front(req, res, next) {
  const m = /^\/ops\/(\d+)\?plan=([\w,]+)$/.exec(req.url);
  if (!m) return next();
  const key = req.get('idempotency-key');
  const i = counts.get(key) || 0;
  counts.set(key, i + 1);
  const plan = m[2].split(',');
  const fault = plan[Math.min(i, plan.length - 1)];
  const entry = { n: Number(m[1]), key, requestId: req.get('x-request-id'), at: Date.now(), fault, answeredAt: null };
  seen.push(entry);
  req.fault = fault;
  const answer = (status, headers = {}) => {
    entry.answeredAt = Date.now();
    res.set(headers).status(status).json({ error: fault });
  };
  if (fault === '503' || fault === '422' || fault === '400') return answer(Number(fault));
  if (fault === '429' || fault === '409') return answer(Number(fault), { 'Retry-After': '1' });
  if (fault === 'reset_before') return req.socket.destroy();
  if (fault === 'after500' || fault === 'reset_after') {
    // the middleware sends only after its commit: the answer is lost then
    const end = res.end;
    res.end = function lost() {
      if (fault === 'reset_after') return req.socket.destroy();
      res.end = end;
      res.statusCode = 500;
      res.removeHeader('Content-Length');
      return res.end('{"error":"after the commit"}');
    };
  }
  return next();
}

function startServer(pool) {
  const app = express();
  app.use(front);
  app.post('/ops/:n', idempotent({ pool, tenant: 'e2e', wait: '3 seconds' }, async (req, res) => {
    const { client, key } = req.idempotency;
    await client.query('INSERT INTO executed (n, key) VALUES ($1, $2)', [Number(req.params.n), key]);
    if (req.fault === '500before') return res.status(500).json({ error: 'before the commit' });
    if (req.fault === 'slow') await sleep(1500);
    return res.status(201).json({ n: Number(req.params.n) });
  }));
  return new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
}

const senders = [null, null];
function startSender(i) {
  const child = spawn(process.execPath, [BIN, ...SENDER_ARGS], { stdio: ['ignore', 'inherit', 'pipe'] });
  // its signal handlers are set once it logs that it started
  child.ready = new Promise((resolve) => {
    let log = '';
    child.stderr.on('data', (d) => {
      if (process.env.E2E_VERBOSE) process.stderr.write(d);
      log += d;
      if (/idempotency-outbox notice: started/.test(log)) { log = ''; resolve(); }
    });
    child.on('exit', resolve);
  });
  senders[i] = child;
}

async function enqueue(db, base) {
  const ops = [];
  // the frozen sender's operation, leased by this driver and never recorded
  const frozen = (await db.query("SELECT idempotency.idem_outbox_add('POST', $1, '{}') AS key",
    [`${base}/ops/0?plan=ok`])).rows[0].key;
  const leased = (await db.query("SELECT key FROM idempotency.idem_outbox_lease(1, '1 second')")).rows;
  assert.deepEqual(leased.map((r) => r.key), [frozen], 'the driver holds the first operation\'s lease');
  ops.push({ n: 0, key: frozen, expect: 'succeeded' });
  let n = 1;
  for (const [plan, expect] of PLANS) {
    const rollback = expect === 'rolled_back';
    await db.query('BEGIN');
    await db.query('INSERT INTO orders (n) VALUES ($1)', [n]);
    const key = (await db.query("SELECT idempotency.idem_outbox_add('POST', $1, $2::jsonb) AS key",
      [`${base}/ops/${n}?plan=${plan}`, JSON.stringify({ n, plan })])).rows[0].key;
    await db.query(rollback ? 'ROLLBACK' : 'COMMIT');
    ops.push({ n, key, expect, plan });
    n++;
  }
  return ops;
}

// Kills a sender now and then, restarting it, until every operation is
// finished (or the time budget ends).
async function chaos(db, started) {
  let kills = 0;
  for (;;) {
    const left = (await db.query("SELECT count(*)::int AS n FROM idempotency.outbox WHERE state IN ('pending', 'in_flight')")).rows[0].n;
    if (left === 0 || Date.now() - started > TIME_BUDGET_MS) return { left, kills };
    await sleep(300 + Math.floor(Math.random() * 900));
    if (kills < 6) {
      const i = Math.floor(Math.random() * 2);
      senders[i].kill('SIGKILL');
      kills++;
      await sleep(Math.floor(Math.random() * 200));
      startSender(i);
    }
  }
}

// The exits of the current senders, stopped by SIGTERM (one that ended on
// its own reports how; one killed earlier and replaced may report its exit
// late: it does not count).
async function stopSenders() {
  return Promise.all(senders.map(async (c) => {
    await c.ready;
    if (c.exitCode !== null || c.signalCode !== null) return { i: senders.indexOf(c), code: c.exitCode, signal: c.signalCode };
    return new Promise((r) => {
      c.once('exit', (code, signal) => r({ i: senders.indexOf(c), code, signal }));
      c.kill('SIGTERM');
    });
  }));
}

function check(ops, rows, executed, attempts, left, stopped) {
  assert.equal(left, 0, 'every operation reached a definite state in time');
  const byKey = new Map(rows.map((r) => [r.key, r]));
  for (const op of ops) {
    const execs = executed.filter((e) => e.n === op.n);
    if (op.expect === 'rolled_back') {
      assert.ok(!byKey.has(op.key), `operation ${op.n} rolled back: not in the outbox`);
      assert.equal(seen.filter((s) => s.n === op.n).length, 0, `operation ${op.n} rolled back: never sent`);
      continue;
    }
    assert.equal(byKey.get(op.key).state, op.expect, `operation ${op.n} (${op.plan}) ends ${op.expect}`);
    assert.equal(execs.length, op.expect === 'succeeded' ? 1 : 0, `operation ${op.n} (${op.plan}) executed once at most`);
    assert.ok(seen.filter((s) => s.n === op.n).every((s) => s.key === op.key), `operation ${op.n}: always its own key`);
  }
  const ids = seen.map((s) => s.requestId);
  assert.equal(new Set(ids).size, ids.length, 'a fresh X-Request-Id per attempt');
  assert.ok(seen.every((s) => s.requestId && !s.requestId.includes(s.key)), 'X-Request-Id not derived from the key');
  assert.equal(attempts.filter((a) => a.status === 422 && a.outcome !== 'failed').length, 0, '422 never retried');
  const op422 = ops.find((o) => o.plan === '422' && o.expect === 'failed');
  const a422 = attempts.filter((a) => a.key === op422.key && a.outcome !== 'lapsed');
  assert.deepEqual(a422.map((a) => [a.status, a.outcome]), [[422, 'failed']], '422: one recorded attempt, failed');
  // Retry-After: 1 s from the answer to the next request with that key
  for (const s of seen.filter((x) => x.fault === '429' || x.fault === '409')) {
    const next = seen.find((x) => x.key === s.key && x.at > s.at);
    assert.ok(next && next.at >= s.answeredAt + 1000, `Retry-After honoured after a ${s.fault} (operation ${s.n})`);
  }
  for (const [i, a] of attempts.entries()) {
    const b = attempts[i + 1];
    if ([429, 409].includes(a.status) && a.outcome === 'retry' && b && b.key === a.key) {
      // ended_at is taken inside the record, after its retry_at: the
      // record's own duration is the tolerance (500 ms under load), still
      // above the backoff's cap (400 ms) that ignoring Retry-After would give
      assert.ok(b.started_at.getTime() >= a.ended_at.getTime() + 1000 - 500, `outbox_attempts: Retry-After after ${a.status}`);
    }
  }
  const frozen = attempts.filter((a) => a.key === ops[0].key).map((a) => a.outcome);
  assert.equal(frozen[0], 'lapsed', 'the frozen lease lapsed');
  assert.equal(frozen[frozen.length - 1], 'succeeded', 'and was taken over, with the same key');
  assert.ok(stopped.every((e) => e.code === 0), `the senders exit 0 on SIGTERM (${JSON.stringify(stopped)})`);
}

async function main() {
  const started = Date.now();
  const db = new pg.Client(conn);
  await db.connect();
  await db.query('CREATE TABLE executed (n int NOT NULL, key text NOT NULL)');
  await db.query('CREATE TABLE orders (n int NOT NULL)');
  const pool = new pg.Pool({ ...conn, max: 20 });
  const server = await startServer(pool);
  const base = `http://127.0.0.1:${server.address().port}`;
  const ops = await enqueue(db, base);
  startSender(0);
  startSender(1);
  const { left, kills } = await chaos(db, started);
  const stopped = await stopSenders();
  const rows = (await db.query('SELECT key, state, attempts FROM idempotency.outbox')).rows;
  const executed = (await db.query('SELECT n, key FROM executed')).rows;
  const attempts = (await db.query(`SELECT o.key, a.attempt, a.started_at, a.ended_at, a.status, a.outcome
    FROM idempotency.outbox_attempts a JOIN idempotency.outbox o ON o.id = a.outbox_id
    ORDER BY o.id, a.attempt, a.started_at`)).rows;
  const states = {};
  for (const r of rows) states[r.state] = (states[r.state] || 0) + 1;
  console.log(`operations ${ops.length} (${ops.filter((o) => o.expect === 'rolled_back').length} rolled back), ` +
    `requests ${seen.length}, sender kills ${kills}, states ${JSON.stringify(states)}, ${Date.now() - started} ms`);
  check(ops, rows, executed, attempts, left, stopped);
  console.log('RESULT ok: each committed operation executed once, none rolled back sent, definite states, ' +
    '422 not retried, Retry-After honoured, a lapsed lease taken over with its key');
  await new Promise((r) => server.close(r));
  await pool.end();
  await db.end();
}

main().catch((err) => {
  console.error(`FAILED: ${err.stack || err}`);
  for (const c of senders) if (c) c.kill('SIGKILL');
  process.exit(1);
});
