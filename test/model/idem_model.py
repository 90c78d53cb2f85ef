#!/usr/bin/python3
"""A model-based test of the claim/finish protocol (test/t/062_model.pl).

A reference model of the protocol, written from README "Claims and
completions", "Maintenance" and "Tombstones for expired keys", and a driver
(Hypothesis stateful testing) that runs random sequences of calls from
several sessions against a real server and checks every answer, and after
each maintenance pass and at the end of each sequence the contents of
idempotency.keys and idempotency.tombstones and their partitions, against
the model.

The calls: idem_claim (atomic and lease mode, with the endpoint's or an
explicit ttl and lease), idem_finish, idem_fail, idem_release,
idem_heartbeat, idem_resolve, idem_lookup, a request as an application
makes it (claim, finish on execute, commit), BEGIN (the three isolation
levels), SAVEPOINT, RELEASE SAVEPOINT, ROLLBACK TO SAVEPOINT, COMMIT,
ROLLBACK, and idem_maintenance as of now, a later or an earlier time
(preview => false), from three sessions that are in autocommit mode or in a transaction
of their own.

Waits:
- a claim passes wait => 0: a duplicate of a claim another session's open
  transaction holds answers in_progress at once; or, from an idle session
  when another session's transaction holds the scope with an atomic claim,
  wait => '20 seconds': it runs in a thread of its own, must still be
  waiting after every later step while the scope is held, and is judged,
  once the holder has given the lock back (commit, rollback, release, a
  rolled-back savepoint, an error), by what a claim made then finds;
- every session runs with lock_timeout = 30ms: a lease-mode call on a row
  that another session's open transaction has changed would wait for it;
  the driver never lets that transaction go on meanwhile, so the model
  expects 55P03 (lock_not_available);
- a maintenance pass runs only when no session is in a transaction.

Time.  Claims, and the functions that read a key, use the server's clock;
the driver never sleeps.  Every ttl, lease and extension is either one
microsecond (the key or lease has run out by the next call: the model asks
the client's clock, which is the server's, before each call) or an hour or
more (longer than any run).  What lies in between is reached through
maintenance passes as of a later time, whose as_of the driver names exactly;
the model knows each key's exact expires_at (a claim returns it), so it
knows which partition holds it, what a pass purges, drops and turns into
tombstones.  A comparison of the server's now with a time inside the
call's window (a partition boundary passing during the run) would be
ambiguous: the example is then discarded, never judged.

The server's shared state.  Between calls the driver may restart the
server (IDEM_MODEL_PGCTL, IDEM_MODEL_PGDATA and IDEM_MODEL_PGLOG name
pg_ctl, the data folder and the log; once a sequence at most, fast or
immediate, a crash): every open transaction is gone, what was committed
stays, and the tombstone filters and key horizons are unknown until a pass
learns them again, which must change no answer.  A second database
(OTHER_DB) fills the server's table of tombstone filters with partitions
of its own, each holding a tombstone, when that takes at most
IDEM_MODEL_FILL_MAX partitions (test/model/model.conf makes the table tiny
where the server has idempotency.tombstone_filter_entries); its passes,
between calls, drop some (the room they free may go to a partition of the
model's database that got tombstones while it had no entry: it must still
find them), and it fills more.  While no session is in a transaction, an
endpoint's ttl, tombstone_ttl or on_expired_reuse may change, and a
tenant's keys are exported (checked against the model) and imported: moved
out and back (deleted and imported in one transaction), or imported again
over themselves.  A third database (RUNS_DB) gets, once a sequence, a
partition of more than 1,024 expired keys, which a pass drops, writing
their tombstones as runs; claims of some of those keys (then, and at any
later step, after restarts too) must answer mismatch with the other
fingerprint and execute with their own; with 7,000 keys the filter of their
partition reaches three generations, and the pass compacts it.
idempotency.max_ttl changes too (ALTER ROLE ... IN DATABASE, for the
model's role and the driver's, whose connections are made again): claims,
imports (refused beyond it) and the passes' windows follow it.  Passes
that race open transactions are not driven yet.

Not modelled: request digests and mismatch diagnostics (a mismatch must
name nothing here, since no claim gives a digest), resolvers that
fail or time out (one endpoint's resolver answers, for a stale lease of
key k1 a response, for the others NULL), claims that wait for a leased row in
progress (they poll until their wait runs out), tenant binding, response
size limits and sensitive headers, the Citus and PL/Proxy modes, and a
maintenance pass racing the calls (passes run between them; the isolation
specs race them).

Environment:
  IDEM_MODEL_SEED      replay the run of that seed (printed by every run)
  IDEM_MODEL_EXAMPLES  sequences to run (default 50)
  IDEM_MODEL_STEPS     most calls in a sequence (default 60)
  IDEM_MODEL_SHRINK    0: report the first failing sequence without
                       shrinking it
  IDEM_MODEL_TRACE     1: print every statement and its answer (stderr)
  IDEM_MODEL_PGCTL, IDEM_MODEL_PGDATA, IDEM_MODEL_PGLOG
                       pg_ctl, the data folder and the log file: restarts
  IDEM_MODEL_FILL_MAX  the most partitions the other database makes to fill
                       the table of filters (default 600)
  IDEM_MODEL_REPLAY    the command a failure prints to replay it
  IDEM_MODEL_SCENARIO  a scripted sequence (SCENARIOS) to run before the
                       random ones: filter_room, the filter defect of issue
                       36 (needs the table of filters filled)
Connection: PGHOST, PGPORT, PGDATABASE of a server with the library
preloaded, the settings of test/model/model.conf, and the extension
created; the driver connects as the superuser PGUSER, makes the role
model_app and the database OTHER_DB.
"""

import copy
import datetime
import hashlib
import json
import os
import random
import sys
import threading
import time

import psycopg
from hypothesis import HealthCheck, Phase, assume, seed, settings
from hypothesis import note as hypothesis_note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

US = 1
MS = 1000
SEC = 1000000
MIN = 60 * SEC
HOUR = 60 * MIN
DAY = 24 * HOUR
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)

# the settings of the cluster (test/model/model.conf); a sequence may
# change max_ttl (do_max_ttl)
MAX_TTL_START = 2 * DAY
MAX_TTL = MAX_TTL_START
DEFAULT_TTL = DAY
TOMBSTONE_TTL = DAY
KEYS_WIDTH = DAY
TOMB_WIDTH = DAY

# endpoint -> policy: ttl, lease, tombstone_ttl (None: the setting's),
# on_expired_reuse = 'conflict'
ENDPOINTS = {
    'ep_atomic': dict(ttl=None, lease=None, tomb=None, conflict=False),
    'ep_lease': dict(ttl=DAY, lease=30 * MIN, tomb=None, conflict=True),
    'ep_notomb': dict(ttl=None, lease=None, tomb=0, conflict=False),
    'ep_short': dict(ttl=HOUR, lease=None, tomb=HOUR, conflict=True),
    # stale leases go to the resolver (model_resolver): k1 completed, others failed
    'ep_resolve': dict(ttl=None, lease=30 * MIN, tomb=None, conflict=False, resolve=True),
}
# the policies as each sequence starts (a sequence may change them)
ENDPOINTS_START = copy.deepcopy(ENDPOINTS)
# the changes of policy a sequence makes, when no session is in a
# transaction: (endpoint, column, SQL value, what the model keeps)
POLICY_CHANGES = [
    ('ep_atomic', 'on_expired_reuse', 'conflict', ('conflict', True)),
    ('ep_atomic', 'on_expired_reuse', 'execute', ('conflict', False)),
    ('ep_short', 'on_expired_reuse', 'execute', ('conflict', False)),
    ('ep_lease', 'on_expired_reuse', 'execute', ('conflict', False)),
    ('ep_atomic', 'ttl', '1 hour', ('ttl', HOUR)),
    ('ep_atomic', 'ttl', None, ('ttl', None)),
    ('ep_notomb', 'ttl', '1 day', ('ttl', DAY)),
    ('ep_resolve', 'ttl', '1 hour', ('ttl', HOUR)),
    ('ep_atomic', 'tombstone_ttl', '0', ('tomb', 0)),
    ('ep_atomic', 'tombstone_ttl', '1 hour', ('tomb', HOUR)),
    ('ep_notomb', 'tombstone_ttl', None, ('tomb', None)),
    ('ep_short', 'tombstone_ttl', '0', ('tomb', 0)),
    ('ep_lease', 'tombstone_ttl', '1 hour', ('tomb', HOUR)),
]
RESOLVED = ('json', {'resolved': True})
ENDPOINT_SQL = """
CREATE OR REPLACE FUNCTION public.model_resolver(tenant text, endpoint text, key text)
RETURNS jsonb LANGUAGE sql
AS $$ SELECT CASE WHEN key = 'k1' THEN '{"status": 299, "body": {"resolved": true}}'::jsonb END $$;
INSERT INTO idempotency.endpoints (endpoint, ttl, lease, tombstone_ttl, on_expired_reuse,
                                   on_lease_expiry, resolver) VALUES
  ('ep_atomic', NULL, NULL, NULL, 'execute', 'unknown', NULL),
  ('ep_lease', '1 day', '30 minutes', NULL, 'conflict', 'unknown', NULL),
  ('ep_notomb', NULL, NULL, '0', 'execute', 'unknown', NULL),
  ('ep_short', '1 hour', NULL, '1 hour', 'conflict', 'unknown', NULL),
  ('ep_resolve', NULL, '30 minutes', NULL, 'execute', 'resolve',
   'public.model_resolver(text, text, text)')
"""

TENANTS = ['t1', 't1', 't1', 't2']
KEYS = ['k1', 'k2']
SCOPES = [(t, e, k) for t in sorted(set(TENANTS)) for e in ENDPOINTS for k in KEYS]
FPS = [hashlib.sha256(b'request A').digest(), hashlib.sha256(b'request B').digest()]
NSESSIONS = 3

# (SQL literal, microseconds); None: the argument is left NULL
TTLS = [None, None, None, None, ('1 microsecond', US), ('1 hour', HOUR), ('1 day', DAY),
        ('2 days', 2 * DAY), ('2 days 1 hour', 2 * DAY + HOUR)]
LEASES = [None, None, None, None, None, ('1 microsecond', US), ('30 minutes', 30 * MIN), ('2 hours', 2 * HOUR)]
EXTENDS = [('1 microsecond', US), ('20 minutes', 20 * MIN), ('3 days', 3 * DAY),
           ('-1 second', -SEC)]
# 'midnight': just after the next midnight UTC, when today's partition of
# keys has ended and the tombstones of keys that expired today still live
# (as of a fixed offset from now, whether a pass writes tombstones depends
# on the time of day the test runs)
AS_OF = [-36 * HOUR, 0, 45 * MIN, 3 * HOUR, DAY + 6 * HOUR, 2 * DAY + 12 * HOUR, 'midnight',
         'midnight']
