"""A producer that does not hold the queue's bell wakes the idle consumer by interrupting its wait
(`wakeup.instant_wake`): KILL QUERY of the watcher's statement, which then goes to claim at once.

Only one producer per queue and server holds the bell (wakeup.py): in a web app of 8 worker
processes, 7 producers would otherwise leave their jobs to the watcher's backoff poll (up to
wakeup.poll_max_s). The put's COMMIT carries, in its own round trip, the read of who holds the
watch lock and of this session's id as the server knows it (store/bells.py, interrupt_look);
only when a consumer watches does the producer send the KILL, on the same connection (so both
name sessions of the same server, or of the same Galera node). Nobody watching: nothing more,
and the look then holds for QUIET_LOOK_S, as a ringer's does (under load nobody idles, and the
puts in that window commit as plain ones do). No extra connection, and no statement at all while
the watcher is away.

A KILL is only safe and useful where
  - producers and consumers log in as the same database user: otherwise the server refuses it
    (1095). With "auto" (the default) the producer stops trying after the first refusal, for its
    life, and says once what to set; with true it keeps trying (a watcher of its own user may
    come), and says once that it was refused;
  - the producer talks to the server directly: behind a multiplexing proxy (ProxySQL, RDS Proxy)
    the handshake's id is not the server's, and a KILL by the server's id could hit another
    client's session. Then it never sends one (true and "auto" alike);
  - the server has advisory locks (not Galera's 1235, nor a proxy's refusal): else consumers poll.
A KILL that lands while the watcher is between two statements interrupts nothing, but its next
statement reads the count first; one that lands while it hands the watch on is lost, and the
next watcher's first read finds the jobs. The poll (wakeup.poll_max_s) bounds every miss.
The watcher session runs only lock statements and autocommit single-row updates, which are rerun
when interrupted, so the KILL can never abort a claim.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from notifyq import errors
from notifyq.store import advisory, bells
from notifyq.store.db import Session
from notifyq.store.driver import DriverError, locks_unavailable
from notifyq.store.locks import QueueLocks
from notifyq.wakeup import QUIET_LOOK_S

log = logging.getLogger("notifyq.producer")


class Interrupter:
    """One producer's instant wake for its queue: whether it still tries, and the quiet window."""

    def __init__(self, queue: str, locks: QueueLocks, insist: bool):
        self.queue = queue
        self.locks = locks
        self.insist = insist  # instant_wake = true: a refusal does not stop it
        self.off: str | None = None  # why it stopped for good: "refused", "proxy", "no locks"
        self.looks = self.kills = self.refusals = 0  # tests and benchmarks read them
        self._quiet_until = 0.0  # monotonic: until then, the last look's "nobody watching" holds
        self._look_query: str | None = None
        self._told_refused = False

    def look_due(self) -> bool:
        return self.off is None and time.monotonic() >= self._quiet_until

    def commit_look_and_kill(self, work: Session, cur, result: Any) -> bool:
        """Inside a put's body on `work`: COMMIT with the look in its round trip, then the KILL,
        on that connection, if a consumer watches. False: the look failed after the COMMIT (the
        session is dropped); the caller wakes after the put with wake()."""
        self.looks += 1
        if self._look_query is None:  # bound once, as the bell's look is
            self._look_query = cur.mogrify(*bells.interrupt_look(self.locks))
        seen = work.pipeline.commit_then_read(cur, self._look_query, result=result)
        if seen is None:
            return False
        self._act(work, cur, *seen)
        return True

    def wake(self, session: Session) -> None:
        """After a COMMIT this did not carry (the caller's own, or a look that failed): read the
        holder and KILL on `session`. Best effort: never raises."""
        if self.off is not None:
            return
        self.looks += 1
        try:
            session.run(lambda cur: self._act(session, cur, *advisory.lock_holder_and_me(cur, self.locks.watch)),
                        what="instant wake")
        except DriverError as e:
            if locks_unavailable(e):
                self.off = "no locks"
                log.debug("instant wake is off: the server refuses advisory locks, the consumers poll "
                          "queue=%s", self.queue)
            else:
                log.debug("instant wake failed, the consumers' poll finds the jobs error=%s", e)
            session.discard()
        except errors.NotifyqError as e:
            log.debug("instant wake failed, the consumers' poll finds the jobs error=%s", e)

    def _act(self, session: Session, cur, holder: int | None, me: int) -> None:
        if int(me) != session.connection_id:
            self.off = "proxy"
            log.warning("wakeup.instant_wake is off for this producer: its connection goes through a proxy "
                        "(the server knows it by another id than the handshake gave), where a KILL QUERY "
                        "could hit an unrelated session; the consumers' poll finds its jobs queue=%s", self.queue)
            return
        if holder is None:
            self._quiet_until = time.monotonic() + QUIET_LOOK_S
            return
        try:
            outcome = bells.interrupt(cur, holder)
        except DriverError as e:  # the jobs are committed: the poll finds them; reconnect next put
            log.debug("instant wake failed, the consumers' poll finds the jobs error=%s", e)
            try:
                cur.close()
            except DriverError:
                pass
            session.discard()
            return
        if outcome == "sent":
            self.kills += 1
        elif outcome == "refused":
            self._refused()

    def _refused(self) -> None:
        self.refusals += 1
        if not self.insist:
            self.off = "refused"
            log.warning("wakeup.instant_wake is off for this producer: the server refused its KILL QUERY of the idle "
                        "consumer's wait (1095: the consumers log in as another database user), so their "
                        "poll finds its jobs, within wakeup.poll_max_s. To wake them at once, log producers "
                        "in as the consumers' user; wakeup.instant_wake = false silences this queue=%s",
                        self.queue)
        elif not self._told_refused:
            self._told_refused = True
            log.warning("the server refused this producer's KILL QUERY of the idle consumer's wait (1095: "
                        "another database user); wakeup.instant_wake = true keeps trying on every put, and "
                        "the consumers' poll finds its jobs meanwhile queue=%s", self.queue)
