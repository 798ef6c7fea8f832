"""QueueWakes: a process's wakes of the idle consumers of queues other than its own, as a
producer wakes its queue's after a put.

Their signal is bumped in the transaction that made jobs ready there, but an idle consumer's
watcher reads that signal only at its next poll (up to wakeup.poll_max_s): without a wake, a
job on another queue started up to a second late. Two callers: a worker whose outcome released
workflow children on other queues (every ack that released some, whoever sends it:
Outcomes.on_release; a job.transaction() block's COMMIT; a complete_in COMMIT found landed; a
failure that released run_anyway children), and a producer whose put_workflow() made jobs
ready on other queues than its own. This wakes each such queue's watcher with the instant wake
(KILL QUERY of its wait: wakeup/waker.py), all on one session of its own, opened on first
use. The own queue needs none: its worker claims again at once after such an outcome, and a
producer's put wakes it already. Best effort, as any wake: a watcher woken before the COMMIT
lands (a claim's COMMIT is not waited for) claims in vain, then finds the signal moved by its
next turn's reads of the count (the first at once, the next after FIRST_WAIT_S,
wakeup/waiter.py, then backing off from wakeup.poll_initial_s); one that misses the wake (no
advisory locks, a KILL refused) reads the signal at its next poll. Either way within
wakeup.poll_max_s of the COMMIT.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from notifyq.config import Config
from notifyq.store.db import Session
from notifyq.store.locks import QueueLocks
from notifyq.wakeup.waker import InstantWake, instant_wanted

WAKE_RETRY_S = 1.0  # the wake's session gives up on an unreachable server soon: the poll covers it


class QueueWakes:
    def __init__(self, config: Config, own_queue: str):
        self.config = config
        self.own_queue = own_queue
        # Per queue woken, its instant wake (what it learnt: a refusal, a proxy; its look's quiet
        # window); all of them on one session, however many queues: a workflow's put may make
        # jobs ready on hundreds, and a session each held the server's connections (1040)
        self.instants: dict[str, InstantWake] = {}
        self.session: Session | None = None
        self.wakes = 0  # tests read it
        # A worker's acks and its handler's blocks (on the handler's thread) both call it, and
        # so does the stop's send of what the worker could not ack (the service's thread)
        self._mutex = threading.Lock()
        self._closed = False

    def wake(self, queues: Iterable[str]) -> None:
        """After a COMMIT that made jobs ready on `queues`: wake their watchers, the own queue's
        apart (never raises)."""
        with self._mutex:
            self._wake([q for q in dict.fromkeys(queues) if q != self.own_queue])
            if self._closed:  # (the stop's sends come after its worker closed us: no session kept)
                self._end_session()

    def _wake(self, queues: list[str]) -> None:
        """Each queue's watcher, by the instant wake (the KILL QUERY of its wait), as a producer
        wakes its own queue's (Waker._instant), unless `wakeup.instant_wake` or
        `wakeup.use_locks` is off: then their poll finds the jobs."""
        for queue in queues:
            self.wakes += 1
            if not instant_wanted(self.config):
                continue
            if queue not in self.instants:
                self.instants[queue] = InstantWake(queue, QueueLocks(self.config.dsn.database, queue))
            instant = self.instants[queue].usable(self.config.wakeup.instant_wake)
            if instant is not None and instant.look.due():
                instant.wake(self._session())

    def _session(self) -> Session:
        if self.session is None:
            self.session = Session(self.config.dsn, autocommit=True, name="queue-wakes", retry_s=WAKE_RETRY_S,
                                   retry_log_level=logging.DEBUG)
        return self.session

    def reload(self, config: Config) -> None:
        """A reload's config: the next wakes read its `wakeup.instant_wake`."""
        with self._mutex:
            self.config = config

    def close(self) -> None:
        """For good (a worker's end): a wake after it opens its session and closes it again."""
        with self._mutex:
            self._closed = True
            self._end_session()

    def end_sessions(self, drop: bool = False) -> None:
        """The session ended (drop: without a word to a server that is gone); the next wake
        opens a new one (a producer's close(), after which a put may come)."""
        with self._mutex:
            self._end_session(drop)

    def _end_session(self, drop: bool = False) -> None:
        if self.session is not None:
            if drop:
                self.session.discard()
            else:
                self.session.close()
        self.session = None
