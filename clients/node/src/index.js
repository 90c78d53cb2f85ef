'use strict';
// Express 5 middleware: HTTP idempotency keys on the idempotency PostgreSQL
// extension.  idempotent(options) returns a middleware that claims the key
// on a pooled client inside a transaction, hands that client to the
// handlers that follow (req.idempotency.client), captures their response,
// finishes the key and commits before the first byte is sent, and answers
// replays, conflicts and mismatches per the chosen profile.

const { parseKeyHeader, applyKeyPolicy, KeyError } = require('./header');
const { fingerprintBody, formToJson, BodyError } = require('./body');
const { answer, ACTION_OUTCOME } = require('./profiles');
const zlib = require('node:zlib');
const { captureResponse, sendBody } = require('./capture');
const { cancelBackend } = require('./cancel');

// Errors after which the whole request is run again: serialization
// failure, deadlock, and a connection lost before COMMIT was acknowledged
// (in atomic mode the next claim replays if the commit went through).
const RETRY_SQLSTATES = new Set(['40001', '40P01']);
const LOST_SQLSTATES = new Set(['57P01', '57P02', '57P03', '08000', '08003', '08006']);
const LOST_MESSAGES = /Connection terminated|Client has encountered a connection error|ECONNRESET|EPIPE|not queryable/;

// Response headers that describe one transmission, never stored.
const NOT_STORED = new Set(['connection', 'keep-alive', 'transfer-encoding', 'date', 'content-length',
  'upgrade', 'proxy-connection', 'trailer', 'idempotent-replayed', 'idempotency-key']);

// the request's digest (mismatch diagnostics) goes with the claim: a reused
// key with another body is answered with the members that differ
const SQL_CLAIM = `SELECT action, error_code, retry_after, response_status, response_headers,
       response_body, lease_token::text AS lease_token, mismatch
  FROM idempotency.idem_claim($1, $2, $3,
       idempotency.idem_fingerprint($4, $5, $6::jsonb, $7::text[]),
       $8::interval, $9::interval, $10::interval,
       idempotency.idem_request_digest($1, $2, $3, $6::jsonb, $4, $5, $7::text[]))`;
const SQL_FINISH = 'SELECT idempotency.idem_finish_bytes($1, $2, $3, $4, $5::bytea, $6::jsonb, $7::bigint)';
const SQL_HEARTBEAT = 'SELECT idempotency.idem_heartbeat($1, $2, $3, $4::bigint, $5::interval)';
const SQL_FAIL = "SELECT idempotency.idem_fail($1, $2, $3, 'unknown', $4, $5::bigint)";
const SQL_RELEASE = 'SELECT idempotency.idem_release($1, $2, $3, $4::bigint)';
const SQL_DOWNSTREAM = 'SELECT idempotency.idem_downstream_key($1, $2, $3, $4) AS key';

// Errors of set-up, answered 500 idempotency_not_configured: the extension
// or its functions missing (3F000, 42883, 42P01), no privilege (42501).
const CONFIG_SQLSTATES = new Set(['3F000', '42883', '42P01', '42501']);
const CONFIG_FIX = 'install the extension in this database (CREATE EXTENSION idempotency CASCADE), ' +
  'grant its client role to the application\'s role (GRANT idempotency_client TO ...) and check the options';

const sqlstate = (err) => (err && (err.code || (err.cause && err.cause.code))) || null;
const isRetryable = (err) => RETRY_SQLSTATES.has(sqlstate(err));
const isConnectionLoss = (err) =>
  !!err && (LOST_SQLSTATES.has(sqlstate(err)) || LOST_MESSAGES.test(String(err.message || '')) ||
    (err.cause ? isConnectionLoss(err.cause) : false));

// "30 seconds", "30s", "500 ms", "2 min", or a number of seconds, in ms: a
// quick local reading, kept for applications that used it; the options'
// intervals go to PostgreSQL as they are.
function intervalMs(value) {
  if (typeof value === 'number') return value * 1000;
  const m = /^\s*(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|secs?|seconds?|min|mins|minutes?)?\s*$/i.exec(String(value));
  if (!m) throw new TypeError(`cannot read ${value} as an interval (use e.g. '30 seconds')`);
  const unit = (m[2] || 's').toLowerCase();
  const f = unit.startsWith('ms') || unit.startsWith('milli') ? 1 : unit.startsWith('min') ? 60000 : 1000;
  return Number(m[1]) * f;
}
// The words PostgreSQL's interval input knows (compared on their first 10
// characters, as it does): units, their abbreviations and plurals, and '@',
// 'ago', 'infinity'.
const INTERVAL_WORDS = new Set(`microsecon us usec usecs usecond useconds millisecon ms msec msecs msecond mseconds
  s sec secs second seconds m min mins minute minutes h hr hrs hour hours d day days w week weeks mon mons month
  months qtr quarter y yr yrs year years dec decs decade decades c cent century centuries mil mils millennia
  millennium ago infinity`.split(/\s+/));
