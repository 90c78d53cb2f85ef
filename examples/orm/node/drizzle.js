// Drizzle on node-postgres: drizzle(client) over the client that claims, so
// that the claim, the ORM's insert and the finish are one transaction.  A
// recipe of doc/orm.md, run by clients/test.sh node_orm; PGHOST, PGPORT,
// PGDATABASE, PGUSER name the database.  With @idempotency/express, the
// claim is made already: `drizzle(req.idempotency.client)` and write.
//
//   node examples/orm/node/drizzle.js
'use strict';
const assert = require('node:assert/strict');
const pg = require('pg');
const { sql } = require('drizzle-orm');
const { drizzle } = require('drizzle-orm/node-postgres');
const { pgTable, bigint, integer } = require('drizzle-orm/pg-core');

const orders = pgTable('orm_drizzle_orders', {
  id: bigint('id', { mode: 'number' }).primaryKey().generatedAlwaysAsIdentity(),
  amount: integer('amount').notNull(),
});
const TENANT = 'acct_demo';
const ENDPOINT = 'POST /orders';

// One request: the answer to send, { status, body, replayed }.
async function createOrder(pool, key, order, { failAfterWrite = false } = {}) {
  const client = await pool.connect();
  try {
    const db = drizzle(client);   // the claim's client: Drizzle's transaction is on it
    return await db.transaction(async (tx) => {
      const { rows: [claim] } = await tx.execute(sql`
        SELECT action, http_status, response_json
          FROM idempotency.idem_claim(${TENANT}, ${ENDPOINT}, ${key},
                                      idempotency.idem_fingerprint('POST', '/orders', ${JSON.stringify(order)}::jsonb))`);
      if (claim.action !== 'execute') {
        return { status: claim.http_status, body: claim.response_json, replayed: claim.action === 'replay' };
      }
      const [row] = await tx.insert(orders).values({ amount: order.amount }).returning({ id: orders.id });
      if (failAfterWrite) throw new Error('the handler failed after its write');   // Drizzle rolls back
      const body = { id: row.id };
      await tx.execute(sql`SELECT idempotency.idem_finish(${TENANT}, ${ENDPOINT}, ${key}, 201, ${JSON.stringify(body)}::jsonb)`);
      return { status: 201, body, replayed: false };
    });
  } finally {
    client.release();
  }
}

async function main() {
  const pool = new pg.Pool({ max: 2 });
  const db = drizzle(pool);
  await db.execute(sql`CREATE TABLE IF NOT EXISTS orm_drizzle_orders
                         (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount integer NOT NULL)`);
  const count = async () => (await db.select({ n: sql`count(*)`.mapWith(Number) }).from(orders))[0].n;
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
  console.log('ok - drizzle: executed, replayed, rolled back leaving nothing');
}

main().catch((err) => { console.error('FAILED: drizzle:', err); process.exit(1); });
