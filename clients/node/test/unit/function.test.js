'use strict';
// idempotentFunction (src/function.js) against the extension: atomic mode
// (the claim, fn's writes and the stored result in one transaction; a
// failing fn leaves nothing), the answers that keep fn from running
// (replay, mismatch, in_progress, pending) and lease mode (heartbeat,
// release on noSideEffect, unknown otherwise); and the command's arguments.

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const pg = require('pg');
const { conn, skip } = require('../support');
const { idempotentFunction, IdempotentFunctionError } = require('../../src/index.js');

const env = { pool: null };
test.before(async () => {
  if (skip) return;
  env.pool = new pg.Pool({ ...conn, max: 6 });
  await env.pool.query('CREATE TABLE IF NOT EXISTS fn_rows (k text, v int)');
});
test.after(async () => { if (!skip) await env.pool.end(); });

const unique = (p) => `${p}-${Date.now()}-${Math.floor(Math.random() * 1e6)}`;
const count = async (k) => (await env.pool.query('SELECT count(*)::int AS n FROM fn_rows WHERE k = $1', [k])).rows[0].n;

test('options are checked when the function is made', () => {
  const pool = { connect() {}, query() {} };
  assert.throws(() => idempotentFunction({ endpoint: 'e' }, () => {}), /options.pool/);
  assert.throws(() => idempotentFunction({ pool }, () => {}), /options.endpoint/);
  assert.throws(() => idempotentFunction({ pool, endpoint: 'e', key: 'id' }, () => {}), /options.key is a function/);
  assert.throws(() => idempotentFunction({ pool, endpoint: 'e' }), /the function to run/);
});

test('atomic: runs once, stores the result, replays it; a throw leaves nothing and the key free', { skip }, async () => {
  let runs = 0;
  const id = unique('m');
  let fail = true;
  const f = idempotentFunction({ pool: env.pool, endpoint: 'fn-atomic' }, async (msg, { client, key }) => {
    runs++;
    assert.equal(key, msg.id);
    await client.query('INSERT INTO fn_rows VALUES ($1, $2)', [msg.id, msg.v]);
    if (fail) throw new Error('the work failed');
    return { v: msg.v, list: [1, 'two'] };
  });
  await assert.rejects(f({ id, v: 1 }), /the work failed/);
  assert.equal(await count(id), 0, 'rolled back with the claim');
  fail = false;
  assert.deepEqual(await f({ id, v: 1 }), { v: 1, list: [1, 'two'] });
  assert.deepEqual(await f({ id, v: 1 }), { v: 1, list: [1, 'two'] });
  assert.equal(runs, 2);
  assert.equal(await count(id), 1);
  await assert.rejects(f({ id, v: 2 }), (err) => err instanceof IdempotentFunctionError &&
    err.code === 'idempotency_key_reuse' && err.retryable === false && err.key === id);
  await assert.rejects(f({ v: 2 }), /has no key/);
});

test('atomic: the key and the payload come from the options', { skip }, async () => {
  const order = unique('order');
  let runs = 0;
  const f = idempotentFunction({ pool: env.pool, endpoint: 'fn-key', key: (m) => m.order, payload: (m) => ({ amount: m.amount }) },
    async () => { runs++; return null; });
  assert.equal(await f({ order, amount: 5, deliveredAt: 1 }), null);
  assert.equal(await f({ order, amount: 5, deliveredAt: 2 }), null, 'a field outside the payload changes nothing');
  assert.equal(runs, 1);
});

test('a duplicate still running past wait: a retryable request_in_progress', { skip }, async () => {
  const id = unique('slow');
  let release;
  const gate = new Promise((r) => { release = r; });
  const f = idempotentFunction({ pool: env.pool, endpoint: 'fn-busy', wait: 0 }, async () => { await gate; return 'done'; });
  const first = f({ id });
  await new Promise((r) => setTimeout(r, 200));
  await assert.rejects(f({ id }), (err) => err instanceof IdempotentFunctionError && err.code === 'request_in_progress' &&
    err.retryable === true && err.retryAfter >= 1);
  release();
  assert.equal(await first, 'done');
  assert.equal(await f({ id }), 'done');
});

test('lease mode: replays; a throw marks the key unknown, or releases it after noSideEffect()', { skip }, async () => {
  let runs = 0;
  const mode = { fail: false, clean: false };
  const f = idempotentFunction({ pool: env.pool, endpoint: 'fn-lease', lease: '2 seconds', heartbeatMs: 100 },
    async (msg, ctx) => {
      runs++;
      assert.equal(ctx.client, undefined);
      assert.match(ctx.leaseToken, /^-?\d+$/);
      if (mode.clean) ctx.noSideEffect();
      await new Promise((r) => setTimeout(r, 300)); // beyond a few heartbeats
      if (mode.fail) throw new Error('the mailer failed');
      return { sent: msg.id };
    });
  const ok = unique('mail');
  assert.deepEqual(await f({ id: ok }), { sent: ok });
  assert.deepEqual(await f({ id: ok }), { sent: ok });
  assert.equal(runs, 1);
  Object.assign(mode, { fail: true, clean: true });
  const clean = unique('mail');
  await assert.rejects(f({ id: clean }), /mailer failed/);
  mode.fail = false;
  assert.deepEqual(await f({ id: clean }), { sent: clean }, 'released: the redelivery runs');
  Object.assign(mode, { fail: true, clean: false });
  const dirty = unique('mail');
  await assert.rejects(f({ id: dirty }), /mailer failed/);
  await assert.rejects(f({ id: dirty }), (err) => err instanceof IdempotentFunctionError && err.code === 'outcome_pending');
});

test('lease mode: the heartbeat keeps the lease of a run longer than the lease', { skip }, async () => {
  const id = unique('long');
  // a lease of 3 seconds, so that a machine under load (a heartbeat late by
  // a second) does not see it lapse; the check comes past its first end
  const f = idempotentFunction({ pool: env.pool, endpoint: 'fn-beat', lease: '3 seconds', heartbeatMs: 200, wait: 0 },
    async () => { await new Promise((r) => setTimeout(r, 4500)); return 'long'; });
  const first = f({ id });
  await new Promise((r) => setTimeout(r, 3500));
  await assert.rejects(f({ id }), (err) => err instanceof IdempotentFunctionError && err.code === 'request_in_progress',
    'past the first lease, still held');
  const l = (await env.pool.query(`SELECT locked_until > now() AS ahead
    FROM idempotency.idem_lookup('default', 'fn-beat', $1)`, [id])).rows[0];
  assert.equal(l.ahead, true, 'the lease was moved on by the heartbeat');
  assert.equal(await first, 'long');
});

test('idempotency-outbox: --help, and bad arguments exit 2 with a message', () => {
  const bin = path.join(__dirname, '../../src/bin/idempotency-outbox.js');
  const run = (...args) => spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', env: { PATH: process.env.PATH } });
  const help = run('--help');
  assert.equal(help.status, 0);
  assert.match(help.stdout, /^Usage: idempotency-outbox --database URL/);
  for (const [args, message] of [[[], /--database URL is required/], [['--database', 'x', '--bogus'], /Unknown option '--bogus'/],
    [['--database', 'x', '--concurrency', 'two'], /--concurrency takes a positive integer/],
    [['--database', 'x', '--lease-ms', '1000'], /leaseMs must exceed timeoutMs/], [['--database', 'x', 'extra'], /positional/]]) {
    const r = run(...args);
    assert.equal(r.status, 2, args.join(' '));
    assert.match(r.stderr, message);
    assert.match(r.stderr, /Try idempotency-outbox --help/);
  }
});
