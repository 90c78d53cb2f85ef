'use strict';
// The client's retry rules for a request sent with an Idempotency-Key (the
// project's clients/vectors/retry.json, shared with the Python client):
// classify an attempt's outcome, read Retry-After, the full-jitter backoff,
// and withRetry(send, options), which sends one operation with the same key
// at every attempt until a definite answer or its bounds.  The outbox
// sender (outbox.js) applies the same rules.

const { randomUUID } = require('node:crypto');

// Kinds: success, retry, wait (409), refresh (401), new_key (422), fatal.
const RETRY_STATUSES = new Set([408, 425, 429, 500, 502, 503, 504]);

// The final state when retries end, by the last attempt's kind.
const OUTCOME_WHEN_RETRIES_END = Object.freeze({
  success: 'succeeded', fatal: 'failed', new_key: 'failed', retry: 'attention', wait: 'attention', refresh: 'attention',
});

// Whether an error is a timeout (no whole answer in time) rather than a
// network failure: AbortSignal.timeout's TimeoutError, or an error marked so.
function isTimeout(err) {
  return !!err && (err.name === 'TimeoutError' || err.code === 'ETIMEDOUT' || err.timeout === true ||
    (err.cause ? isTimeout(err.cause) : false));
}

// The kind of an attempt's outcome: a status (a number, or a response with
// .status), or the error of an attempt without an answer (network, timeout:
// both ambiguous, retried with the same key).
function classify(outcome) {
  if (outcome instanceof Error || outcome === 'network' || outcome === 'timeout') return 'retry';
  const status = typeof outcome === 'number' ? outcome : outcome && outcome.status;
  if (!Number.isInteger(status)) throw new TypeError('classify: a status, a response or an error');
  if (status >= 200 && status < 300) return 'success';
  if (RETRY_STATUSES.has(status)) return 'retry';
  if (status === 409) return 'wait';
  if (status === 401) return 'refresh';
  if (status === 422) return 'new_key';
  return 'fatal';
}

const MONTHS = 'Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec';
// RFC 9110's HTTP-date: IMF-fixdate, and the obsolete RFC 850 and asctime forms
const HTTP_DATE = new RegExp(`^(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \\d{2} (?:${MONTHS}) \\d{4} \\d{2}:\\d{2}:\\d{2} GMT` +
  `|(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day, \\d{2}-(?:${MONTHS})-\\d{2} \\d{2}:\\d{2}:\\d{2} GMT` +
  `|(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:${MONTHS}) [ \\d]\\d \\d{2}:\\d{2}:\\d{2} \\d{4})$`);

// Retry-After (delay-seconds or an HTTP-date) in milliseconds from `now`
// (ms since the epoch, or a Date); null when absent or not valid; a date in
// the past gives 0.
function parseRetryAfter(header, now = Date.now()) {
  if (header == null) return null;
  const text = String(Array.isArray(header) ? header[0] : header).trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  if (!HTTP_DATE.test(text)) return null;
  const at = Date.parse(/ GMT$/.test(text) ? text : `${text} GMT`);
  if (Number.isNaN(at)) return null;
  return Math.max(0, at - Number(now));
}

// The upper bound of the jitter interval before attempt n + 1 (n >= 1).
function backoffBound(attempts, { baseMs = 100, capMs = 10000 } = {}) {
  const n = Math.max(1, Math.floor(attempts));
  return Math.min(capMs, baseMs * 2 ** Math.min(n - 1, 1023));
}

// Full jitter: uniform in [0, min(capMs, baseMs * 2^(attempts - 1))].
function backoffDelay(attempts, options = {}, random = Math.random) {
  return Math.floor(random() * (backoffBound(attempts, options) + 1));
}

// setTimeout's largest delay is 2^31 - 1 ms (about 24.8 days)
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, Math.min(ms, 2147483647)));

// The delay before the next attempt, or null when the bounds end the retries
// (attempts used up, or the delay would go past the total time left).
function nextDelay(retryAfterMs, attempts, elapsedMs, o) {
  if (attempts >= o.maxAttempts) return null;
  const delay = retryAfterMs != null ? retryAfterMs : backoffDelay(attempts, o, o.random);
  return elapsedMs + delay > o.maxTotalMs ? null : delay;
}

function retryOptions(options) {
  const o = { maxAttempts: 5, maxTotalMs: 30000, baseMs: 100, capMs: 10000, random: Math.random, sleep,
    now: Date.now, ...options };
  if (!(Number.isInteger(o.maxAttempts) && o.maxAttempts >= 1)) throw new TypeError('withRetry: maxAttempts is an integer >= 1');
  if (!(o.maxTotalMs >= 0)) throw new TypeError('withRetry: maxTotalMs is a number of milliseconds');
  if (options && options.key != null && typeof options.key !== 'string') throw new TypeError('withRetry: key is a string');
  return o;
}

// Sends one operation until a definite answer: send({ key, attempt,
// requestId }) resolves with a response (anything with .status and
// .headers) or rejects (network, timeout).  The key is options.key or a
// fresh UUID, the same at every attempt; requestId is fresh at each.  A 401
// calls options.refresh() (when given) before the next attempt.  Resolves
// with { outcome, kind, attempts, response, error, key }: outcome is
// 'succeeded', 'failed' (fatal, new_key) or 'attention' (retries ended on an
// ambiguous outcome: the operation may have happened).
async function withRetry(send, options = {}) {
  const o = retryOptions(options);
  const key = o.key != null ? o.key : randomUUID();
  const started = o.now();
  for (let attempt = 1; ; attempt++) {
    let response = null;
    let error = null;
    try {
      response = await send({ key, attempt, requestId: randomUUID() });
    } catch (err) {
      error = err;
    }
    const kind = classify(error || response);
    const done = (outcome) => ({ outcome, kind, attempts: attempt, response, error, key });
    if (kind === 'success' || kind === 'fatal' || kind === 'new_key') return done(OUTCOME_WHEN_RETRIES_END[kind]);
    if (kind === 'refresh' && typeof o.refresh !== 'function') return done('attention');
    const retryAfter = response ? parseRetryAfter(headerOf(response, 'retry-after'), o.now()) : null;
    const delay = nextDelay(retryAfter, attempt, o.now() - started, o);
    if (delay === null) return done('attention');
    if (kind === 'refresh') await o.refresh();
    if (o.onRetry) o.onRetry({ attempt, kind, delayMs: delay, status: response ? response.status : null, error });
    await o.sleep(delay);
  }
}

// A header of a response: a fetch Headers, a node:http headers object, or a plain object.
function headerOf(response, name) {
  const h = response && response.headers;
  if (!h) return null;
  if (typeof h.get === 'function') return h.get(name);
  const k = Object.keys(h).find((x) => x.toLowerCase() === name);
  return k === undefined ? null : h[k];
}

module.exports = {
  classify, isTimeout, parseRetryAfter, backoffBound, backoffDelay, withRetry, nextDelay, headerOf,
  OUTCOME_WHEN_RETRIES_END,
};
