"""A consumer's registration against a real server: its row is never written without its
liveness lock held on the connection that wrote it."""

from __future__ import annotations

import threading
import time

from conftest import wait_until

from notifyq.consume.presence import Presence
from notifyq.store import advisory, liveness
from notifyq.store.db import Session


def test_a_registration_whose_session_reconnects_between_the_lock_and_the_row_takes_its_lock_again(
        db, monkeypatch):
    # Given a consumer about to register, whose liveness session the server drops right after it
    # took its lock, before the row is written (as a restart between the two statements would)
    stop = threading.Event()
    presence = Presence(db.config(), ["q"], stop)
    register = liveness.register_consumer

    def dropped_first(session, *args, **kwargs):
        monkeypatch.setattr(liveness, "register_consumer", register)  # once
        db.query(f"KILL CONNECTION {int(session.connection_id)}")
        return register(session, *args, **kwargs)

    monkeypatch.setattr(liveness, "register_consumer", dropped_first)
    try:
        # When it registers
        consumer_id = presence.ensure_registered(holder=object())

        # Then its row is there, and its lock is held by its liveness session's present connection
        lock_name = db.scalar("SELECT lock_name FROM nq_consumer WHERE id = %s", (consumer_id,))
        assert lock_name is not None
        assert db.scalar("SELECT IS_USED_LOCK(%s)", (lock_name,)) == presence.session.connection_id
        assert presence.registration_current()
    finally:
        stop.set()
        presence.close()


def test_a_consumers_row_records_the_flow_settings_it_applies_per_queue_and_after_a_reload(db):
    # Given a consumer of a limited, fair, rated queue (a pattern override first, order kept)
    # and of a plain one
    import json

    config = db.config(queue={"api": {"limit": 10, "limit_per_key": 2, "key_limits": {"vip*": 5, "vip-1": 1},
                                      "rate_per_key": "3/1h", "fair": True}})
    stop = threading.Event()
    presence = Presence(config, ["api", "plain"], stop)
    try:
        # When it registers
        consumer_id = presence.ensure_registered(holder=object())

        # Then its row records, per queue, the settings its claims apply (and that they do not
        # keep the per-key counters: store/count_trust.py)
        recorded = json.loads(db.scalar("SELECT flow FROM nq_consumer WHERE id = %s", (consumer_id,)))
        assert recorded == {
            "api": {"limit": 10, "limit_per_key": 2, "key_limits": [["vip*", 5], ["vip-1", 1]], "rate": "",
                    "rate_per_key": "3/1h", "fair": True, "counts": False},
            "plain": {"limit": 0, "limit_per_key": 0, "key_limits": [], "rate": "", "rate_per_key": "",
                      "fair": False, "counts": False}}
        # When a reload lowers the queue's limit, and the consumer's next liveness check runs
        presence.reload(db.config(queue={"api": {"limit": 4}}))
        seat = object()
        assert presence.home.seat(seat, 5)
        try:
            presence.ensure_registered(seat)
        finally:
            presence.home.leave(seat)
        # Then its row records the settings it applies from now on, under the same id
        recorded = json.loads(db.scalar("SELECT flow FROM nq_consumer WHERE id = %s", (consumer_id,)))
        assert recorded["api"] == {"limit": 4, "limit_per_key": 0, "key_limits": [], "rate": "",
                                   "rate_per_key": "", "fair": False, "counts": False}
    finally:
        stop.set()
        presence.close()


def test_a_reload_that_changes_the_flow_settings_is_recorded_within_seconds_while_an_idle_worker_waits(db):
    # Given a registered consumer of a limited queue, idle: its worker waits for work on the home
    # session, holding its seat (the liveness check, which records them too, runs only when the
    # seat is next taken: up to an idle wait, or a keeper's ping interval, away)
    import json

    stop = threading.Event()
    presence = Presence(db.config(queue={"api": {"limit": 10}}), ["api"], stop)
    idle_worker = object()
    try:
        consumer_id = presence.ensure_registered(holder=object())

        def recorded_limit() -> int:
            return json.loads(db.scalar("SELECT flow FROM nq_consumer WHERE id = %s", (consumer_id,)))["api"]["limit"]

        assert recorded_limit() == 10
        assert presence.home.seat(idle_worker, 5)
        # When a reload lowers the limit
        presence.reload(db.config(queue={"api": {"limit": 4}}))
        # Then its row records the new limit within seconds, under the same id
        wait_until(lambda: recorded_limit() == 4, timeout=5, message="the reloaded limit recorded")
    finally:
        presence.home.leave(idle_worker)
        stop.set()
        presence.close()


