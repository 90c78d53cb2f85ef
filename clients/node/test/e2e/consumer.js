'use strict';
// End-to-end: a queue consumer on idempotentFunction.  Each message is
// delivered several times: concurrently (on one pool), again after the
// first run ended, and after a consumer crashed inside fn (a child process
// killed with SIGKILL mid-run, its transaction rolled back by the server).
// Then: each message's business row written once, every delivery got the
// stored result, a changed payload under a key refused with
// idempotency_key_reuse; and the same in lease mode for work outside the
// database (a file written once per message).  Loopback only.
//
//   node consumer.js            the test
//   node consumer.js --child ID a consumer that crashes: reports IN_FN from inside fn, then waits to be killed

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const assert = require('node:assert/strict');
const pg = require('pg');
const { idempotentFunction, IdempotentFunctionError } = require('../../src/index.js');

const { conn } = require('../support.js');
const MESSAGES = 8;
const DELIVERIES = 4;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The consumer: the business write with the claim's client, then a result.
function consumer(pool, onRun = () => {}) {
  return idempotentFunction({ pool, endpoint: 'consume-payment', tenant: 'shop', wait: '10 seconds' },
    async (msg, { client }) => {
      await client.query('INSERT INTO payments (msg_id, amount, pid) VALUES ($1, $2, $3)', [msg.id, msg.amount, process.pid]);
      await onRun(msg);
      return { msg: msg.id, charged: msg.amount * 100, by: process.pid };
    });
}

// A queue's redelivery: a retryable answer (a duplicate still running) is delivered again later.
async function deliver(handle, msg) {
  for (let i = 0; ; i++) {
    try {
      return await handle(msg);
    } catch (err) {
      if (!(err instanceof IdempotentFunctionError && err.retryable) || i > 20) throw err;
      await sleep(100);
    }
  }
}

async function crashInside(id) {
  const child = spawn(process.execPath, [__filename, '--child', id], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise((resolve, reject) => {
    child.stdout.on('data', (d) => { if (String(d).includes('IN_FN')) resolve(); });
    child.on('exit', (code) => reject(new Error(`the child ended (${code}) before it was killed`)));
  });
  child.removeAllListeners('exit');
  await new Promise((r) => { child.once('exit', r); child.kill('SIGKILL'); });
}

async function atomicMode(pool, db) {
  const handle = consumer(pool);
  const msgs = Array.from({ length: MESSAGES }, (_, i) => ({ id: `msg-${i}`, amount: i + 1 }));
  // a crash inside fn for one message first: its write is rolled back
  await crashInside('msg-crash');
  msgs.push({ id: 'msg-crash', amount: 99 });
  const results = await Promise.all(msgs.flatMap((m) => Array.from({ length: DELIVERIES }, () => deliver(handle, m))));
  const again = await Promise.all(msgs.map((m) => deliver(handle, m)));
  const rows = (await db.query('SELECT msg_id, count(*)::int AS n, min(pid) AS pid FROM payments GROUP BY msg_id')).rows;
  assert.equal(rows.length, msgs.length);
  for (const r of rows) {
    assert.equal(r.n, 1, `${r.msg_id} executed once`);
    assert.equal(r.pid, process.pid, `${r.msg_id}: the crashed consumer's write is not there`);
  }
  for (const [i, m] of msgs.entries()) {
    const got = [...results.slice(i * DELIVERIES, (i + 1) * DELIVERIES), again[i]];
    for (const g of got) assert.deepEqual(g, { msg: m.id, charged: m.amount * 100, by: process.pid }, `${m.id}: the stored result`);
  }
  await assert.rejects(handle({ id: 'msg-1', amount: 1000 }), (err) => err instanceof IdempotentFunctionError &&
    err.code === 'idempotency_key_reuse' && !err.retryable);
  return msgs.length;
}

async function leaseMode(pool) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-consumer-'));
  let runs = 0;
  const handle = idempotentFunction({ pool, endpoint: 'send-email', tenant: 'shop', lease: '5 seconds', wait: '10 seconds' },
    async (msg) => {
      runs++;
      fs.appendFileSync(path.join(dir, msg.id), 'sent\n');
      await sleep(200);
      return { sent: msg.id };
    });
  const msgs = Array.from({ length: 4 }, (_, i) => ({ id: `mail-${i}` }));
  const results = await Promise.all(msgs.flatMap((m) => [deliver(handle, m), deliver(handle, m), deliver(handle, m)]));
  const again = await Promise.all(msgs.map((m) => deliver(handle, m)));
  for (const m of msgs) assert.equal(fs.readFileSync(path.join(dir, m.id), 'utf8'), 'sent\n', `${m.id} sent once`);
  assert.equal(runs, msgs.length);
  assert.ok([...results, ...again].every((r, i) => r.sent === msgs[i < results.length ? Math.floor(i / 3) : i - results.length].id));
  fs.rmSync(dir, { recursive: true });
}

async function child(id) {
  const pool = new pg.Pool({ ...conn, max: 2 });
  const handle = consumer(pool, async () => { process.stdout.write('IN_FN\n'); await sleep(60000); });
  await handle({ id, amount: 99 });
}

async function main() {
  const started = Date.now();
  const db = new pg.Client(conn);
  await db.connect();
  await db.query('CREATE TABLE payments (msg_id text NOT NULL, amount int NOT NULL, pid int NOT NULL)');
  const pool = new pg.Pool({ ...conn, max: 12 });
  const n = await atomicMode(pool, db);
  await leaseMode(pool);
  console.log(`RESULT ok: ${n} messages delivered ${DELIVERIES + 1} times each (one after a consumer crash) executed ` +
    `once and replayed the stored result; lease mode the same (${Date.now() - started} ms)`);
  await pool.end();
  await db.end();
}

if (process.argv[2] === '--child') {
  child(process.argv[3]).catch((err) => { console.error(err); process.exit(1); });
} else {
  main().catch((err) => { console.error(`FAILED: ${err.stack || err}`); process.exit(1); });
}
