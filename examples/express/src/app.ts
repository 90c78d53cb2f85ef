// A typed Express 5 payments API on @idempotency/express: POST /v1/charges
// takes an Idempotency-Key (Stripe style), writes the charge in the claim's
// transaction, and a retry with the same key gets the same answer.
//
// Environment: PGHOST, PGPORT, PGDATABASE, PGUSER (pg's own variables), PORT.

import express from 'express';
import type { Request, Response } from 'express';
import pg from 'pg';
import { idempotent } from '@idempotency/express';
import type { IdempotencyOptions, IdempotentRequest } from '@idempotency/express';

const pool = new pg.Pool({ max: 20 });

const options: IdempotencyOptions = {
  pool,
  tenant: (req: Request): string => req.get('x-account') ?? 'acct_demo',
  profile: 'stripe',
  exclude: ['/metadata/request_ts'],
  wait: '5 seconds',
  ttl: '1 day',
};

interface ChargeRow {
  id: string;
  amount: string;
  currency: string;
}

export const app = express();

// The handler goes to idempotent() itself: it runs it, again after a
// serialization failure or a lost connection, and req.idempotency is typed.
app.post('/v1/charges', idempotent(options, async (req: IdempotentRequest, res: Response): Promise<void> => {
  const body = req.body as { amount?: unknown; currency?: unknown };
  const amount = Number(body.amount);
  if (!Number.isInteger(amount) || amount <= 0 || typeof body.currency !== 'string') {
    res.status(400).json({ error: { type: 'invalid_request_error', message: 'amount and currency are required' } });
    return;
  }
  const { rows } = await req.idempotency.client.query<ChargeRow>(
    'INSERT INTO shop_charges (amount, currency) VALUES ($1, $2) RETURNING id, amount, currency',
    [amount, body.currency]);
  const row = rows[0];
  if (!row) throw new Error('no row returned');
  // after the commit, once the response is sent; a failure is logged
  req.idempotency.afterCommit(async (): Promise<void> => {
    await pool.query('INSERT INTO shop_receipts (charge_id) VALUES ($1)', [row.id]);
  });
  res.status(200).json({ id: row.id, object: 'charge', amount: Number(row.amount), currency: row.currency });
}));

// A router mounted at a path with a parameter: mountPath names the template
// (one endpoint 'POST /accounts/:acct/refunds' for every account).
const accounts = express.Router();
accounts.post('/refunds', idempotent({ ...options, mountPath: '/accounts/:acct' },
  (req: IdempotentRequest, res: Response): void => {
    res.status(200).json({ object: 'refund', endpoint: req.idempotency.endpoint });
  }));
app.use('/accounts/:acct', accounts);

if (require.main === module) {
  const port = Number(process.env.PORT ?? 3000);
  app.listen(port, '127.0.0.1', () => {
    process.stdout.write(`LISTENING http://127.0.0.1:${port}\n`);
  });
}
