// A keyed request through the Express middleware against a database
// reached through PgBouncer in transaction pooling mode, for
// test/t/057_pgbouncer.pl: the first request executes, its retry replays.
//
//   node client.js CONNSTRING    (IDEM_CLIENTS_DIR: the project's clients/)
//
// Prints "first STATUS BODY", "retry STATUS BODY" and "runs N".
'use strict';
const path = require('node:path');
const { createRequire } = require('node:module');

const from = createRequire(path.join(process.env.IDEM_CLIENTS_DIR, 'node', 'package.json'));
const express = from('express');
const pg = from('pg');
const { idempotent } = from('./src/index.js');

const pool = new pg.Pool({ connectionString: process.argv[2], max: 2 });
const app = express();
app.use(express.json());
let runs = 0;
app.post('/v1/orders', idempotent({ pool, tenant: 'acme' }, async (req, res) => {
  runs += 1;
  const { rows } = await req.idempotency.client.query(
    'INSERT INTO orders (amount) VALUES ($1) RETURNING id', [req.body.amount]);
  res.status(201).json({ id: Number(rows[0].id) });
}));

const server = app.listen(0, '127.0.0.1', async () => {
  try {
    const url = `http://127.0.0.1:${server.address().port}/v1/orders`;
    for (const label of ['first', 'retry']) {
      const r = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'node-1' },
        body: JSON.stringify({ amount: 5 }),
      });
      console.log(label, r.status, await r.text());
    }
    console.log('runs', runs);
  } catch (err) {
    console.error(err);
    process.exitCode = 1;
  } finally {
    server.close();
    await pool.end();
  }
});
