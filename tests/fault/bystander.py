"""The `bystander` class (outside attack 35): an innocent application sharing the server and the
database user with the consumers, whose sessions no consumer may ever end.

A server restarts counting connection ids from 1 again, so an id a consumer remembers from
before (a claim's earlier connection it means to KILL on a rerun) may name an application's
session after it. The bystander holds about SESSIONS idle sessions of the runtime user: opened
at the start and again right after each restart (FaultRun.restart_server), taking the ids the
consumers had just before it (it opens sessions and keeps those whose id one of them held, up
to SESSIONS and at most FILL_TRIES opens). Every POLL_S it asks each session for a round trip;
one that fails is a loss (history.BystanderLoss). The checker's `bystander_killed` rule excuses
only a server fault between its last answer and the failure: any other loss was a KILL of an
id that was not the killer's.
"""

from __future__ import annotations

import threading
import time

import MySQLdb

from notifyq.config import DSN

from .history import BystanderLoss

SESSIONS = 40
FILL_TRIES = 600  # opens per fill at most: the ids reach past what the consumers held by then
POLL_S = 0.5


class _Held:
    def __init__(self, conn, conn_id: int, opened_at: float):
        self.conn, self.conn_id, self.opened_at = conn, conn_id, opened_at
        self.last_ok = opened_at


class Bystander(threading.Thread):
    def __init__(self, dsn: DSN):
        super().__init__(name="bystander", daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.losses: list[BystanderLoss] = []
        self.fills: list[tuple[int, int]] = []  # per fill: (sessions held, of them on a target id)
        self._lock = threading.Lock()
        self._held: list[_Held] = []
        self._opened: set[int] = set()  # ids of a fill under way, held or not yet closed
        self._refill = threading.Event()
        self._targets: set[int] = set()

    def ids(self) -> set[int]:
        """The server ids its sessions hold now (the schedule's own KILLs leave them alone)."""
        with self._lock:
            return {h.conn_id for h in self._held} | self._opened

    def server_back(self, targets: set[int]) -> None:
        """The server was restarted: `targets` are the ids the runtime user's sessions had
        before it. Its sessions are gone with it; new ones are opened at once."""
        self._targets = set(targets)
        self._refill.set()

    def run(self) -> None:
        self._fill(set())
        while not self.stop.is_set():
            if self._refill.wait(POLL_S):  # the driver's pace, and a restart's wake-up
                self._refill.clear()
                self._poll()  # what a restart ended, it ended before this: judged so
                self._drop_all()
                self._fill(self._targets)
                continue
            self._poll()
        self._poll()
        self._drop_all()

    def _connect(self):
        return MySQLdb.connect(**self.dsn.connect_args(0), autocommit=True, connect_timeout=2, read_timeout=5)

    def _fill(self, targets: set[int]) -> None:
        """Open sessions as fast as one thread can, keeping those on a target id (then any,
        until SESSIONS are held), until SESSIONS target ids are held or the ids pass them."""
        kept: list[_Held] = []
        spare: list[_Held] = []
        top = max(targets, default=0)
        for _ in range(FILL_TRIES if targets else SESSIONS):
            try:
                conn = self._connect()
            except MySQLdb.Error:
                break  # the server went again: the next restart refills
            held = _Held(conn, conn.thread_id(), time.monotonic())
            with self._lock:
                self._opened.add(held.conn_id)
            if held.conn_id in targets and len(kept) < SESSIONS:
                kept.append(held)
            elif len(kept) + len(spare) < SESSIONS:
                spare.append(held)
            else:
                conn.close()
            if len(kept) >= SESSIONS or held.conn_id >= top:
                if len(kept) + len(spare) >= SESSIONS:
                    break
        hold = kept + spare[:max(0, SESSIONS - len(kept))]
        for extra in spare[max(0, SESSIONS - len(kept)):]:
            extra.conn.close()
        self.fills.append((len(hold), len(kept)))
        with self._lock:
            self._held = hold
            self._opened = set()

    def _poll(self) -> None:
        with self._lock:
            held = list(self._held)
        gone = []
        for h in held:
            try:
                h.conn.query("SELECT 1")
                h.conn.store_result()
                h.last_ok = time.monotonic()
            except MySQLdb.Error as e:
                gone.append(h)
                self.losses.append(BystanderLoss(h.conn_id, h.opened_at, h.last_ok, time.monotonic(), str(e)[:120]))
        if gone:
            with self._lock:
                self._held = [h for h in self._held if h not in gone]

    def _drop_all(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        for h in held:
            try:
                h.conn.close()
            except MySQLdb.Error:
                pass
