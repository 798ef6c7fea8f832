"""ReleaseWake: a worker whose ack released workflow children wakes the idle consumers of their
queues, as a producer wakes them after a put.

The release bumps each child queue's signal in the ack's own transaction (store/workflows.py),
but an idle consumer's watcher reads that signal only at its next poll (up to
wakeup.poll_max_s): a child on another queue started up to a second late. After every ack that
released children, whoever sends it (Outcomes.on_release: the next claim's, a flush, an ack
sent on its own because the batch's lease was due an extension or its worker stops, the stop's
own sends), and after a job.transaction() block's COMMIT that released children, this wakes
each such queue's watcher with the instant wake (KILL QUERY of its wait: wakeup/waker.py), on a
session of its own per queue, opened on first use. The worker's own queue needs none: the
worker claims again at once after an ack that released children. Best effort, as any wake: a
watcher woken before the ack's COMMIT lands (a claim's COMMIT is not waited for) claims in
vain, then finds the signal moved by its next turn's reads of the count (the first at once, the
next after FIRST_WAIT_S, wakeup/waiter.py, then backing off from wakeup.poll_initial_s); one
that misses the wake (no advisory locks, a KILL refused) reads the signal at its next poll.
Either way within wakeup.poll_max_s of the COMMIT.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from notifyq.config import Config
from notifyq.store.locks import QueueLocks
from notifyq.wakeup import Waker

WAKE_RETRY_S = 1.0  # the wake's session gives up on an unreachable server soon: the poll covers it


class ReleaseWake:
    def __init__(self, config: Config, own_queue: str):
        self.config = config
        self.own_queue = own_queue
        self.wakers: dict[str, Waker] = {}
        self.wakes = 0  # tests read it
        # The worker's acks and its handler's blocks (on the handler's thread) both call it, and
        # so does the stop's send of what the worker could not ack (the service's thread)
        self._mutex = threading.Lock()
        self._closed = False

    def released(self, queues: Iterable[str]) -> None:
        """After an ack that released children on `queues`: wake their watchers (never raises)."""
        with self._mutex:
            self._wake([q for q in queues if q != self.own_queue])
            if self._closed:  # (the stop's sends come after its worker closed us: no session kept)
                self._close_wakers()

    def _wake(self, queues: list[str]) -> None:
        for queue in queues:
            waker = self.wakers.get(queue)
            if waker is None:
                waker = self.wakers[queue] = Waker(
                    queue, QueueLocks(self.config.dsn.database, queue), self.config, ring=False,
                    retry={"retry_s": WAKE_RETRY_S, "retry_log_level": logging.DEBUG})
            self.wakes += 1
            waker.wake()

    def reload(self, config: Config) -> None:
        """A reload's config: the next wakes read its `wakeup.instant_wake`."""
        with self._mutex:
            self.config = config
            for waker in self.wakers.values():
                waker.reload(config)

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            self._close_wakers()

    def _close_wakers(self) -> None:
        for waker in self.wakers.values():
            waker.close()
        self.wakers.clear()
