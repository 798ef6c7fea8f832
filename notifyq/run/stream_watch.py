"""A `notifyq produce` stream's stall watch: a put whose reply is not coming (a frozen server, a
black-holed path) is ended as a consumer's call is (notifyq/consume/stall.py), rather than
waited for until its read timeout (a minute, then as long again for the check whether its
COMMIT landed), so the stream exits 5 within connect_retry_s and the bound docs/configuration.md
gives ("When the server stays away")."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from notifyq.config import DSN
from notifyq.consume.stall import STALL_S, StallWatch
from notifyq.store.db import Session

log = logging.getLogger("notifyq.producer")

TURN_S = STALL_S / 4  # how often the watch looks at the calls' ages (no statement unless one is overdue)


class StreamStallWatch:
    """Looks, on a thread of its own, at the calls of `sessions()` (the producer's); a context
    manager around the stream."""

    def __init__(self, sessions: Callable[[], list[tuple[str, Session]]]):
        self._sessions = sessions
        self._watches: list[tuple[DSN, StallWatch]] = []  # one per server (a sharded queue's shards)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notifyq-stall-watch", daemon=True)

    def __enter__(self) -> StreamStallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # Not joined: a look under way may wait seconds for a server that does not answer, and
        # must not hold the exit (the thread is a daemon's: it ends with the process).
        self._done.set()

    def _run(self) -> None:
        while not self._done.wait(TURN_S):
            try:
                sessions = self._sessions()
                for dsn, watch in self._watches_for(sessions):
                    watch.check([(label, s) for label, s in sessions if s.dsn == dsn])
            except Exception as e:  # the watch's own failure must not end the stream
                log.debug("stall watch failed error=%s", e)

    def _watches_for(self, sessions: list[tuple[str, Session]]) -> list[tuple[DSN, StallWatch]]:
        """The watch of each server the sessions are on (a DSN holds a dict: no dict key)."""
        for _, session in sessions:
            if not any(dsn == session.dsn for dsn, _ in self._watches):
                self._watches.append((session.dsn, StallWatch(session.dsn)))
        return [(dsn, watch) for dsn, watch in self._watches if any(s.dsn == dsn for _, s in sessions)]