const ISO_INTERVAL = /^(?:P(?:[-+]?[\d.,]+[YMWD])*(?:T(?:[-+]?[\d.,]+[HMS])*)?|P[\d.:T-]+)$/;

// Whether text can be an interval PostgreSQL reads, as far as a local look
// tells ('soon', 'thirty seconds' cannot): ISO 8601 ('P1D', 'PT30S'), or
// numbers, times (02:00:00) and the words it knows.  The server has the
// last word at the first claim.
function intervalSyntaxOk(text) {
  const t = text.trim();
  if (ISO_INTERVAL.test(t)) return true;
  const words = t.match(/[A-Za-z_]+/g) || [];
  if (words.some((w) => !INTERVAL_WORDS.has(w.toLowerCase().slice(0, 10)))) return false;
  if (/[^\w\s@.:+,-]/.test(t)) return false;
  return /\d/.test(t) || words.some((w) => w.toLowerCase() === 'infinity');
}

// An option's interval as PostgreSQL reads it: a string as it is ('1 day',
// 'P1D', '24h'), a number as seconds.  A string that cannot be an interval
// is refused here, when the middleware is built.
function pgInterval(value, name = 'interval') {
  if (value == null) return null;
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw new TypeError(`idempotent: options.${name}: ${value} is not an interval`);
    return `${value} seconds`;
  }
  if (typeof value !== 'string' || !intervalSyntaxOk(value)) {
    throw new TypeError(`idempotent: options.${name}: ${JSON.stringify(value)} is not an interval PostgreSQL reads ` +
      "(use e.g. '30 seconds', '1 day', 'P1D', or a number of seconds)");
  }
  return value;
}
const SQL_CHECK = 'SELECT $1::interval AS ttl, $2::interval AS lease, $3::interval AS wait, extract(epoch FROM $2::interval) * 1000 AS lease_ms';

// The options' intervals, read once by PostgreSQL: a mistake is reported
// by name (and the request answered idempotency_not_configured), and the
// heartbeat's period comes from the lease as the server reads it.
class ConfigError extends Error {
  constructor(message, cause) {
    super(message);
    this.name = 'ConfigError';
    this.cause = cause;
  }
}

const poolsWatched = new WeakSet();

// The handlers' deadline when the options give none: 60 s, above what a
// handler usually takes and below what HTTP clients usually wait; past it
// a hung handler gives its claim and its connection back.
const DEFAULT_DEADLINE_MS = 60000;
// setTimeout's largest delay (about 24.8 days)
const MAX_TIMER_MS = 2147483647;

// The default log: one line on stderr, with the error's message and code.
function defaultLog(message, err) {
  const detail = err ? `: ${err.message || err}${err.code ? ` (${err.code})` : ''}` : '';
  process.stderr.write(`idempotency: ${message}${detail}\n`);
}

function normalize(options) {
  const o = { ...options };
  if (!o.pool || typeof o.pool.connect !== 'function') throw new TypeError('idempotent: options.pool (a pg.Pool) is required');
  if (o.tenant === undefined) throw new TypeError('idempotent: options.tenant (a string or req => string) is required');
  o.profile = o.profile || 'stripe';
  if (o.profile !== 'stripe' && o.profile !== 'ietf') throw new TypeError("idempotent: profile is 'stripe' or 'ietf'");
  o.keyPolicy = o.keyPolicy || 'refuse';
  if (o.keyPolicy !== 'refuse' && o.keyPolicy !== 'hash') throw new TypeError("idempotent: keyPolicy is 'refuse' or 'hash'");
  o.exclude = o.exclude || null;
  o.required = !!o.required;
  o.retries = o.retries === undefined ? 3 : o.retries;
  o.limit = o.limit || 1024 * 1024;
  o.isolation = o.isolation || null;
  o.log = o.log || defaultLog;
  o.storeStatus = o.storeStatus || ((status) => status < 500);
  o.beginSql = o.isolation ? `BEGIN ISOLATION LEVEL ${o.isolation}` : 'BEGIN';
  if (o.isolation && !/^(READ COMMITTED|REPEATABLE READ|SERIALIZABLE)$/i.test(o.isolation)) {
    throw new TypeError('idempotent: isolation is READ COMMITTED, REPEATABLE READ or SERIALIZABLE');
  }
  o.leaseSql = pgInterval(o.lease, 'lease');
  o.waitSql = pgInterval(o.wait, 'wait');
  o.ttlSql = pgInterval(o.ttl, 'ttl');
  if (o.problemTypeBase != null && typeof o.problemTypeBase !== 'string') {
    throw new TypeError('idempotent: options.problemTypeBase is a string (a URI the code is appended to)');
  }
  o.checked = null; // a promise: the intervals read by the server
  // deadlineMs: 0 (or null, Infinity) turns the deadline off
  if (o.deadlineMs === undefined) o.deadlineMs = DEFAULT_DEADLINE_MS;
  if (o.deadlineMs === null || o.deadlineMs === Infinity) o.deadlineMs = 0;
  if (!(Number.isFinite(o.deadlineMs) && o.deadlineMs >= 0 && o.deadlineMs <= MAX_TIMER_MS)) {
    throw new TypeError(`idempotent: deadlineMs is a number of milliseconds from 1 to ${MAX_TIMER_MS}, or 0 for none`);
  }
  if (!poolsWatched.has(o.pool) && typeof o.pool.on === 'function') {
    // an idle client whose backend was killed emits 'error' on the pool,
    // which would end the process without a listener
    poolsWatched.add(o.pool);
    o.pool.on('error', (err) => o.log('idle database client lost', err));
  }
  return o;
}

