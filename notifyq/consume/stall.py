"""The stall watch: no stall of a consumer process is silent, and none outlasts a reply that is
not coming.

Every call a session makes says, while it waits for the server, since when and how long it may
wait on purpose (Session.waiting: a GET_LOCK's or a SLEEP's wait; an answer is due at once
otherwise). The service's main loop asks here, every turn, without a statement, whether one of
its sessions' calls (the workers' work sessions, the watcher sessions; a handler's own
connection while job.complete_in() writes there: store/completion.py's CallerCall) is overdue by
STALL_S.
Then, once per call, it asks the server on a session of its own how it lists that session:
  - running a statement (a lock wait, a slow disk): a WARNING saying so; it goes on waiting, and
    is looked at again every STALL_S (a KILL may still cut the rest of its query);
  - without a statement for under a second: a reply may be on its way; asked again next turn;
  - without a statement for longer, or not at all: the reply is not coming (a KILL QUERY that landed
    between two statements of one query makes the server drop the rest unanswered; a network
    path that went black lost a reply the server sent; a client would wait out its read timeout,
    a minute, its jobs ready and nobody starting them). A WARNING, KILL CONNECTION of that
    session, and its socket shut down on this side (Session.cut_socket: the server's close never
    reaches a client behind a black-holed path): its read ends at once, and the session
    reconnects as after any lost connection (a claim's COMMIT sent ahead counts as failed: its
    jobs may run again, under at-least-once);
  - the server cannot be reached at all (the look's own connect gets no answer: a black-holed
    path, a host gone): no reply is coming over that path either. A WARNING, and the socket shut
    down on this side, the same way. A server that answers the look with an error (too many
    connections) is reachable: looked at again every STALL_S, nothing ended.
When the call ends, an INFO line says after how long. At shutdown the same runs with
STOPPING_STALL_S, so a stuck read delays a SIGTERM by about that, not by its read timeout.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable

from notifyq import errors
from notifyq.config import DSN
from notifyq.store import advisory
from notifyq.store.db import Session
from notifyq.store.driver import DriverError, error_code
from notifyq.store.pipeline import Waiting

log = logging.getLogger("notifyq.consumer")

# A call this long past its own wait is a stall: said, and looked into. Short: a foreign KILL
# QUERY that cuts a work session's claim short while its worker watches holds every idle consumer
# of the queue until it is ended (about STALL_S + a turn + IDLE_S).
STALL_S = 2.0
IDLE_S = 1  # the server lists the session without a statement this long (whole seconds): no reply is on its way
STOPPING_STALL_S = 1.0  # the same while stopping: a stuck read must not hold the exit long
LOOK_RETRY_S = 2.0  # the look's own connect retry: the server may be the thing that is gone
LOOK_READ_TIMEOUT_S = 5  # the look's reply: a server that stops answering must not hold the main loop a minute
# The look's connect failed with one of these (no answer, refused, cut in the handshake): the
# server cannot be reached from here. Any other error is the server's own answer.
UNREACHABLE = frozenset({2002, 2003, 2006, 2013, 2055})


@dataclasses.dataclass
class Stall:
    """An overdue call the watch has said: whose, which, and when to look at it again."""

    label: str
    waiting: Waiting
    look_again_at: float | None  # the server still ran it: look again then (its rest may be dropped)


class StallWatch:
    """One consumer service's watch over its sessions' calls (called from its main loop)."""

    def __init__(self, dsn: DSN):
        self.dsn = dsn
        self._said: dict[int, Stall] = {}  # id(session) -> its overdue call, said
        self._stuck_loops: set[str] = set()  # workers whose loop stopped turning, said
        self.stalls = 0  # overdue calls said (tests and benchmarks read them)
        self.ended = 0  # connections ended because their reply was not coming

    def check(self, sessions: Iterable[tuple[str, Session]], stall_s: float = STALL_S) -> None:
        now = time.monotonic()
        due: list[tuple[str, Session, Waiting]] = []
        seen: set[int] = set()
        for label, session in sessions:
            seen.add(id(session))
            waiting = session.waiting
            said = self._said.get(id(session))
            if said is not None and said.waiting is not waiting:
                del self._said[id(session)]
                _ended(said, now)
                said = None
            if waiting is None or now - waiting.since < waiting.wait_s + stall_s:
                continue
            if said is None or (said.look_again_at is not None and now >= said.look_again_at):
                due.append((label, session, waiting))
        for gone in set(self._said) - seen:  # a session replaced meanwhile (a worker restarted), a run over
            _ended(self._said.pop(gone), now)
        if due:
            self._look(due, now, stall_s)

    def check_loops(self, loops: Iterable[tuple[str, float, bool]], limit_s: float) -> None:
        """loops: (worker name, when its loop last turned, whether it is excused: in a handler, in
        a database call (check says those), or reconnecting). A loop that has not turned for
        limit_s otherwise is stuck in the process itself: said once (the systemd watchdog, fed only
        while every loop turns, stops being fed then), and again when it turns."""
        now = time.monotonic()
        for name, last_turn, excused in loops:
            stuck = not excused and now - last_turn > limit_s
            if stuck and name not in self._stuck_loops:
                self._stuck_loops.add(name)
                log.warning("stalled: a worker's loop has not turned for %.0f s, outside a handler and any "
                            "database call worker=%s", now - last_turn, name)
            elif not stuck and name in self._stuck_loops:
                self._stuck_loops.discard(name)
                log.info("no longer stalled: the worker's loop turns again worker=%s", name)

    def _look(self, due: list[tuple[str, Session, Waiting]], now: float, stall_s: float) -> None:
        looker = Session(self.dsn, autocommit=True, retry_s=LOOK_RETRY_S, name="stall-watch",
                         read_timeout_s=LOOK_READ_TIMEOUT_S)
        try:
            for label, session, waiting in due:
                self._look_at(looker, label, session, waiting, now, stall_s)
        finally:
            looker.close()

    def _look_at(self, looker: Session, label: str, session: Session, waiting: Waiting, now: float,
                 stall_s: float) -> None:
        """Say the overdue call (once), and end its connection if its reply is not coming."""
        late_s = now - waiting.since
        conn_id = session.connection_id
        first = id(session) not in self._said
        try:
            state = advisory.session_state(looker, conn_id) if conn_id else None
            if session.node and looker.node != session.node:  # (a failover, a balancer): not its server
                raise errors.DatabaseError(f"the look reached {looker.node}, the call's server is {session.node}")
        except (DriverError, errors.NotifyqError) as e:
            if _unreachable(looker, e) and session.waiting is waiting and session.connection_id == conn_id:
                log.warning("stalled: a call has waited %.1f s for its reply (due after %g s), and the "
                            "server cannot be reached: ending its connection on this side, which "
                            "reconnects session=%s what=%s error=%s", late_s, waiting.wait_s, label,
                            waiting.what, e)
                self._say(session, label, waiting, None)
                if session.waiting is waiting and session.connection_id == conn_id and session.cut_socket():
                    self.ended += 1
                return
            if first:
                log.warning("stalled: a call has waited %.1f s for its reply (due after %g s), and the "
                            "server could not be asked why session=%s what=%s error=%s", late_s,
                            waiting.wait_s, label, waiting.what, e)
            self._say(session, label, waiting, now + stall_s)
            return
        if session.waiting is not waiting or session.connection_id != conn_id:
            return  # it answered meanwhile
        if state is not None and state[1]:
            if first:
                log.warning("stalled: a call has waited %.1f s for its reply (due after %g s); the server "
                            "is still running it session=%s what=%s server_command=%s", late_s,
                            waiting.wait_s, label, waiting.what, state[0])
            self._say(session, label, waiting, now + stall_s)
            return
        if state is not None and state[2] < IDLE_S:
            return  # its statement ended just now: its reply may be on the way (looked at next turn)
        listed = "lists it without a statement" if state is not None else "has no such session"
        log.warning("stalled: a call has waited %.1f s for a reply that is not coming (the server %s): "
                    "ending its connection, which reconnects session=%s what=%s", late_s, listed,
                    label, waiting.what)
        self._say(session, label, waiting, None)
        killed = False
        # A server restarted since the connection last answered ended it, and may have given its
        # id to another client's session (the looker connected to the new server): no KILL then
        open_at = getattr(session, "open_at", None)  # (not known of a complete_in caller's connection)
        gone = open_at is not None and looker.restarted_after(open_at, session.server_run)
        try:
            killed = bool(conn_id) and not gone and advisory.kill_connection(looker, conn_id, owner=session)
        except (DriverError, errors.NotifyqError) as e:
            log.warning("could not end the stalled connection on the server: ending it on this side "
                        "session=%s error=%s", label, e)
        # And on this side: the server's close may never reach us (a black-holed network path)
        cut = session.waiting is waiting and session.connection_id == conn_id and session.cut_socket()
        if killed or cut:
            self.ended += 1

    def _say(self, session: Session, label: str, waiting: Waiting, look_again_at: float | None) -> None:
        if id(session) not in self._said:
            self.stalls += 1
        self._said[id(session)] = Stall(label, waiting, look_again_at)


def _unreachable(looker: Session, e: BaseException) -> bool:
    """The look failed because its connect got no answer from the server (not the server's own
    error, nor a failure after it connected)."""
    if looker.connected or not isinstance(e, errors.DatabaseError):
        return False
    return error_code(e.__context__) in UNREACHABLE if e.__context__ is not None else False

def _ended(said: Stall, now: float) -> None:
    log.info("no longer stalled: the call answered or ended after %.1f s session=%s what=%s",
             now - said.waiting.since, said.label, said.waiting.what)
