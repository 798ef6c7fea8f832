"""The producer's side of the wake-up: one Waker per producer, which wakes an idle consumer of
its queue after each COMMIT that put jobs, by whichever way this producer may.

The ways, and who chooses: only the Waker (`_way`), or the Waker it was left to (`leave_to`).
  - The ring (Bell): a `ring=True` producer that became its queue's ringer on this server,
    once a watcher can be waiting on its bell (Bell.announce).
  - The instant wake (InstantWake): KILL QUERY of the watcher's wait, for every other producer,
    and for a new ringer's first put; unless `wakeup.instant_wake` is false, or it stopped for
    good (another database user with "auto", a proxy).
  - Neither (no advisory locks, or both off): the consumers' poll finds the jobs.
Either way, the look that says whether a consumer watches rides the put's own COMMIT (one round
trip, as a bare COMMIT), and inside the quiet window of a look that saw nobody it is not sent at
all (Look). A put on the caller's own connection is woken after the caller's COMMIT
(`wake()`), on the Waker's own session, which is also the one that holds the bell.

Only one producer per queue and server holds the bell: in a web app of 8 worker processes, 7
producers would otherwise leave their jobs to the watcher's backoff poll (up to poll_max_s). The
instant wake reads who holds the watch lock and this session's own id in its put's COMMIT, and
sends the KILL on the same connection (so both name sessions of the same server, or of the same
Galera node). A KILL is only safe and useful where
  - producers and consumers log in as the same database user: otherwise the server refuses it
    (1095). With "auto" (the default) the producer stops trying after the first refusal, for its
    life (a consumer's, until a reload sets true), and says once what to set; with true it keeps
    trying (a watcher of its own user may come), and says once that it was refused;
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
from collections.abc import Callable
from typing import Any, TypeVar

from notifyq import errors
from notifyq.config import Config
from notifyq.store import advisory, bells
from notifyq.store.db import Session
from notifyq.store.driver import DriverError, locks_unavailable
from notifyq.store.locks import QueueLocks

log = logging.getLogger("notifyq.producer")
ring_log = logging.getLogger("notifyq.wakeup")  # the bell's lines, under the name they have always had

T = TypeVar("T")

RINGER_RETRY_S = 1.0  # a producer that found another ringer tries to become the ringer this often
# A look that saw nobody watching holds this long: the puts in between commit without a look,
# as plain puts do. Under load no consumer idles, and a look per put was a statement per job. A
# consumer that starts watching inside the window is woken by the first put after it, or finds
# the jobs first by its own reads of the count (poll_initial_s doubling): a few ms more.
QUIET_LOOK_S = 0.005


class Look:
    """One way of waking's look: its statement, bound once (not mogrified on every put), the
    quiet window, and how many were taken (tests and benchmarks read `taken`)."""

    def __init__(self, statement: tuple[str, dict[str, Any]]):
        self.statement = statement
        self.taken = 0
        self.quiet_s = QUIET_LOOK_S
        self.quiet_until = 0.0  # monotonic: until then, the last "nobody watching" holds
        self._bound: str | None = None

    def due(self) -> bool:
        """Whether the next COMMIT carries the look: not inside the quiet window."""
        return time.monotonic() >= self.quiet_until

    def saw_nobody(self) -> None:
        self.quiet_until = time.monotonic() + self.quiet_s

    def forget(self) -> None:
        self.quiet_until = 0.0

    def with_commit(self, work: Session, cur, result: Any) -> tuple | None:
        """COMMIT the put's transaction on `work` and look in the same round trip
        (Pipeline.commit_then_read): the look's row, or None if the look failed after the COMMIT
        (the session is dropped). `result` is what the put's body returns, for Session.run to
        ask about if the COMMIT's reply is lost."""
        self.taken += 1
        if self._bound is None:
            self._bound = cur.mogrify(*self.statement)
        return work.pipeline.commit_then_read(cur, self._bound, result=result)

    def read(self, cur) -> tuple:
        """The look alone, after a COMMIT it did not ride (the caller's own)."""
        self.taken += 1
        cur.execute(*self.statement)
        return cur.fetchone()


