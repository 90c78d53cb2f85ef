'use strict';
// The request body as the fingerprint sees it: JSON as sent, a
// form-encoded body mapped to JSON (the mapping is part of the
// fingerprint, see doc/http.md, "HTTP APIs"), any other body by its type and
// SHA-256, no body as SQL NULL.

const crypto = require('node:crypto');

// answerCode: the code of the 400 that answers it (request_body_invalid by default)
class BodyError extends Error {
  constructor(message, answerCode) {
    super(message);
    this.name = 'BodyError';
    this.answerCode = answerCode;
  }
}

function mediaType(req) {
  return String(req.headers['content-type'] || '').split(';')[0].trim().toLowerCase();
}

function readRaw(req, limit) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    let over = false;
    req.on('data', (c) => {
      if (over) return; // the rest is read and dropped, so that the client gets its 400
      size += c.length;
      if (size > limit) {
        over = true;
        chunks.length = 0;
        reject(new BodyError('request body too large', 'request_body_too_large'));
        return;
      }
      chunks.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

// "a[b][c]=v" sets a.b.c, "a[]=v" appends to the array a, "a=v" sets a;
// values stay strings; a name repeated without [] becomes an array of its
// values in order.  A name used both as a value and as an object or array
// ("a=1&a[b]=2") is refused.
function formToJson(text) {
  const root = Object.create(null);
  if (text === '') return root;
  for (const pair of text.split('&')) {
    if (pair === '') continue;
    const eq = pair.indexOf('=');
    const rawName = eq < 0 ? pair : pair.slice(0, eq);
    const rawValue = eq < 0 ? '' : pair.slice(eq + 1);
    const dec = (s) => {
      try {
        return decodeURIComponent(s.replace(/\+/g, ' '));
      } catch {
        throw new BodyError('malformed percent-encoding in the form body');
      }
    };
    const name = dec(rawName);
    const value = dec(rawValue);
    const m = /^([^[\]]+)((?:\[[^[\]]*\])*)$/.exec(name);
    const path = m ? [m[1], ...[...m[2].matchAll(/\[([^[\]]*)\]/g)].map((x) => x[1])] : [name];
    setPath(root, path, value, name);
  }
  return root;
}

function isPlainObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

function setPath(root, path, value, name) {
  const clash = () => new BodyError(`form field ${name} is used both as a value and as a structure`);
  let node = root;
  for (let i = 0; i < path.length; i++) {
    const token = path[i];
    if (i === path.length - 1) {
      if (token === '') {
        if (!Array.isArray(node)) throw clash();
        node.push(value);
        return;
      }
      const have = Object.prototype.hasOwnProperty.call(node, token) ? node[token] : undefined;
      if (have === undefined) node[token] = value;
      else if (typeof have === 'string') node[token] = [have, value];
      else if (Array.isArray(have) && have.every((x) => typeof x === 'string')) have.push(value);
      else throw clash();
      return;
    }
    const wantArray = path[i + 1] === '';
    if (token === '') {
      if (!Array.isArray(node)) throw clash();
      const child = wantArray ? [] : Object.create(null);
      node.push(child);
      node = child;
      continue;
    }
    if (Array.isArray(node)) throw clash();
    const have = Object.prototype.hasOwnProperty.call(node, token) ? node[token] : undefined;
    if (have === undefined) node[token] = wantArray ? [] : Object.create(null);
    else if (wantArray ? !Array.isArray(have) : !isPlainObject(have)) throw clash();
    node = node[token];
  }
}

// Reads the body (unless a body parser already did) and returns
// { json: text or null, parsed: what req.body becomes, raw: Buffer }.
async function fingerprintBody(req, limit) {
  const type = mediaType(req);
  if (req.body !== undefined && (req.readableEnded || req.complete)) {
    // a body parser ran first: its result is what the handler sees
    const parsed = req.body;
    const empty = parsed === null || (isPlainObject(parsed) && Object.keys(parsed).length === 0 && !req.headers['content-length']);
    return { json: empty ? null : JSON.stringify(Buffer.isBuffer(parsed) ? { content_type: type, sha256: sha256(parsed) } : parsed), parsed, raw: null };
  }
  const raw = await readRaw(req, limit);
  if (raw.length === 0) return { json: null, parsed: undefined, raw };
  if (type === 'application/json' || type.endsWith('+json')) {
    const text = raw.toString('utf8');
    let parsed;
    try {
      parsed = JSON.parse(text);
    } catch {
      throw new BodyError('the request body is not valid JSON');
    }
    return { json: text, parsed, raw };
  }
  if (type === 'application/x-www-form-urlencoded') {
    const parsed = formToJson(raw.toString('utf8'));
    return { json: JSON.stringify(parsed), parsed, raw };
  }
  return { json: JSON.stringify({ content_type: type, sha256: sha256(raw) }), parsed: raw, raw };
}

function sha256(buf) {
  return crypto.createHash('sha256').update(buf).digest('hex');
}

module.exports = { fingerprintBody, formToJson, BodyError };
