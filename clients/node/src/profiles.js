'use strict';
// What each outcome answers, per convention: 'stripe' (Stripe's API and
// what stripe-node understands) and 'ietf' (draft-ietf-httpapi-idempotency-key-header,
// errors as RFC 9457 problem details).  Each answer is
// { status, headers, body } with body a JSON value.

// The problem types' URIs (ietf) are this base and the answer's code, one
// per problem: each code has its anchor in doc/http.md ("Problem codes").
const PROBLEM_TYPE_BASE = 'https://pgxn.org/dist/idempotency/doc/http.html#';

// outcome -> [stripe status, stripe error type, Stripe-Should-Retry, ietf status, title]
const OUTCOMES = {
  key_missing: [400, 'invalid_request_error', 'false', 400, 'Idempotency-Key is missing'],
  key_invalid: [400, 'invalid_request_error', 'false', 400, 'Idempotency-Key is malformed'],
  body_invalid: [400, 'invalid_request_error', 'false', 400, 'The request body cannot be read'],
  in_progress: [409, 'idempotency_error', 'true', 409, 'A request with this Idempotency-Key is being processed'],
  mismatch: [400, 'idempotency_error', 'false', 422, 'This Idempotency-Key was used with a different request'],
  pending: [409, 'idempotency_error', 'false', 409, 'The outcome of the request with this Idempotency-Key is being resolved'],
  expired: [409, 'idempotency_error', 'false', 409, 'This Idempotency-Key has expired; send the request with a new key to repeat it'],
  not_configured: [500, 'api_error', 'false', 500, 'The idempotency layer of this API is not configured'],
  too_large: [500, 'api_error', 'false', 500, 'The response is too large to be stored for replay'],
  unavailable: [503, 'api_error', 'true', 503, 'The request could not be completed; retry it with the same Idempotency-Key'],
};

// outcome -> the code its answer carries when the caller names none (every
// answer has a code: Stripe's error.code, the problem's code and type)
const DEFAULT_CODE = {
  key_missing: 'idempotency_key_missing',
  key_invalid: 'idempotency_key_invalid',
  body_invalid: 'request_body_invalid',
  in_progress: 'request_in_progress',
  mismatch: 'idempotency_key_reuse',
  pending: 'outcome_pending',
  expired: 'key_expired',
  not_configured: 'idempotency_not_configured',
  too_large: 'response_too_large',
  unavailable: 'request_not_completed',
};

// What a mismatch's diagnostics say, in one sentence: the members (JSON
// Pointers into the body) that differ, never their values.
function mismatchMessage(m) {
  const parts = [];
  const list = (xs) => xs.map((p) => (p === '' ? 'the whole body' : p)).join(', ');
  if (m.method) parts.push('the method differs');
  if (m.path) parts.push('the path differs');
  if (m.changed && m.changed.length) parts.push(`changed: ${list(m.changed)}`);
  if (m.added && m.added.length) parts.push(`added: ${list(m.added)}`);
  if (m.removed && m.removed.length) parts.push(`removed: ${list(m.removed)}`);
  if (!parts.length) return null;
  return `${OUTCOMES.mismatch[4]} (${parts.join('; ')}${m.truncated ? '; within the members named' : ''}).`;
}

// code: the outcome's own by default; the ietf problem's type is typeBase
// (PROBLEM_TYPE_BASE by default) followed by the code.
function answer(profile, outcome, { message, code, retryAfter, mismatch, typeBase } = {}) {
  const o = OUTCOMES[outcome];
  if (!o) throw new Error(`unknown outcome ${outcome}`);
  code = code || DEFAULT_CODE[outcome];
  if (mismatch && !message) message = mismatchMessage(mismatch) || undefined;
  const headers = {};
  if (retryAfter) headers['Retry-After'] = String(retryAfter);
  if (profile === 'stripe') {
    headers['Stripe-Should-Retry'] = o[2];
    headers['Content-Type'] = 'application/json';
    const error = { type: o[1], message: message || o[4], code };
    if (mismatch) error.mismatch = mismatch;
    return { status: o[0], headers, body: { error } };
  }
  headers['Content-Type'] = 'application/problem+json';
  const body = { type: (typeBase || PROBLEM_TYPE_BASE) + code, title: o[4], status: o[3] };
  if (message) body.detail = message;
  body.code = code;
  if (mismatch) body.mismatch = mismatch;
  return { status: o[3], headers, body };
}

// A claim's action other than execute and replay, as an outcome.
const ACTION_OUTCOME = { in_progress: 'in_progress', mismatch: 'mismatch', pending: 'pending', expired: 'expired' };

module.exports = { answer, mismatchMessage, ACTION_OUTCOME, OUTCOMES, DEFAULT_CODE, PROBLEM_TYPE_BASE };
