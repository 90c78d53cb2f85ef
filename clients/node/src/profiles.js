'use strict';
// What each outcome answers, per convention: 'stripe' (Stripe's API and
// what stripe-node understands) and 'ietf' (draft-ietf-httpapi-idempotency-key-header,
// errors as RFC 9457 problem details).  Each answer is
// { status, headers, body } with body a JSON value.

const IETF_TYPE = 'https://datatracker.ietf.org/doc/draft-ietf-httpapi-idempotency-key-header/';

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

function answer(profile, outcome, { message, code, retryAfter, mismatch } = {}) {
  const o = OUTCOMES[outcome];
  if (!o) throw new Error(`unknown outcome ${outcome}`);
  if (mismatch && !message) message = mismatchMessage(mismatch) || undefined;
  const headers = {};
  if (retryAfter) headers['Retry-After'] = String(retryAfter);
  if (profile === 'stripe') {
    headers['Stripe-Should-Retry'] = o[2];
    headers['Content-Type'] = 'application/json';
    const error = { type: o[1], message: message || o[4] };
    if (code) error.code = code;
    if (mismatch) error.mismatch = mismatch;
    return { status: o[0], headers, body: { error } };
  }
  headers['Content-Type'] = 'application/problem+json';
  const body = { type: IETF_TYPE, title: o[4], status: o[3] };
  if (message) body.detail = message;
  if (code) body.code = code;
  if (mismatch) body.mismatch = mismatch;
  return { status: o[3], headers, body };
}

// A claim's action other than execute and replay, as an outcome.
const ACTION_OUTCOME = { in_progress: 'in_progress', mismatch: 'mismatch', pending: 'pending', expired: 'expired' };

module.exports = { answer, mismatchMessage, ACTION_OUTCOME, OUTCOMES };