class Bell:
    """The ring, a long-running producer's way: hold a bell, and ring it after a commit that a consumer
    is watching for, by taking the other bell and releasing the held one (bells.ring)."""

    def __init__(self, session: Session, queue: str, locks: QueueLocks):
        self.session = session
        self.queue = queue
        self.locks = locks
        self.held: int | None = None  # index of the bell we hold
        self.rings = 0  # rings sent: tests and the benchmark read it
        self.look = Look(bells.ring_look(locks))
        self._generation = -1
        self._retry_ringer_at = 0.0
        self._told_not_ringer = False
        self._announced = False  # see announce()
        self._replied: int | None = None  # the last ring_if_watched's reply, once read (_settle)

    def become_ringer(self) -> bool:
        """Become this queue's ringer if none is."""
        if self.session.generation != self._generation:
            # A new lock connection (or none yet): whatever we held died with the old one.
            self.held = None
        if self.held is not None:
            # The last ring's reply, read now (it came long ago, as a rule): the look after our
            # COMMIT must see the ring done. A lost connection shows as a new generation.
            try:
                self.session.conn
            except (DriverError, errors.NotifyqError) as e:
                ring_log.debug("the last ring failed, becoming ringer again error=%s", e)
                self._forget()
            self._settle()
            if self.held is not None and self.session.generation == self._generation:
                return True
            self.held = None
        if time.monotonic() < self._retry_ringer_at:
            return False
        try:
            if advisory.get_lock(self.session, self.locks.ringer, 0) != 1:
                # Another producer rings this queue's bells. Ask again in a while, not on every
                # put: at hundreds of puts a second the refused GET_LOCK was a statement each.
                self._retry_ringer_at = time.monotonic() + RINGER_RETRY_S
                if not self._told_not_ringer:  # once: why this producer's jobs start later
                    self._told_not_ringer = True
                    ring_log.info("another producer rings this queue's bell (one per queue and server): "
                             "this one wakes the consumers by interrupting their wait (wakeup.instant_wake), "
                             "else their poll finds its jobs, within wakeup.poll_max_s queue=%s", self.queue)
                return False
            self._generation = self.session.generation
            self._announced = False
            advisory.hold_session(self.session)
            # Either bell will do: a watcher chooses the one it sees held. One is busy only for
            # the instant a watcher's statement holds a grant.
            for bell, wait_s in ((0, 0), (1, 0), (0, 5)):
                if advisory.get_lock(self.session, self.locks.bells[bell], wait_s) == 1:
                    self.held = bell
                    break
            else:
                self._forget()
                return False
            if self.session.generation != self._generation:
                # Reconnected in between: the ringer lock is gone, but this connection may hold
                # the bell; a later become_ringer would take it twice and one release would never ring.
                self._forget()
                return False
            return True
        except DriverError as e:
            if locks_unavailable(e):
                self.held = None
                return False
            raise

    def announce(self) -> bool:
        """Whether an idle watcher can be waiting on this bell yet. Not until it has read the
        locks again since we took it (it sleeps while no ringer holds a bell): the first call
        after arming says no, and its put wakes the watcher another way (the instant wake),
        which makes it read them; from the next call on, yes."""
        if self._announced:
            return True
        self._announced = True
        return False

    def commit_and_look(self, work: Session, cur, result: Any) -> tuple | None:
        """COMMIT the put's transaction on `work` and, in that round trip, look whether a consumer
        watches: the row for after_commit()."""
        return self.look.with_commit(work, cur, result)

    def ring_if_watched(self) -> bool:
        """After a COMMIT this bell did not look after (the caller's own, `put(conn=...)`): ring
        if a consumer watches, the look and the ring in one statement on the bell's session, not
        waited for (bells.ring_if_watched): the look's round trip before the ring was most of
        the time from the caller's COMMIT to the watcher's wake-up. Its reply, read before the
        session's next statement (_settle), says which bell is ours and opens the quiet window
        if nobody watched. Nothing inside that window. False when the statement could not be
        sent (the connection is gone, and the bell with it): the caller wakes another way.
        A reply that says the bell was lost comes too late for this wake-up: the watcher's
        poll finds the jobs (it sleeps while no ringer holds a bell), and the next put arms again."""
        self.session.pipeline.read_reply()  # the last one's, if still on the wire (it came long ago, as a rule)
        self._settle()
        if self.held is None or self.session.generation != self._generation:
            return False
        if not self.look.due():
            return True
        self.look.taken += 1
        bells.ring_if_watched(self.session, self.locks, self._reply)
        if self.session.pipeline.pending is None or self.session.generation != self._generation:
            self._forget()  # not sent (the connection failed and was dropped, the bell with it)
            return False
        return True

    def _reply(self, code: int) -> None:
        """ring_if_watched's reply, read inside the session's read of it: kept for _settle,
        which may end the connection (not to be done in the middle of reading from it)."""
        self._replied = code

    def _settle(self) -> None:
        """Follow the last ring_if_watched's reply, once read: which bell is ours, whether it
        rang, whether nobody watched (the quiet window); -1: let go of everything."""
        code, self._replied = self._replied, None
        if code is None or self.held is None:
            return
        if code < 0:
            ring_log.debug("the bell was lost or its ring failed, becoming ringer again")
            self._forget()
            return
        self.held = code % 10
        if code >= 20:
            self.rings += 1
        else:
            self.look.saw_nobody()

    def after_commit(self, seen: tuple | None) -> bool:
        """Ring if a consumer watches the queue. `seen` is the look's row (watch holder, bell 0
        and bell 1 holders), read after our COMMIT: nobody watching then means whoever watches
        later reads the count after our jobs, so no ring is needed. None: the look failed; ring
        anyway (one needless claim at worst). False when a watcher may be left unrung (the bell
        was lost, or the ring failed): the caller wakes it another way if it can."""
        if self.held is None:
            return True
        if self.session.generation != self._generation:
            self._forget()
            return False
        if seen is not None:
            watcher, *holders = seen
            mine = self.session.connection_id
            if [holder == mine for holder in holders] != [self.held == 0, self.held == 1]:
                # Our lock connection lost its bell (killed, the server restarted, or the last
                # ring could not take the other bell): let go of everything and become ringer
                # again on a fresh connection at the next put.
                self._forget()
                return watcher is None
            if watcher is None:
                self.look.saw_nobody()
                return True
        try:
            bells.ring(self.session, self.locks, self.held)
        except (DriverError, errors.NotifyqError) as e:
            # The jobs are committed. Become ringer again at the next put.
            ring_log.debug("ring failed error=%s", e)
            self._forget()
            return False
        if self.session.generation != self._generation:
            self._forget()  # a new connection that holds neither bell: start over
            return False
        self.held = 1 - self.held  # the next look checks it
        self.rings += 1
        return True

    def _forget(self) -> None:
        # Drop the lock connection: the server frees the ringer and both bells with it, at
        # once and whatever state they were in; the next put re-arms on a fresh connection.
        self.session.discard()
        self.held = None
        self._generation = -1
        self.look.forget()

    def stop_ringing(self) -> None:
        """At close: give up the ringer lock and the bell, waking the watcher to its polling."""
        # The bell first: releasing it wakes the watcher, which then finds no bell held (no
        # ringer) and sleeps with backoff.
        self.session.pipeline.read_reply()  # a ring_if_watched's, if on the wire: which bell is ours
        self._settle()
        names = ([self.locks.bells[self.held]] if self.held is not None else list(self.locks.bells))
        for name in (*names, self.locks.ringer):
            try:
                advisory.release_lock(self.session, name)
            except Exception:  # closing anyway; the server frees them with the session
                pass
        self.held = None


