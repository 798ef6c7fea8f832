"""ClaimBackoff: a worker's claims (and the acks it sends before them) that outlived the retry
policy on lock conflicts.

A claim is safe to run again (its rerun hands back what an earlier try may have marked, and
its COMMIT is fenced by its token), and a storm of deadlocks or lock wait timeouts (1213,
1205: the server answers, another transaction holds what the claim needs; or the other
RERUN_CODES, driver.py: a snapshot conflict, an interrupted statement) is no outage: a
consumer that ended on one (exit 5) left its queue to its peers, and a fleet whose every
worker met the same lock holder all ended. So a claim whose retries all lost such a conflict
ends no worker: it waits a while (bounded, growing), turning its loop, and claims again; so
does an ack of what ran (fenced by its claim's token: as safe to run again), whose jobs wait
for the next try (acking.py) instead of their lease's end. Said once when the storm starts and
once when a claim goes through again, not per claim. A lost connection that outlives the retry
policy still ends the worker (the server is gone: exit 5).
"""

from __future__ import annotations

import logging
import threading
import time

from notifyq import errors
from notifyq.consume.retry import backoff_s
from notifyq.store.driver import is_lost_rerun

log = logging.getLogger("notifyq.consumer")

FIRST_S = 0.5  # the wait after a storm's first failed claim, doubling ...
MOST_S = 5.0  # ... up to this (well inside the loop's stall limit: the worker keeps its liveness)


class ClaimBackoff:
    def __init__(self, queue: str, worker: str):
        self.queue, self.worker = queue, worker
        self.failed = 0  # claims of this storm that gave up (0: no storm)
        self._since = 0.0  # when the storm's first claim gave up

    @property
    def failing(self) -> bool:
        """The last claim gave up on a conflict: claim again (after wait()), not idle or exit."""
        return self.failed > 0

    def absorbed(self, e: errors.TransientDBError) -> bool:
        """A claim raised `e` after retrying: True when it lost conflicts only (the worker claims
        again); False for anything else (the worker ends on it, as before)."""
        if not is_lost_rerun(e.__cause__ or e):
            return False
        if not self.failed:
            self._since = time.monotonic()
            log.warning("claims keep losing lock conflicts after retrying: waiting and claiming again "
                        "queue=%s worker=%s error=%s", self.queue, self.worker, e)
        self.failed += 1
        return True

    def wait(self, stop: threading.Event) -> None:
        """Before the next claim of a storm: wait its turn (none outside a storm)."""
        if self.failed:
            stop.wait(backoff_s(self.failed, FIRST_S, MOST_S))

    def claimed(self) -> None:
        """A claim went through: the storm, if any, is over."""
        if self.failed:
            log.info("claims go through again queue=%s worker=%s failed_claims=%d seconds=%.1f",
                     self.queue, self.worker, self.failed, time.monotonic() - self._since)
            self.failed = 0