function sendAnswer(res, a) {
  res.statusCode = a.status;
  for (const [k, v] of Object.entries(a.headers)) res.setHeader(k, v);
  res.end(a.body === undefined ? undefined : Buffer.from(JSON.stringify(a.body)));
}

// A stored header value as Node sends it: characters beyond Latin-1 (a
// value idem_finish, idem_resolve or a resolver stored) go out as their
// UTF-8 bytes instead of failing the replay.
const headerValue = (v) => (Array.isArray(v) ? v.map(headerValue)
  : /[^\x00-\xff]/.test(String(v)) ? Buffer.from(String(v), 'utf8').toString('latin1') : String(v));

// A stored body encoded (Content-Encoding, a compression() after this
// middleware) for a client whose Accept-Encoding does not take that
// encoding: decoded for it (gzip, deflate, br), the header dropped.
const DECODERS = { gzip: zlib.gunzipSync, 'x-gzip': zlib.gunzipSync, deflate: zlib.inflateSync, br: zlib.brotliDecompressSync };

function accepts(acceptEncoding, coding) {
  if (!acceptEncoding) return false;
  let star = null;
  for (const part of String(acceptEncoding).split(',')) {
    const [name, ...params] = part.trim().toLowerCase().split(';');
    const q = params.map((p) => p.trim()).find((p) => p.startsWith('q='));
    const ok = !q || Number(q.slice(2)) > 0;
    if (name === coding || (coding === 'x-gzip' && name === 'gzip')) return ok;
    if (name === '*') star = ok;
  }
  return star === true;
}

function decodeForClient(req, headers, body) {
  const name = Object.keys(headers).find((k) => k.toLowerCase() === 'content-encoding');
  if (!name || !body || !body.length) return body;
  const codings = String(headers[name]).toLowerCase().split(',').map((c) => c.trim()).filter((c) => c && c !== 'identity');
  if (codings.every((c) => accepts(req.headers['accept-encoding'], c))) return body;
  let out = body;
  for (const c of codings.reverse()) {
    const decode = DECODERS[c];
    if (!decode) return body; // an encoding this middleware cannot undo: sent as stored
    out = decode(out);
  }
  delete headers[name];
  return out;
}

function sendStored(res, status, headers, body) {
  res.statusCode = status;
  for (const [k, v] of Object.entries(headers || {})) {
    // a HEAD answer's Content-Length is that of the body it did not send
    if (k.toLowerCase() !== 'content-length' || (res.req && res.req.method === 'HEAD')) res.setHeader(k, headerValue(v));
  }
  sendBody(res, body);
}

// What runs the request's handlers.  Given to idempotent() itself, they are
// run by the middleware, again on a retry (serialization failure, deadlock,
// lost connection), each called as Express calls a handler (an async one's
// rejection is its error).  Otherwise (the middleware in front of a route's
// handlers or mounted with app.use) Express's own next hands over, once:
// errors go to the application's error handler, whose answer is captured
// like any other, and nothing can be run again.
function makeRunner(req, res, next, handlers) {
  if (!handlers.length) return { repeatable: false, run: () => next() };
  return {
    repeatable: true,
    run(done) {
      let i = 0;
      const step = (err) => {
        if (err === 'route' || err === 'router') return done(new Error(`next('${err}') leaves an idempotent route`));
        if (err) return done(err);
        if (i >= handlers.length) return done(new Error('the idempotent handlers passed the request on without answering'));
        const handler = handlers[i++];
        try {
          const r = handler(req, res, step);
          if (r && typeof r.then === 'function') r.then(undefined, (e) => step(e || new Error('rejected')));
        } catch (e) {
          step(e);
        }
        return undefined;
      };
      step();
    },
  };
}

