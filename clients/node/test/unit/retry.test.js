'use strict';
// The retry helper (src/retry.js) against every vector of the project's
// clients/vectors/retry.json (shared with the Python client), and
// withRetry's loop with a fake send, clock and sleep: no database, no network.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { classify, parseRetryAfter, backoffBound, backoffDelay, withRetry, OUTCOME_WHEN_RETRIES_END } =
  require('../../src/retry.js');

const VECTORS = JSON.parse(fs.readFileSync(path.join(__dirname, '../../../vectors/retry.json'), 'utf8'));

test('classify: every vector', () => {
  assert.ok(VECTORS.classify.length >= 20);
  for (const v of VECTORS.classify) {
    if (v.status !== undefined) {
      assert.equal(classify(v.status), v.kind, `status ${v.status}`);
      assert.equal(classify({ status: v.status, headers: {} }), v.kind, `response ${v.status}`);
    } else {
      assert.equal(classify(v.error), v.kind, `error ${v.error}`);
      const err = v.error === 'timeout' ? new DOMException('timed out', 'TimeoutError')
        : Object.assign(new TypeError('fetch failed'), { cause: Object.assign(new Error('reset'), { code: 'ECONNRESET' }) });
      assert.equal(classify(err), v.kind, `an Error (${v.error})`);
    }
  }
});

test('parseRetryAfter: every vector', () => {
  const now = Date.parse(VECTORS.retry_after.now);
  for (const c of VECTORS.retry_after.cases) {
    assert.equal(parseRetryAfter(c.header, now), c.ms, JSON.stringify(c.header));
    assert.equal(parseRetryAfter(c.header, new Date(now)), c.ms, `${JSON.stringify(c.header)} (a Date)`);
  }
});

test('backoff: every vector, full jitter over [0, bound]', () => {
  const o = { baseMs: VECTORS.backoff.base_ms, capMs: VECTORS.backoff.cap_ms };
  for (const c of VECTORS.backoff.cases) {
    assert.equal(backoffBound(c.attempts, o), c.max_ms, `attempts ${c.attempts}`);
    assert.equal(backoffDelay(c.attempts, o, () => 0), 0);
    assert.equal(backoffDelay(c.attempts, o, () => 0.999999999), c.max_ms);
    for (let i = 0; i < 50; i++) {
      const d = backoffDelay(c.attempts, o);
      assert.ok(Number.isInteger(d) && d >= 0 && d <= c.max_ms, `${d} within [0, ${c.max_ms}]`);
    }
  }
});

test('the outcome when retries end: every vector', () => {
  for (const [kind, state] of Object.entries(VECTORS.outcome_when_retries_end)) {
    if (kind === 'about') continue;
    assert.equal(OUTCOME_WHEN_RETRIES_END[kind], state, kind);
  }
});

// A fake world: send answers from a script, sleep advances a fake clock.
function world(script) {
  let t = 1000000;
  const calls = [];
  const sleeps = [];
  const send = async (a) => {
    calls.push({ ...a, at: t });
    const step = script[Math.min(calls.length - 1, script.length - 1)];
    if (step instanceof Error) throw step;
    return { status: step.status, headers: step.headers || {} };
  };
  return { send, calls, sleeps, opts: { now: () => t, sleep: async (ms) => { sleeps.push(ms); t += ms; } } };
}

test('withRetry: the same key at every attempt, a fresh request id each time, stops on success', async () => {
  const w = world([new Error('reset'), { status: 503 }, { status: 500 }, { status: 201 }]);
  const r = await withRetry(w.send, { ...w.opts, maxAttempts: 10 });
  assert.equal(r.outcome, 'succeeded');
  assert.equal(r.attempts, 4);
  assert.equal(r.response.status, 201);
  assert.equal(new Set(w.calls.map((c) => c.key)).size, 1);
  assert.equal(w.calls[0].key, r.key);
  assert.match(r.key, /^[0-9a-f-]{36}$/);
  assert.equal(new Set(w.calls.map((c) => c.requestId)).size, 4);
  assert.ok(w.calls.every((c) => c.requestId !== c.key));
  assert.deepEqual(w.calls.map((c) => c.attempt), [1, 2, 3, 4]);
});

test('withRetry: a given key is used as it is', async () => {
  const w = world([{ status: 500 }, { status: 200 }]);
  const r = await withRetry(w.send, { ...w.opts, key: 'order-42' });
  assert.deepEqual(w.calls.map((c) => c.key), ['order-42', 'order-42']);
  assert.equal(r.outcome, 'succeeded');
});

test('withRetry: 422 and fatal statuses are never retried', async () => {
  for (const status of [422, 400, 404, 403]) {
    const w = world([{ status }, { status: 200 }]);
    const r = await withRetry(w.send, w.opts);
    assert.equal(r.outcome, 'failed', String(status));
    assert.equal(w.calls.length, 1, `${status} sent once`);
    assert.equal(r.kind, status === 422 ? 'new_key' : 'fatal');
  }
});

test('withRetry: Retry-After is followed (429, 409), backoff otherwise', async () => {
  const w = world([{ status: 429, headers: { 'Retry-After': '3' } }, { status: 409, headers: { 'retry-after': '1' } },
    { status: 503 }, { status: 200 }]);
  const r = await withRetry(w.send, { ...w.opts, random: () => 0.5, baseMs: 100 });
  assert.equal(r.outcome, 'succeeded');
  assert.deepEqual(w.sleeps, [3000, 1000, 200]);
  assert.ok(w.calls[1].at - w.calls[0].at >= 3000);
});

test('withRetry: bounded by maxAttempts and maxTotalMs, ends in attention', async () => {
  let w = world([{ status: 503 }]);
  let r = await withRetry(w.send, { ...w.opts, maxAttempts: 3 });
  assert.equal(r.outcome, 'attention');
  assert.equal(w.calls.length, 3);
  w = world([{ status: 429, headers: { 'Retry-After': '20' } }]);
  r = await withRetry(w.send, { ...w.opts, maxAttempts: 10, maxTotalMs: 30000 });
  assert.equal(r.outcome, 'attention', 'a Retry-After beyond the time left ends the retries');
  assert.equal(w.calls.length, 2);
  const timeout = new DOMException('timed out', 'TimeoutError');
  w = world([timeout]);
  r = await withRetry(w.send, { ...w.opts, maxAttempts: 2 });
  assert.equal(r.outcome, 'attention', 'a timeout is not a failure');
  assert.equal(r.error, timeout);
});

test('withRetry: 401 refreshes the credentials, then the same key; without a hook, attention', async () => {
  let refreshed = 0;
  let w = world([{ status: 401 }, { status: 200 }]);
  let r = await withRetry(w.send, { ...w.opts, refresh: async () => { refreshed++; } });
  assert.equal(r.outcome, 'succeeded');
  assert.equal(refreshed, 1);
  assert.equal(w.calls[0].key, w.calls[1].key);
  w = world([{ status: 401 }]);
  r = await withRetry(w.send, w.opts);
  assert.equal(r.outcome, 'attention');
  assert.equal(w.calls.length, 1);
});
