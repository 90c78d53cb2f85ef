'use strict';
// Header parsing, key policy, form mapping, fingerprint input, intervals and
// profile answers: no database.  The expected values are those of
// clients/vectors/expected.json, which the Python client's tests read too,
// so that both clients read keys, fingerprint bodies and answer alike.

const test = require('node:test');
const assert = require('node:assert/strict');
const { Readable } = require('node:stream');
const { parseKeyHeader, applyKeyPolicy, formToJson, answer, intervalMs } = require('../../src/index.js');
const { fingerprintBody } = require('../../src/body.js');
const { OUTCOMES } = require('../../src/profiles.js');
const V = require('../../../vectors/expected.json');

const show = (x) => JSON.stringify(x);

test('Idempotency-Key: bare and RFC 8941 sf-string (vectors)', () => {
  assert.equal(parseKeyHeader(undefined), V.key_header.absent);
  for (const [header, key] of V.key_header.valid) assert.equal(parseKeyHeader(header), key, show(header));
  for (const bad of V.key_header.invalid) {
    assert.throws(() => parseKeyHeader(bad), { name: 'KeyError' }, show(bad));
  }
});

test('key policy: refuse or map by hashing (vectors)', () => {
  for (const key of V.key_policy.within) {
    assert.equal(applyKeyPolicy(key, 'refuse'), key);
    assert.equal(applyKeyPolicy(key, 'hash'), key);
  }
  for (const key of V.key_policy.outside) assert.throws(() => applyKeyPolicy(key, 'refuse'), { name: 'KeyError' }, key);
  for (const [key, mapped] of V.key_policy.hash) {
    assert.equal(applyKeyPolicy(key, 'hash'), mapped, key);
    assert.match(mapped, /^h_[A-Za-z0-9_-]{43}$/);
  }
});

test('form bodies map to JSON as documented (vectors)', () => {
  for (const [form, json] of V.form.valid) assert.deepEqual(JSON.parse(JSON.stringify(formToJson(form))), json, form);
  for (const bad of V.form.invalid) assert.throws(() => formToJson(bad), { name: 'BodyError' }, bad);
});

test('form bodies: __proto__ is a plain member', () => {
  assert.equal(JSON.stringify(formToJson('__proto__[x]=1')), '{"__proto__":{"x":"1"}}');
  assert.equal({}.x, undefined);
});

// A request as fingerprintBody reads it: a stream with headers, no body parser before.
function request(contentType, body) {
  const req = Readable.from(body ? [Buffer.from(body, 'utf8')] : []);
  req.headers = { 'content-type': contentType };
  return req;
}

test('the fingerprint input of a body (vectors)', async () => {
  for (const v of V.fingerprint.valid) {
    const { json } = await fingerprintBody(request(v.content_type, v.body), 1024);
    assert.deepEqual(json === null ? null : JSON.parse(json), v.json, show(v));
  }
  for (const v of V.fingerprint.invalid) {
    await assert.rejects(fingerprintBody(request(v.content_type, v.body), 1024), { name: 'BodyError' }, show(v));
  }
});

test('intervals (vectors)', () => {
  for (const [text, seconds] of V.intervals.seconds) assert.equal(intervalMs(text), seconds * 1000, show(text));
  for (const bad of V.intervals.invalid) assert.throws(() => intervalMs(bad), TypeError, bad);
});

test('profiles: every outcome\'s answer, Stripe and IETF (vectors)', () => {
  assert.deepEqual(Object.keys(V.answers).sort(), Object.keys(OUTCOMES).sort(), 'the vectors name every outcome');
  for (const [outcome, byProfile] of Object.entries(V.answers)) {
    for (const [profile, expected] of Object.entries(byProfile)) {
      assert.deepEqual(answer(profile, outcome), expected, `${profile} ${outcome}`);
    }
  }
});

test('profiles: answers with options (vectors)', () => {
  for (const c of V.answer_cases) {
    const x = c.options;
    const a = answer(c.profile, c.outcome, {
      retryAfter: x.retry_after, code: x.code, message: x.message, mismatch: x.mismatch, typeBase: x.type_base,
    });
    const what = show(c);
    const stripe = c.profile === 'stripe';
    if ('status' in c) assert.equal(a.status, c.status, what);
    if ('headers' in c) assert.deepEqual(a.headers, c.headers, what);
    if ('body' in c) assert.deepEqual(a.body, c.body, what);
    if ('body_code' in c) assert.equal(stripe ? a.body.error.code : a.body.code, c.body_code, what);
    if ('message' in c) assert.equal(stripe ? a.body.error.message : a.body.detail, c.message, what);
    if ('body_mismatch' in c) {
      const m = stripe ? a.body.error.mismatch : a.body.mismatch;
      assert.deepEqual(m === undefined ? null : m, c.body_mismatch, what);
    }
  }
});