// The route template a request matched: its route's path, behind the
// mount paths of the sub-applications it went through (app.mountpath, a
// public property).  A router mounted with a path gives no public
// template, so the request's base URL is used only when those mount paths
// explain it; otherwise options.mountPath (the path as written in
// app.use) or options.endpoint must name it.
function routeTemplate(req, mountPath) {
  if (!req.route) throw new ConfigError('outside a route (app.use), options.endpoint must name the endpoint');
  const path = String(req.route.path);
  const base = req.baseUrl || '';
  if (mountPath != null) return `${String(mountPath).replace(/\/+$/, '')}${path}`;
  if (base === '') return path;
  let prefix = '';
  for (let a = req.app; a && a.parent; a = a.parent) {
    if (typeof a.mountpath !== 'string') { prefix = null; break; }
    prefix = a.mountpath.replace(/\/+$/, '') + prefix;
  }
  if (prefix !== null) {
    const pattern = prefix.replace(/[.*+?^${}()|[\]\\]/g, '\\$&').replace(/:[A-Za-z0-9_]+/g, '[^/]+');
    if (new RegExp(`^${pattern}$`, 'i').test(base)) return prefix + path;
  }
  throw new ConfigError(`the route is mounted under ${base}, which has no template the middleware can read: ` +
    "give options.mountPath (the path as written in app.use, e.g. '/accounts/:acct') or options.endpoint");
}

// idempotent(options, ...handlers): the middleware.  A request goes
// through named steps, each in a method of its own below:
//   Middleware.handle:  readKey -> readBody -> readNames -> attempts -> (retries spent) exhausted
//   Attempt.run:        claimKey -> runHandlers -> storeOrRelease, or failed(err)
// and every answer of the middleware itself is built in one place,
// Middleware.answer (a replay in Attempt.answerClaim).
function idempotent(options, ...handlers) {
  const o = normalize(options);
  handlers = handlers.flat();
  for (const h of handlers) {
    if (typeof h !== 'function') throw new TypeError('idempotent: the handlers after the options are functions');
  }
  const m = new Middleware(o, handlers);
  return async function middleware(req, res, next) {
    return m.request(req, res, next);
  };
}

// What one idempotent() holds: its options and handlers, and the steps of
// a request before and between its attempts.
class Middleware {
  constructor(o, handlers) {
    this.o = o;
    this.handlers = handlers;
  }

  // An answer of the middleware, in the profile's format: sent, and 'done'.
  answer(res, outcome, x = {}) {
    sendAnswer(res, answer(this.o.profile, outcome, { ...x, typeBase: this.o.problemTypeBase }));
    return 'done';
  }

  async request(req, res, next) {
    // a client that goes away (its connection closed before the response
    // was sent) ends the handlers' run: see Attempt
    const state = { leaseToken: null, noSideEffect: false, connectFailed: false, disconnected: false, onDisconnect: null };
    const onClose = () => {
      if (res.writableFinished) return;
      state.disconnected = true;
      if (state.onDisconnect) state.onDisconnect();
    };
    res.on('close', onClose);
    try {
      await this.handle(req, res, next, state);
    } finally {
      res.removeListener('close', onClose);
    }
  }

  // The request path: each step returns null once the request is answered
  // (or handed to Express's error handler).
  async handle(req, res, next, state) {
    const keys = this.readKey(req, res, next);
    if (!keys) return;
    const body = await this.readBody(req, res, next, state);
    if (!body) return;
    const names = await this.readNames(req, res, next);
    if (!names) return;
    const request = { ...names, ...keys, path: req.originalUrl || req.url, json: body.json };
    const runner = makeRunner(req, res, next, this.handlers);
    if (await this.attempts(req, res, next, request, runner, state) === 'retry') await this.exhausted(res, request, state);
  }

  // The key: { key, rawKey } (both null without the header), or null once answered.
  readKey(req, res, next) {
    let keys;
    try {
      // headersDistinct keeps two Idempotency-Key headers apart (headers joins them with ", ")
      const values = req.headersDistinct ? req.headersDistinct['idempotency-key'] : req.headers['idempotency-key'];
      const parsed = parseKeyHeader(values);
      keys = {
        key: parsed === null ? null : applyKeyPolicy(parsed, this.o.keyPolicy),
        // replays echo the header as the client sent it
        rawKey: parsed === null ? null : String(Array.isArray(values) ? values[0] : values).trim(),
      };
    } catch (err) {
      if (err instanceof KeyError) this.answer(res, 'key_invalid', { message: err.message });
      else next(err);
      return null;
    }
    if (keys.key === null && this.o.required) {
      this.answer(res, 'key_missing', { message: 'this request needs an Idempotency-Key header' });
      return null;
    }
    return keys;
  }

