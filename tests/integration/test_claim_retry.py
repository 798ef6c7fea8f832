"""A claim retried after a read timeout leaves nothing claimed under its token that it does not
deliver: the first attempt's transaction may still be running on the server when the client
gives up on it, and commit after the retry looked for its rows. And a claim whose mark stalls
(sent with its COMMIT, not waited for) delivers its jobs at once and strands none of them."""

from __future__ import annotations

import time

import pytest

from conftest import wait_until

from notifyq.produce.producer import Producer
from notifyq.store import queries
from notifyq.store.db import Session

OWNER = "r" * 32
STALL_S = 4
READ_TIMEOUT_S = 2


def _stall_updates_of(db, connection_id: int, table: str, when: str, condition: str) -> None:
    """An UPDATE of `table` matching `condition` sleeps STALL_S at its first matching row, on
    that one connection only (a server stalled mid-statement, once: past the read timeout is what
    counts, and a stall per row would only lengthen the test); the retry, on a new connection,
    runs at full speed.
    The trigger reads an InnoDB table: a consistent read, no lock the retry could wait on. It
    runs as the runtime user, so the stalled session stays the consumer's own (as a session
    stalled in I/O would), and the consumer may see and end it."""
    definer = f"'{db.dsn.user}'@'%'"
    db.query("CREATE TABLE nq_test_stall (id BIGINT UNSIGNED PRIMARY KEY) ENGINE=InnoDB")
    db.query("INSERT INTO nq_test_stall VALUES (%s)", (connection_id,))
    db.query(f"GRANT SELECT ON nq_test_stall TO {definer}")
    db.query(f"GRANT TRIGGER ON {table} TO {definer}")
    db.query(f"""
        CREATE DEFINER = {definer} TRIGGER nq_test_stall {when} UPDATE ON {table} FOR EACH ROW
        BEGIN
          IF {condition} AND @nq_test_stalled IS NULL
             AND EXISTS (SELECT 1 FROM nq_test_stall WHERE id = CONNECTION_ID()) THEN
            SET @nq_test_stalled = 1;
            DO SLEEP({STALL_S});
          END IF;
        END""")


def _stalled_claimer(db, table: str, when: str, condition: str) -> tuple[list[int], Session, int]:
    """3 ready jobs (and 500 scheduled: a table big enough for its indexes), and a consumer's work
    session whose UPDATEs of `table` matching `condition` stall: (the ready ids, the session,
    its first connection's id)."""
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(3)])
        p.put_many([{"n": i} for i in range(500)], delay=3600)
    session = Session(cfg.dsn, read_timeout_s=READ_TIMEOUT_S)
    first_connection = session.conn.thread_id()
    _stall_updates_of(db, first_connection, table, when, condition)
    return ids, session, first_connection


def _wait_gone(db, connection_id: int) -> None:
    wait_until(lambda: not db.query("SELECT ID FROM information_schema.PROCESSLIST WHERE ID = %s",
                                    (connection_id,)), STALL_S * 6, message="the first attempt ended")


@pytest.mark.parametrize("when", ["BEFORE", "AFTER"])
def test_a_claim_retried_after_a_read_timeout_leaves_no_undelivered_rows_under_its_token(db, when):
    # Given 3 ready jobs, and a server that stalls the first watcher claim's record of the
    # watched count past the read timeout, in a claim whose last statements are waited for:
    # one carrying acks (here of a batch none of whose rows is left)
    ids, session, first_connection = _stalled_claimer(db, "nq_queue", when, "NEW.watched_seq <> OLD.watched_seq")
    try:
        # When a consumer claims: its first attempt times out, it reconnects and claims again
        started = time.monotonic()
        claim = queries.claim(session, "q", OWNER, 3, 60, as_watcher=True, acks=queries.Acks([0], 1, False))
        assert session.connection_id != first_connection, "the claim was retried on a new connection"
        # Then once the first attempt's server thread is gone, whatever it did is settled ...
        _wait_gone(db, first_connection)
        # ... and the rows claimed under our name are exactly the ones delivered: none waits for
        # its lease under a token nobody runs
        delivered = sorted(job.id for job in claim.jobs)
        held = sorted(r[0] for r in db.query("SELECT id FROM nq_job WHERE status = 2 AND owner = %s", (OWNER,)))
        assert held == delivered, (held, delivered)
        # And every job is claimable or delivered
        ready = sorted(r[0] for r in db.query("SELECT id FROM nq_job WHERE status = 0 AND id IN %s", (ids,)))
        assert sorted(delivered + ready) == ids
        print(f"\nclaim retried after the read timeout: {len(delivered)} delivered, "
              f"{time.monotonic() - started:.1f}s")
    finally:
        session.close()


