'use strict';
// Holds back what handlers write to an http.ServerResponse (status,
// headers, body) until the key is finished and committed, then sends it;
// or throws it away and puts the response back as it was, for a retry.

function captureResponse(res) {
  const saved = { writeHead: res.writeHead, write: res.write, end: res.end };
  const headersBefore = res.getHeaders();
  // listeners a run adds for the end of the response ('finish', 'close')
  // belong to that run: a run thrown away takes them with it, so that
  // work an application hangs on them happens once, after the commit
  const EVENTS = ['finish', 'close', 'prefinish'];
  const listenersBefore = Object.fromEntries(EVENTS.map((e) => [e, res.listeners(e)]));
  // what the handlers wrote, and how their run ends (see run)
  const held = { chunks: [], settle: null };
  interceptWrites(res, held);

  function restore() {
    res.writeHead = saved.writeHead;
    res.write = saved.write;
    res.end = saved.end;
  }

  return {
    // runner.run(done) starts the handlers; resolves with the response
    // when they end it, rejects when they pass on an error.
    run(runner) {
      return new Promise((resolve, reject) => {
        held.settle = { resolve, reject };
        try {
          runner.run((err) => {
            if (held.settle) held.settle.reject(err);
            held.settle = null;
          });
        } catch (err) {
          if (held.settle) held.settle.reject(err);
          held.settle = null;
        }
      });
    },
    // sends a captured response (its headers are already set on res)
    send(out) {
      restore();
      // the headers as they were when the handlers ended the response: an
      // error handler that ran after (a handler that answered, then threw)
      // does not change what is sent
      const spelled = new Map((out.rawNames || []).map((n) => [n.toLowerCase(), n]));
      for (const name of res.getHeaderNames()) res.removeHeader(name);
      for (const [k, v] of Object.entries(out.headers)) res.setHeader(spelled.get(k) || k, v);
      res.statusCode = out.status;
      sendBody(res, out.body);
    },
    restore,
    // ends a run that has not answered yet with this error
    abort(err) {
      if (held.settle) held.settle.reject(err);
      held.settle = null;
    },
    // headers the response had before the handlers ran (per delivery, never stored)
    headersBefore,
    // forget what the handlers did: the response is as before they ran
    reset() {
      restore();
      held.chunks = [];
      held.settle = null;
      for (const name of res.getHeaderNames()) res.removeHeader(name);
      for (const [k, v] of Object.entries(headersBefore)) res.setHeader(k, v);
      res.statusCode = 200;
      for (const e of EVENTS) {
        for (const l of res.listeners(e)) {
          if (!listenersBefore[e].includes(l)) res.removeListener(e, l);
        }
      }
    },
  };
}

// The response's writeHead, write and end replaced: what the handlers write
// is held (held.chunks), and their end of the response settles the run
// (held.settle) with status, headers and body.
function interceptWrites(res, held) {
  const toBuffer = (chunk, enc) => (Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk, typeof enc === 'string' ? enc : 'utf8'));

  res.writeHead = function writeHead(status, reason, headers) {
    if (typeof reason !== 'string') headers = reason;
    res.statusCode = status;
    if (Array.isArray(headers)) {
      for (let i = 0; i + 1 < headers.length; i += 2) res.setHeader(headers[i], headers[i + 1]);
    } else if (headers) {
      for (const [k, v] of Object.entries(headers)) res.setHeader(k, v);
    }
    return res;
  };
  res.write = function write(chunk, enc, cb) {
    if (typeof enc === 'function') { cb = enc; enc = undefined; }
    if (chunk != null) held.chunks.push(toBuffer(chunk, enc));
    if (cb) process.nextTick(cb);
    return true;
  };
  res.end = function end(chunk, enc, cb) {
    if (typeof chunk === 'function') { cb = chunk; chunk = undefined; } else if (typeof enc === 'function') { cb = enc; enc = undefined; }
    if (chunk != null) held.chunks.push(toBuffer(chunk, enc));
    if (held.settle) {
      held.settle.resolve({ status: res.statusCode, headers: res.getHeaders(), rawNames: res.getRawHeaderNames(), body: Buffer.concat(held.chunks) });
    }
    held.settle = null;
    if (cb) process.nextTick(cb);
    return res;
  };
}

// Ends a response with its body; a HEAD answer gets the body's length
// without the body, a status without a body neither.
function sendBody(res, body) {
  const noBody = res.statusCode === 204 || res.statusCode === 304 || (res.statusCode >= 100 && res.statusCode < 200);
  if (!noBody && !res.hasHeader('content-length') && !res.hasHeader('transfer-encoding')) {
    res.setHeader('Content-Length', String(body ? body.length : 0));
  }
  if (res.req && res.req.method === 'HEAD') return res.end();
  return res.end(body && body.length ? body : undefined);
}

module.exports = { captureResponse, sendBody };
