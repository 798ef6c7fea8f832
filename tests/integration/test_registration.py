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
