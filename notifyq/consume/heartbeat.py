"""The liveness of a consumer that holds no liveness lock (polling mode).

A lock-mode consumer is alive while the server holds its lock for it, whatever its handlers
do. A polling consumer process has no such lock, so it proves it is alive by writing: a thread
of its own, on a session of its own (handlers may run for hours on the workers' threads),
refreshes its nq_consumer row every BEAT_S. Reapers judge it dead when the row is older than
liveness.POLLING_STALE_S: the process, its host or its connection stopped.

The beat says the process lives, not that its handlers make progress: it extends no lease. A
job's lease is pushed out by its worker (between the jobs of a batch, while a command runs
within its timeout) and by the handler itself (job.extend_lease()), in polling mode as with
locks; a handler hung past its lease loses its job to another consumer in both modes. (The
beat once extended every job the process held, and a hung handler then held its job forever.)
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from notifyq.config import DSN
from notifyq.store import liveness
from notifyq.store.db import Session
from notifyq.store.liveness import POLLING_STALE_S

log = logging.getLogger("notifyq.heartbeat")

BEAT_S = 5.0  # well inside POLLING_STALE_S: a few missed beats are not a death
# On a multi-host DSN, how long one beat keeps trying (a read timeout, reconnects to the next
# node) before the thread waits for its next turn: half of POLLING_STALE_S, room for a second try.
BEAT_RETRY_S = POLLING_STALE_S / 2
# A beat that lands more than this late (past its interval; a shorter interval allows as much
# as itself) ends our steady spell: the server or the cluster's primary component was away for
# us, and so, as a rule, for the others (steady_s). Well below GALERA_LOCK_GRACE_S less a beat,
# by which a lock-mode consumer on a Galera node is judged by its silence.
LATE_S = 1.0


class Heartbeat:
    def __init__(self, dsn: DSN, consumer_id: Callable[[], str], name: str,
                 wakeup: Callable[[], str] = lambda: "polling", interval_s: float = BEAT_S):
        self._consumer_id = consumer_id  # read at every beat: a re-registered process has a new id
        self._wakeup = wakeup  # 'locks' for a lock-mode consumer on a Galera node (liveness.py)
        self.interval_s = interval_s
        # A silence of ours longer than this is a gap (steady_s). It must stay under the Galera
        # grace: a reaper whose own beats were silent as long as everyone's (no primary
        # component) would otherwise count itself steady and take live peers for dead.
        self.gap_s = self.interval_s + min(LATE_S, self.interval_s)
        self.lost = threading.Event()  # the row was gone: a reaper judged us dead
        self._landed_at: float | None = None  # monotonic time of the last beat that landed
        self._steady_since = -math.inf  # ... of the first landing after a gap (none yet: -inf)
        self._stop = threading.Event()
        self._beating = threading.Lock()
        # A beat must land within POLLING_STALE_S of the last one. On a multi-host DSN a paused
        # writer answers nothing, and the work sessions' read timeout plus a whole interval
        # before the next try would overrun it (benchmarks/HISTORY.md). So there its statements
        # (tiny) give up after one interval and a failed beat is retried at once, on the next
        # ready node: about two intervals and a connect timeout after the last one. One server:
        # nowhere else to go, so the beat keeps the plain timeouts.
        if len(dsn.servers) > 1:
            self._session = Session(dsn, retry_s=BEAT_RETRY_S, read_timeout_s=math.ceil(self.interval_s),
                                    name=f"{name}-heartbeat", stop=self._stop)
        else:
            self._session = Session(dsn, retry_s=min(10.0, self.interval_s), name=f"{name}-heartbeat")
        self._thread = threading.Thread(target=self._run, name=f"{name}-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        self._session.close()

    def beat(self) -> None:
        with self._beating:  # the process beats once at registration, then the thread: one session
            if not liveness.heartbeat(self._session, self._consumer_id(), self._wakeup()):
                self.lost.set()
            now = time.monotonic()
            if self._in_gap(now):
                self._steady_since = now
            self._landed_at = now

    def landed_within(self, seconds: float, now: float) -> bool:
        return self._landed_at is not None and now - self._landed_at < seconds

    def _in_gap(self, now: float) -> bool:
        return self._landed_at is not None and now - self._landed_at > self.gap_s

    def steady_s(self) -> float:
        """For how long our beats have been landing since the last gap in them: 0 while in one,
        infinite if there was none yet. While ours could not land, others' could not either, as
        a rule (the server, or the cluster's primary component, was gone): for a while after
        such a gap their silence says nothing (reaper.reap)."""
        now = time.monotonic()
        if self._in_gap(now):
            return 0.0
        return now - self._steady_since

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except Exception as e:  # keep beating: the next beat may reach the server
                log.warning("heartbeat failed consumer=%s error=%s", self._consumer_id(), e)
