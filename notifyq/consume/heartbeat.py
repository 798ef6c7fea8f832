"""The liveness of a consumer that holds no liveness lock (polling mode).

A lock-mode consumer is alive while the server holds its lock for it, whatever its handler
does. A polling consumer has no such lock, so it proves it is alive by writing: a thread of its
own, on a session of its own (a handler may run for hours on the worker's thread), refreshes
its nq_consumer row and extends the lease of every job it holds, every BEAT_S or a third of the
lease, whichever is shorter. Reapers judge it dead when the row is older than
queries.POLLING_STALE_S, or take its jobs back when a lease runs out: both mean the process,
its host or its connection stopped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from notifyq.config import DSN
from notifyq.store import liveness
from notifyq.store.db import Session

log = logging.getLogger("notifyq.heartbeat")

BEAT_S = 5.0  # well inside POLLING_STALE_S: a few missed beats are not a death


class Heartbeat:
    def __init__(self, dsn: DSN, consumer_id: Callable[[], str], lease_s: float, name: str,
                 wakeup: Callable[[], str] = lambda: "polling"):
        self._consumer_id = consumer_id  # read at every beat: a re-registered worker has a new id
        self._wakeup = wakeup  # 'locks' for a lock-mode consumer on a Galera node (liveness.py)
        self.lease_s = lease_s
        self.interval_s = min(BEAT_S, lease_s / 3)
        self.lost = threading.Event()  # the row was gone: a reaper judged us dead
        self._stop = threading.Event()
        self._beating = threading.Lock()
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
        with self._beating:  # the worker beats once at start, then the thread: one session
            if not liveness.heartbeat(self._session, self._consumer_id(), self._wakeup(), self.lease_s):
                self.lost.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except Exception as e:  # keep beating: the next beat may reach the server
                log.warning("heartbeat failed consumer=%s error=%s", self._consumer_id(), e)
