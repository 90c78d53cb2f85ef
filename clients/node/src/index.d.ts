// Type declarations of @idempotency/express: the options, the middleware,
// the helpers, and req.idempotency on Express's Request.

import type { NextFunction, Request, RequestHandler, Response } from 'express';
import type { Pool, PoolClient } from 'pg';

/** An interval as PostgreSQL reads it ('30 seconds', '1 day', 'P1D', '24h'), or a number of seconds. */
export type Interval = string | number;

export type Profile = 'stripe' | 'ietf';
export type KeyPolicy = 'refuse' | 'hash';
export type Isolation = 'READ COMMITTED' | 'REPEATABLE READ' | 'SERIALIZABLE';

export interface IdempotencyOptions {
  /** The pool the claims, the handler's transaction and the heartbeats use. */
  pool: Pool;
  /** The authenticated account the keys belong to. */
  tenant: string | ((req: Request) => string | Promise<string>);
  /** The endpoint (default: the method and the route template). */
  endpoint?: string | ((req: Request) => string | Promise<string>);
  /**
   * The path a router was mounted at, as written in app.use ('/accounts/:acct'):
   * a router's mount path is not public, so the endpoint's template needs it.
   * Sub-applications need none (app.mountpath).
   */
  mountPath?: string;
  profile?: Profile;
  keyPolicy?: KeyPolicy;
  /** JSON Pointers left out of the fingerprint. */
  exclude?: string[];
  /**
   * Intervals as PostgreSQL reads them ('30 seconds', '1 day', 'P1D'), or
   * seconds; a string that cannot be one ('soon') throws a TypeError in
   * idempotent(), and the server reads them at the first claim.
   */
  lease?: Interval;
  wait?: Interval;
  ttl?: Interval;
  /** Refuse requests without an Idempotency-Key (400). */
  required?: boolean;
  /** Runs again after a serialization failure, a deadlock or a lost connection (default 3). */
  retries?: number;
  /** Largest request body read, in bytes (default 1 MiB). */
  limit?: number;
  isolation?: Isolation;
  /** Lease mode: the heartbeat's period in milliseconds (default a third of the lease). */
  heartbeatMs?: number;
  /**
   * The handlers' deadline in milliseconds (default 60000; 0 turns it off):
   * past it the transaction is rolled back, its connection closed (the claim
   * freed; in lease mode the key marked unknown unless noSideEffect()), and
   * the request answered 503 handler_timeout.  A client that disconnects
   * while the handlers run ends their run the same way, without an answer.
   */
  deadlineMs?: number;
  /** Whether a response with this status is stored (default: below 500). */
  storeStatus?: (status: number) => boolean;
  /** Where the middleware reports what went wrong (default: console.error). */
  log?: (message: string, err?: unknown) => void;
  /**
   * The ietf problems' type is this base followed by the answer's code
   * (default: the anchors of the project's doc/http.md).
   */
  problemTypeBase?: string;
}

/** What the handlers get as req.idempotency. */
export interface IdempotencyContext {
  /** The pooled client, inside the claim's transaction: write with it. */
  client: PoolClient;
  /** The key as stored (after the key policy), or null without a header. */
  key: string | null;
  tenant: string;
  endpoint: string;
  /** Lease mode: the claim's lease token. */
  leaseToken: string | null;
  /** Lease mode: nothing happened outside the database yet, a failure releases the key. */
  noSideEffect(): void;
  /**
   * Work for after the commit (an e-mail, a webhook): started once the
   * response is sent, never when the request's work rolled back; a failing
   * task is logged. It must not use `client`.
   */
  afterCommit(task: () => unknown): void;
  /** idem_downstream_key: the key to send a downstream service for this step. */
  downstreamKey(step: string): Promise<string>;
}

/** A request inside idempotent(): req.idempotency is set. */
export type IdempotentRequest = Request & { idempotency: IdempotencyContext };
/** A handler given to idempotent(): run again after a serialization failure, deadlock or lost connection. */
export type IdempotentHandler = (req: IdempotentRequest, res: Response, next: NextFunction) => unknown;

