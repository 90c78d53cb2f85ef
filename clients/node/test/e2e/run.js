'use strict';
// End-to-end: the official stripe npm client (its own retries, its own
// Idempotency-Key handling) against server.js under faults: lost
// responses, crashes before commit, slow handlers, killed backends,
// serialization failures, and kill -9 of the server by this driver.  Then,
// from the database: no key executed twice, every acknowledged charge is
// there, and every retry (and a final replay of every key) got the first
// response.  Loopback only; bounded in calls and time.

const { spawn } = require('node:child_process');
const net = require('node:net');
const path = require('node:path');
const pg = require('pg');
const Stripe = require('stripe');

const CALLS = Number(process.env.E2E_CALLS || 300);
const CONCURRENCY = 12;
const TIME_BUDGET_MS = 45000; // no call starts later: the run stays well under 2 minutes on a loaded machine
const SERVER_KILLS = 3;
const { conn } = require('../support.js');

const freePort = () => new Promise((resolve) => {
  const s = net.createServer();
  s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
});

const faults = {};
let child = null;
let stopping = false;
let starts = 0;

function startServer(port, rate) {
  return new Promise((resolve) => {
    starts++;
    child = spawn(process.execPath, [path.join(__dirname, 'server.js')], {
      env: { ...process.env, PORT: String(port), FAULT_RATE: String(rate) },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let buf = '';
    child.stdout.on('data', (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (line === 'LISTENING') resolve();
        const m = /^FAULT (\w+)/.exec(line);
        if (m) faults[m[1]] = (faults[m[1]] || 0) + 1;
      }
    });
    const me = child;
    child.on('exit', (code, signal) => {
      if (!stopping && me === child) startServer(port, rate); // the supervisor restarts it
    });
  });
}

async function stopServer() {
  stopping = true;
  if (child && child.exitCode === null && child.signalCode === null) {
    await new Promise((r) => { child.once('exit', r); child.kill('SIGTERM'); });
  }
  stopping = false;
}

// The call phase: CALLS charges by CONCURRENCY workers, the server killed
// now and then; what was acknowledged, and the calls that failed or were
// skipped past the time budget.
async function callPhase(port, started) {
  await startServer(port, 0.2);
  const stripe = new Stripe('sk_test_e2e', {
    host: '127.0.0.1', port, protocol: 'http', maxNetworkRetries: 10, timeout: 2000, telemetry: false,
  });

  // kill -9 of the whole server now and then, a bounded number of times
  let kills = 0;
  const killer = setInterval(() => {
    if (kills >= SERVER_KILLS) return clearInterval(killer);
    if (child && child.exitCode === null) { kills++; faults.server_kill_9 = kills; child.kill('SIGKILL'); }
  }, 3000);

  const acknowledged = new Map(); // key -> { id, requestId, amount }
  const failures = [];
  let next = 0;
  let skipped = 0;
  async function worker(w) {
    for (;;) {
      const i = next++;
      if (i >= CALLS) return;
      if (Date.now() - started > TIME_BUDGET_MS) { skipped++; continue; }
      const key = `e2e-${process.pid}-${i}`;
      const amount = 100 + i;
      try {
        const charge = await stripe.charges.create(
          { amount, currency: 'usd', metadata: { request_ts: String(Date.now()) } },
          { idempotencyKey: key });
        acknowledged.set(key, { id: charge.id, requestId: charge.lastResponse.requestId, amount });
      } catch (err) {
        failures.push(`${key}: ${err.type || err.name}: ${err.message}`);
      }
    }
  }
  await Promise.all(Array.from({ length: CONCURRENCY }, (_, w) => worker(w)));
  clearInterval(killer);
  await stopServer();
  console.log(`calls done after ${((Date.now() - started) / 1000).toFixed(1)} s`);
  return { acknowledged, failures, skipped };
}

// The replay phase: no faults; every key again, with another (excluded)
// request_ts, then one reused with another amount.
async function replayPhase(port, acknowledged, problems) {
  await startServer(port, 0);
  const replayClient = new Stripe('sk_test_e2e', { host: '127.0.0.1', port, protocol: 'http', maxNetworkRetries: 2, telemetry: false });
  let mismatched = 0;
  let replayedOk = 0;
  for (const [key, a] of acknowledged) {
    try {
      const c = await replayClient.charges.create({ amount: a.amount, currency: 'usd', metadata: { request_ts: 'later' } }, { idempotencyKey: key });
      const replayed = c.lastResponse.headers['idempotent-replayed'] === 'true';
      if (c.id !== a.id || c.lastResponse.requestId !== a.requestId || !replayed) {
        mismatched++;
        problems.push(`${key}: first ${a.id} ${a.requestId}, replay ${c.id} ${c.lastResponse.requestId} replayed=${replayed}`);
      } else replayedOk++;
    } catch (err) {
      mismatched++;
      problems.push(`${key}: replay failed: ${err.message}`);
    }
  }
  // a reused key with another amount is refused as Stripe does
  let reuseRefused = false;
  const [someKey, some] = acknowledged.entries().next().value;
  try {
    await replayClient.charges.create({ amount: some.amount + 1, currency: 'usd' }, { idempotencyKey: someKey });
  } catch (err) {
    reuseRefused = err.type === 'StripeIdempotencyError' && err.statusCode === 400;
  }
  await stopServer();
  return { mismatched, replayedOk, reuseRefused };
}

// What the database holds: duplicates, acknowledged charges lost, keys not completed.
async function checkDatabase(db, acknowledged, problems) {
  const dup = await db.query('SELECT idem_key, count(*) AS n FROM charges GROUP BY idem_key HAVING count(*) > 1');
  const byKey = new Map((await db.query('SELECT idem_key, id FROM charges')).rows.map((r) => [r.idem_key, r.id]));
  let lost = 0;
  for (const [key, a] of acknowledged) {
    if (byKey.get(key) !== a.id) { lost++; problems.push(`${key}: acknowledged ${a.id}, database has ${byKey.get(key)}`); }
  }
  const pendingKeys = (await db.query("SELECT count(*)::int AS n FROM idempotency.keys WHERE state <> 'completed'")).rows[0].n;
  return { duplicates: dup.rowCount, lost, pendingKeys };
}

async function main() {
  const started = Date.now();
  const db = new pg.Client(conn);
  await db.connect();
  await db.query('CREATE TABLE charges (id text PRIMARY KEY, idem_key text NOT NULL, amount int NOT NULL)');
  const port = await freePort();
  const { acknowledged, failures, skipped } = await callPhase(port, started);
  const problems = [];
  const { mismatched, replayedOk, reuseRefused } = await replayPhase(port, acknowledged, problems);
  const { duplicates, lost, pendingKeys } = await checkDatabase(db, acknowledged, problems);
  await db.end();

  const faultTotal = Object.values(faults).reduce((s, v) => s + v, 0);
  console.log(`faults: ${JSON.stringify(faults)}`);
  for (const p of problems.slice(0, 20)) console.log(`problem: ${p}`);
  for (const f of failures.slice(0, 10)) console.log(`unacknowledged: ${f}`);
  const ok = duplicates === 0 && lost === 0 && mismatched === 0 && reuseRefused &&
    acknowledged.size >= 0.95 * (CALLS - skipped) && faultTotal > 0;
  console.log(`RESULT ${ok ? 'ok' : 'FAILED'}: calls=${CALLS - skipped} acknowledged=${acknowledged.size} unacknowledged=${failures.length} ` +
    `faults=${faultTotal} server_starts=${starts} duplicates=${duplicates} lost=${lost} mismatched_replays=${mismatched} ` +
    `replayed=${replayedOk} reuse_refused=${reuseRefused} keys_not_completed=${pendingKeys} seconds=${((Date.now() - started) / 1000).toFixed(1)}`);
  process.exit(ok ? 0 : 1);
}

main().catch((err) => { console.error(err); stopping = true; if (child) child.kill('SIGKILL'); process.exit(2); });
