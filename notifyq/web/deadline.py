"""A page's time in the database, bounded as a whole (docs/web.md, "Limits").

A page may make several reads, each of which could wait for a free session (data.SESSION_WAIT_S),
retry its connect (connect_retry_s) and wait for a statement's answer (data.READ_TIMEOUT_S): with
the server stopped or frozen, two reads of one page took 20 s, past the 15 s the docs promise.
Here one GET gets one deadline (PAGE_S from its connection's accept, so that the time it waited
for a handler counts: bounds.QUEUE_S) that every read of it shares:

- a server that failed a read of this page is not asked again by it (the page says it is down);
- a read waits for a session only for what is left of the page's time, and retries a connect
  only until CONNECT_FLOOR_S before its end: an attempt started then lasts at most its own
  timeout (Session._open_server: max(CONNECT_FLOOR_S, the retry time), which that leaves room
  for); a session not connected is not connected in the last CONNECT_FLOOR_S;
- a statement still unanswered at the deadline has its socket cut (Session.cut_socket) by one
  watcher thread per Reader, so its read returns at once as a lost connection.
"""

from __future__ import annotations

import threading
import time
from typing import Any

PAGE_S = 14.0  # a page's whole time in the database: the docs' 15 s, with a second left to answer
CONNECT_FLOOR_S = 3.0  # Session._open_server's least connect timeout


class PageTime:
    """One GET's deadline (monotonic) and the servers that failed it, by name, with their error."""

    def __init__(self, budget_s: float = PAGE_S, started: float | None = None):
        """`started`: when the page's time began (monotonic), its connection's accept; now if None."""
        self.budget_s = budget_s
        self.deadline = (time.monotonic() if started is None else started) + budget_s
        self.down: dict[str, str] = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()


class Cutter:
    """Cuts the socket of a session still in a read at its page's deadline. One thread, started
    with the Reader and stopped by close(); a session is armed for the time of one read."""

    def __init__(self) -> None:
        self._armed: dict[Any, float] = {}  # session -> deadline (monotonic)
        self._cut: set[Any] = set()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="notifyq-web-deadline", daemon=True)
        self._thread.start()

    def arm(self, session: Any, deadline: float) -> None:
        with self._cond:
            self._armed[session] = deadline
            self._cond.notify()

    def disarm(self, session: Any) -> bool:
        """The read is over: True if its socket was cut (the session must reconnect)."""
        with self._cond:
            self._armed.pop(session, None)
            if session in self._cut:
                self._cut.discard(session)
                return True
            return False

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                for session in [s for s, deadline in self._armed.items() if deadline <= now]:
                    del self._armed[session]
                    # Under the lock: a session disarmed (its read over, back in the pool for
                    # another page) is never cut
                    if session.cut_socket():
                        self._cut.add(session)
                soonest = min(self._armed.values(), default=None)
                self._cond.wait(None if soonest is None else max(0.0, soonest - now))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)
