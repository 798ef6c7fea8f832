"""The stall watch: no stall of a consumer process is silent, and none outlasts a reply that is
not coming.

Every call a session makes says, while it waits for the server, since when and how long it may
wait on purpose (Session.waiting: a GET_LOCK's or a SLEEP's wait; an answer is due at once
otherwise). The service's main loop asks here, every turn, without a statement, whether one of
its sessions' calls (the workers' work sessions, the watcher sessions) is overdue by STALL_S.
Then, once per call, it asks the server on a session of its own how it lists that session:
  - running a statement (a lock wait, a slow disk): a WARNING saying so; it goes on waiting;
  - without a statement, or not at all: the reply is not coming (a KILL QUERY that landed
    between two statements of one query makes the server drop the rest unanswered, and a client
    would wait out its read timeout, a minute, its jobs ready and nobody starting them). A
    WARNING, and KILL CONNECTION of that session: its read ends at once, and the session
    reconnects as after any lost connection (a claim's COMMIT sent ahead counts as failed: its
    jobs may run again, under at-least-once).
When the call ends, an INFO line says after how long. At shutdown the same runs with
STOPPING_STALL_S, so a stuck read delays a SIGTERM by about that, not by its read timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from notifyq import errors
from notifyq.config import DSN
from notifyq.store import advisory
from notifyq.store.db import Session
from notifyq.store.driver import DriverError
from notifyq.store.pipeline import Waiting

log = logging.getLogger("notifyq.consumer")

STALL_S = 5.0  # a call this long past its own wait is a stall: said, and looked into
STOPPING_STALL_S = 1.0  # the same while stopping: a stuck read must not hold the exit long
LOOK_RETRY_S = 2.0  # the look's own connect retry: the server may be the thing that is gone


class StallWatch:
    """One consumer service's watch over its sessions' calls (called from its main loop)."""

    def __init__(self, dsn: DSN):
        self.dsn = dsn
        self._told: dict[int, tuple[str, Waiting]] = {}  # id(session) -> the overdue call said
        self.stalls = 0  # overdue calls said (tests and benchmarks read them)
        self.ended = 0  # connections ended because their reply was not coming

    def check(self, sessions: Iterable[tuple[str, Session]], stall_s: float = STALL_S) -> None:
        now = time.monotonic()
        overdue: list[tuple[str, Session, Waiting]] = []
        seen: set[int] = set()
        for label, session in sessions:
            seen.add(id(session))
            waiting = session.waiting
            told = self._told.get(id(session))
            if told is not None and told[1] is not waiting:
                del self._told[id(session)]
                log.info("no longer stalled: the call answered or ended after %.1f s session=%s what=%s",
                         now - told[1].since, told[0], told[1].what)
            if waiting is None or id(session) in self._told or now - waiting.since < waiting.wait_s + stall_s:
                continue
            overdue.append((label, session, waiting))
        for gone in set(self._told) - seen:  # a session replaced meanwhile (a worker restarted)
            del self._told[gone]
        if overdue:
            self._look(overdue, now)

    def _look(self, overdue: list[tuple[str, Session, Waiting]], now: float) -> None:
        looker = Session(self.dsn, autocommit=True, retry_s=LOOK_RETRY_S, name="stall-watch")
        try:
            for label, session, waiting in overdue:
                self._told[id(session)] = (label, waiting)
                self.stalls += 1
                self._look_at(looker, label, session, waiting, now)
        finally:
            looker.close()

    def _look_at(self, looker: Session, label: str, session: Session, waiting: Waiting, now: float) -> None:
        late_s = now - waiting.since
        conn_id = session.connection_id
        try:
            state = advisory.session_state(looker, conn_id) if conn_id else None
        except (DriverError, errors.NotifyqError) as e:
            log.warning("stalled: a call has waited %.1f s for its reply (due after %g s), and the "
                        "server could not be asked why session=%s what=%s error=%s", late_s,
                        waiting.wait_s, label, waiting.what, e)
            return
        if session.waiting is not waiting or session.connection_id != conn_id:
            return  # it answered meanwhile (the INFO line comes at the next check)
        if state is not None and state[1]:
            log.warning("stalled: a call has waited %.1f s for its reply (due after %g s); the server "
                        "is still running it session=%s what=%s server_command=%s", late_s,
                        waiting.wait_s, label, waiting.what, state[0])
            return
        listed = "lists it without a statement" if state is not None else "has no such session"
        log.warning("stalled: a call has waited %.1f s for a reply that is not coming (the server %s): "
                    "ending its connection, which reconnects session=%s what=%s", late_s, listed,
                    label, waiting.what)
        try:
            if conn_id and advisory.kill_connection(looker, conn_id):
                self.ended += 1
        except (DriverError, errors.NotifyqError) as e:
            log.warning("could not end the stalled connection: its read ends at its read timeout "
                        "session=%s error=%s", label, e)
