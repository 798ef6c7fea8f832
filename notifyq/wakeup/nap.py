"""NapLock: what an idle watcher waits in on MariaDB where no ringer holds a bell: GET_LOCK of a
lock its own worker's work session holds, not SLEEP().

MariaDB's KILL QUERY of a session in SLEEP() now and then takes two seconds (the server's
SECONDS_TO_WAIT_FOR_KILL, after which it gives up trying the victim's wait mutex, the one mutex
every SLEEP() on the server shares), and every other SLEEP() on the server overruns by as much
meanwhile. It needs other sessions in SLEEP() at the time, and each idle queue's watcher is one.
So a process of 50 idle queues whose watchers were woken at once (a workflow's children, one per
queue, each an instant wake: waker.py) started a batch of them about 2 s late (4 or 6 s when it
struck again) in one trial in three to six. With 20 sessions sleeping, 5 of 1380 KILLs took
2.0 s; with 50 waiting in GET_LOCK, none of 6800 took over 8 ms: a GET_LOCK wait has a mutex of
its own.

The lock is held by the seated worker's work session, idle while its worker watches, taken once
per connection; nobody else ever asks for it, so the wait ends by its timeout, or a KILL. Where
the watch statement finds it not held (the work session reconnected and has not taken it again)
it sleeps, as before. MariaDB answers a KILL of a GET_LOCK with NULL, not with an error: the
statement ends as after a wait, and the next one reads the count first (one more round trip than
an interrupted SLEEP's). MySQL keeps SLEEP(): it rounds GET_LOCK's timeout to whole seconds, and
a watcher's first wait of a turn is 0.05 s.
"""

from __future__ import annotations

import logging
import os

from notifyq import errors
from notifyq.store import advisory
from notifyq.store.db import Session
from notifyq.store.driver import DriverError
from notifyq.store.locks import lock_name

log = logging.getLogger("notifyq.consumer")


class NapLock:
    """One worker's nap lock, held on its work session."""

    def __init__(self, database: str):
        self.name = lock_name(database, "nap", os.urandom(8).hex())
        self._held_by: Session | None = None  # the session that took it, on connection _generation
        self._generation = -1

    def held(self, session: Session) -> str | None:
        """The lock's name for the watch statement, taken on `session` first if its present
        connection does not hold it yet; None: the watcher sleeps (not MariaDB, or not taken)."""
        if "mariadb" not in session.server_version.lower():
            return None
        if self._held_by is session and self._generation == session.generation:
            return self.name
        try:
            got = advisory.get_lock(session, self.name, 0)
        except (errors.NotifyqError, DriverError) as e:
            log.debug("could not take the nap lock, the watcher sleeps error=%s", e)
            return None
        if got != 1:
            return None
        self._held_by, self._generation = session, session.generation
        return self.name