STATUSES = [200, 201, 404]
LEVELS = ['READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE']

TOKENS = ['right', 'right', 'wrong', 'none']
CLAIM_SQL = """SELECT action, http_status, error_code, retry_after, response_status,
                      response_headers, response_json, lease_token, expires_at, replayed,
                      response_body_ref, mismatch, response_body
               FROM idempotency.idem_claim(%s, %s, %s, %s, ttl => %s::interval,
                                           lease => %s::interval, wait => %s::interval)"""
# the calls of a session, claims and finishes more often than the others
OPS = ['request'] * 4 + ['claim'] * 4 + ['finish'] * 3 + ['wait_claim'] * 2 + [
    'fail', 'release', 'heartbeat', 'resolve', 'lookup']
OP_ARGS = {
    'claim': [('fp', st.integers(0, 1)), ('ttl', st.sampled_from(TTLS)),
              ('lease', st.sampled_from(LEASES))],
    'finish': [('token', st.sampled_from(TOKENS)), ('status', st.sampled_from(STATUSES)),
               ('body', st.integers(0, 3)), ('headers', st.booleans()),
               ('kind', st.sampled_from(['json', 'json', 'bytes', 'ref']))],
    'fail': [('token', st.sampled_from(TOKENS)), ('outcome', st.sampled_from(['failed', 'unknown']))],
    'release': [('token', st.sampled_from(TOKENS))],
    'heartbeat': [('token', st.sampled_from(TOKENS)), ('extend', st.sampled_from(EXTENDS))],
    'resolve': [('status', st.sampled_from(STATUSES)), ('body', st.integers(0, 3))],
    'lookup': [],
    'wait_claim': [('fp', st.integers(0, 1)), ('ttl', st.sampled_from(TTLS)),
                   ('lease', st.sampled_from(LEASES))],
    'request': [('fp', st.integers(0, 1)), ('ttl', st.sampled_from(TTLS)),
                ('lease', st.sampled_from(LEASES)), ('status', st.sampled_from(STATUSES)),
                ('body', st.integers(0, 3))],
}


def note(what):
    """Hypothesis's note, printed with a failing example; outside a test
    (a scripted scenario), to stderr."""
    try:
        hypothesis_note(what)
    except Exception:
        print('  note: %s' % what, file=sys.stderr, flush=True)


class Ambiguous(Exception):
    """A time the server compared lies inside the call's window."""


def now_us():
    return time.time_ns() // 1000


def to_us(ts):
    return None if ts is None else (ts - EPOCH) // datetime.timedelta(microseconds=1)


def utc_literal(t):
    return (EPOCH + datetime.timedelta(microseconds=t)).isoformat()


def is_past(t, lo, hi):
    """Whether the server's now of a call made in [lo, hi] had reached t
    (t <= now)."""
    if t <= lo:
        return True
    if t > hi:
        return False
    raise Ambiguous('time %s inside the call window [%s, %s]' % (t, lo, hi))


def slot_start(t, width):
    return (t // width) * width


def part_name(prefix, lo):
    d = EPOCH + datetime.timedelta(microseconds=lo)
    if d.second or d.microsecond:
        return '%s%s' % (prefix, d.strftime('%Y%m%dt%H%M%S'))
    return '%s%s' % (prefix, d.strftime('%Y%m%dt%H%M'))


def plan_premake(parts, as_of, windows, width):
    """maint_partitions.c IdemPlanPremake: the ranges to make so that the
    windows [as_of + lo, as_of + hi) (sorted by lo) are covered, from the
    slot of as_of on."""
    plan = []
    nxt = None
    existing = sorted(parts)
    for w_lo, w_hi in windows:
        slot = slot_start(as_of + max(w_lo, 0), width)
        if nxt is not None:
            slot = max(slot, nxt)
        horizon = as_of + w_hi
        while slot < horizon:
            cur, end = slot, slot + width
            for lo, hi in existing:
                if cur >= end:
                    break
                if hi <= cur:
                    continue
                if lo >= end:
                    break
                if lo > cur:
                    plan.append((cur, lo))
                cur = max(cur, hi)
            if cur < end:
                plan.append((cur, end))
            slot += width
            nxt = slot
    return plan


def tomb_windows():
    """IdemTombstonesWindows: one window per tombstone ttl in use."""
    ttls = sorted({TOMBSTONE_TTL} | {p['tomb'] for p in ENDPOINTS.values() if p['tomb']})
    return [(t - KEYS_WIDTH, t + MAX_TTL + KEYS_WIDTH + TOMB_WIDTH) for t in ttls if t > 0]


def covering(parts, t):
    for lo, hi in parts:
        if lo <= t < hi:
            return (lo, hi)
    return None


class Row:
    __slots__ = ('fp', 'state', 'token', 'locked_until', 'status', 'body', 'headers',
                 'created_at', 'expires_at')

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))

    def copy(self):
        return Row(**{k: getattr(self, k) for k in self.__slots__})

    def __repr__(self):
        return 'Row(%s)' % ', '.join('%s=%r' % (k, getattr(self, k)) for k in self.__slots__
                                     if k not in ('fp',)) + ' fp=%s' % FPS.index(self.fp)


class Tomb:
    __slots__ = ('scope', 'fp', 'expired_at', 'expires_at')

    def __init__(self, scope, fp, expired_at, expires_at):
        self.scope, self.fp, self.expired_at, self.expires_at = scope, fp, expired_at, expires_at


class Pending:
    """An atomic claim of the transaction that holds its scope lock
    (claim_pending.h PendingClaim): nest, the subtransaction level whose lock it is;
    done, 0 while unfinished, else the level that finished, failed or
    released it."""
    __slots__ = ('scope', 'fp', 'created_at', 'expires_at', 'nest', 'done')

    def __init__(self, scope, fp, created_at, expires_at, nest):
        self.scope, self.fp, self.created_at, self.expires_at = scope, fp, created_at, expires_at
        self.nest, self.done = nest, 0

    def copy(self):
        p = Pending(self.scope, self.fp, self.created_at, self.expires_at, self.nest)
        p.done = self.done
        return p


class Session:
    def __init__(self):
        self.end_txn()

    def end_txn(self):
        self.in_txn = False
        self.aborted = False
        self.level = None
        self.overlay = {}       # scope -> list of Row: what this transaction wrote
        self.pending = []       # Pending (atomic claims), newest first
        self.row_locks = set()  # scopes whose committed live row this transaction locked
        self.expired_locks = set()  # scopes whose committed expired rows it deleted
        self.scope_locks = set()    # scopes of its lease-mode claims
        self.savepoints = []    # (name, state when it was made)

    def nest(self):
        return 1 + len(self.savepoints)

    def state(self):
        return (dict(self.overlay), [p.copy() for p in self.pending], set(self.row_locks),
                set(self.expired_locks), set(self.scope_locks))

    def restore(self, state):
        overlay, pending, row_locks, expired_locks, scope_locks = state
        self.overlay, self.row_locks = dict(overlay), set(row_locks)
        self.pending = [p.copy() for p in pending]
        self.expired_locks, self.scope_locks = set(expired_locks), set(scope_locks)

    def find_pending(self, scope):
        for p in self.pending:
            if p.scope == scope and not p.done:
                return p
        return None


class Err(Exception):
    def __init__(self, sqlstate):
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


