'use strict';
// PostgreSQL's cancel request for the query a pg.Client runs: the
// CancelRequest message of the frontend/backend protocol (length 16, code
// 80877102, the backend's process id and secret key from its
// BackendKeyData) sent on a connection of its own to the client's server,
// which the server closes once it has signalled the backend.  No pool
// connection is needed and no role's privilege: the key proves the right,
// as for libpq's PQcancel.  Sent without TLS, as libpq's PQcancel does:
// the server reads a cancel request before any authentication.

const net = require('node:net');

const CANCEL_CODE = 80877102;

// Whether this client can be cancelled: a connected pg.Client (pure
// JavaScript; pg-native keeps no secret key readable here).
function cancellable(client) {
  return !!(client && Number.isInteger(client.processID) && Number.isInteger(client.secretKey));
}

// Sends the cancel request for client's backend; resolves once the server
// closed the cancel connection (the backend signalled), rejects on an error
// or after timeoutMs.  What the backend was running ends with SQLSTATE 57014
// (query_canceled); a backend that runs nothing is left as it is.
function cancelBackend(client, timeoutMs = 2000) {
  return new Promise((resolve, reject) => {
    if (!cancellable(client)) {
      reject(new Error('the client has no backend process id and secret key to cancel with'));
      return;
    }
    const host = client.host || (client.connectionParameters && client.connectionParameters.host) || 'localhost';
    const port = Number(client.port || (client.connectionParameters && client.connectionParameters.port) || 5432);
    const where = host.startsWith('/') ? { path: `${host}/.s.PGSQL.${port}` } : { host, port };
    const packet = Buffer.alloc(16);
    packet.writeInt32BE(16, 0);
    packet.writeInt32BE(CANCEL_CODE, 4);
    packet.writeInt32BE(client.processID, 8);
    packet.writeInt32BE(client.secretKey, 12);
    let settled = false;
    const socket = net.connect(where);
    const finish = (err) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      if (err) reject(err); else resolve();
    };
    const timer = setTimeout(() => finish(new Error(`no answer to the cancel request within ${timeoutMs} ms`)), timeoutMs);
    socket.on('connect', () => socket.end(packet));
    socket.on('error', finish);
    socket.on('close', () => finish());
    socket.resume(); // the server sends nothing; read to see its end
  });
}

module.exports = { cancelBackend, cancellable };