/**
 * idempotent(options, ...handlers): the middleware runs the handlers itself
 * (again on a retry). idempotent(options) in front of a route's handlers
 * hands over once with Express's next (no retry).
 */
export function idempotent(options: IdempotencyOptions, ...handlers: Array<IdempotentHandler | IdempotentHandler[]>): RequestHandler;

export class KeyError extends Error {}
export function parseKeyHeader(value: string | string[] | undefined | null): string | null;
export function applyKeyPolicy(key: string, policy: KeyPolicy): string;
export function formToJson(text: string): Record<string, unknown>;
export function intervalMs(value: Interval): number;

export interface Answer {
  status: number;
  headers: Record<string, string>;
  body: unknown;
}
export function answer(profile: Profile, outcome: string,
  details?: { message?: string; code?: string; retryAfter?: number; mismatch?: unknown; typeBase?: string }): Answer;

// ---- The retry rules, the outbox sender, idempotent functions (issue 37) ----

/** The kind of an attempt's outcome (the project's clients/vectors/retry.json). */
export type RetryKind = 'success' | 'retry' | 'wait' | 'refresh' | 'new_key' | 'fatal';
/** An operation's state once its retries end. */
export type FinalOutcome = 'succeeded' | 'failed' | 'attention';

/** A status, a response (anything with .status), or the error of an attempt without an answer. */
export function classify(outcome: number | { status: number } | Error | 'network' | 'timeout'): RetryKind;
/** Retry-After (seconds or an HTTP date) in milliseconds from now; null when absent or not valid. */
export function parseRetryAfter(header: string | string[] | null | undefined, now?: number | Date): number | null;
/** Full jitter: uniform in [0, min(capMs, baseMs * 2^(attempts - 1))]. */
export function backoffDelay(attempts: number, options?: { baseMs?: number; capMs?: number }, random?: () => number): number;

export interface RetryAttempt {
  /** The operation's key: the same at every attempt. */
  key: string;
  /** 1 for the first attempt. */
  attempt: number;
  /** Fresh at every attempt: send it as X-Request-Id. */
  requestId: string;
}
export interface RetryResponse {
  status: number;
  headers?: { get(name: string): string | null } | Record<string, string | string[] | undefined>;
}
export interface RetryOptions {
  /** The operation's key (default: a fresh UUID, the same for every attempt). */
  key?: string;
  /** Attempts in all (default 5). */
  maxAttempts?: number;
  /** Time from the first attempt after which no attempt starts (default 30000). */
  maxTotalMs?: number;
  /** Backoff: the first interval's bound (default 100) and the largest (default 10000). */
  baseMs?: number;
  capMs?: number;
  /** Called after a 401, before the next attempt; without it a 401 ends in 'attention'. */
  refresh?: () => unknown | Promise<unknown>;
  onRetry?: (info: { attempt: number; kind: RetryKind; delayMs: number; status: number | null; error: unknown }) => void;
}
export interface RetryResult<R> {
  outcome: FinalOutcome;
  kind: RetryKind;
  attempts: number;
  /** The last answer, or null when the last attempt got none. */
  response: R | null;
  /** The last attempt's error (network, timeout), or null. */
  error: unknown;
  key: string;
}
/** Sends one operation with the same key until a definite answer or the bounds. */
export function withRetry<R extends RetryResponse>(send: (attempt: RetryAttempt) => Promise<R>,
  options?: RetryOptions): Promise<RetryResult<R>>;