class Model:
    """The protocol as the README states it.  Each call returns what the
    server must answer (a dict, or raises Err with the SQLSTATE), given
    [lo, hi], the client's clock before and after the call."""

    def __init__(self, keys_parts, tomb_parts):
        self.rows = {}          # scope -> list of Row, committed
        self.tombs = []         # committed tombstones
        self.keys_parts = sorted(keys_parts)
        self.tomb_parts = sorted(tomb_parts)
        self.sessions = [Session() for _ in range(NSESSIONS)]
        self.tokens = {}        # scope -> every lease token handed out

    # ---- visibility -------------------------------------------------

    def visible(self, s, scope):
        sess = self.sessions[s]
        if scope in sess.overlay:
            return sess.overlay[scope]
        return self.rows.get(scope, [])

    def write(self, s, scope, rows):
        sess = self.sessions[s]
        for i, other in enumerate(self.sessions):
            if i != s and scope in other.overlay:
                raise AssertionError('model: two transactions write scope %r' % (scope,))
        sess.overlay[scope] = rows
        if not sess.in_txn:
            self.commit_overlay(sess)

    def commit_overlay(self, sess):
        for scope, rows in sess.overlay.items():
            if rows:
                self.rows[scope] = rows
            else:
                self.rows.pop(scope, None)
        sess.overlay = {}

    def live(self, rows, lo, hi):
        return [r for r in rows if not is_past(r.expires_at, lo, hi)]

    def keys_part_ended(self, t, lo, hi):
        """Whether the partition holding expiry t (not the default one)
        had ended at the call's now."""
        p = covering(self.keys_parts, t)
        return p is not None and is_past(p[1], lo, hi)

    def scope_lock_holder(self, scope):
        for i, sess in enumerate(self.sessions):
            # an atomic claim keeps its lock until the transaction ends,
            # finished or not, unless released
            if scope in sess.scope_locks or any(p.scope == scope for p in sess.pending):
                return i
        return None

    def check_open(self, s):
        if self.sessions[s].aborted:
            raise Err('25P02')

    def fail_txn(self, s):
        """An error: the statement, and in a transaction block the whole
        transaction, is undone (the block stays aborted until ROLLBACK)."""
        sess = self.sessions[s]
        if sess.in_txn:
            # the (sub)transaction's locks go at once; a ROLLBACK TO the
            # savepoint brings back what was before it
            if sess.savepoints:
                sess.restore(sess.savepoints[-1][1])
            else:
                sess.restore(({}, [], set(), set(), set()))
            sess.aborted = True

    def tomb_ttl(self, endpoint):
        t = ENDPOINTS[endpoint]['tomb']
        return TOMBSTONE_TTL if t is None else t

    # ---- the calls ---------------------------------------------------

    def claim(self, s, scope, fp, ttl, lease, lo, hi):
        """ttl, lease: microseconds or None (the endpoint's)."""
        self.check_open(s)
        sess = self.sessions[s]
        pol = ENDPOINTS[scope[1]]
        if ttl is None:
            ttl = pol['ttl'] if pol['ttl'] is not None else DEFAULT_TTL
        if lease is None:
            lease = pol['lease']
        if ttl > MAX_TTL:
            raise Err('22023')
        if lease is not None and lease > ttl:
            raise Err('22023')
        in_progress = dict(action='in_progress', http_status=409,
                           error_code='request_in_progress', retry_after=(1, 1))
        if sess.find_pending(scope) is not None:
            return in_progress
        holder = self.scope_lock_holder(scope)
        if holder is not None and holder != s:
            return in_progress
        rows = self.visible(s, scope)
        live = self.live(rows, lo, hi)
        if live:
            r = live[0]
            if r.fp != fp:
                return dict(action='mismatch', http_status=422, error_code='idempotency_key_reuse')
            if r.state == 'completed':
                return dict(action='replay', http_status=r.status, row=r, key=scope[2])
            if r.state in ('failed', 'unknown'):
                return dict(action='pending', http_status=409, error_code='outcome_pending')
            if r.locked_until is None:
                retry = (1, 1)
            else:
                retry = (max(1, -(-(r.locked_until - hi) // SEC)),
                         max(1, -(-(r.locked_until - lo) // SEC)))
            return dict(action='in_progress', http_status=409,
                        error_code='request_in_progress', retry_after=retry)
        tomb_on = self.tomb_ttl(scope[1]) > 0
        # the expired rows the claim reads: every partition's with tombstones
        # on, otherwise those of partitions whose range has not ended
        expired = [r for r in rows
                   if tomb_on or not self.keys_part_ended(r.expires_at, lo, hi)]
        if tomb_on:
            prev = None
            for r in expired:
                if prev is None or r.expires_at > prev[0]:
                    prev = (r.expires_at, r.fp)
            for t in self.tombs:
                if t.scope != scope or is_past(t.expires_at, lo, hi):
                    continue
                p = covering(self.tomb_parts, t.expires_at)
                if p is not None and is_past(p[1], lo, hi):
                    continue
                if prev is None or t.expired_at > prev[0]:
                    prev = (t.expired_at, t.fp)
            if prev is not None:
                if prev[1] != fp:
                    return dict(action='mismatch', http_status=422,
                                error_code='idempotency_key_reuse')
                if pol['conflict']:
                    return dict(action='expired', http_status=409, error_code='key_expired')
        # execute: the expired rows go
        result = dict(action='execute', ttl=ttl, lease=lease)
        if expired and scope not in sess.overlay:
            # the claim deletes them: rows another open transaction deleted
            # are locked by it
            for i, other in enumerate(self.sessions):
                if i != s and scope in other.expired_locks:
                    raise Err('55P03')
            if sess.in_txn:
                sess.expired_locks.add(scope)
        if not sess.in_txn and lease is None:
            raise Err('IK500')      # the implicit commit: an unfinished claim
        if expired:
            rows = []
        if lease is not None:
            result['lease_row'] = True
            sess.scope_locks.add(scope)
            result['commit'] = lambda token, e: self._lease_row(s, scope, fp, rows, token, e,
                                                                ttl, lease)
        else:
            result['commit'] = lambda token, e: self._atomic_pending(s, scope, fp, rows, e, ttl)
        return result

    def _lease_row(self, s, scope, fp, rows, token, e, ttl, lease):
        sess = self.sessions[s]
        created = e - ttl
        row = Row(fp=fp, state='in_progress', token=token, locked_until=created + lease,
                  created_at=created, expires_at=e)
        self.tokens.setdefault(scope, []).append(token)
        self.write(s, scope, list(rows) + [row])
        if not sess.in_txn:
            sess.scope_locks.discard(scope)

    def _atomic_pending(self, s, scope, fp, rows, e, ttl):
        sess = self.sessions[s]
        sess.pending.insert(0, Pending(scope, fp, e - ttl, e, sess.nest()))
        # by value: visible() makes a new empty list for a scope without
        # rows, which is no write (an empty overlay would erase, at commit,
        # rows another session committed meanwhile)
        if list(rows) != list(self.visible(s, scope)):
            self.write(s, scope, list(rows))

    def row_path(self, s, scope, lo, hi, allowed, token, token_checked=True):
        """IdemLeasedRow / idem_resolve: lock the live row, check it."""
        sess = self.sessions[s]
        committed_live = self.live(self.rows.get(scope, []), lo, hi)
        if scope not in sess.overlay and committed_live:
            for i, other in enumerate(self.sessions):
                if i != s and scope in other.row_locks:
                    raise Err('55P03')
        live = self.live(self.visible(s, scope), lo, hi)
        if not live:
            raise Err('IK404')
        r = live[0]
        if r.state not in allowed:
            raise Err('IK409')
        if token_checked:
            if token is None:
                raise Err('IK403')
            if r.token is None or r.token != token:
                raise Err('IK403')
        return r

    def changed(self, s, scope, new_rows, lo, hi):
        sess = self.sessions[s]
        if sess.in_txn and scope not in sess.overlay and self.live(self.rows.get(scope, []), lo, hi):
            sess.row_locks.add(scope)
        self.write(s, scope, new_rows)

    def finish(self, s, scope, token, status, body, headers, lo, hi):
        self.check_open(s)
        sess = self.sessions[s]
        p = sess.find_pending(scope)
        if p is not None:
            if token is not None:
                raise Err('IK403')
            row = Row(fp=p.fp, state='completed', status=status, body=body, headers=headers,
                      created_at=p.created_at, expires_at=p.expires_at)
            p.done = sess.nest()
            self.write(s, scope, list(self.visible(s, scope)) + [row])
            return
        r = self.row_path(s, scope, lo, hi, ('in_progress', 'unknown'), token)
        n = r.copy()
        n.state, n.locked_until, n.status, n.body, n.headers = 'completed', None, status, body, headers
        self.changed(s, scope, [n if x is r else x for x in self.visible(s, scope)], lo, hi)

    def fail(self, s, scope, token, outcome, lo, hi):
        self.check_open(s)
        sess = self.sessions[s]
        p = sess.find_pending(scope)
        if p is not None:
            if token is not None:
                raise Err('IK403')
            row = Row(fp=p.fp, state=outcome, created_at=p.created_at, expires_at=p.expires_at)
            p.done = sess.nest()
            self.write(s, scope, list(self.visible(s, scope)) + [row])
            return
        r = self.row_path(s, scope, lo, hi, ('in_progress', 'unknown'), token)
        n = r.copy()
        n.state, n.locked_until = outcome, None
        self.changed(s, scope, [n if x is r else x for x in self.visible(s, scope)], lo, hi)

    def release(self, s, scope, token, lo, hi):
        self.check_open(s)
        sess = self.sessions[s]
        p = sess.find_pending(scope)
        if p is not None:
            if token is not None:
                raise Err('IK403')
            if p.nest == sess.nest():
                # the claim's own (sub)transaction: the lock goes at once
                sess.pending.remove(p)
            else:
                # kept, and its lock, until the transaction ends
                p.done = sess.nest()
            return
        r = self.row_path(s, scope, lo, hi, ('in_progress',), token)
        self.changed(s, scope, [x for x in self.visible(s, scope) if x is not r], lo, hi)

    def heartbeat(self, s, scope, token, extend, lo, hi):
        """Returns a function of the returned locked_until that applies it."""
        self.check_open(s)
        if extend <= 0:
            raise Err('22023')
        r = self.row_path(s, scope, lo, hi, ('in_progress',), token)
        # until = now + extend must not outlive the key
        if r.expires_at - extend < lo:
            raise Err('22023')
        if r.expires_at - extend <= hi:
            raise Ambiguous('heartbeat close to the expiry')

        def apply(until):
            n = r.copy()
            n.locked_until = until
            self.changed(s, scope, [n if x is r else x for x in self.visible(s, scope)], lo, hi)
        return apply

    def resolve(self, s, scope, status, body, lo, hi):
        self.check_open(s)
        r = self.row_path(s, scope, lo, hi, ('failed', 'unknown'), None, token_checked=False)
        n = r.copy()
        n.state, n.locked_until, n.status, n.body, n.headers = 'completed', None, status, body, None
        self.changed(s, scope, [n if x is r else x for x in self.visible(s, scope)], lo, hi)

    def lookup(self, s, scope, lo, hi):
        self.check_open(s)
        sess = self.sessions[s]
        p = sess.find_pending(scope)
        if p is not None:
            return dict(state='in_progress', fp=p.fp, lease_held=False, expires_at=p.expires_at,
                        locked_until=None, response_status=None)
        live = self.live(self.visible(s, scope), lo, hi)
        if not live:
            return None
        r = live[0]
        return dict(state=r.state, fp=r.fp, lease_held=r.token is not None,
                    expires_at=r.expires_at, locked_until=r.locked_until,
                    response_status=r.status)

    def begin(self, s, level):
        sess = self.sessions[s]
        sess.end_txn()
        sess.in_txn = True
        sess.level = level

    def commit(self, s):
        sess = self.sessions[s]
        if sess.aborted:
            sess.end_txn()
            return
        if any(not p.done for p in sess.pending):
            sess.end_txn()
            raise Err('IK500')
        self.commit_overlay(sess)
        sess.end_txn()

    def rollback(self, s):
        self.sessions[s].end_txn()

    def savepoint(self, s, name):
        sess = self.sessions[s]
        if sess.aborted:
            raise Err('25P02')
        sess.savepoints.append((name, sess.state()))

    def release_savepoint(self, s, name):
        """RELEASE: its subtransaction commits into the one around it."""
        sess = self.sessions[s]
        if sess.aborted:
            raise Err('25P02')
        i = [n for n, _ in sess.savepoints].index(name)
        del sess.savepoints[i:]
        level = sess.nest()
        for p in sess.pending:
            p.nest = min(p.nest, level)
            if p.done:
                p.done = min(p.done, level)

    def rollback_to(self, s, name):
        """ROLLBACK TO: what the subtransaction did is undone; the savepoint
        stays."""
        sess = self.sessions[s]
        i = [n for n, _ in sess.savepoints].index(name)
        del sess.savepoints[i + 1:]
        sess.restore(sess.savepoints[i][1])
        sess.aborted = False

    # ---- maintenance -------------------------------------------------

    def maintenance(self, as_of):
        """One pass as of as_of, every session idle; returns the rows it
        reports: (kind, object) -> rows (None: not compared)."""
        out = {}
        # 1. stale leases
        for scope, rows in self.rows.items():
            for r in rows:
                if (r.state == 'in_progress' and r.locked_until is not None
                        and r.locked_until < as_of and r.expires_at > as_of):
                    if not ENDPOINTS[scope[1]].get('resolve'):
                        r.state, kind = 'unknown', 'lease_unknown'
                    elif scope[2] == 'k1':
                        r.state, r.locked_until, kind = 'completed', None, 'lease_completed'
                        r.status, r.body, r.headers = 299, RESOLVED, None
                    else:
                        r.state, r.locked_until, kind = 'failed', None, 'lease_failed'
                    out[(kind, scope[1])] = out.get((kind, scope[1]), 0) + 1
        # 2. premake of the tombstones
        for lo, hi in plan_premake(self.tomb_parts, as_of, tomb_windows(), TOMB_WIDTH):
            moved = sum(1 for t in self.tombs if lo <= t.expires_at < hi
                        and covering(self.tomb_parts, t.expires_at) is None)
            self.tomb_parts.append((lo, hi))
            self.tomb_parts.sort()
            out[('create', part_name('tombstones_p', lo))] = moved

        def bury(scope, r):
            ttl = self.tomb_ttl(scope[1])
            if ttl > 0 and r.expires_at + ttl > as_of:
                self.tombs.append(Tomb(scope, r.fp, r.expires_at, r.expires_at + ttl))
                return 1
            return 0

        # 3. purge of the default partition
        purged = buried = 0
        for scope in list(self.rows):
            keep = []
            for r in self.rows[scope]:
                if covering(self.keys_parts, r.expires_at) is None and r.expires_at <= as_of:
                    purged += 1
                    buried += bury(scope, r)
                else:
                    keep.append(r)
            self.rows[scope] = keep
        if buried:
            out[('tombstone', 'keys_default')] = buried
        if purged:
            out[('purge', 'keys_default')] = purged
        # 4. premake of the keys
        for lo, hi in plan_premake(self.keys_parts, as_of, [(0, MAX_TTL + KEYS_WIDTH)], KEYS_WIDTH):
            moved = sum(1 for rows in self.rows.values() for r in rows
                        if lo <= r.expires_at < hi and covering(self.keys_parts, r.expires_at) is None)
            self.keys_parts.append((lo, hi))
            self.keys_parts.sort()
            out[('create', part_name('keys_p', lo))] = moved
        # 5. retention of the keys
        for lo, hi in list(self.keys_parts):
            if hi > as_of:
                continue
            n = 0
            for scope in list(self.rows):
                keep = []
                for r in self.rows[scope]:
                    if lo <= r.expires_at < hi:
                        n += bury(scope, r)
                    else:
                        keep.append(r)
                self.rows[scope] = keep
            if n:
                out[('tombstone', part_name('keys_p', lo))] = n
            out[('drop', part_name('keys_p', lo))] = None
            self.keys_parts.remove((lo, hi))
        # 6. retention of the tombstones
        for lo, hi in list(self.tomb_parts):
            if hi > as_of:
                continue
            self.tombs = [t for t in self.tombs if not lo <= t.expires_at < hi]
            out[('drop', part_name('tombstones_p', lo))] = None
            self.tomb_parts.remove((lo, hi))
        # 7. purge of the tombstones' default partition
        n = 0
        keep = []
        for t in self.tombs:
            if covering(self.tomb_parts, t.expires_at) is None and t.expires_at <= as_of:
                n += 1
            else:
                keep.append(t)
        self.tombs = keep
        if n:
            out[('purge', 'tombstones_default')] = n
        self.rows = {k: v for k, v in self.rows.items() if v}
        return out


# ---------------------------------------------------------------------------
# The server

# Restarts and crashes: the driver stops the server (pg_ctl -m fast, or -m
# immediate: a crash) and starts it again, when it is told how
PGCTL = os.environ.get('IDEM_MODEL_PGCTL')
PGDATA = os.environ.get('IDEM_MODEL_PGDATA')
PGLOG = os.environ.get('IDEM_MODEL_PGLOG')
CAN_RESTART = bool(PGCTL and PGDATA and PGLOG)
# The other database, whose maintenance fills and frees the shared tables
# of the server (tombstone filters, horizons) while the model's database
# runs: its "fill" partitions of tombstones, one minute wide, from FILL_BASE
# on (freed by its passes as of a time among them) and from REFILL_BASE on
# (made again later, never freed), each holding one tombstone, so each takes
# one entry of the filters' table.
OTHER_DB = 'model_other'
FILL_BASE = to_us(datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc))
REFILL_BASE = to_us(datetime.datetime(2040, 1, 1, tzinfo=datetime.timezone.utc))
# the most partitions the driver makes to fill the table of filters (each
# costs about 15 ms once per run): with the default 8,192 entries, more
# than make test can afford, unless IDEM_MODEL_FILL_MAX says so
FILL_MAX = int(os.environ.get('IDEM_MODEL_FILL_MAX') or '600')
# A third database, where a pass drops partitions of keys holding more than
# IDEM_TOMBSTONE_RUN_MIN (1,024) expired keys: it writes runs of tombstones
# (doc/tombstones.md).  Each round uses days of its own from RUNS_BASE on.
RUNS_DB = 'model_runs'
RUNS_BASE = to_us(datetime.datetime(2050, 1, 1, tzinfo=datetime.timezone.utc))
RUNS_FPS = [hashlib.sha256(b'run A').digest(), hashlib.sha256(b'run B').digest()]
# the capacities of the shared structures, where the server has the setting
CAPACITY_SETTINGS = ['idempotency.tombstone_filter_entries', 'idempotency.horizon_entries',
                     'idempotency.tombstone_filter_memory', 'idempotency.diagnostics_tracked_keys',
                     'idempotency.stats_max_endpoints']
TOMBFILTER_ENTRIES_DEFAULT = 8192


class Harness:
    def __init__(self):
        self.conninfo = dict(host=os.environ.get('PGHOST'), port=os.environ.get('PGPORT'),
                             dbname=os.environ.get('PGDATABASE', 'postgres'))
        self.user = os.environ.get('PGUSER')
        self.connect_admin()
        self.admin.execute('DROP ROLE IF EXISTS model_app')
        self.admin.execute('CREATE ROLE model_app LOGIN IN ROLE idempotency_client, idempotency_admin')
        self.admin.execute('DELETE FROM idempotency.endpoints')
        self.admin.execute(ENDPOINT_SQL)
        self.capacity = {}
        for name in CAPACITY_SETTINGS:
            self.capacity[name] = self.admin.execute(
                'SELECT pg_catalog.current_setting(%s, true)', (name,)).fetchone()[0]
        self.sessions = []
        self.connect_sessions()
        self.busy = {}          # session -> thread of a claim that waits
        self.max_ttl_changed = False
        self.hashes = {}
        for scope in SCOPES:
            self.hashes[scope] = self.admin.execute(
                'SELECT idempotency.idem_tombstone_hash(%s, %s, %s)', scope).fetchone()[0]
        # the model's database learns its filters first (a pass learns them
        # once per server start): then the other one fills the table
        self.admin.execute("SELECT count(*) FROM idempotency.idem_maintenance(now(), preview => false)")
        self.setup_other()
        self.setup_runs()

    def set_max_ttl(self, value):
        """idempotency.max_ttl of the model's database for the model's
        role and the driver's (ALTER ROLE ... IN DATABASE, which a restart
        keeps), or back to the server's (None); every connection to the
        model's database is made again to take it."""
        global MAX_TTL
        db = self.conninfo['dbname']
        for role in ('model_app', self.admin.info.user):
            if value is None:
                self.admin.execute('ALTER ROLE %s IN DATABASE %s RESET idempotency.max_ttl' % (role, db))
            else:
                self.admin.execute("ALTER ROLE %s IN DATABASE %s SET idempotency.max_ttl = '%s'"
                                   % (role, db, value[0]))
        MAX_TTL = MAX_TTL_START if value is None else value[1]
        self.max_ttl_changed = value is not None
        self.admin.close()
        self.connect_admin()
        self.connect_sessions()

    def connect_admin(self):
        self.admin = psycopg.connect(autocommit=True, user=self.user, **self.conninfo)
        self.admin.execute("SET TimeZone = 'UTC'")

    def connect_sessions(self):
        for c in self.sessions:
            c.close()
        self.sessions = []
        for _ in range(NSESSIONS):
            c = psycopg.connect(autocommit=True, user='model_app', **self.conninfo)
            c.execute("SET TimeZone = 'UTC'")
            c.execute("SET lock_timeout = '30ms'")
            self.sessions.append(c)

    def connect_other(self):
        conninfo = dict(self.conninfo, dbname=OTHER_DB)
        self.other = psycopg.connect(autocommit=True, user=self.user, **conninfo)
        self.other.execute("SET TimeZone = 'UTC'")

    def setup_other(self):
        """The other database: made afresh, with wide partitions of its own
        (its passes as of the fill times make few), and its fill partitions."""
        self.admin.execute('DROP DATABASE IF EXISTS %s WITH (FORCE)' % OTHER_DB)
        self.admin.execute('CREATE DATABASE %s' % OTHER_DB)
        self.admin.execute("ALTER DATABASE %s SET idempotency.tombstone_partition_interval = '30d'"
                           % OTHER_DB)
        self.connect_other()
        self.other.execute('CREATE EXTENSION idempotency CASCADE')
        self.other.execute("SELECT count(*) FROM idempotency.idem_maintenance(now(), preview => false)")
        entries = self.capacity['idempotency.tombstone_filter_entries']
        self.filter_entries = int(entries) if entries else TOMBFILTER_ENTRIES_DEFAULT
        # enough partitions with a tombstone to fill the table, and some
        self.fill_n = self.filter_entries + 8
        self.fill_on = self.fill_n <= FILL_MAX
        self.fill_lo = 0            # the first fill partition not freed yet
        self.refill_hi = 0          # refill partitions made
        self.other_as_of = None
        if self.fill_on:
            started = time.monotonic()
            self.make_fill(FILL_BASE, 0, self.fill_n)
            print('model: the other database filled the table of filters: %d partitions, %.1f s'
                  % (self.fill_n, time.monotonic() - started), flush=True)

    def connect_runs(self):
        conninfo = dict(self.conninfo, dbname=RUNS_DB)
        self.runsdb = psycopg.connect(autocommit=True, user=self.user, **conninfo)
        self.runsdb.execute("SET TimeZone = 'UTC'")

    def setup_runs(self):
        self.admin.execute('DROP DATABASE IF EXISTS %s WITH (FORCE)' % RUNS_DB)
        self.admin.execute('CREATE DATABASE %s' % RUNS_DB)
        self.connect_runs()
        self.runsdb.execute('CREATE EXTENSION idempotency CASCADE')
        self.runs_round = 0
        self.runs_keys = None       # (tenant, n) of the last round

    def make_runs(self, n):
        """A round: n expired keys in one partition of keys (fingerprints
        alternating), which a pass drops, writing their tombstones as runs;
        returns what the pass reported."""
        day = RUNS_BASE + self.runs_round * 10 * DAY
        tenant = 'run%d' % self.runs_round
        self.runs_round += 1
        c = self.runsdb
        c.execute("SELECT count(*) FROM idempotency.idem_maintenance(%s, preview => false)",
                  (utc_literal(day),))
        # late in the day: their tombstones (a ttl of a day) outlive the pass
        c.execute("""INSERT INTO idempotency.keys (tenant, endpoint, key, fingerprint, state,
                                                   response_status, created_at, expires_at)
                     SELECT %s, 'ep', 'k' || i, CASE i %% 2 WHEN 0 THEN %s ELSE %s END::bytea,
                            'completed', 200, %s::timestamptz,
                            %s::timestamptz + i * interval '1 millisecond'
                     FROM generate_series(0, %s - 1) i""",
                  (tenant, RUNS_FPS[0], RUNS_FPS[1], utc_literal(day),
                   utc_literal(day + 23 * HOUR), n))
        rows = c.execute("""SELECT kind, object, rows FROM idempotency.idem_maintenance(%s, preview => false)
                            WHERE kind = 'tombstone'""", (utc_literal(day + DAY + MIN),)).fetchall()
        self.runs_keys = (tenant, n)
        return rows

    def check_runs(self, picks):
        """Claims of keys of the last round (in a transaction rolled
        back): with the other fingerprint, a mismatch; with their own, an
        execute (the endpoint's policy is the default); a key never used
        there, an execute."""
        tenant, n = self.runs_keys
        out = []
        for i, own in picks:
            i = i % (n + 1)
            key = 'k%d' % i if i < n else 'never'
            fp = RUNS_FPS[i % 2] if own else RUNS_FPS[1 - i % 2]
            want = 'execute' if own or i == n else 'mismatch'
            with self.runsdb.transaction(force_rollback=True):
                got = self.runsdb.execute(
                    "SELECT action FROM idempotency.idem_claim(%s, 'ep', %s, %s, wait => '0')",
                    (tenant, key, fp)).fetchone()[0]
            out.append((key, 'own' if own else 'other', want, got))
        return out

    def make_fill(self, base, lo, hi):
        """Fill partitions lo..hi-1 of the region from base, each with one
        tombstone (so one entry in the filters' table each); by 200, for
        the locks of one transaction."""
        for a in range(lo, hi, 200):
            b = min(hi, a + 200)
            # past the DDL guard, which keeps the partitions maintenance's
            self.other.execute('SET session_replication_role = replica')
            self.other.execute(
                """DO $$ BEGIN FOR i IN %d..%d LOOP
                     EXECUTE pg_catalog.format('CREATE TABLE idempotency.fill_%%s_%%s PARTITION OF
                       idempotency.tombstones FOR VALUES FROM (%%L) TO (%%L)', %d, i,
                       %s::timestamptz + i * interval '1 minute',
                       %s::timestamptz + (i + 1) * interval '1 minute');
                   END LOOP; END $$""" % (a, b - 1, base // DAY,
                                          "'%s'" % utc_literal(base), "'%s'" % utc_literal(base)))
            self.other.execute('RESET session_replication_role')
            self.other.execute(
                """INSERT INTO idempotency.tombstones (scope_hash, fingerprint, expired_at, expires_at)
                   SELECT idempotency.idem_tombstone_hash('fill', 'fill', %s || '_' || i),
                          pg_catalog.sha256('fill'::bytea),
                          %s::timestamptz + i * interval '1 minute' - interval '1 day',
                          %s::timestamptz + i * interval '1 minute' + interval '30 seconds'
                   FROM generate_series(%s::integer, %s::integer) i""",
                (str(base // DAY), utc_literal(base), utc_literal(base), a, b - 1))

    def other_free(self, k):
        """A pass of the other database as of a time among its fill
        partitions: it drops the k first (and frees their entries)."""
        self.fill_lo = min(self.fill_n, self.fill_lo + k)
        as_of = FILL_BASE + self.fill_lo * MIN
        rows = self.other.execute(
            "SELECT kind, object FROM idempotency.idem_maintenance(%s, preview => false)",
            (utc_literal(as_of),)).fetchall()
        return rows

    def other_refill(self, k):
        self.make_fill(REFILL_BASE, self.refill_hi, self.refill_hi + k)
        self.refill_hi += k

    def restart(self, mode):
        """Stop the server (fast: a clean shutdown; immediate: a crash) and
        start it again; every connection is made again."""
        for c in self.sessions + [self.admin, self.other, self.runsdb]:
            try:
                c.close()
            except Exception:
                pass
        import subprocess
        subprocess.run([PGCTL, '-D', PGDATA, '-l', PGLOG, '-m', mode, '-w', '-t', '600', 'restart'],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.connect_admin()
        self.connect_sessions()
        self.connect_other()
        self.connect_runs()

    def drain(self):
        """End every transaction, and wait for the claims that wait (an
        example that failed may leave one)."""
        for i, c in enumerate(self.sessions):
            if i not in self.busy:
                c.execute('ROLLBACK')
        for i, th in list(self.busy.items()):
            th.join(30)
            if th.is_alive():
                raise RuntimeError('a waiting claim of session %d never ended' % i)
            del self.busy[i]
            self.sessions[i].execute('ROLLBACK')

    def reset(self):
        trace('---- new sequence')
        if any(c.closed for c in self.sessions + [self.admin, self.other, self.runsdb]):
            # a sequence failed while the server restarted
            self.connect_admin()
            self.connect_sessions()
            self.connect_other()
            self.busy = {}
        self.drain()
        # max_ttl as a sequence starts
        if self.max_ttl_changed:
            self.set_max_ttl(None)
        # the policies of the endpoints as a sequence starts
        ENDPOINTS.clear()
        ENDPOINTS.update(copy.deepcopy(ENDPOINTS_START))
        self.admin.execute('DELETE FROM idempotency.endpoints')
        self.admin.execute(ENDPOINT_SQL)
        # DELETE rather than TRUNCATE, which costs a new file per partition
        self.admin.execute('DELETE FROM idempotency.keys')
        self.admin.execute('DELETE FROM idempotency.tombstones')
        return self.partitions('keys'), self.partitions('tombstones')

    def partitions(self, table):
        rows = self.admin.execute(
            """SELECT m[1]::timestamptz, m[2]::timestamptz
               FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid,
                    regexp_match(pg_get_expr(c.relpartbound, c.oid),
                                 'FROM \\(''([^'']*)''\\) TO \\(''([^'']*)''\\)') m
               WHERE i.inhparent = %s::regclass AND m IS NOT NULL""", ('idempotency.' + table,)).fetchall()
        return [(to_us(a), to_us(b)) for a, b in rows]


HARNESS = None
# what the calls answered, over the run: (call, answer) -> count
TALLY = {}


def tally(what, answer):
    k = (what.split(' ')[0], answer)
    TALLY[k] = TALLY.get(k, 0) + 1


TRACE = os.environ.get('IDEM_MODEL_TRACE') == '1'


def trace(*what):
    if TRACE:
        print('  ', *what, file=sys.stderr, flush=True)


def call(conn, sql, args=()):
    """Run one statement; returns (rows, None) or (None, sqlstate), with the
    client's clock before and after."""
    trace('session %s:' % conn.info.backend_pid, ' '.join(sql.split())[:60], args)
    lo = now_us()
    try:
        cur = conn.execute(sql, args)
        rows = cur.fetchall() if cur.description else []
        err = None
    except psycopg.Error as e:
        rows, err = None, e.sqlstate or 'XXXXX'
        if threading.current_thread() is threading.main_thread():
            note('error %s: %s' % (err, str(e).splitlines()[0] if str(e) else ''))
    hi = now_us()
    trace('  ->', err or (rows[:1] if rows else rows))
    return rows, err, lo, hi


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.h = HARNESS
        keys_parts, tomb_parts = self.h.reset()
        self.m = Model(keys_parts, tomb_parts)
        self.recent = []
        self.last_session = 0
        self.waits = {}     # session -> its claim that waits
        self.restarts = 0
        self.runs_made = False

    # ---- helpers -----------------------------------------------------

    def pick_scope(self, data):
        """Mostly one of the scopes the sequence used last, so that calls
        meet each other; sometimes any."""
        which = data.draw(st.integers(0, 3), label='which scope') if self.recent else 0
        if which >= 2:
            scope = self.recent[-1]
        elif which == 1:
            scope = data.draw(st.sampled_from(self.recent), label='scope')
        else:
            scope = (data.draw(st.sampled_from(TENANTS), label='tenant'),
                     data.draw(st.sampled_from(sorted(ENDPOINTS)), label='endpoint'),
                     data.draw(st.sampled_from(KEYS), label='key'))
        if scope in self.recent:
            self.recent.remove(scope)
        self.recent = (self.recent + [scope])[-3:]
        return scope

    def token_for(self, s, scope, kind):
        if kind == 'none':
            return None
        if kind == 'wrong':
            return 1
        for r in self.m.visible(s, scope):
            if r.token is not None:
                return r.token
        tokens = self.m.tokens.get(scope)
        return tokens[-1] if tokens else 2

    def expect(self, what, expected_err, err):
        if expected_err != err:
            raise AssertionError('%s: the model expects %s, the server answered %s'
                                 % (what, expected_err or 'success', err or 'success'))

    def run(self, s, what, sql, args, model_fn, result=None):
        """Run a call whose model raises Err or returns a value (or take
        the result of one that ran already); on a server error, check it;
        returns (model value, server rows, lo, hi) on success, None on an
        (expected) error."""
        conn = self.h.sessions[s]
        rows, err, lo, hi = result or call(conn, sql, args)
        tally(what, err or (rows[0][0] if what.startswith(('claim', 'waited_claim')) else 'ok'))
        try:
            value = model_fn(lo, hi)
        except Err as e:
            self.expect(what, e.sqlstate, err)
            if e.sqlstate != '25P02':
                self.m.fail_txn(s)
            return None
        except Ambiguous as e:
            note('ambiguous: %s' % e)
            assume(False)
        if err is not None:
            self.expect(what, None, err)
        return value, rows, lo, hi

    # ---- rules -------------------------------------------------------

    @rule(data=st.data())
    def step(self, data):
        """One step: a call of a session (its operation, then its
        arguments), BEGIN, COMMIT or ROLLBACK of one, or a maintenance pass
        when no session is in a transaction."""
        sessions = self.m.sessions
        lo = now_us()
        kinds = ['call'] * 10
        if any(not x.in_txn and i not in self.waits for i, x in enumerate(sessions)):
            kinds += ['begin'] * 4
        if any(x.in_txn and not x.aborted and len(x.savepoints) < 2 for x in sessions):
            kinds += ['savepoint'] * 2
        if any(x.savepoints and not x.aborted for x in sessions):
            kinds += ['release_savepoint']
        if any(x.savepoints for x in sessions):
            kinds += ['rollback_to'] * 2
        if any(x.aborted for x in sessions):
            kinds += ['rollback'] * 4
        if any(x.aborted and x.savepoints for x in sessions):
            kinds += ['rollback_to'] * 4
        if any(x.in_txn for x in sessions):
            kinds += ['commit'] * 2 + ['rollback']
        elif not self.waits:
            kinds += ['maintenance'] * 2 + ['policy', 'transfer', 'max_ttl']
        if self.h.fill_on:
            # the other database frees entries of the shared tables, or takes more
            kinds += ['other_free', 'other_refill']
        if not self.runs_made:
            kinds += ['runs']
        if self.h.runs_keys is not None:
            kinds += ['runs_check']
        if CAN_RESTART and not self.waits and self.restarts < 1:
            kinds += ['restart']
        kind = data.draw(st.sampled_from(kinds), label='step')
        if kind != 'call':
            getattr(self, 'do_' + kind)(data)
        else:
            self.one_call(data)
        self.settle_waits(lo)
        # each session's transaction state, as the connection knows it
        TS = psycopg.pq.TransactionStatus
        for i, x in enumerate(sessions):
            if i in self.waits:
                continue
            ts = self.h.sessions[i].info.transaction_status
            want = TS.INERROR if x.aborted else TS.INTRANS if x.in_txn else TS.IDLE
            if ts != want:
                raise AssertionError('session %d is %s, the model says %s' % (i, ts.name, want.name))

    def one_call(self, data):
        # mostly the session of the last call, so that a claim meets its finish
        if data.draw(st.integers(0, 2), label='another session') == 0:
            self.last_session = data.draw(st.integers(0, NSESSIONS - 1), label='session')
        if self.last_session in self.waits:
            self.last_session = data.draw(st.sampled_from(
                [i for i in range(NSESSIONS) if i not in self.waits]), label='free session')
        s = self.last_session
        sess = self.m.sessions[s]
        if sess.aborted and data.draw(st.integers(0, 2), label='end the aborted') != 0:
            # mostly, an application ends a failed transaction before its next call
            self.do_rollback_to(data, s) if sess.savepoints else self.do_rollback(data, s)
            return
        op = data.draw(st.sampled_from(OPS), label='call')
        kw = {name: data.draw(strategy, label=name) for name, strategy in OP_ARGS[op]}
        getattr(self, 'do_' + op)(s, data, **kw)

    def do_claim(self, s, data, fp, ttl, lease, scope=None, result=None):
        """Returns the claim's answer (action, lease_token), or None.  With
        result, the answer of a claim that waited, taken when the lock it
        waited for was given back."""
        scope = scope or self.pick_scope(data)
        t, e, k = scope
        r = self.run(s, '%s %r fp=%d ttl=%s lease=%s' % ('waited_claim' if result else 'claim', scope, fp,
                                                         ttl and ttl[0], lease and lease[0]),
                     CLAIM_SQL, (t, e, k, FPS[fp], ttl and ttl[0], lease and lease[0], '0'),
                     lambda lo, hi: self.m.claim(s, scope, FPS[fp], ttl and ttl[1],
                                                 lease and lease[1], lo, hi),
                     result)
        if r is None:
            return
        want, rows, lo, hi = r
        (action, http_status, error_code, retry_after, response_status, response_headers,
         response_json, lease_token, expires_at, replayed, body_ref, mismatch,
         response_body) = rows[0]
        got = dict(action=action, http_status=http_status, error_code=error_code)
        exp = dict(action=want['action'], http_status=want.get('http_status'),
                   error_code=want.get('error_code'))
        if got != exp:
            raise AssertionError('claim %r: the model expects %r, the server answered %r'
                                 % (scope, exp, got))
        if mismatch is not None:
            raise AssertionError('claim %r: mismatch set: %r' % (scope, mismatch))
        if action == 'execute':
            e_us = to_us(expires_at)
            created = e_us - want['ttl']
            if not lo <= created <= hi:
                raise AssertionError('claim %r: expires_at %s is not now + ttl' % (scope, expires_at))
            if (lease_token is not None) != bool(want.get('lease_row')):
                raise AssertionError('claim %r: lease_token %r' % (scope, lease_token))
            if replayed or response_status is not None or retry_after is not None:
                raise AssertionError('claim %r: execute with response fields' % (scope,))
            want['commit'](lease_token, e_us)
        elif action == 'replay':
            row = want['row']
            hdrs = dict(row.headers or {})
            hdrs.update({'Idempotent-Replayed': 'true', 'Idempotency-Key': k})
            kind, value = row.body
            body = (('json', response_json) if kind == 'json' and response_body is not None
                    and body_ref is None else
                    ('bytes', bytes(response_body)) if kind == 'bytes' and response_json is None
                    and body_ref is None and response_body is not None else
                    ('ref', body_ref) if kind == 'ref' and response_body is None
                    and response_json is None else
                    ('answered', response_body, response_json, body_ref))
            if (response_status != row.status or body != row.body
                    or response_headers != hdrs or not replayed
                    or to_us(expires_at) != row.expires_at or lease_token is not None):
                raise AssertionError('claim %r: replay of %r answered status %r body %r headers %r '
                                     'replayed %r expires_at %r'
                                     % (scope, row, response_status, body,
                                        response_headers, replayed, expires_at))
        else:
            if replayed or response_status is not None or lease_token is not None \
                    or expires_at is not None:
                raise AssertionError('claim %r: %s with response fields' % (scope, action))
            if action == 'in_progress':
                a, b = want['retry_after']
                if retry_after is None or not a <= retry_after <= b:
                    raise AssertionError('claim %r: retry_after %r, the model expects %d..%d'
                                         % (scope, retry_after, a, b))
            elif retry_after is not None:
                raise AssertionError('claim %r: retry_after %r' % (scope, retry_after))
        return action, lease_token

    def do_wait_claim(self, s, data, fp, ttl, lease):
        """A claim with a wait, of an idle session, when another session's
        transaction holds the scope with an atomic claim: it waits (in a
        thread of its own) until that transaction gives the lock back, and
        is then judged by what it finds (settle_waits).  Otherwise, and for
        arguments a claim refuses before it waits, a claim that does not
        wait."""
        sessions = self.m.sessions
        waited = [w[2] for w in self.waits.values()]
        held = [(p.scope, i) for i, x in enumerate(sessions) for p in x.pending
                if p.scope not in x.scope_locks and p.scope not in waited]
        idle = [i for i, x in enumerate(sessions) if not x.in_txn and i not in self.waits]
        if held and idle:
            scope, holder = data.draw(st.sampled_from(sorted(set(held))), label='held scope')
            s = self.last_session = data.draw(st.sampled_from(idle), label='waiting session')
        else:
            scope = self.pick_scope(data)
        holder = self.m.scope_lock_holder(scope)
        pol = ENDPOINTS[scope[1]]
        t_us = ttl[1] if ttl else pol['ttl'] or DEFAULT_TTL
        l_us = lease[1] if lease else pol['lease']
        if (holder is None or holder == s or self.m.sessions[s].in_txn
                or scope in self.m.sessions[holder].scope_locks or scope in waited
                or t_us > MAX_TTL or (l_us is not None and l_us > t_us)):
            self.do_claim(s, data, fp, ttl, lease, scope=scope)
            return
        conn = self.h.sessions[s]
        box = {}
        args = (scope[0], scope[1], scope[2], FPS[fp], ttl and ttl[0], lease and lease[0], '20 seconds')

        def waiting():
            box['result'] = call(conn, CLAIM_SQL, args)
        th = threading.Thread(target=waiting, daemon=True)
        self.waits[s] = (th, box, scope, fp, ttl, lease)
        self.h.busy[s] = th
        th.start()

    def settle_waits(self, lo):
        """After each step: a waiting claim whose lock was given back has
        answered, as the model says a claim made now answers; one whose lock
        is still held must still wait."""
        for s, (th, box, scope, fp, ttl, lease) in sorted(self.waits.items()):
            holder = self.m.scope_lock_holder(scope)
            if holder is not None and holder != s:
                if not th.is_alive():
                    raise AssertionError('claim %r of session %d answered %r while session %d '
                                         'held the scope' % (scope, s, box['result'][:2], holder))
                continue
            th.join(30)
            if th.is_alive():
                raise AssertionError('claim %r of session %d still waits, the scope is free'
                                     % (scope, s))
            del self.waits[s]
            del self.h.busy[s]
            rows, err, _, hi = box['result']
            self.do_claim(s, None, fp, ttl, lease, scope=scope, result=(rows, err, lo, hi))

    def do_finish(self, s, data, token, status, body, headers, kind='json', scope=None):
        """idem_finish (a JSON body), idem_finish_bytes or idem_finish_ref."""
        scope = scope or self.pick_scope(data)
        t, e, k = scope
        tok = self.token_for(s, scope, token) if isinstance(token, str) else token
        hdr = {'X-Model': str(body)} if headers else None
        if kind == 'json':
            stored, fn, arg = ('json', {'r': body}), 'idem_finish', json.dumps({'r': body})
            cast = 'jsonb'
        elif kind == 'bytes':
            stored, fn, cast = ('bytes', b'\x00body %d\xff' % body), 'idem_finish_bytes', 'bytea'
            arg = stored[1]
        else:
            stored, fn, cast = ('ref', 's3://bucket/%d' % body), 'idem_finish_ref', 'text'
            arg = stored[1]
        self.run(s, 'finish %r %s token=%s' % (scope, fn, token),
                 'SELECT idempotency.%s(%%s, %%s, %%s, %%s, %%s::%s, %%s::jsonb, lease_token => %%s)'
                 % (fn, cast),
                 (t, e, k, status, arg, hdr and json.dumps(hdr), tok),
                 lambda lo, hi: self.m.finish(s, scope, tok, status, stored, hdr, lo, hi))

    def do_request(self, s, data, fp, ttl, lease, status, body):
        """A request as an application makes it: in a transaction of its
        own unless the session is in one, claim; on execute, finish (with
        the lease token in lease mode); commit."""
        own = not self.m.sessions[s].in_txn
        if own:
            self.do_begin(data, s)
        answer = self.do_claim(s, data, fp, ttl, lease)
        if answer is not None and answer[0] == 'execute':
            self.do_finish(s, data, answer[1], status, body, False, scope=self.recent[-1])
        if own:
            self.do_commit(data, s)

    def do_fail(self, s, data, token, outcome):
        scope = self.pick_scope(data)
        t, e, k = scope
        tok = self.token_for(s, scope, token)
        self.run(s, 'fail %r token=%s' % (scope, token),
                 "SELECT idempotency.idem_fail(%s, %s, %s, %s, 'model', lease_token => %s)",
                 (t, e, k, outcome, tok),
                 lambda lo, hi: self.m.fail(s, scope, tok, outcome, lo, hi))

    def do_release(self, s, data, token):
        scope = self.pick_scope(data)
        t, e, k = scope
        tok = self.token_for(s, scope, token)
        self.run(s, 'release %r token=%s' % (scope, token),
                 'SELECT idempotency.idem_release(%s, %s, %s, lease_token => %s)',
                 (t, e, k, tok),
                 lambda lo, hi: self.m.release(s, scope, tok, lo, hi))

    def do_heartbeat(self, s, data, token, extend):
        scope = self.pick_scope(data)
        t, e, k = scope
        tok = self.token_for(s, scope, token)
        r = self.run(s, 'heartbeat %r token=%s extend=%s' % (scope, token, extend[0]),
                     'SELECT idempotency.idem_heartbeat(%s, %s, %s, %s, %s::interval)',
                     (t, e, k, tok, extend[0]),
                     lambda lo, hi: self.m.heartbeat(s, scope, tok, extend[1], lo, hi))
        if r is None:
            return
        apply, rows, lo, hi = r
        until = to_us(rows[0][0])
        if not lo <= until - extend[1] <= hi:
            raise AssertionError('heartbeat %r: locked_until %s is not now + extend' % (scope, rows[0][0]))
        apply(until)

    def do_resolve(self, s, data, status, body):
        scope = self.pick_scope(data)
        t, e, k = scope
        body_j = ('json', {'resolved': body})
        self.run(s, 'resolve %r' % (scope,),
                 'SELECT idempotency.idem_resolve(%s, %s, %s, %s, %s::jsonb)',
                 (t, e, k, status, json.dumps(body_j[1])),
                 lambda lo, hi: self.m.resolve(s, scope, status, body_j, lo, hi))

    def do_lookup(self, s, data):
        scope = self.pick_scope(data)
        t, e, k = scope
        r = self.run(s, 'lookup %r' % (scope,),
                     """SELECT state, fingerprint, lease_held, expires_at, locked_until, response_status
                        FROM idempotency.idem_lookup(%s, %s, %s)""",
                     (t, e, k), lambda lo, hi: self.m.lookup(s, scope, lo, hi))
        if r is None:
            return
        want, rows, lo, hi = r
        got = None
        if rows:
            state, fp, held, exp, lu, status = rows[0]
            got = dict(state=state, fp=bytes(fp), lease_held=held, expires_at=to_us(exp),
                       locked_until=to_us(lu), response_status=status)
        if got != want:
            raise AssertionError('lookup %r: the model expects %r, the server answered %r'
                                 % (scope, want, got))

    def do_begin(self, data, s=None):
        level = data.draw(st.sampled_from(LEVELS), label='level')
        if s is None:
            idle = [i for i, x in enumerate(self.m.sessions) if not x.in_txn and i not in self.waits]
            s = data.draw(st.sampled_from(idle), label='session')
        self.last_session = s
        rows, err, lo, hi = call(self.h.sessions[s], 'BEGIN ISOLATION LEVEL ' + level)
        self.expect('begin', None, err)
        self.m.begin(s, level)

    def do_commit(self, data, s=None):
        if s is None:
            busy = [i for i, x in enumerate(self.m.sessions) if x.in_txn]
            s = data.draw(st.sampled_from(busy), label='session')
        rows, err, lo, hi = call(self.h.sessions[s], 'COMMIT')
        tally('commit', err or 'ok')
        try:
            self.m.commit(s)
            self.expect('commit', None, err)
        except Err as e:
            self.expect('commit', e.sqlstate, err)

    def do_savepoint(self, data):
        can = [i for i, x in enumerate(self.m.sessions)
               if x.in_txn and not x.aborted and len(x.savepoints) < 2]
        s = self.last_session = data.draw(st.sampled_from(can), label='session')
        name = 'sp%d' % (len(self.m.sessions[s].savepoints) + 1)
        rows, err, lo, hi = call(self.h.sessions[s], 'SAVEPOINT ' + name)
        tally('savepoint', err or 'ok')
        self.expect('savepoint', None, err)
        self.m.savepoint(s, name)

    def do_release_savepoint(self, data):
        can = [i for i, x in enumerate(self.m.sessions) if x.savepoints and not x.aborted]
        s = self.last_session = data.draw(st.sampled_from(can), label='session')
        name = data.draw(st.sampled_from([n for n, _ in self.m.sessions[s].savepoints]),
                         label='savepoint')
        rows, err, lo, hi = call(self.h.sessions[s], 'RELEASE SAVEPOINT ' + name)
        tally('release_savepoint', err or 'ok')
        self.expect('release savepoint', None, err)
        self.m.release_savepoint(s, name)

    def do_rollback_to(self, data, s=None):
        if s is None:
            can = [i for i, x in enumerate(self.m.sessions) if x.savepoints and x.aborted] or \
                [i for i, x in enumerate(self.m.sessions) if x.savepoints]
            s = self.last_session = data.draw(st.sampled_from(can), label='session')
        name = data.draw(st.sampled_from([n for n, _ in self.m.sessions[s].savepoints]),
                         label='savepoint')
        rows, err, lo, hi = call(self.h.sessions[s], 'ROLLBACK TO SAVEPOINT ' + name)
        tally('rollback_to', err or 'ok')
        self.expect('rollback to savepoint', None, err)
        self.m.rollback_to(s, name)

    def do_rollback(self, data, s=None):
        if s is None:
            # an aborted transaction first
            busy = [i for i, x in enumerate(self.m.sessions) if x.aborted] or \
                [i for i, x in enumerate(self.m.sessions) if x.in_txn]
            s = data.draw(st.sampled_from(busy), label='session')
        rows, err, lo, hi = call(self.h.sessions[s], 'ROLLBACK')
        self.expect('rollback', None, err)
        self.m.rollback(s)

    def do_maintenance(self, data):
        drawn = offset = data.draw(st.sampled_from(AS_OF), label='as_of - now')
        t = now_us()
        if drawn == 'midnight':
            offset = slot_start(t, DAY) + DAY + MIN - t
        as_of = t + offset
        rows, err, lo, hi = call(self.h.admin,
                                 'SELECT kind, object, rows FROM idempotency.idem_maintenance(%s, preview => false)',
                                 (utc_literal(as_of),))
        self.expect('maintenance', None, err)
        tally('maintenance', 'as of the next midnight' if drawn == 'midnight'
              else 'as of now + %ds' % (offset // SEC))
        want = self.m.maintenance(as_of)
        got = {}
        for kind, obj, n in rows:
            got[(kind, obj)] = None if kind == 'drop' else n
            tally('pass', kind)
        if got != want:
            locks = self.h.admin.execute(
                """SELECT a.pid, a.state, a.backend_type, l.locktype, l.relation::regclass, l.mode, l.granted,
                          left(a.query, 60)
                   FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                   WHERE a.pid <> pg_backend_pid()""").fetchall()
            raise AssertionError('maintenance as of now + %ds: the model expects %r, the pass reported %r'
                                 '\nlocks of other sessions: %r\nsessions: %r'
                                 % (offset // SEC, sorted(want.items()), sorted(got.items()), locks,
                                    [(x.in_txn, x.aborted, c.info.transaction_status, c.info.backend_pid)
                                     for x, c in zip(self.m.sessions, self.h.sessions)]))
        self.check_tables()

    def do_policy(self, data):
        """An endpoint's policy changes (ttl, tombstone_ttl,
        on_expired_reuse) while no session is in a transaction: the calls
        that follow, and the passes, follow the new one."""
        ep, column, value, (field, kept) = data.draw(st.sampled_from(POLICY_CHANGES),
                                                     label='policy change')
        rows, err, lo, hi = call(self.h.admin,
                                 'UPDATE idempotency.endpoints SET %s = %%s::%s WHERE endpoint = %%s'
                                 % (column, 'text' if column == 'on_expired_reuse' else 'interval'),
                                 (value, ep))
        self.expect('policy %s %s' % (ep, column), None, err)
        tally('policy', '%s %s' % (column, value))
        ENDPOINTS[ep][field] = kept

    def do_transfer(self, data):
        """idem_export_keys of a tenant, checked against the model's live
        keys of it; then either the tenant moves out and back (its keys
        deleted and the export imported, in one transaction: its expired
        keys are gone, without tombstones), or the export is imported again
        over the keys it came from (every one unchanged)."""
        tenant = data.draw(st.sampled_from(sorted(set(TENANTS))), label='tenant')
        how = data.draw(st.sampled_from(['move', 'again']), label='transfer')
        m = self.m
        rows, err, lo, hi = call(self.h.admin, 'SELECT k FROM idempotency.idem_export_keys(%s) k',
                                 (tenant,))
        self.expect('export', None, err)
        got = sorted((k['endpoint'], k['key'], k['fingerprint'], k['state'],
                      to_us(datetime.datetime.fromisoformat(k['expires_at'])))
                     for (k,) in rows)
        try:
            live = {scope: m.live(r, lo, hi) for scope, r in m.rows.items() if scope[0] == tenant}
        except Ambiguous as e:
            note('ambiguous: %s' % e)
            assume(False)
        want = sorted((scope[1], scope[2], '\\x' + r.fp.hex(), r.state, r.expires_at)
                      for scope, rs in live.items() for r in rs)
        tally('transfer', how)
        if got != want:
            raise AssertionError('export of %s: the model expects\n  %s\nthe server gave\n  %s'
                                 % (tenant, '\n  '.join(map(repr, want)), '\n  '.join(map(repr, got))))
        export = json.dumps([k for (k,) in rows])
        # an expires_at later than max_ttl from now is refused, nothing written
        lo = now_us()
        try:
            with self.h.admin.transaction():
                if how == 'move':
                    self.h.admin.execute('DELETE FROM idempotency.keys WHERE tenant = %s', (tenant,))
                out = dict(self.h.admin.execute(
                    'SELECT outcome, rows FROM idempotency.idem_import_keys(%s::jsonb)',
                    (export,)).fetchall())
            err = None
        except psycopg.Error as e:
            err = e.sqlstate
        hi = now_us()
        latest = [r.expires_at - MAX_TTL for rs in live.values() for r in rs]
        if any(lo <= t <= hi for t in latest):
            note('ambiguous: an expires_at against max_ttl from now')
            assume(False)
        if any(t > hi for t in latest):
            self.expect('import of %s beyond max_ttl' % tenant, '22023', err)
            tally('transfer', 'refused')
            self.check_tables()
            return
        self.expect('import of %s' % tenant, None, err)
        try:
            still = [r for rs in live.values() for r in m.live(rs, lo, hi)]
        except Ambiguous as e:
            note('ambiguous: %s' % e)
            assume(False)
        n = len(still)
        expired = sum(len(rs) for rs in live.values()) - n
        want_out = dict(inserted=n if how == 'move' else 0, unchanged=0 if how == 'move' else n,
                        kept=0, expired=expired)
        if out != want_out:
            raise AssertionError('import of %s (%s): the model expects %r, the server answered %r'
                                 % (tenant, how, want_out, out))
        if how == 'move':
            for scope in list(m.rows):
                if scope[0] == tenant:
                    m.rows[scope] = [r for r in live[scope] if r in still]
            m.rows = {k: v for k, v in m.rows.items() if v}
        self.check_tables()

    def do_runs(self, data):
        """The third database: a pass drops a partition of more than 1,024
        expired keys, which become runs of tombstones; claims of some of
        them answer as their tombstones say."""
        # 7,000: the filter of their partition grows to three generations,
        # which the pass compacts at its end (IdemMaintCompactFilters)
        n = data.draw(st.sampled_from([1030, 1600, 7000]), label='expired keys')
        self.runs_made = True
        rows = self.h.make_runs(n)
        if sum(r[2] for r in rows) != n:
            raise AssertionError('runs: %d expired keys, the pass made tombstones %r' % (n, rows))
        tally('runs', n)
        self.do_runs_check(data)

    def do_runs_check(self, data):
        picks = data.draw(st.lists(st.tuples(st.integers(0, 7000), st.booleans()),
                                   min_size=1, max_size=4), label='run keys')
        for key, fp, want, got in self.h.check_runs(picks):
            tally('runs_claim', got)
            if got != want:
                raise AssertionError('a claim of %s (%s fingerprint) in the database of runs: '
                                     'the model expects %s, the server answered %s'
                                     % (key, fp, want, got))

    def do_max_ttl(self, data):
        """idempotency.max_ttl changes while no session is in a transaction
        (and no claim waits): claims, imports and the windows of the passes
        follow it."""
        value = data.draw(st.sampled_from([('1d', DAY), ('3d', 3 * DAY), ('2d', 2 * DAY)]),
                          label='max_ttl')
        tally('max_ttl', value[0])
        self.h.set_max_ttl(value)

    def do_restart(self, data):
        """The server stops (fast, or immediate: a crash) and starts again:
        every open transaction is gone, what was committed stays; the shared
        filters and horizons are unknown until a pass learns them again, and
        every answer must stay the same meanwhile."""
        mode = data.draw(st.sampled_from(['fast', 'immediate']), label='stop mode')
        self.restarts += 1
        tally('restart', mode)
        self.h.restart(mode)
        for s in range(NSESSIONS):
            self.m.rollback(s)
        self.check_tables()

    def do_other_free(self, data):
        """A pass of the other database drops some of its partitions: their
        entries in the shared table of filters are freed."""
        k = data.draw(st.sampled_from([1, 2, 4]), label='partitions freed')
        self.h.other_free(k)
        tally('other_free', k)

    def do_other_refill(self, data):
        """The other database writes tombstones into new partitions: they
        take entries of the shared table of filters."""
        k = data.draw(st.sampled_from([1, 4]), label='partitions filled')
        self.h.other_refill(k)
        tally('other_refill', k)

    # ---- the tables ----------------------------------------------------

    def check_tables(self):
        """What the tables hold, committed, against the model (every
        session idle, or their transactions' writes left out)."""
        m = self.m
        got = sorted(self.h.admin.execute(
            """SELECT c.relname, tenant, endpoint, key, fingerprint, state, lease_token,
                      locked_until, response_status,
                      CASE body_kind WHEN 'json' THEN convert_from(response_body, 'UTF8')::jsonb END,
                      body_kind, CASE body_kind WHEN 'bytes' THEN response_body END, body_ref,
                      response_headers, created_at, expires_at
               FROM idempotency.keys k JOIN pg_class c ON c.oid = k.tableoid""").fetchall(),
            key=lambda x: (x[1], x[2], x[3], x[15]))
        got = [(rel, t, e, k, bytes(fp), state, tok, to_us(lu), status,
                None if kind is None else (kind, body if kind == 'json' else bytes(raw)
                                           if kind == 'bytes' else ref),
                hdrs, to_us(created), to_us(exp))
               for rel, t, e, k, fp, state, tok, lu, status, body, kind, raw, ref, hdrs, created, exp
               in got]
        want = []
        for scope, rows in m.rows.items():
            for r in rows:
                p = covering(m.keys_parts, r.expires_at)
                rel = part_name('keys_p', p[0]) if p else 'keys_default'
                want.append((rel,) + scope + (r.fp, r.state, r.token, r.locked_until, r.status,
                                               r.body, r.headers, r.created_at, r.expires_at))
        want.sort(key=lambda x: (x[1], x[2], x[3], x[12]))
        if got != want:
            raise AssertionError('idempotency.keys holds\n  %s\nthe model\n  %s'
                                 % ('\n  '.join(map(repr, got)), '\n  '.join(map(repr, want))))
        by_hash = {v: k for k, v in self.h.hashes.items()}
        got = sorted((rel, by_hash.get(bytes(h), bytes(h)), bytes(fp), to_us(a), to_us(b))
                     for rel, h, fp, a, b in self.h.admin.execute(
                         """SELECT c.relname, scope_hash, fingerprint, expired_at, expires_at
                            FROM idempotency.tombstones t JOIN pg_class c ON c.oid = t.tableoid"""))
        want = []
        for t in m.tombs:
            p = covering(m.tomb_parts, t.expires_at)
            rel = part_name('tombstones_p', p[0]) if p else 'tombstones_default'
            want.append((rel, t.scope, t.fp, t.expired_at, t.expires_at))
        want.sort()
        if got != want:
            raise AssertionError('idempotency.tombstones holds\n  %s\nthe model\n  %s'
                                 % ('\n  '.join(map(repr, got)), '\n  '.join(map(repr, want))))
        for table, parts in (('keys', m.keys_parts), ('tombstones', m.tomb_parts)):
            got = sorted(self.h.partitions(table))
            if got != sorted(parts):
                raise AssertionError('partitions of %s: %r, the model %r' % (table, got, sorted(parts)))

    def teardown(self):
        if self.h is None:
            return
        lo = now_us()
        for s in range(NSESSIONS):
            if s not in self.waits:
                self.h.sessions[s].execute('ROLLBACK')
                self.m.rollback(s)
        self.settle_waits(lo)
        for s in range(NSESSIONS):
            self.h.sessions[s].execute('ROLLBACK')
            self.m.rollback(s)
        self.check_tables()


class LabelData:
    """Draws of a scripted sequence: the values given for each label, in
    order (the last one again when they run out)."""

    def __init__(self, values):
        self.values = {k: list(v) for k, v in values.items()}

    def draw(self, strategy, label=None):
        q = self.values[label]
        return q.pop(0) if len(q) > 1 else q[0]


def scenario_filter_room(machine):
    """The defect of issue 36, step by step, through the model: with the
    table of filters full, a partition of tombstones made after the model's
    database learned its filters gets the tombstone of k1 (no entry:
    "maybe"); the other database frees an entry; the tombstone of k2, in
    the same partition, makes it a fresh entry; a claim of k1 with another
    fingerprint must still answer mismatch."""
    h = machine.h

    def scope(key):
        return LabelData({'which scope': [0], 'tenant': ['t1'], 'endpoint': ['ep_atomic'],
                          'key': [key], 'level': ['READ COMMITTED']})

    def maintenance(offset):
        machine.do_maintenance(LabelData({'as_of - now': [offset]}))

    # the partitions of tombstones learned at the start go: their entries
    # are freed, and the other database takes them again
    maintenance(2 * DAY + 12 * HOUR)
    h.other_refill(8)
    # partitions made again, after the learning: no entries
    maintenance(0)
    machine.do_request(0, scope('k1'), 0, ('1 microsecond', US), None, 200, 1)
    # just after midnight: today's partition of keys has ended, and the
    # tombstone of a key that expired today (a tombstone_ttl of a day)
    # still lives
    t = now_us()
    after_midnight = slot_start(t, DAY) + DAY + MIN - t
    maintenance(after_midnight)
    h.other_free(1)
    machine.do_request(0, scope('k2'), 0, ('1 microsecond', US), None, 200, 2)
    maintenance(after_midnight)
    # what the server holds: the partition of k1's tombstone, and whether a
    # claim opens it (its index scans, counted by the statistics)
    part = h.admin.execute(
        """SELECT c.relname FROM idempotency.tombstones t JOIN pg_class c ON c.oid = t.tableoid
           WHERE t.scope_hash = idempotency.idem_tombstone_hash('t1', 'ep_atomic', 'k1')""").fetchall()

    def scans():
        h.admin.execute('SELECT pg_stat_clear_snapshot()')
        return h.admin.execute(
            """SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes
               WHERE relname = ANY(%s)""", ([r[0] for r in part],)).fetchone()[0]
    before = scans()
    machine.do_request(0, scope('k1'), 1, None, None, 200, 3)
    time.sleep(1)
    print('model: scenario filter_room: k1\'s tombstone in %s; index scans of it by the last claim: %s'
          % (part, scans() - before), flush=True)


SCENARIOS = {'filter_room': scenario_filter_room}


def main():
    global HARNESS
    run_seed = int(os.environ.get('IDEM_MODEL_SEED') or random.SystemRandom().randrange(1, 2 ** 31))
    examples = int(os.environ.get('IDEM_MODEL_EXAMPLES', '50'))
    steps = int(os.environ.get('IDEM_MODEL_STEPS', '60'))
    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    if os.environ.get('IDEM_MODEL_SHRINK', '1') != '0':
        phases.append(Phase.shrink)
    print('model: seed %d, %d sequences of at most %d calls (replay: IDEM_MODEL_SEED=%d)'
          % (run_seed, examples, steps, run_seed), flush=True)
    HARNESS = Harness()
    scenario = os.environ.get('IDEM_MODEL_SCENARIO')
    if scenario:
        # a scripted sequence (SCENARIOS), before the random ones
        machine = ProtocolMachine()
        try:
            SCENARIOS[scenario](machine)
            machine.teardown()
        except Exception:
            print('model: FAILED in the scenario %s' % scenario, flush=True)
            raise
        print('model: the scenario %s passed' % scenario, flush=True)
    print('model: capacities: %s; restarts %s; the other database %s'
          % (', '.join('%s %s' % (k.split('.')[1], v or 'unknown (no such setting)')
                       for k, v in HARNESS.capacity.items()),
             'on' if CAN_RESTART else 'off (IDEM_MODEL_PGCTL, IDEM_MODEL_PGDATA, IDEM_MODEL_PGLOG unset)',
             'fills the table of filters (%d partitions)' % HARNESS.fill_n if HARNESS.fill_on else
             'does not fill the table of filters (%d entries, more than IDEM_MODEL_FILL_MAX %d)'
             % (HARNESS.filter_entries, FILL_MAX)), flush=True)
    started = time.monotonic()
    machine = seed(run_seed)(ProtocolMachine)
    try:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=examples, stateful_step_count=steps, deadline=None,
            database=None, phases=phases, derandomize=False,
            suppress_health_check=list(HealthCheck), print_blob=False))
    except Exception:
        replay = os.environ.get('IDEM_MODEL_REPLAY') or (
            'IDEM_MODEL_SEED=%d IDEM_MODEL_EXAMPLES=%d IDEM_MODEL_STEPS=%d TESTS=062_model make test,'
            ' or make model SEEDS=%d EXAMPLES=%d STEPS=%d'
            % (run_seed, examples, steps, run_seed, examples, steps))
        print('model: FAILED with seed %d: replay with %s' % (run_seed, replay), flush=True)
        raise
    print('model: answers: %s' % ', '.join('%s %s %d' % (k[0], k[1], n)
                                         for k, n in sorted(TALLY.items())), flush=True)
    print('model: passed, seed %d, %.1f s' % (run_seed, time.monotonic() - started), flush=True)


if __name__ == '__main__':
    main()
