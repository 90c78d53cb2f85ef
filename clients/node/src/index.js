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

function idempotent(options, ...handlers) {
  const o = normalize(options);
  // an answer of the middleware, in the profile's format
  const problem = (outcome, x = {}) => answer(o.profile, outcome, { ...x, typeBase: o.problemTypeBase });
  handlers = handlers.flat();
  for (const h of handlers) {
    if (typeof h !== 'function') throw new TypeError('idempotent: the handlers after the options are functions');
  }

  async function middleware(req, res, next) {
    // a client that goes away (its connection closed before the response
    // was sent) ends the handlers' run: see attemptOnce
    const state = { leaseToken: null, noSideEffect: false, connectFailed: false, disconnected: false, onDisconnect: null };
    const onClose = () => {
      if (res.writableFinished) return;
      state.disconnected = true;
      if (state.onDisconnect) state.onDisconnect();
    };
    res.on('close', onClose);
    try {
      await handle(req, res, next, state);
    } finally {
      res.removeListener('close', onClose);
    }
  }

  async function handle(req, res, next, state) {
    let rawKey;
    let key;
    try {
      // headersDistinct keeps two Idempotency-Key headers apart (headers joins them with ", ")
      const values = req.headersDistinct ? req.headersDistinct['idempotency-key'] : req.headers['idempotency-key'];
      const parsed = parseKeyHeader(values);
      key = parsed === null ? null : applyKeyPolicy(parsed, o.keyPolicy);
      // replays echo the header as the client sent it
      rawKey = parsed === null ? null : String(Array.isArray(values) ? values[0] : values).trim();
    } catch (err) {
      if (!(err instanceof KeyError)) return next(err);
      return sendAnswer(res, problem('key_invalid', { message: err.message }));
    }
    if (key === null && o.required) {
      return sendAnswer(res, problem('key_missing', { message: 'this request needs an Idempotency-Key header' }));
    }
    let body;
    try {
      body = await fingerprintBody(req, o.limit);
    } catch (err) {
      if (state.disconnected) return undefined; // the request was aborted while its body was read
      if (!(err instanceof BodyError)) return next(err);
      return sendAnswer(res, problem('body_invalid', { message: err.message, code: err.answerCode }));
    }
    if (body.parsed !== undefined || req.body === undefined) req.body = body.parsed;
    let tenant;
    let endpoint;
    try {
      tenant = typeof o.tenant === 'function' ? await o.tenant(req) : o.tenant;
      endpoint = typeof o.endpoint === 'function' ? await o.endpoint(req) : o.endpoint;
      if (!endpoint) endpoint = `${req.method} ${routeTemplate(req, o.mountPath)}`;
    } catch (err) {
      if (err instanceof ConfigError) return notConfigured(res, err);
      return next(err);
    }
    const request = { tenant, endpoint, key, rawKey, path: req.originalUrl || req.url, json: body.json };
    const runner = makeRunner(req, res, next, handlers);
    for (let attempt = 0; ; attempt++) {
      const outcome = await attemptOnce(req, res, next, request, runner, state);
      if (outcome !== 'retry') return undefined;
      if (attempt >= o.retries || !runner.repeatable || state.disconnected) break;
      await new Promise((r) => setTimeout(r, (5 + Math.random() * 20) * 2 ** attempt));
    }
    if (state.leaseToken) await settleLease(request, state, 'retries exhausted');
    if (state.disconnected) return undefined;
    if (state.connectFailed) {
      o.log('database_unavailable: no connection from the pool; check the pool\'s connection settings ' +
        '(host, port, user, password) and that the server runs and accepts connections');
    }
    sendAnswer(res, problem('unavailable',
      { retryAfter: 1, code: state.connectFailed ? 'database_unavailable' : undefined }));
    return undefined;
  }

  async function settleLease(request, state, reason, release = false) {
    const { tenant, endpoint, key } = request;
    try {
      if (release || state.noSideEffect) await o.pool.query(SQL_RELEASE, [tenant, endpoint, key, state.leaseToken]);
      else await o.pool.query(SQL_FAIL, [tenant, endpoint, key, reason, state.leaseToken]);
    } catch (err) {
      o.log('could not settle the lease (maintenance will mark it unknown when it expires)', err);
    }
    state.leaseToken = null;
  }

  // One run of the request.  Returns 'retry' when it should run again,
  // 'done' once something was sent or handed to Express's error handler.
  async function attemptOnce(req, res, next, request, runner, state) {
    const { tenant, endpoint, key } = request;
    let client;
    try {
      client = await o.pool.connect();
    } catch (err) {
      o.log('no database connection', err);
      state.connectFailed = true;
      return 'retry';
    }
    state.connectFailed = false;
    if (state.disconnected) {
      // gone while it waited for a pool connection: nothing claimed yet
      client.release();
      o.log('client_disconnected: the client disconnected before the claim; nothing was claimed');
      return 'done';
    }
    try {
      await checkOptions(client);
    } catch (err) {
      client.release(isConnectionLoss(err) ? err : undefined);
      if (isConnectionLoss(err)) return 'retry';
      return notConfigured(res, err);
    }
    let lostError = null;
    let capture = null;
    // a connection lost while the handlers run (a killed backend,
    // idle_in_transaction_session_timeout while they hang) ends their run at
    // once: the client goes back to the pool as broken, the request runs again
    const onClientError = (err) => {
      lostError = err;
      o.log('database client lost', err);
      if (capture) capture.abort(err);
    };
    client.on('error', onClientError);
    // the client back to the pool, once: as broken (closed) after a lost
    // connection or a run given up.  Done before a lease is settled, which
    // takes a pool connection of its own (with a pool of one, it would
    // wait for this one forever)
    let givenBack = false;
    const giveBack = () => {
      if (givenBack) return;
      givenBack = true;
      if (heartbeat) { clearInterval(heartbeat); heartbeat = null; }
      client.off('error', onClientError);
      if (lostError) {
        client.on('error', () => {});
        client.release(lostError);
      } else {
        client.release();
      }
    };
    // a run given up (its deadline, its client gone): its backend may still
    // be running a query (the claim's wait for a duplicate, a handler's
    // query) and hold the claim meanwhile, since the server notices a
    // closed socket only when that query ends.  The query is cancelled
    // first (PostgreSQL's cancel request: the backend's pid and secret key,
    // on a connection of its own, no pool connection needed), then the
    // client is closed, not given back as it is: its backend ends and rolls
    // the transaction back, which frees the claim
    const giveUp = async (err) => {
      lostError = err;
      if (client.processID) {
        try {
          await cancelBackend(client);
        } catch (e) {
          o.log('could not cancel the query of a run given up; its backend ends when that query does', e);
        }
      }
      giveBack();
    };
    let heartbeat = null;
    let inTransaction = false;
    try {
      const claimArgs = () => [tenant, endpoint, key, req.method, request.path, request.json, o.exclude,
        o.ttlSql, o.leaseSql, o.waitSql];
      const answerClaim = async (c) => {
        if (inTransaction) { inTransaction = false; await client.query('ROLLBACK'); }
        if (c.action === 'replay') {
          const headers = {};
          for (const [k, v] of Object.entries(c.response_headers || {})) {
            if (k.toLowerCase() !== 'idempotency-key') headers[k] = v;
          }
          headers['Idempotency-Key'] = request.rawKey;
          sendStored(res, c.response_status, headers, decodeForClient(req, headers, c.response_body));
          return 'done';
        }
        const outcome = ACTION_OUTCOME[c.action];
        if (!outcome) throw new Error(`unexpected claim action ${c.action}`);
        sendAnswer(res, problem(outcome,
          { code: c.error_code, retryAfter: c.retry_after, mismatch: c.mismatch }));
        return 'done';
      };
      // the client went away: during the claim (the handlers are not run),
      // or while they run (their run is ended at once)
      const disconnectError = (ran) => {
        const err = new Error(ran ? 'the client disconnected while the handlers ran' : 'the client disconnected before the handlers ran');
        err.idempotencyDisconnect = ran ? 'running' : 'before';
        return err;
      };
      // the fingerprint refuses a body PostgreSQL cannot take (class 22:
      // a number beyond a double, \u0000): the client's fault, a 400.  A
      // client that goes away meanwhile (the claim may wait for a duplicate
      // that runs, up to `wait`) ends the claim at once: its query is
      // cancelled on the server and its connection closed (giveUp)
      const claim = async () => {
        if (state.disconnected) throw disconnectError(false);
        const query = client.query(SQL_CLAIM, claimArgs());
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
      };
      if (key !== null && o.leaseSql && state.leaseToken === null) {
        const c = await claim();
        if (c.action !== 'execute') return await answerClaim(c);
        state.leaseToken = c.lease_token;
      }
      if (state.leaseToken) {
        heartbeat = setInterval(() => {
          o.pool.query(SQL_HEARTBEAT, [tenant, endpoint, key, state.leaseToken, o.leaseSql])
            .catch((err) => o.log('heartbeat failed', err));
        }, o.heartbeatMs);
      }
      await client.query(o.beginSql);
      inTransaction = true;
      // an endpoint whose policy has a lease answers even this claim with a
      // token: it is finished with it in this same transaction
      let claimToken = null;
      if (key !== null && !o.leaseSql) {
        const c = await claim();
        if (c.action !== 'execute') return await answerClaim(c);
        claimToken = c.lease_token;
      }
      const afterCommit = [];
      req.idempotency = {
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
      capture = captureResponse(res);
      if (state.disconnected) throw disconnectError(false);
      state.onDisconnect = () => capture.abort(disconnectError(true));
      const out = await runWithDeadline(capture, runner);
      state.onDisconnect = null;
      if (lostError) throw lostError;
      if (!o.storeStatus(out.status)) {
        inTransaction = false;
        await client.query('ROLLBACK');
        // a 5xx is the handler's own failure: not stored, the key given
        // back so that a retry runs again (lease mode too)
        if (state.leaseToken) { giveBack(); await settleLease(request, state, `the handler answered ${out.status}`, true); }
        capture.send(out);
        return 'done';
      }
      if (key !== null) {
        const headers = {};
        // stored with the names as the handler spelled them
        const spelled = new Map((out.rawNames || []).map((n) => [n.toLowerCase(), n]));
        for (const [k, v] of Object.entries(out.headers)) {
          if ((NOT_STORED.has(k) && !(k === 'content-length' && req.method === 'HEAD')) || capture.headersBefore[k] === v) continue;
          headers[spelled.get(k) || k] = Array.isArray(v) ? v.map(String) : String(v);
        }
        await client.query(SQL_FINISH, [tenant, endpoint, key, out.status, out.body, headers, state.leaseToken || claimToken])
          .catch((err) => { err.idempotencyOwn = true; throw err; });
      }
      inTransaction = false;
      await client.query('COMMIT');
      state.leaseToken = null;
      capture.send(out);
      runAfterCommit(afterCommit, res);
      return 'done';
    } catch (err) {
      state.onDisconnect = null;
      if (heartbeat) { clearInterval(heartbeat); heartbeat = null; }
      // a run given up may be inside a query: no ROLLBACK queued behind it
      if (inTransaction && !lostError && !isConnectionLoss(err) && !err.idempotencyDisconnect && !err.idempotencyDeadline) {
        try { await client.query('ROLLBACK'); } catch (e) { lostError = e; }
      }
      if (capture) capture.reset();
      if (sqlstate(err) === 'IK413') {
        o.log('response_too_large: the response is larger than idempotency.max_response_bytes (or the endpoint\'s ' +
          'max_response_bytes) and cannot be stored for replay; its work was rolled back. Answer a smaller body, ' +
          'raise the limit, or set store_response = false for the endpoint', err);
        if (state.leaseToken) { giveBack(); await settleLease(request, state, 'response too large', true); }
        sendAnswer(res, problem('too_large', { code: 'response_too_large' }));
        return 'done';
      }
      if (CONFIG_SQLSTATES.has(sqlstate(err)) && err.idempotencyOwn) {
        if (state.leaseToken) { giveBack(); await settleLease(request, state, 'not configured', true); }
        return notConfigured(res, err);
      }
      if (err.idempotencyDisconnect) {
        // nothing can be sent any more.  The handlers may still be using
        // the client: it is closed, not given back as it is (the server
        // rolls the transaction back, which frees the claim); in lease mode
        // the key is released when they had not started or had declared
        // noSideEffect(), otherwise marked unknown, as after a throw
        await giveUp(err);
        o.log(`client_disconnected: ${err.message}; the transaction was rolled back and its connection closed` +
          (state.leaseToken ? '' : ', the key is free for a retry'));
        if (state.leaseToken) { await settleLease(request, state, err.message, err.idempotencyDisconnect === 'before'); }
        return 'done';
      }
      if (err.idempotencyDeadline) {
        // the handler may still be using the client: it is closed and its
        // backend ended (the claim freed), not given back as it is
        await giveUp(err);
        o.log(`handler_timeout: the handlers did not answer within deadlineMs (${o.deadlineMs} ms); the transaction was ` +
          'rolled back and its connection closed. Find what they wait for, or raise deadlineMs', err);
        if (state.leaseToken) await settleLease(request, state, err.message);
        sendAnswer(res, problem('unavailable', { retryAfter: 1, code: 'handler_timeout' }));
        return 'done';
      }
      if (isRetryable(err) || isConnectionLoss(err) || lostError) {
        o.log('request will be run again', err);
        return 'retry';
      }
      if (err.idempotencyBodyInvalid) {
        sendAnswer(res, problem('body_invalid', { message: err.message }));
        return 'done';
      }
      if (state.leaseToken) { giveBack(); await settleLease(request, state, `the handler failed: ${err.message}`); }
      if (capture) capture.restore();
      next(err);
      return 'done';
    } finally {
      giveBack();
    }
  }

  // Work the handler left for after the commit: started once the response
  // is sent, not awaited (the client goes back to the pool meanwhile), each
  // task on its own; a failure is logged and changes nothing.
  function runAfterCommit(tasks, res) {
    if (!tasks.length) return;
    const start = () => {
      for (const task of tasks) {
        Promise.resolve().then(task).catch((err) => o.log('a task after the commit failed', err));
      }
    };
    if (res.writableFinished) setImmediate(start);
    else res.once('close', start);
  }

  // The handlers' run, given up after deadlineMs (60 s by default, 0: none).
  function runWithDeadline(capture, runner) {
    const run = capture.run(runner);
    if (!o.deadlineMs) return run;
    let timer;
    const deadline = new Promise((resolve, reject) => {
      timer = setTimeout(() => {
        const err = new Error(`the handlers did not answer within ${o.deadlineMs} ms`);
        err.idempotencyDeadline = true;
        reject(err);
      }, o.deadlineMs);
    });
    return Promise.race([run, deadline]).finally(() => clearTimeout(timer));
  }

  // The options' intervals read by the server, once; the heartbeat's
  // period from the lease.
  async function checkOptions(client) {
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

  function notConfigured(res, err) {
    o.log(`idempotency_not_configured: ${err instanceof ConfigError ? err.message : CONFIG_FIX}`, err);
    sendAnswer(res, problem('not_configured', { code: 'idempotency_not_configured' }));
    return 'done';
  }

  return middleware;
}

// the retry rules, the outbox sender, idempotent functions (issue 37)
const { classify, parseRetryAfter, backoffDelay, withRetry } = require('./retry');
const { runOutbox } = require('./outbox');
const { idempotentFunction, IdempotentFunctionError } = require('./function');

module.exports = { idempotent, formToJson, parseKeyHeader, applyKeyPolicy, answer, intervalMs, KeyError,
  classify, parseRetryAfter, backoffDelay, withRetry, runOutbox, idempotentFunction, IdempotentFunctionError };