/** What the credentials hook and the logs see of an operation (never its key). */
export interface OutboxOperation {
  id: string;
  method: string;
  url: string;
  attempts: number;
  /** The first 12 hex digits of the SHA-256 of the key. */
  keyHash: string;
}
export interface OutboxOptions {
  /** The pool the leases and records use (the sender's role needs idempotency_client). */
  pool: Pool;
  /** Sends at a time (default 4). */
  concurrency?: number;
  /** Lease of an operation (default 30000); at least timeoutMs + 1000. */
  leaseMs?: number;
  /** Attempts of an operation (default 10). */
  maxAttempts?: number;
  /** Time from the first attempt (default 24 h). */
  maxTotalMs?: number;
  /** Timeout of one attempt, the whole answer read (default 10000). */
  timeoutMs?: number;
  /** Pause when nothing is due (default 1000). */
  pollMs?: number;
  /** Backoff: first interval's bound (default 1000) and the largest (default 300000). */
  baseMs?: number;
  capMs?: number;
  /** Response body kept (default 65536 bytes). */
  maxResponseBytes?: number;
  /** How long stop() waits for the sends in flight (default timeoutMs + 5000). */
  stopTimeoutMs?: number;
  /** The fetch to send with (default globalThis.fetch). */
  fetch?: typeof fetch;
  /**
   * Headers added to every attempt (Authorization); called with refresh: true
   * after a 401, before the retry.  Without it a 401 ends in 'attention'.
   */
  credentials?: (info: { refresh: boolean; operation: OutboxOperation }) =>
    Record<string, string> | undefined | Promise<Record<string, string> | undefined>;
  /** Where the sender logs (default: one line on stderr); fields never hold a key. */
  logger?: (level: 'info' | 'notice' | 'warn' | 'error', message: string, fields?: Record<string, unknown>) => void;
}
export interface OutboxHandle {
  /** Leases no more, waits for the sends in flight (bounded), gives back what was leased and not sent. */
  stop(): Promise<void>;
  /** Settles when the sender stopped. */
  done: Promise<void>;
  /** Outcomes recorded so far, by outcome ('lost': a lease another sender took over). */
  counts: Record<string, number>;
}
/** Runs the outbox sender on the pool until stop(). */
export function runOutbox(options: OutboxOptions): OutboxHandle;

export interface IdempotentFunctionOptions<M> {
  pool: Pool;
  /** The function's name: the claims' endpoint. */
  endpoint: string;
  /** The tenant (default: the session's bound tenant, else 'default'). */
  tenant?: string | ((msg: M) => string | Promise<string>);
  /** The message's key (default msg.id): never a hash of its body. */
  key?: (msg: M) => string;
  /** What the fingerprint covers (default the message). */
  payload?: (msg: M) => unknown;
  ttl?: Interval;
  /** Lease mode, for work outside the database. */
  lease?: Interval;
  /** How long a delivery waits for a duplicate that runs (the claim's wait). */
  wait?: Interval;
  /** Lease mode: the heartbeat's period (default a third of the lease). */
  heartbeatMs?: number;
}
export interface IdempotentFunctionContext {
  /** Atomic mode: the claim's client, inside its transaction: write with it. */
  client?: PoolClient;
  key: string;
  tenant: string;
  /** Lease mode: the lease's token. */
  leaseToken?: string;
  /** Lease mode: nothing happened outside yet, a failure releases the key. */
  noSideEffect?: () => void;
}
/** Wraps fn: the returned function runs it once per message key and replays its stored JSON result. */
export function idempotentFunction<M, R>(options: IdempotentFunctionOptions<M>,
  fn: (msg: M, context: IdempotentFunctionContext) => R | Promise<R>): (msg: M) => Promise<R>;
export class IdempotentFunctionError extends Error {
  /** The claim's error code: idempotency_key_reuse, request_in_progress, outcome_pending, key_expired. */
  code: string;
  /** true for request_in_progress: deliver again later. */
  retryable: boolean;
  /** Seconds before a retry is worth it, or null. */
  retryAfter: number | null;
  key: string | null;
}

declare global {
  // eslint-disable-next-line @typescript-eslint/no-namespace
  namespace Express {
    interface Request {
      /** Set by @idempotency/express on the routes it protects. */
      idempotency?: IdempotencyContext;
    }
  }
}
