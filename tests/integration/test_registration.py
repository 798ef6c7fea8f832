"""A consumer's registration against a real server: its row is never written without its
liveness lock held on the connection that wrote it."""

from __future__ import annotations

import threading

from notifyq.consume.presence import Presence
from notifyq.store import liveness


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

        # Then its row records, per queue, the settings its claims apply
        recorded = json.loads(db.scalar("SELECT flow FROM nq_consumer WHERE id = %s", (consumer_id,)))
        assert recorded == {
            "api": {"limit": 10, "limit_per_key": 2, "key_limits": [["vip*", 5], ["vip-1", 1]], "rate": "",
                    "rate_per_key": "3/1h", "fair": True},
            "plain": {"limit": 0, "limit_per_key": 0, "key_limits": [], "rate": "", "rate_per_key": "",
                      "fair": False}}
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
                                   "rate_per_key": "", "fair": False}
    finally:
        stop.set()
        presence.close()
