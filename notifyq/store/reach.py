"""Reach: since when this process has not reached a server, shared by all its sessions there.

A session's connect retry counts from the moment the process first failed to reach the server,
not from its own first failure: after one call gave up (a claim's, a lease extension's), the
next one (the give-back of the batch, a re-registration, a reaper pass) makes one attempt
instead of retrying as long again, so a daemon whose server stays away exits within its
connect_retry_s of the server's going, whatever path it was on. Any connect that succeeds
ends the outage, and so does any transaction answered on a connection a session kept: a
connect that failed and gave up (the wake's 1 s budget, a stop) while the other sessions
worked on would otherwise leave the outage open, and a connect long after give up at its
first failure. One per server list, for the process's life, as the writer choice is
(store/writer.py). It also keeps whether a session gave up on the outage, and with what budget:
a consumer whose own budget was used up exits even while its workers are in handlers that say
nothing to the server (consume/service.py, ConsumerService.gone).
"""

from __future__ import annotations

import threading
from typing import ClassVar

from notifyq.config import DSN


class Reach:
    _guard: ClassVar[threading.Lock] = threading.Lock()
    _of: ClassVar[dict[tuple, "Reach"]] = {}

    def __init__(self) -> None:
        self._down_since: float | None = None  # monotonic: the first failed connect of the outage
        # The longest retry budget a session gave up with in this outage (None: none gave up): a
        # consumer's own (connect_retry_s) is what ends it, even while a Python handler runs on
        self._given_up_s: float | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, dsn: DSN) -> "Reach":
        with cls._guard:
            return cls._of.setdefault((tuple(dsn.servers), dsn.unix_socket), cls())

    def failed(self, attempted_at: float) -> None:
        """A connect begun at `attempted_at` (monotonic) found the server unreachable."""
        with self._lock:
            if self._down_since is None or attempted_at < self._down_since:
                self._down_since = attempted_at

    def answered(self) -> None:
        """A connect succeeded, or a transaction was answered: the outage, if any, is over."""
        if self._down_since is None:  # the common case, read without the lock: every transaction asks
            return
        with self._lock:
            self._down_since = None
            self._given_up_s = None

    def gave_up(self, retry_s: float, now: float) -> None:
        """A session whose budget is retry_s gave up at `now` (monotonic): on this outage only
        once it has lasted that long (a call's budget counts from the call's start, which may
        come before the outage's first failure), and not if the server answered meanwhile."""
        with self._lock:
            if self._down_since is not None and now - self._down_since >= retry_s:
                self._given_up_s = max(retry_s, self._given_up_s or 0.0)

    def given_up(self, retry_s: float) -> bool:
        """Whether a session gave up on this outage with a budget of retry_s or more (a housekeeping
        session's shorter one, a library producer's 5 s, says nothing of a daemon's 30 s), and
        nothing answered since."""
        given_up_s = self._given_up_s
        return given_up_s is not None and given_up_s >= retry_s

    def down(self) -> bool:
        """A connect found the server unreachable and nothing has answered since."""
        return self._down_since is not None

    def since(self, now: float) -> float:
        """Where a connect retry starting `now` counts its budget from: the outage's start, if
        the process is in one, else now."""
        with self._lock:
            return now if self._down_since is None else min(now, self._down_since)
