// node-postgres (plain `pg`): the claim, the business write and the finish
// on one client, in one transaction.  A recipe of doc/orm.md, run by
// clients/test.sh node_orm; PGHOST, PGPORT, PGDATABASE, PGUSER name the
// database (the extension created, the role granted idempotency_client).
//
//   node examples/orm/node/pg.js
'use strict';
const assert = require('node:assert/strict');
const pg = require('pg');

const TENANT = 'acct_demo';
const ENDPOINT = 'POST /orders';

// One request: the answer to send, { status, body, replayed }.
async function createOrder(pool, key, order, { failAfterWrite = false } = {}) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const { rows: [claim] } = await client.query(
      `SELECT action, http_status, response_json
         FROM idempotency.idem_claim($1, $2, $3, idempotency.idem_fingerprint('POST', '/orders', $4::jsonb))`,
      [TENANT, ENDPOINT, key, order]);
    if (claim.action !== 'execute') {   // replay, in_progress, mismatch, ...: answer what the claim says
      await client.query('COMMIT');
      return { status: claim.http_status, body: claim.response_json, replayed: claim.action === 'replay' };
    }
    const { rows: [row] } = await client.query(
      'INSERT INTO orm_pg_orders (amount) VALUES ($1) RETURNING id', [order.amount]);
    if (failAfterWrite) throw new Error('the handler failed after its write');
    const body = { id: Number(row.id) };
    await client.query('SELECT idempotency.idem_finish($1, $2, $3, 201, $4::jsonb)', [TENANT, ENDPOINT, key, body]);
    await client.query('COMMIT');
    return { status: 201, body, replayed: false };
  } catch (err) {
    await client.query('ROLLBACK');   // the order and the claim go together: the key is free again
    throw err;
  } finally {
    client.release();
  }
}

async function main() {
  const pool = new pg.Pool({ max: 2 });
  await pool.query(`CREATE TABLE IF NOT EXISTS orm_pg_orders
                      (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount integer NOT NULL)`);
  const orders = async () => Number((await pool.query('SELECT count(*) FROM orm_pg_orders')).rows[0].count);
  const before = await orders();
  const key = `order-${process.pid}-${Date.now()}`;

  const first = await createOrder(pool, key, { amount: 4200 });
  assert.equal(first.status, 201);
  assert.equal(await orders(), before + 1);

  const again = await createOrder(pool, key, { amount: 4200 });   // the retry
  assert.deepEqual(again, { status: 201, body: first.body, replayed: true });
  assert.equal(await orders(), before + 1, 'the replay wrote a second order');

  await assert.rejects(createOrder(pool, `${key}-b`, { amount: 100 }, { failAfterWrite: true }));
  assert.equal(await orders(), before + 1, 'the rolled back request left its order');
  const retried = await createOrder(pool, `${key}-b`, { amount: 100 });   // its key was given back
  assert.equal(retried.replayed, false);
  assert.equal(await orders(), before + 2);

  await pool.end();
  console.log('ok - pg: executed, replayed, rolled back leaving nothing');
}

main().catch((err) => { console.error('FAILED: pg:', err); process.exit(1); });
