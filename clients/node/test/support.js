'use strict';
// What the unit tests against a database share (test/unit/*.test.js): the
// cluster clients/test.sh gives them (IDEM_TEST_PGHOST, IDEM_TEST_PGPORT,
// IDEM_TEST_PGUSER, IDEM_TEST_PGDATABASE), the reason they are skipped
// without it, and serve(): an Express app on loopback with a pool and an
// admin client, opened before the file's tests and closed after them.
// Not a test file itself (node --test runs test/unit/ only); the end-to-end
// drivers of test/e2e take conn from it too.

const test = require('node:test');
const pg = require('pg');

const conn = {
  host: process.env.IDEM_TEST_PGHOST || '127.0.0.1',
  port: Number(process.env.IDEM_TEST_PGPORT),
  user: process.env.IDEM_TEST_PGUSER,
  database: process.env.IDEM_TEST_PGDATABASE,
};
const skip = !process.env.IDEM_TEST_PGPORT && 'IDEM_TEST_PGPORT not set';

// An app listening on an ephemeral loopback port: resolves with the server.
function listen(app) {
  return new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
}

// The file's environment, filled in before its tests: env.pool (a pg.Pool of
// `max` clients), env.admin (a connected pg.Client), env.server, env.port,
// env.base ('http://127.0.0.1:PORT').  `sql` runs on the admin client first,
// then `before(env)`, then `app(env)` is built and served; after the tests,
// `after(env)` runs and everything is closed.
function serve({ max = 4, sql = [], app, before, after }) {
  const env = { pool: null, admin: null, server: null, port: null, base: null };
  test.before(async () => {
    if (skip) return;
    env.pool = new pg.Pool({ ...conn, max });
    env.admin = new pg.Client(conn);
    await env.admin.connect();
    for (const s of sql) await env.admin.query(s);
    if (before) await before(env);
    env.server = await listen(app(env));
    env.port = env.server.address().port;
    env.base = `http://127.0.0.1:${env.port}`;
  });
  test.after(async () => {
    if (skip) return;
    if (after) await after(env);
    await new Promise((r) => env.server.close(r));
    await env.pool.end();
    await env.admin.end();
  });
  return env;
}

module.exports = { conn, skip, listen, serve };
