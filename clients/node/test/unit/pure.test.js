'use strict';
// Header parsing, key policy, form mapping and profile answers: no database.

const test = require('node:test');
const assert = require('node:assert/strict');
const { parseKeyHeader, applyKeyPolicy, formToJson, answer, intervalMs } = require('../../src/index.js');

test('Idempotency-Key: bare and RFC 8941 sf-string', () => {
  assert.equal(parseKeyHeader(undefined), null);
  assert.equal(parseKeyHeader('  abc-123 '), 'abc-123');
  assert.equal(parseKeyHeader('"abc-123"'), 'abc-123');
  assert.equal(parseKeyHeader('"a\\"b\\\\c"'), 'a"b\\c');
  assert.equal(parseKeyHeader('order:1'), 'order:1');
  for (const bad of ['', '""', '"abc', '"a"b', '"a\\b"', '"\u00e9"', ['a', 'b']]) {
    assert.throws(() => parseKeyHeader(bad), { name: 'KeyError' }, JSON.stringify(bad));
  }
});

test('key policy: refuse or map by hashing', () => {
  assert.equal(applyKeyPolicy('stripe-node-retry-7f3c', 'refuse'), 'stripe-node-retry-7f3c');
  assert.equal(applyKeyPolicy('stripe-node-retry-7f3c', 'hash'), 'stripe-node-retry-7f3c');
  assert.throws(() => applyKeyPolicy('order:1', 'refuse'), { name: 'KeyError' });
  assert.throws(() => applyKeyPolicy('x'.repeat(256), 'refuse'), { name: 'KeyError' });
  const h = applyKeyPolicy('order:1', 'hash');
  // h_ + base64url(sha256("order:1")), computed independently:
  // printf 'order:1' | sha256sum | xxd -r -p | base64 | tr '+/' '-_' | tr -d '='
  assert.equal(h, 'h_' + require('node:crypto').createHash('sha256').update('order:1').digest('base64url'));
  assert.match(h, /^h_[A-Za-z0-9_-]{43}$/);
  assert.notEqual(applyKeyPolicy('order:2', 'hash'), h);
});

test('form bodies map to JSON as documented', () => {
  const j = (s) => JSON.stringify(formToJson(s));
  assert.equal(j(''), '{}');
  assert.equal(j('amount=1000&currency=usd'), '{"amount":"1000","currency":"usd"}');
  assert.equal(j('metadata[order_id]=6735&metadata[request_ts]=17'), '{"metadata":{"order_id":"6735","request_ts":"17"}}');
  assert.equal(j('expand[]=customer&expand[]=invoice'), '{"expand":["customer","invoice"]}');
  assert.equal(j('a=1&a=2'), '{"a":["1","2"]}');
  assert.equal(j('items[0][price]=p1&items[1][price]=p2'), '{"items":{"0":{"price":"p1"},"1":{"price":"p2"}}}');
  assert.equal(j('items[][price]=p1&items[][price]=p2'), '{"items":[{"price":"p1"},{"price":"p2"}]}');
  assert.equal(j('name=J%C3%B6rg+M&flag'), '{"name":"Jörg M","flag":""}');
  assert.equal(j('__proto__[x]=1'), '{"__proto__":{"x":"1"}}');
  assert.equal({}.x, undefined);
  for (const bad of ['a=1&a[b]=2', 'a[b]=1&a=2', 'a[]=1&a[b]=2', 'a=%E0%A4%A']) {
    assert.throws(() => formToJson(bad), { name: 'BodyError' }, bad);
  }
});

test('profiles: status, error body and retry headers per outcome', () => {
  const s = (o, x) => answer('stripe', o, x);
  const i = (o, x) => answer('ietf', o, x);
  assert.equal(s('mismatch').status, 400);
  assert.equal(s('mismatch').body.error.type, 'idempotency_error');
  assert.equal(s('mismatch').headers['Stripe-Should-Retry'], 'false');
  assert.equal(i('mismatch').status, 422);
  assert.equal(i('mismatch').headers['Content-Type'], 'application/problem+json');
  assert.equal(s('in_progress', { retryAfter: 2 }).status, 409);
  assert.equal(s('in_progress', { retryAfter: 2 }).headers['Retry-After'], '2');
  assert.equal(s('in_progress').headers['Stripe-Should-Retry'], 'true');
  assert.equal(s('pending').status, 409);
  assert.equal(s('pending').headers['Stripe-Should-Retry'], 'false');
  assert.equal(s('unavailable').status, 503);
  assert.equal(s('unavailable').headers['Stripe-Should-Retry'], 'true');
  assert.equal(s('key_missing').body.error.type, 'invalid_request_error');
  assert.equal(i('key_missing').status, 400);
  assert.equal(i('pending', { code: 'outcome_pending' }).body.code, 'outcome_pending');
});

test('intervals', () => {
  assert.equal(intervalMs('30 seconds'), 30000);
  assert.equal(intervalMs('500 ms'), 500);
  assert.equal(intervalMs('2 min'), 120000);
  assert.equal(intervalMs(5), 5000);
  assert.throws(() => intervalMs('tomorrow'));
});

test('a mismatch answer names the members that differ, never their values', () => {
  const m = { changed: ['/amount'], added: [], removed: ['/metadata/trace_id'], method: false, path: true, truncated: false };
  const st = answer('stripe', 'mismatch', { code: 'idempotency_key_reuse', mismatch: m });
  assert.equal(st.body.error.message,
    'This Idempotency-Key was used with a different request (the path differs; changed: /amount; removed: /metadata/trace_id).');
  assert.deepEqual(st.body.error.mismatch, m);
  const ie = answer('ietf', 'mismatch', { mismatch: { changed: [''], added: [], removed: [], method: null, path: null, truncated: true } });
  assert.equal(ie.body.detail, 'This Idempotency-Key was used with a different request (changed: the whole body; within the members named).');
  assert.equal(ie.status, 422);
  assert.equal(answer('ietf', 'mismatch', { mismatch: null }).body.mismatch, undefined);
});
