'use strict';
// The Idempotency-Key request header: its value read bare (Stripe) or as an
// RFC 8941 sf-string (IETF draft), and the key policy that maps a key
// outside the extension's rule to one inside it, or refuses it.

const crypto = require('node:crypto');

const KEY_RULE = /^[A-Za-z0-9_-]{1,255}$/;
// RFC 8941 parameters: *( ";" *SP key [ "=" bare-item ] ), a bare item
// being a string, a token, a number, a boolean or a byte sequence
const SF_PARAMETERS = /^(;[ ]*[a-z*][a-z0-9_.*-]*(=("([^"\\]|\\["\\])*"|[A-Za-z*][A-Za-z0-9!#$%&'*+.^_`|~:/-]*|-?[0-9]+(\.[0-9]+)?|\?[01]|:[A-Za-z0-9+/=]*:))?)*$/;

class KeyError extends Error {
  constructor(message) {
    super(message);
    this.name = 'KeyError';
  }
}

// RFC 8941 section 4.2.5: a String is DQUOTE *(unescaped / "\" DQUOTE / "\\")
// DQUOTE, unescaped being printable ASCII (0x20-0x7E) but " and \.
function parseSfString(text) {
  let out = '';
  for (let i = 1; i < text.length; i++) {
    const c = text[i];
    if (c === '\\') {
      const n = text[++i];
      if (n !== '"' && n !== '\\') throw new KeyError('invalid escape in the Idempotency-Key string');
      out += n;
    } else if (c === '"') {
      // RFC 8941 section 3.1.2: an Item may carry parameters (;key or
      // ;key=value), which do not belong to the key
      if (!SF_PARAMETERS.test(text.slice(i + 1))) throw new KeyError('characters after the end of the Idempotency-Key string');
      return out;
    } else {
      const code = c.charCodeAt(0);
      if (code < 0x20 || code > 0x7e) throw new KeyError('invalid character in the Idempotency-Key string');
      out += c;
    }
  }
  throw new KeyError('unterminated Idempotency-Key string');
}

// Node reads a header's bytes as Latin-1 characters: a bare key is read
// again as the UTF-8 it was sent in (refused when it is not UTF-8), so that
// keyPolicy 'hash' hashes the bytes the client sent.
function fromHeaderBytes(text) {
  if (!/[^\x00-\x7f]/.test(text) || /[^\x00-\xff]/.test(text)) return text;
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(Buffer.from(text, 'latin1'));
  } catch {
    throw new KeyError('the Idempotency-Key is not UTF-8');
  }
}

// The key a request carries, or null when it has none.  A value that
// starts with a double quote is an sf-string; any other is taken bare,
// without the surrounding white space.
function parseKeyHeader(value) {
  if (value === undefined || value === null) return null;
  if (Array.isArray(value)) {
    if (value.length !== 1) throw new KeyError('more than one Idempotency-Key header');
    value = value[0];
  }
  const text = String(value).trim();
  if (text === '') throw new KeyError('empty Idempotency-Key header');
  const key = text.startsWith('"') ? parseSfString(text) : fromHeaderBytes(text);
  if (key === '') throw new KeyError('empty Idempotency-Key');
  return key;
}

// A key within the extension's rule passes unchanged.  Any other key is
// refused (policy 'refuse') or replaced (policy 'hash') by "h_" and the
// base64url SHA-256 of its UTF-8 bytes, 45 characters.
function applyKeyPolicy(key, policy) {
  if (KEY_RULE.test(key)) return key;
  if (policy === 'hash') {
    return 'h_' + crypto.createHash('sha256').update(key, 'utf8').digest('base64url');
  }
  throw new KeyError('an Idempotency-Key is 1 to 255 characters from A-Z a-z 0-9 - _');
}

module.exports = { parseKeyHeader, applyKeyPolicy, KeyError, KEY_RULE };