  // The body read and fingerprinted (req.body set), or null once answered.
  async readBody(req, res, next, state) {
    let body;
    try {
      body = await fingerprintBody(req, this.o.limit);
    } catch (err) {
      // nothing is sent to a request aborted while its body was read
      if (state.disconnected) return null;
      if (err instanceof BodyError) this.answer(res, 'body_invalid', { message: err.message, code: err.answerCode });
      else next(err);
      return null;
    }
    if (body.parsed !== undefined || req.body === undefined) req.body = body.parsed;
    return body;
  }

  // { tenant, endpoint }, or null once answered.
  async readNames(req, res, next) {
    const o = this.o;
    try {
      const tenant = typeof o.tenant === 'function' ? await o.tenant(req) : o.tenant;
      let endpoint = typeof o.endpoint === 'function' ? await o.endpoint(req) : o.endpoint;
      if (!endpoint) endpoint = `${req.method} ${routeTemplate(req, o.mountPath)}`;
      return { tenant, endpoint };
    } catch (err) {
      if (err instanceof ConfigError) this.notConfigured(res, err);
      else next(err);
      return null;
    }
  }

  // The attempts of a request: 'retry' when the last one asked for another
  // and none is left.
  async attempts(req, res, next, request, runner, state) {
    for (let attempt = 0; ; attempt++) {
      const outcome = await this.attemptOnce(req, res, next, request, runner, state);
      if (outcome !== 'retry') return outcome;
      if (attempt >= this.o.retries || !runner.repeatable || state.disconnected) return 'retry';
      await new Promise((r) => setTimeout(r, (5 + Math.random() * 20) * 2 ** attempt));
    }
  }

  // No attempt completed: the lease settled, 503.
  async exhausted(res, request, state) {
    if (state.leaseToken) await this.settleLease(request, state, 'retries exhausted');
    if (state.disconnected) return;
    if (state.connectFailed) {
      this.o.log('database_unavailable: no connection from the pool; check the pool\'s connection settings ' +
        '(host, port, user, password) and that the server runs and accepts connections');
    }
    this.answer(res, 'unavailable', { retryAfter: 1, code: state.connectFailed ? 'database_unavailable' : undefined });
  }

  async settleLease(request, state, reason, release = false) {
    const { tenant, endpoint, key } = request;
    try {
      if (release || state.noSideEffect) await this.o.pool.query(SQL_RELEASE, [tenant, endpoint, key, state.leaseToken]);
      else await this.o.pool.query(SQL_FAIL, [tenant, endpoint, key, reason, state.leaseToken]);
    } catch (err) {
      this.o.log('could not settle the lease (maintenance will mark it unknown when it expires)', err);
    }
    state.leaseToken = null;
  }

  // One run of the request.  Returns 'retry' when it should run again,
  // 'done' once something was sent or handed to Express's error handler.
  async attemptOnce(req, res, next, request, runner, state) {
    const client = await this.connect(res, state);
    if (typeof client === 'string') return client;
    return new Attempt(this, client, { req, res, next, request, state }).run(runner);
  }

  // A pool client with the options checked, or 'retry' / 'done'.
  async connect(res, state) {
    let client;
    try {
      client = await this.o.pool.connect();
    } catch (err) {
      this.o.log('no database connection', err);
      state.connectFailed = true;
      return 'retry';
    }
    state.connectFailed = false;
    if (state.disconnected) {
      // gone while it waited for a pool connection: nothing claimed yet
      client.release();
      this.o.log('client_disconnected: the client disconnected before the claim; nothing was claimed');
      return 'done';
    }
    try {
      await this.checkOptions(client);
    } catch (err) {
      client.release(isConnectionLoss(err) ? err : undefined);
      if (isConnectionLoss(err)) return 'retry';
      return this.notConfigured(res, err);
    }
    return client;
  }

  // Work the handler left for after the commit: started once the response
  // is sent, not awaited (the client goes back to the pool meanwhile), each
  // task on its own; a failure is logged and changes nothing.
  runAfterCommit(tasks, res) {
    if (!tasks.length) return;
    const start = () => {
      for (const task of tasks) {
        Promise.resolve().then(task).catch((err) => this.o.log('a task after the commit failed', err));
      }
    };
    if (res.writableFinished) setImmediate(start);
    else res.once('close', start);
  }

  // The handlers' run, given up after deadlineMs (60 s by default, 0: none).
  runWithDeadline(capture, runner) {
    const run = capture.run(runner);
    const { deadlineMs } = this.o;
    if (!deadlineMs) return run;
    let timer;
    const deadline = new Promise((resolve, reject) => {
      timer = setTimeout(() => {
        const err = new Error(`the handlers did not answer within ${deadlineMs} ms`);
        err.idempotencyDeadline = true;
        reject(err);
      }, deadlineMs);
    });
    return Promise.race([run, deadline]).finally(() => clearTimeout(timer));
  }