def instant_wanted(config: Config, instant: bool | None = None) -> bool:
    """Whether the instant wake may be tried: `instant` (None: `wakeup.instant_wake`) is not
    False, and locks are on. (InstantWake.usable says whether one queue's still tries.)"""
    mode = config.wakeup.instant_wake
    return (mode if instant is None else instant) is not False and config.wakeup.use_locks


class InstantWake:
    """One producer's instant wake for its queue: whether it still tries, and its look."""

    def __init__(self, queue: str, locks: QueueLocks, insist: bool = False):
        self.queue = queue
        self.locks = locks
        self.insist = insist  # instant_wake = true: a refusal does not stop it
        self.off: str | None = None  # why it stopped for good: "refused", "proxy", "no locks"
        self.kills = self.refusals = 0  # tests and benchmarks read them
        self.look = Look(bells.instant_look(locks))
        self._told_refused = False

    def follow(self, mode: bool | str) -> None:
        """Take `wakeup.instant_wake` as it is now (a consumer's reload changes it): true tries
        again after a refusal that stopped "auto", and "auto" stops at its next refusal. A stop
        for a proxy or a server without locks holds whatever the mode: nothing a reload says
        makes a KILL safe there."""
        self.insist = mode is True
        if self.insist and self.off == "refused":
            self.off = None

    def usable(self, mode: bool | str) -> InstantWake | None:
        """Itself, following `mode` (`wakeup.instant_wake` now), unless it stopped for good."""
        self.follow(mode)
        return self if self.off is None else None

    def commit_and_look(self, work: Session, cur, result: Any) -> bool:
        """Inside a put's body on `work`: COMMIT with the look in its round trip, then the KILL,
        on that connection, if a consumer watches. False: the look failed after the COMMIT (the
        session is dropped): the caller wakes after the put with wake()."""
        seen = self.look.with_commit(work, cur, result)
        if seen is None:
            return False
        self._act(work, cur, *seen)
        return True

    def wake(self, session: Session) -> None:
        """After a COMMIT this did not carry (the caller's own, or a look that failed): read the
        holder and KILL on `session`. Best effort: never raises."""
        if self.off is not None:
            return
        try:
            session.run(lambda cur: self._act(session, cur, *self.look.read(cur)), what="instant wake")
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
            self.look.saw_nobody()
            return
        try:
            outcome = advisory.kill_query(cur, holder)
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


