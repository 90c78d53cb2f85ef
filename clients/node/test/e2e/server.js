'use strict';
// The end-to-end test's API: a small Stripe-shaped Express app on the
// middleware, which injects faults itself when FAULT_RATE > 0 and reports
// each one on stdout ("FAULT kind") before injecting it.

const express = require('express');
const pg = require('pg');
const { idempotent } = require('../../src/index.js');

const port = Number(process.env.PORT);
const rate = Number(process.env.FAULT_RATE || 0);
const { conn } = require('../support.js');
// a frozen or killed instance must not hold a claim for ever
const pool = new pg.Pool({ ...conn, max: 40, options: '-c idle_in_transaction_session_timeout=20s' });
const admin = new pg.Pool({ ...conn, max: 2 });
admin.on('error', () => {});

const KINDS = ['lost_response', 'crash_before_commit', 'slow_handler', 'killed_backend', 'serialization_failure'];
const fault = (kind) => process.stdout.write(`FAULT ${kind}\n`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const app = express();
app.use((req, res, next) => {
  req.fault = rate > 0 && Math.random() < rate ? KINDS[Math.floor(Math.random() * KINDS.length)] : null;
  if (req.fault === 'lost_response') {
    // committed, then the connection drops before the answer goes out
    res.end = function lostEnd() { fault('lost_response'); req.socket.destroy(); return res; };
  }
  next();
});
let requestSeq = 0;
app.post('/v1/charges',
  idempotent({ pool, tenant: 'acme', profile: 'stripe', exclude: ['/metadata/request_ts'], wait: '5 seconds', retries: 3 },
    async (req, res) => {
    const { client, key } = req.idempotency;
    const seq = ++requestSeq;
    await client.query('INSERT INTO charges (id, idem_key, amount) VALUES ($1, $2, $3)',
      [`ch_${key}_${process.pid}_${seq}`, key, Number(req.body.amount)]);
    const f = req.fault;
    req.fault = null; // once per request, not on the middleware's own retries
    if (f === 'crash_before_commit') { fault(f); process.kill(process.pid, 'SIGKILL'); await sleep(10000); }
    if (f === 'slow_handler') { fault(f); await sleep(3000); }
    if (f === 'killed_backend') {
      fault(f);
      const pid = (await client.query('SELECT pg_backend_pid() AS p')).rows[0].p;
      await admin.query('SELECT pg_terminate_backend($1)', [pid]);
      await client.query('SELECT 1');
    }
    if (f === 'serialization_failure') {
      fault(f);
      await client.query("DO $$BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END$$");
    }
    const row = (await client.query('SELECT id FROM charges WHERE idem_key = $1', [key])).rows[0];
    res.set('Request-Id', `req_${process.pid}_${seq}`);
    res.json({ id: row.id, object: 'charge', amount: Number(req.body.amount), currency: req.body.currency });
  }));
app.use((err, req, res, next) => {
  res.status(500).json({ error: { type: 'api_error', message: err.message } });
});
app.listen(port, '127.0.0.1', () => process.stdout.write('LISTENING\n'));