  // The options' intervals read by the server, once; the heartbeat's
  // period from the lease.
  async checkOptions(client) {
    const o = this.o;
    if (o.checked) return;
    let row;
    try {
      row = (await client.query(SQL_CHECK, [o.ttlSql, o.leaseSql, o.waitSql])).rows[0];
    } catch (err) {
      if (/^22/.test(sqlstate(err) || '')) {
        throw new ConfigError(`the options ttl, lease and wait must be intervals PostgreSQL reads (${err.message})`, err);
      }
      throw err;
    }
    if (o.leaseSql && !o.heartbeatMs) o.heartbeatMs = Math.max(100, Number(row.lease_ms) / 3);
    o.checked = true;
  }

  notConfigured(res, err) {
    this.o.log(`idempotency_not_configured: ${err instanceof ConfigError ? err.message : CONFIG_FIX}`, err);
    return this.answer(res, 'not_configured', { code: 'idempotency_not_configured' });
  }
}

// the client went away: during the claim (the handlers are not run), or
// while they run (their run is ended at once)
function disconnectError(ran) {
  const err = new Error(ran ? 'the client disconnected while the handlers ran' : 'the client disconnected before the handlers ran');
  err.idempotencyDisconnect = ran ? 'running' : 'before';
  return err;
}

// One attempt of a request on one pool client: the key claimed, the
// handlers run inside the claim's transaction, their response stored and
// committed (or the key given back), then sent.
class Attempt {
  constructor(m, client, { req, res, next, request, state }) {
    Object.assign(this, { m, o: m.o, client, req, res, next, request, state });
    this.lostError = null;
    this.capture = null;
    this.heartbeat = null;
    this.inTransaction = false;
    this.givenBack = false;
    this.claimToken = null;
    this.afterCommit = [];
    // a connection lost while the handlers run (a killed backend,
    // idle_in_transaction_session_timeout while they hang) ends their run at
    // once: the client goes back to the pool as broken, the request runs again
    this.onClientError = (err) => {
      this.lostError = err;
      this.o.log('database client lost', err);
      if (this.capture) this.capture.abort(err);
    };
    client.on('error', this.onClientError);
  }

  async run(runner) {
    this.runner = runner;
    try {
      const c = await this.claimKey();
      if (c) return await this.answerClaim(c);
      const out = await this.runHandlers(runner);
      return await this.storeOrRelease(out);
    } catch (err) {
      return await this.failed(err);
    } finally {
      this.giveBack();
    }
  }

  // The key claimed and the transaction begun: null to run the handlers,
  // or the claim's answer when it is not execute.  In lease mode the claim
  // commits on its own before the transaction; otherwise it is inside it.
  async claimKey() {
    const { o, state } = this;
    const { key } = this.request;
    if (key !== null && o.leaseSql && state.leaseToken === null) {
      const c = await this.claim();
      if (c.action !== 'execute') return c;
      state.leaseToken = c.lease_token;
    }
    if (state.leaseToken) this.startHeartbeat();
    await this.client.query(o.beginSql);
    this.inTransaction = true;
    // an endpoint whose policy has a lease answers even this claim with a
    // token: it is finished with it in this same transaction
    if (key !== null && !o.leaseSql) {
      const c = await this.claim();
      if (c.action !== 'execute') return c;
      this.claimToken = c.lease_token;
    }
    return null;
  }

  // The claim's query.  The fingerprint refuses a body PostgreSQL cannot
  // take (class 22: a number beyond a double, \u0000): the client's fault,
  // a 400.  A client that goes away meanwhile (the claim may wait for a
  // duplicate that runs, up to `wait`) ends the claim at once: its query is
  // cancelled on the server and its connection closed (giveUp)
  async claim() {
    const { state, request, o } = this;
    if (state.disconnected) throw disconnectError(false);
    const query = this.client.query(SQL_CLAIM, [request.tenant, request.endpoint, request.key, this.req.method,
      request.path, request.json, o.exclude, o.ttlSql, o.leaseSql, o.waitSql]);
    const gone = new Promise((resolve, reject) => { state.onDisconnect = () => reject(disconnectError(false)); });
    try {
      return (await Promise.race([query, gone])).rows[0];
    } catch (err) {
      if (err.idempotencyDisconnect) {
        query.catch(() => {}); // it ends cancelled, or with its connection
        throw err;
      }
      if (/^22/.test(sqlstate(err) || '')) err.idempotencyBodyInvalid = true;
      err.idempotencyOwn = true;
      throw err;
    } finally {
      state.onDisconnect = null;
    }
  }

