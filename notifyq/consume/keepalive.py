"""Keep a worker's lock session alive while its handler runs, so that the server may drop it
soon after its host vanishes.

A worker's lock session holds its liveness lock. A host that vanishes without closing its
connections (power loss, a cut network: no FIN) leaves that session open on the server, and
the lock held, until the server notices: after `wait_timeout` of silence. So the session's
wait_timeout is short (consumer.session_idle_s, 60 s by default) and a live worker is never
silent that long: its own loop touches the session between batches (the idle wait, the reap
check), and while a handler runs, which may take hours, this keeper sends one tiny statement
every session_idle_s / 4. A vanished host's liveness lock is then free, and its jobs come back,
within session_idle_s plus a reap interval; a stalled process (SIGSTOP) is judged the same way.

One connection is never used by two threads at once: the worker lends the session to the
keeper only while it is inside a handler, and takes it back before it goes on.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from notifyq.store import queries
from notifyq.store.db import Session

log = logging.getLogger("notifyq.consumer")

PINGS_PER_IDLE = 4  # a ping or two may be slow or lost before the server's timeout is near


class SessionKeeper:
    def __init__(self, session: Session, idle_s: float, name: str):
        self.session = session
        self.every_s = idle_s / PINGS_PER_IDLE
        self._lent = threading.Lock()  # free only while the worker is inside a handler
        self._lent.acquire()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-keepalive", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def lent(self):
        """Around a handler call: the keeper may use the session until this block ends."""
        self._lent.release()
        try:
            yield
        finally:
            self._lent.acquire()  # waits out a ping in flight, never more

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            if not self._lent.acquire(blocking=False):
                continue  # the worker has the session: its own statements keep it alive
            try:
                queries.keep_alive(self.session)
            except Exception as e:  # the worker reconnects and re-registers on its next turn
                log.warning("lock session keepalive failed session=%s error=%s", self.session.name, e)
            finally:
                self._lent.release()
