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

declare global {
  // eslint-disable-next-line @typescript-eslint/no-namespace
  namespace Express {
    interface Request {
      /** Set by @idempotency/express on the routes it protects. */
      idempotency?: IdempotencyContext;
    }
  }
}
