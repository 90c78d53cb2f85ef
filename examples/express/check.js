'use strict';
// What run.sh --test asks the example API (BASE): a charge, its retry with
// the same key (a replay of the same answer), the same key with another
// amount (refused).  Prints the charge id for the row count; exits non-zero
// on the first answer that is not as expected.

const base = process.env.BASE;
const key = `example-${process.pid}-${Date.now()}`;
const post = (body, k = key) => fetch(`${base}/v1/charges`, {
  method: 'POST',
  headers: { 'Content-Type': 'application/json', 'Idempotency-Key': k },
  body: JSON.stringify(body),
});
const expect = (cond, what) => { if (!cond) { console.error(`not ok - ${what}`); process.exit(1); } console.log(`ok - ${what}`); };

(async () => {
  const first = await post({ amount: 1500, currency: 'eur' });
  const firstBody = await first.text();
  expect(first.status === 200, `first call: 200 (got ${first.status} ${firstBody})`);
  const again = await post({ amount: 1500, currency: 'eur' });
  expect(again.status === 200 && (await again.text()) === firstBody, 'retry: the same answer, byte for byte');
  expect(again.headers.get('idempotent-replayed') === 'true', 'retry: Idempotent-Replayed: true');
  const other = await post({ amount: 9999, currency: 'eur' });
  const otherBody = await other.json();
  expect(other.status === 400 && otherBody.error.type === 'idempotency_error', 'same key, other amount: 400 idempotency_error');
  const refund = await fetch(`${base}/accounts/acct_1/refunds`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', 'Idempotency-Key': `${key}-r` }, body: '{}' });
  expect(refund.status === 200 && (await refund.json()).endpoint === 'POST /accounts/:acct/refunds',
    'a router mounted at /accounts/:acct: one endpoint, its template');
  console.log(`CHARGE ${JSON.parse(firstBody).id}`);
})().catch((err) => { console.error(err); process.exit(1); });
