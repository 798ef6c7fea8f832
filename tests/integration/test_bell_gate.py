"""Two rings between the watcher's read of the count and its wait on the bell: the first releases
the bell the watcher is about to wait on, the second would take it back (ABA), and the watcher
would sleep through both. The interleaving is forced here with the statements themselves."""

from __future__ import annotations

import time

import pytest

from conftest import wait_until

from notifyq.store import advisory, bells, queries
from notifyq.store.db import Session
from notifyq.store.locks import QueueLocks

WAIT_S = 3.0  # the watcher's wait on the bell: a ring slept through would end it by this timeout
HOLD_S = 10.0


def _ring_arrived(db, producer: Session, bell: str) -> bool:
    """The producer's ring statement is at the server: it holds `bell`, or waits on a lock."""
    me = producer.connection_id
    return (db.scalar("SELECT IS_USED_LOCK(%s)", (bell,)) == me
            or db.scalar("SELECT STATE FROM information_schema.PROCESSLIST WHERE ID = %s", (me,)) == "User lock")


def test_a_watcher_that_saw_a_bell_held_is_granted_it_after_two_rings_before_its_wait(db):
    # Given a ringer holding bell 0, and the watcher (it holds the watch lock), whose statement
    # saw bell 0 held at its end, with no new work
    cfg = db.config()
    locks = QueueLocks(cfg.dsn.database, "q")
    watcher = Session(cfg.dsn, autocommit=True, name="watcher")
    producer = Session(cfg.dsn, autocommit=True, name="ringer")
    try:
        watcher.run(lambda cur: queries.ensure_queue(cur, "q"), what="t")
        assert advisory.get_lock(watcher, locks.watch, 0) == 1
        assert advisory.get_lock(producer, locks.bells[0], 0) == 1
        seen = bells.watch(watcher, "q", locks, None, 0)
        assert seen.waited is None and seen.held == 0
        # When the ringer rings twice before the watcher's next statement waits on bell 0 (the
        # count stays as the watcher read it: the first ring's job taken by another consumer,
        # the second one's committed after the read): bell 0 released, then taken back
        bells.ring(producer, locks, 0)
        producer.pipeline.read_reply()
        assert db.scalar("SELECT IS_USED_LOCK(%s)", (locks.bells[1],)) == producer.connection_id
        bells.ring(producer, locks, 1)  # not waited for: its reply is read below
        wait_until(lambda: _ring_arrived(db, producer, locks.bells[0]), HOLD_S, message="the second ring at the server")
        started = time.monotonic()
        woke = bells.watch(watcher, "q", locks, seen.held, WAIT_S)
        took = time.monotonic() - started
        # Then the watcher is granted bell 0 at once: the second ring took it back only after
        # that, not before (which would leave the watcher asleep until its wait timed out)
        assert woke.waited == 1, f"slept through two rings: waited={woke.waited} after {took:.2f}s"
        assert took < WAIT_S / 2, took
        # And the second ring still rang, once the watcher was through: the ringer holds bell 0
        producer.pipeline.read_reply()
        assert db.scalar("SELECT IS_USED_LOCK(%s)", (locks.bells[0],)) == producer.connection_id
        assert db.scalar("SELECT IS_USED_LOCK(%s)", (locks.bells[1],)) is None
    finally:
        watcher.close()
        producer.close()


@pytest.mark.parametrize("wait_on", [None, 0], ids=["new turn", "bell gated"])
def test_a_watcher_that_sees_neither_bell_held_while_a_ringer_is_there_does_not_sleep_through_its_rings(db, wait_on):
    # Given a ringer that holds the ringer lock but, at the moment the watch statement looks,
    # neither bell: what the statement's two looks at the two bells saw when a ring from bell 1
    # to bell 0 fell between them (bell 0 looked at before the ring took it, bell 1 after the
    # ring let it go)
    cfg = db.config()
    locks = QueueLocks(cfg.dsn.database, "q")
    watcher = Session(cfg.dsn, autocommit=True, name="watcher")
    producer = Session(cfg.dsn, autocommit=True, name="ringer")
    try:
        watcher.run(lambda cur: queries.ensure_queue(cur, "q"), what="t")
        assert advisory.get_lock(watcher, locks.watch, 0) == 1
        assert advisory.get_lock(producer, locks.ringer, 0) == 1
        # When the watcher's statement, with nothing new, would wait WAIT_S
        started = time.monotonic()
        seen = bells.watch(watcher, "q", locks, wait_on, WAIT_S)
        took = time.monotonic() - started
        # Then it does not sleep out its wait, deaf to the rings that follow: it reads again
        # at once (a new turn) or takes the free bell it waits on (granted: it goes to claim)
        assert took < WAIT_S / 2, f"slept {took:.2f}s: waited={seen.waited}"
        assert seen.waited == (1 if wait_on is not None else -1)
    finally:
        watcher.close()
        producer.close()