def test_a_worker_queued_for_the_watch_lock_when_the_liveness_session_reconnects_waits_no_more(db):
    # Given a registered consumer whose idle worker waits, on the liveness session, for the
    # queue's watch lock, which a peer's watcher holds (idle_wait_s 20: how long it would wait)
    config = db.config(wakeup={"idle_wait_s": 20.0})
    stop = threading.Event()
    presence = Presence(config, ["q"], stop)
    worker = object()
    peer = Session(config.dsn, autocommit=True, name="peer-watcher")
    waited: list[tuple[bool, float]] = []
    queued = None
    try:
        presence.ensure_registered(worker)
        assert advisory.get_lock(peer, presence.home.waiter.locks.watch, 0) == 1
        assert presence.home.seat(worker, 5)
        home_id = presence.session.connection_id

        def queue_for_the_watch() -> None:
            got = presence.home.waiter.acquire_watch()
            waited.append((got, time.monotonic()))

        queued = threading.Thread(target=queue_for_the_watch, daemon=True)
        queued.start()
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s "
                                     "AND INFO LIKE %s", (home_id, "%GET_LOCK%")), 10,
                   message="the worker queued in GET_LOCK on the liveness session")

        # When the liveness session's connection ends (as every one does in a server restart)
        db.query(f"KILL CONNECTION {int(home_id)}")
        ended_at = time.monotonic()

        # Then the wait is not begun again on the new connection: the worker is back at once,
        # without the watch, and re-registers (taking its lock back) before it queues again. It
        # waited out idle_wait_s there, its liveness lock free all along: after a restart, past a
        # reaper's grace, and a peer took its process's running jobs back as a dead consumer's.
        queued.join(5)
        assert waited, "the worker still waits for the watch lock on the new connection"
        got, back_at = waited[0]
        assert got is False and back_at - ended_at < 5
        presence.ensure_registered(worker)
        lock_name = db.scalar("SELECT lock_name FROM nq_consumer WHERE id = %s", (presence.consumer_id,))
        assert db.scalar("SELECT IS_USED_LOCK(%s)", (lock_name,)) == presence.session.connection_id
    finally:
        peer.close()  # (the watch lock goes with it: a worker still queued gets it and returns)
        if queued is not None:
            queued.join(30)
        presence.home.leave(worker)
        stop.set()
        presence.close()


def test_a_reconnected_liveness_session_waits_for_a_reaper_judging_its_lock_and_keeps_its_id(db):
    # Given a registered consumer whose liveness session's connection ends (as in a restart),
    # while a reaper holds its lock to judge it (and will find it alive after all: within a
    # restart's grace, a consumer not back yet is not judged)
    stop = threading.Event()
    presence = Presence(db.config(), ["q"], stop)
    worker = object()
    reaper = Session(db.config().dsn, autocommit=True, name="reaper")
    try:
        consumer_id = presence.ensure_registered(worker)
        lock_name = db.scalar("SELECT lock_name FROM nq_consumer WHERE id = %s", (consumer_id,))
        db.query(f"KILL CONNECTION {int(presence.session.connection_id)}")
        wait_until(lambda: advisory.get_lock(reaper, lock_name, 0) == 1, 10, message="the reaper holds the lock")
        # (the verdict's transaction lets go a moment later: its length, not a wait for anything)
        let_go = threading.Timer(0.3, lambda: advisory.release_lock(reaper, lock_name))
        let_go.start()

        # When the consumer re-registers (its next claim's check)
        advisory.lock_holder(presence.session, lock_name)  # (its dead connection found, reconnected)
        again = presence.ensure_registered(worker)
        let_go.join()

        # Then it took its own lock back and kept its id: a new one left its old row, with the
        # claims its handlers still ran, to read as dead once the grace ended, and they were
        # taken back while they ran
        assert again == consumer_id
        assert db.scalar("SELECT IS_USED_LOCK(%s)", (lock_name,)) == presence.session.connection_id
        assert db.scalar("SELECT COUNT(*) FROM nq_consumer") == 1
    finally:
        reaper.close()
        stop.set()
        presence.close()
