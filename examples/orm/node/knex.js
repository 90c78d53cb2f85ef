// Knex on the claim's client: the claim and the finish are queries on a
// node-postgres client in a transaction, and Knex's queries run on that
// same client with .connection(client) (what an application does with
// @idempotency/express's req.idempotency.client, whose transaction is
// open already).  A recipe of doc/orm.md, run by clients/test.sh
// node_orm; PGHOST, PGPORT, PGDATABASE, PGUSER name the database.
//
//   node examples/orm/node/knex.js
'use strict';
const assert = require('node:assert/strict');
const pg = require('pg');
const knex = require('knex')({ client: 'pg' });   // builds queries; each runs on the client given

const TENANT = 'acct_demo';
const ENDPOINT = 'POST /orders';

// The handler: Knex writes with the claim's client.
async function handle(client, order, { failAfterWrite = false } = {}) {
  const [row] = await knex('orm_knex_orders').insert({ amount: order.amount }).returning('id').connection(client);
  if (failAfterWrite) throw new Error('the handler failed after its write');
  return { id: Number(row.id) };
}

// One request: the answer to send, { status, body, replayed }.
async function createOrder(pool, key, order, options) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const { rows: [claim] } = await client.query(
      `SELECT action, http_status, response_json
         FROM idempotency.idem_claim($1, $2, $3, idempotency.idem_fingerprint('POST', '/orders', $4::jsonb))`,
      [TENANT, ENDPOINT, key, order]);
    if (claim.action !== 'execute') {
      await client.query('COMMIT');
      return { status: claim.http_status, body: claim.response_json, replayed: claim.action === 'replay' };
    }
    const body = await handle(client, order, options);
    await client.query('SELECT idempotency.idem_finish($1, $2, $3, 201, $4::jsonb)', [TENANT, ENDPOINT, key, body]);
    await client.query('COMMIT');
    return { status: 201, body, replayed: false };
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  } finally {
    client.release();
  }
}

async function main() {
  const pool = new pg.Pool({ max: 2 });
  const client = await pool.connect();
  await knex.raw(`CREATE TABLE IF NOT EXISTS orm_knex_orders
                    (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount integer NOT NULL)`).connection(client);
  client.release();
  const count = async () => {
    const c = await pool.connect();
    try { return Number((await knex('orm_knex_orders').count('* as n').connection(c))[0].n); } finally { c.release(); }
  };
  const before = await count();
  const key = `order-${process.pid}-${Date.now()}`;

  const first = await createOrder(pool, key, { amount: 4200 });
  assert.equal(first.status, 201);
  assert.equal(await count(), before + 1);

  const again = await createOrder(pool, key, { amount: 4200 });   // the retry
  assert.deepEqual(again, { status: 201, body: first.body, replayed: true });
  assert.equal(await count(), before + 1, 'the replay wrote a second order');

  await assert.rejects(createOrder(pool, `${key}-b`, { amount: 100 }, { failAfterWrite: true }));
  assert.equal(await count(), before + 1, 'the rolled back request left its order');
  const retried = await createOrder(pool, `${key}-b`, { amount: 100 });   // its key was given back
  assert.equal(retried.replayed, false);
  assert.equal(await count(), before + 2);

  await pool.end();
  await knex.destroy();
  console.log('ok - knex: executed, replayed, rolled back leaving nothing');
}

main().catch((err) => { console.error('FAILED: knex:', err); process.exit(1); });
