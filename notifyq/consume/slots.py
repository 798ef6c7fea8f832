"""SlotWake: a limited queue's worker wakes the watcher when it frees a slot.

A job held back by a limit (store/flow.py) stays ready and counts as taken for the watcher, which
then waits for the queue's signal to move. Every outcome that frees a slot (an ack, a retry, a
burial, a cancel, a give-back, a take-back) bumps that signal in its own transaction (a job
completed in its own, job.transaction(): Outcomes.send bumps it with the batch's outcomes);
this wakes the watcher at once, as a producer wakes it after a put: the instant wake's KILL QUERY of the
watcher's wait (wakeup/waker.py), on a session of its own, after the COMMIT. Best effort: a
watcher that misses it reads the moved signal at its next turn (wakeup.poll_max_s at worst).
Queues without a limit never create one: their outcomes wake nobody, as before.
"""

from __future__ import annotations

import logging

from notifyq.config import Config
from notifyq.store.locks import QueueLocks
from notifyq.wakeup import Waker

WAKE_RETRY_S = 1.0  # the wake's session gives up on an unreachable server soon: the poll covers it


class SlotWake:
    def __init__(self, config: Config, queue: str, locks: QueueLocks):
        self.waker = Waker(queue, locks, config, ring=False,
                           retry={"retry_s": WAKE_RETRY_S, "retry_log_level": logging.DEBUG})
        self.wakes = 0  # tests and the benchmark read it

    def watch_lock(self) -> str | None:
        """The watch lock a claim that frees slots may read the holder of with its mark
        (queries.Acks.watch): nobody holding it then, freed() after that claim would only look
        and find nobody, a round trip on the wake's session; None: freed() decides alone."""
        return self.waker.watch_looked_at()

    def freed(self, watched: bool | None = None) -> None:
        """After a COMMIT that freed slots: wake the watcher if one waits (never raises).
        watched: whether a consumer held the watch lock when the claim that freed them read it
        with its mark (queries.Claim.watched; None: not read). False: the wake's own look would
        find nobody, so it is not sent; its quiet window starts as that look's would have."""
        if watched is False:
            self.waker.saw_nobody_watching()
            return
        self.wakes += 1
        self.waker.wake()

    def reload(self, config: Config) -> None:
        """A reload's config: the next wakes read its `wakeup.instant_wake`."""
        self.waker.reload(config)

    def close(self) -> None:
        self.waker.close()