  // A claim that is not execute: the stored response replayed, or the
  // conflict, mismatch, pending or expired answer.
  async answerClaim(c) {
    if (this.inTransaction) { this.inTransaction = false; await this.client.query('ROLLBACK'); }
    if (c.action === 'replay') {
      const headers = {};
      for (const [k, v] of Object.entries(c.response_headers || {})) {
        if (k.toLowerCase() !== 'idempotency-key') headers[k] = v;
      }
      headers['Idempotency-Key'] = this.request.rawKey;
      sendStored(this.res, c.response_status, headers, decodeForClient(this.req, headers, c.response_body));
      return 'done';
    }
    const outcome = ACTION_OUTCOME[c.action];
    if (!outcome) throw new Error(`unexpected claim action ${c.action}`);
    return this.m.answer(this.res, outcome, { code: c.error_code, retryAfter: c.retry_after, mismatch: c.mismatch });
  }

  // The handlers run with req.idempotency, their response captured.
  async runHandlers(runner) {
    const { state } = this;
    this.req.idempotency = this.context();
    this.capture = captureResponse(this.res);
    if (state.disconnected) throw disconnectError(false);
    state.onDisconnect = () => this.capture.abort(disconnectError(true));
    const out = await this.m.runWithDeadline(this.capture, runner);
    state.onDisconnect = null;
    if (this.lostError) throw this.lostError;
    return out;
  }

  // What the handlers get as req.idempotency.
  context() {
    const { client, state, afterCommit } = this;
    const { key, tenant, endpoint } = this.request;
    return {
      client,
      key,
      tenant,
      endpoint,
      leaseToken: state.leaseToken,
      attempt: undefined,
      noSideEffect() { state.noSideEffect = true; },
      afterCommit(task) {
        if (typeof task !== 'function') throw new TypeError('afterCommit takes a function');
        afterCommit.push(task);
      },
      async downstreamKey(step) {
        if (key === null) throw new Error('no Idempotency-Key: no downstream key');
        return (await client.query(SQL_DOWNSTREAM, [tenant, endpoint, key, step])).rows[0].key;
      },
    };
  }

  // The handlers' response stored under the key and committed, then sent;
  // or (storeStatus false: a 5xx by default, the handler's own failure; an
  // error answered before any route began) rolled back, the key given back
  // so that a retry runs again, and sent.
  async storeOrRelease(out) {
    const { client, state, request } = this;
    const early = this.answeredBeforeRoute(out);
    if (early || !this.o.storeStatus(out.status)) {
      this.inTransaction = false;
      await client.query('ROLLBACK');
      await this.settle(early ? `answered ${out.status} before any route began` : `the handler answered ${out.status}`, true);
      this.capture.send(out);
      return 'done';
    }
    if (request.key !== null) {
      await client.query(SQL_FINISH, [request.tenant, request.endpoint, request.key, out.status, out.body,
        this.storedHeaders(out), state.leaseToken || this.claimToken])
        .catch((err) => { err.idempotencyOwn = true; throw err; });
    }
    this.inTransaction = false;
    await client.query('COMMIT');
    state.leaseToken = null;
    this.capture.send(out);
    this.m.runAfterCommit(this.afterCommit, this.res);
    return 'done';
  }

  // Whether an error answer came before any route's handler began (Stripe's
  // rule: results are saved only once the endpoint began executing): the
  // middleware mounted with app.use hands over with Express's next, and the
  // request reached no route (req.route, set when Express dispatches to a
  // route, is not set): the application's error handler answered an error
  // of its own middleware (a 401 of its authentication, a validator's
  // 422), or Express's 404 when no route matched.  A handler mounted with
  // app.use that succeeds is stored as before.
  answeredBeforeRoute(out) {
    return !this.runner.repeatable && !this.req.route && out.status >= 400;
  }

  // The response's headers as stored: with the names as the handler spelled
  // them, without those of one transmission or set before the handlers ran.
  storedHeaders(out) {
    const headers = {};
    const spelled = new Map((out.rawNames || []).map((n) => [n.toLowerCase(), n]));
    for (const [k, v] of Object.entries(out.headers)) {
      if ((NOT_STORED.has(k) && !(k === 'content-length' && this.req.method === 'HEAD')) || this.capture.headersBefore[k] === v) continue;
      headers[spelled.get(k) || k] = Array.isArray(v) ? v.map(String) : String(v);
    }
    return headers;
  }

  // What an error of the attempt answers: 'retry', or 'done' once answered
  // (or handed to Express's error handler).
  async failed(err) {
    const { state, o } = this;
    state.onDisconnect = null;
    this.stopHeartbeat();
    // a run given up may be inside a query: no ROLLBACK queued behind it
    if (this.inTransaction && !this.lostError && !isConnectionLoss(err) && !err.idempotencyDisconnect && !err.idempotencyDeadline) {
      try { await this.client.query('ROLLBACK'); } catch (e) { this.lostError = e; }
    }
    if (this.capture) this.capture.reset();
    if (sqlstate(err) === 'IK413') return this.tooLarge(err);
    if (CONFIG_SQLSTATES.has(sqlstate(err)) && err.idempotencyOwn) {
      await this.settle('not configured', true);
      return this.m.notConfigured(this.res, err);
    }
    if (err.idempotencyDisconnect) return this.disconnected(err);
    if (err.idempotencyDeadline) return this.timedOut(err);
    if (isRetryable(err) || isConnectionLoss(err) || this.lostError) {
      o.log('request will be run again', err);
      return 'retry';
    }
    if (err.idempotencyBodyInvalid) return this.m.answer(this.res, 'body_invalid', { message: err.message });
    await this.settle(`the handler failed: ${err.message}`);
    if (this.capture) this.capture.restore();
    this.next(err);
    return 'done';
  }

