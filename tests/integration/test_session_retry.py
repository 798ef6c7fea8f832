"""Session.run across a lost connection: retried whole, and the return says so in one line."""

from __future__ import annotations

import logging

from conftest import admin_connect

from notifyq.store.db import Session


class Lines(logging.Handler):
    """The notifyq.db log, caught on the logger itself (notifyq's loggers may not propagate)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> "Lines":
        logger = logging.getLogger("notifyq.db")
        self._level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logger = logging.getLogger("notifyq.db")
        logger.removeHandler(self)
        logger.setLevel(self._level)


def test_a_transaction_whose_connection_was_killed_is_rerun_and_the_session_says_it_is_back(db):
    session = Session(db.admin, retry_s=10)
    try:
        assert session.run(lambda cur: (cur.execute("SELECT 1"), cur.fetchone()[0])[1], what="test") == 1
        # Given its connection killed by the server
        conn = admin_connect(db.admin)
        conn.cursor().execute("KILL %s", (session.connection_id,))
        conn.close()
        # When the next transaction runs
        with Lines() as log:
            value = session.run(lambda cur: (cur.execute("SELECT 2"), cur.fetchone()[0])[1], what="test")
        # Then it returns its result on a new connection, and one line says the server is back
        assert value == 2
        back = [line for line in log.lines if "reachable again" in line]
        assert len(back) == 1 and "what=test attempts=2" in back[0], back
    finally:
        session.close()


def test_a_deadlock_retried_is_not_announced_as_an_outage(db):
    session = Session(db.admin, retry_s=10)
    calls = []

    def body(cur):
        calls.append(1)
        if len(calls) == 1:
            cur.execute("SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'deadlock'")
        cur.execute("SELECT 3")
        return cur.fetchone()[0]

    try:
        with Lines() as log:
            assert session.run(body, what="test") == 3
        assert len(calls) == 2
        assert any("retrying what=test" in line for line in log.lines)
        assert not [line for line in log.lines if "reachable again" in line]
    finally:
        session.close()