@pytest.mark.parametrize("when", ["BEFORE", "AFTER"])
def test_a_claim_whose_mark_stalls_delivers_at_once_and_its_acks_land_once_the_mark_does(db, when):
    # Given 3 ready jobs, and a server that stalls the claim's mark (sent with its COMMIT, not
    # waited for) past the session's read timeout
    ids, session, first_connection = _stalled_claimer(db, "nq_job", when, "NEW.status = 2 AND OLD.status <> 2")
    try:
        # When a consumer claims
        started = time.monotonic()
        claim = queries.claim(session, "q", OWNER, 3, 60)
        # Then the jobs come back at once: their rows are locked, the mark runs meanwhile
        assert sorted(job.id for job in claim.jobs) == ids
        assert time.monotonic() - started < STALL_S
        # When the consumer acks them: the COMMIT's reply is read first (the read times out:
        # the claim counts as lost), and the ack, on a new connection, waits for the rows
        queries.ack(session, ids, claim.token, keep=False)
        assert claim.commit is not None and claim.commit.settled
        _wait_gone(db, first_connection)
        # Then nothing is left claimed under our token: all acked (the mark landed, and an ack
        # attempt after it; a retried ack may count 0 of them, its earlier attempt having
        # deleted them), or all ready again (the claim was lost, and they run elsewhere)
        rows = db.query("SELECT id, status FROM nq_job WHERE id IN %s", (ids,))
        assert not [r for r in rows if r[1] != 0], rows
        assert sorted(r[0] for r in rows) in ([], ids), rows
    finally:
        session.close()


def test_a_watchers_claim_whose_watched_count_stalls_delivers_at_once(db):
    # Given 3 ready jobs, and a server that stalls a watcher claim's record of the watched count
    # (sent with its mark and COMMIT, not waited for) past the session's read timeout
    ids, session, first_connection = _stalled_claimer(db, "nq_queue", "BEFORE", "NEW.watched_seq <> OLD.watched_seq")
    try:
        # When the watcher claims them
        claim = queries.claim(session, "q", OWNER, 3, 60, as_watcher=True)
        # Then the jobs come back at once, on the first attempt: their rows are locked, and the
        # record runs meanwhile (the watch's hand-on waits for its COMMIT on the server)
        assert sorted(job.id for job in claim.jobs) == ids and claim.drained
        assert session.connection_id == first_connection, "no read timeout, no retry"
    finally:
        session.close()


def test_a_watchers_claim_whose_signal_read_comes_back_null_is_run_again(db, monkeypatch):
    """Regression (an attack's storm of KILL QUERY at the claim statements): MariaDB answered a
    KILL that cut the claim's read of the signal total with OK and a NULL total, not with 1317;
    int(None) raised a TypeError that ended the worker, and with it the consumer process. The
    read is taken as cut short: the claim is rolled back and run again, as after the KILL's 1317."""
    # Given 2 ready jobs, and a claim whose first read of the signal total comes back NULL
    with Producer("q", db.config()) as p:
        ids = sorted(p.put_many([{"n": 0}, {"n": 1}]))
    read = queries._signal_read
    totals = []

    def first_cut(total, queue):
        totals.append(total)
        return read(None if len(totals) == 1 else total, queue)

    monkeypatch.setattr(queries, "_signal_read", first_cut)
    session = Session(db.config().dsn, name="test", retry_s=30)
    try:
        # When the watcher claims
        claim = queries.claim(session, "q", OWNER, 10, 60, as_watcher=True)
        # Then it ran again and took both jobs; nothing raised
        assert sorted(job.id for job in claim.jobs) == ids
        assert len(totals) == 2 and totals[1] is not None
    finally:
        session.close()