  async tooLarge(err) {
    this.o.log('response_too_large: the response is larger than idempotency.max_response_bytes (or the endpoint\'s ' +
      'max_response_bytes) and cannot be stored for replay; its work was rolled back. Answer a smaller body, ' +
      'raise the limit, or set store_response = false for the endpoint', err);
    await this.settle('response too large', true);
    return this.m.answer(this.res, 'too_large', { code: 'response_too_large' });
  }

  // Nothing can be sent any more.  The handlers may still be using the
  // client: it is closed, not given back as it is (the server rolls the
  // transaction back, which frees the claim); in lease mode the key is
  // released when they had not started or had declared noSideEffect(),
  // otherwise marked unknown, as after a throw
  async disconnected(err) {
    await this.giveUp(err);
    this.o.log(`client_disconnected: ${err.message}; the transaction was rolled back and its connection closed` +
      (this.state.leaseToken ? '' : ', the key is free for a retry'));
    await this.settle(err.message, err.idempotencyDisconnect === 'before');
    return 'done';
  }

  // The handler may still be using the client: it is closed and its
  // backend ended (the claim freed), not given back as it is
  async timedOut(err) {
    await this.giveUp(err);
    this.o.log(`handler_timeout: the handlers did not answer within deadlineMs (${this.o.deadlineMs} ms); the transaction was ` +
      'rolled back and its connection closed. Find what they wait for, or raise deadlineMs', err);
    await this.settle(err.message);
    return this.m.answer(this.res, 'unavailable', { retryAfter: 1, code: 'handler_timeout' });
  }

  // Lease mode: the client given back first (settling takes a pool
  // connection of its own), then the key released or marked unknown.
  async settle(reason, release = false) {
    if (!this.state.leaseToken) return;
    this.giveBack();
    await this.m.settleLease(this.request, this.state, reason, release);
  }

  startHeartbeat() {
    const { tenant, endpoint, key } = this.request;
    this.heartbeat = setInterval(() => {
      this.o.pool.query(SQL_HEARTBEAT, [tenant, endpoint, key, this.state.leaseToken, this.o.leaseSql])
        .catch((err) => this.o.log('heartbeat failed', err));
    }, this.o.heartbeatMs);
  }

  stopHeartbeat() {
    if (this.heartbeat) { clearInterval(this.heartbeat); this.heartbeat = null; }
  }

  // The client back to the pool, once: as broken (closed) after a lost
  // connection or a run given up.  Done before a lease is settled, which
  // takes a pool connection of its own (with a pool of one, it would
  // wait for this one forever)
  giveBack() {
    if (this.givenBack) return;
    this.givenBack = true;
    this.stopHeartbeat();
    this.client.off('error', this.onClientError);
    if (this.lostError) {
      this.client.on('error', () => {});
      this.client.release(this.lostError);
    } else {
      this.client.release();
    }
  }

  // A run given up (its deadline, its client gone): its backend may still
  // be running a query (the claim's wait for a duplicate, a handler's
  // query) and hold the claim meanwhile, since the server notices a closed
  // socket only when that query ends.  The query is cancelled first
  // (PostgreSQL's cancel request: the backend's pid and secret key, on a
  // connection of its own, no pool connection needed), then the client is
  // closed, not given back as it is: its backend ends and rolls the
  // transaction back, which frees the claim
  async giveUp(err) {
    this.lostError = err;
    if (this.client.processID) {
      try {
        await cancelBackend(this.client);
      } catch (e) {
        this.o.log('could not cancel the query of a run given up; its backend ends when that query does', e);
      }
    }
    this.giveBack();
  }
}

// the retry rules, the outbox sender, idempotent functions (issue 37)
const { classify, parseRetryAfter, backoffDelay, withRetry } = require('./retry');
const { runOutbox } = require('./outbox');
const { idempotentFunction, IdempotentFunctionError } = require('./function');

module.exports = { idempotent, formToJson, parseKeyHeader, applyKeyPolicy, answer, intervalMs, KeyError,
  classify, parseRetryAfter, backoffDelay, withRetry, runOutbox, idempotentFunction, IdempotentFunctionError };