class Waker:
    """One producer's wake-ups for its queue on one server. Not thread-safe: its producer calls
    it under its own lock."""

    def __init__(self, queue: str, locks: QueueLocks, config: Config, *, ring: bool, retry: dict[str, Any]):
        self.queue = queue
        self.locks = locks
        self.config = config
        self.ring = ring
        self._retry = retry
        self.session: Session | None = None  # the bell's, and wake()'s: opened on first use
        self.bell: Bell | None = None
        # Kept for the producer's life, since what it learnt (another database user, a proxy)
        # outlives a reconnect.
        self.instant: InstantWake | None = None
        # Another producer's wake(), when that one wakes for this one's puts (leave_to).
        self.left_to: Callable[[], None] | None = None

    def leave_to(self, wake: Callable[[], None]) -> None:
        """Leave the wake-up after this producer's COMMITs to `wake` (another producer's wake():
        AsyncProducer's first session's, which rings the queue's bell): this Waker then takes no
        look and no instant wake of its own, so the consumers are not woken twice per put.
        `wake` takes that producer's own lock, so it is safe to call from any thread, and only
        the wake-up waits for it, never this producer's COMMIT."""
        self.left_to = wake

    def commit_and_wake(self, work: Session, put: Callable[[Any], T], *, what: str,
                        committed: Callable[[Any, T], bool]) -> T:
        """Run `put(cursor)` as one transaction on `work` (Session.run, not idempotent: after a
        COMMIT whose reply was lost, `committed` says whether it landed), and wake an idle
        consumer for what it committed. The COMMIT carries the chosen way's look in its round
        trip; if that look is lost (with the COMMIT's reply, or after it), the way wakes anyway.
        Left to another producer (leave_to): a plain COMMIT, then that producer's wake()."""
        if self.left_to is not None:
            result = work.run(put, what=what, idempotent=False, committed=committed)
            self.left_to()
            return result
        way = self._way(None)
        if way is not None and not way.look.due():
            way = None  # the quiet window of a look that saw nobody: a plain COMMIT (Session.run's)
        seen: list[Any] = [None]

        def body(cur) -> T:
            seen[0] = None
            result = put(cur)
            if way is not None:
                seen[0] = way.commit_and_look(work, cur, result)
            return result

        result = work.run(body, what=what, idempotent=False, committed=committed)
        if way is None:
            return result
        # The bell rings now, on its own session; the instant wake's KILL went in the body, on
        # the put's connection, unless its look was lost (seen: False, or None).
        woken = way.after_commit(seen[0]) if isinstance(way, Bell) else seen[0]
        if not woken and (instead := self._instant(None)) is not None:
            instead.wake(work)  # the bell was lost with a consumer watching, or the look was
        return result

    def wake(self, instant: bool | None = None) -> None:
        """After a COMMIT this did not carry (the caller's own): look whether a consumer watches,
        on the Waker's session, and wake it. `instant`: whether the instant wake may be used
        (None: as `wakeup.instant_wake` says; left to another producer: its wake() decides).
        Best effort: it never raises."""
        if self.left_to is not None:
            self.left_to()
            return
        try:
            way = self._way(instant)
            if isinstance(way, Bell):
                if way.ring_if_watched():
                    return
                way = self._instant(instant)  # the bell was lost with a consumer watching
            if way is not None and way.look.due():
                way.wake(self._session())
        except (errors.NotifyqError, DriverError) as e:
            log.debug("wake failed, the consumers' poll finds the jobs queue=%s error=%s", self.queue, e)

    def watch_looked_at(self) -> str | None:
        """The watch lock whose holder wake() would look for now (the instant wake's look, on a
        Waker that rings no bell and leaves its wakes to nobody), or None: then wake() takes no
        such look, and a caller that read the holder itself cannot stand in for it."""
        if self.left_to is not None or self.ring:
            return None
        return self.locks.watch if self._instant(None) is not None else None

    def saw_nobody_watching(self) -> None:
        """The caller read the watch lock's holder itself (watch_looked_at) and found nobody:
        what wake() would have made of its own look, without sending it (its quiet window
        starts, unless one runs already: then wake() would have sent none)."""
        instant = self._instant(None) if self.left_to is None and not self.ring else None
        if instant is not None and instant.look.due():
            instant.look.saw_nobody()

    def reload(self, config: Config) -> None:
        """The settings the next wake reads (a consumer's reload: `wakeup.instant_wake`); its
        session and bell stay as they are, on the server (dsn) the process started with."""
        self.config = config

    def close(self) -> None:
        """Give up the bell (which wakes its watcher to its polling) and close the session."""
        if self.bell is not None:
            self.bell.stop_ringing()
        self._end(Session.close)

    def drop(self) -> None:
        """Close the session without a word to the server (it is gone): the bell dies with it."""
        self._end(Session.discard)

    def _end(self, how: Callable[[Session], None]) -> None:
        if self.session is not None:
            how(self.session)
        self.session = self.bell = None

    def _way(self, instant: bool | None) -> Bell | InstantWake | None:
        """Who wakes an idle consumer after the next COMMIT: the bell, once a watcher can be
        waiting on it; else the instant wake. A new ringer's first put is the instant wake's
        too: the watcher sleeps while no ringer holds a bell and waits on ours only from its
        next read on, so a ring would reach nobody."""
        bell = self._armed_bell()
        if bell is not None and bell.announce():
            return bell
        return self._instant(instant)

    def _instant(self, instant: bool | None) -> InstantWake | None:
        """The instant wake, unless `instant` (None: `wakeup.instant_wake`) is False, locks are
        off, or it stopped for good."""
        if not instant_wanted(self.config, instant):
            return None
        if self.instant is None:
            self.instant = InstantWake(self.queue, self.locks)
        return self.instant.usable(self.config.wakeup.instant_wake)

    def _armed_bell(self) -> Bell | None:
        if not self.ring or not self.config.wakeup.use_locks:
            return None
        if self.bell is None:
            self.bell = Bell(self._session(), self.queue, self.locks)
        return self.bell if self.bell.become_ringer() else None

    def _session(self) -> Session:
        if self.session is None:
            self.session = Session(self.config.dsn, autocommit=True, name="producer-locks", **self._retry)
        return self.session
