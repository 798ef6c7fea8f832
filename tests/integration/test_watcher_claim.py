"""A watcher's claim reads and locks its jobs in one statement (claim_take): one round trip to the
rows instead of two, with what the two steps guaranteed: claim order, peers' locked rows
skipped, only the rows it returns locked, due jobs and a pause seen, and whether it left any
job behind (drained) told exactly."""

from __future__ import annotations

import pytest
from test_claim import _make_due

from notifyq.produce.producer import Producer
from notifyq.store import queries
from notifyq.store.db import Session
from notifyq.store.sql import QUERIES

OWNER = "w" * 32


@pytest.fixture
def sessions(db):
    made: list[Session] = []

    def session() -> Session:
        made.append(Session(db.config().dsn))
        return made[-1]

    yield session
    for s in made:
        s.conn.rollback()
        s.close()


@pytest.fixture
def lock_steps(monkeypatch):
    """Every call of the claim's lock-by-id step (the second round trip of the two steps)."""
    calls: list[list[int]] = []
    lock_window = queries.lock_window

    def counted(cur, ids, version, gate=None):
        calls.append(list(ids))
        return lock_window(cur, ids, version, gate)

    monkeypatch.setattr(queries, "lock_window", counted)
    return calls


def _unlocked(session: Session, ids: list[int]) -> set[int]:
    """Which of these rows no other transaction holds (a locking read that skips held rows)."""
    cur = session.conn.cursor()
    cur.execute("SELECT id FROM nq_job FORCE INDEX (PRIMARY) WHERE id IN %(ids)s FOR UPDATE SKIP LOCKED",
                {"ids": ids})
    free = {r[0] for r in cur.fetchall()}
    session.conn.rollback()
    return free


def test_a_watchers_claim_takes_its_jobs_in_one_locking_read_without_the_lock_by_id_step(db, sessions, lock_steps):
    # Given three ready jobs
    with Producer("q", db.config()) as p:
        ids = p.put_many([{"n": i} for i in range(3)])
    # When the woken watcher claims
    claim = queries.claim(sessions(), "q", OWNER, 10, 60, as_watcher=True)
    # Then it took them all, in claim order, with no lock-by-id step (a round trip less to the
    # handler), and drained the queue
    assert [j.id for j in claim.jobs] == ids and claim.drained
    assert lock_steps == []
    # (a busy worker's claim still reads candidates, then locks them by id)
    with Producer("q", db.config()) as p:
        more = p.put_many([{"n": i} for i in range(3)])
    busy = queries.claim(sessions(), "q", OWNER, 10, 60)
    assert [j.id for j in busy.jobs] == more and lock_steps == [more]


def test_claim_take_locks_exactly_the_rows_it_returns_and_no_gap(db, sessions):
    # Given six ready jobs, the first claimed and committed by a peer (its ix_state entry for
    # the ready state delete-marked, at the head of the index)
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(6)])
    peer = sessions()
    first = queries.claim(peer, "q", "p" * 32, 1, 60)
    peer.pipeline.read_reply()
    assert [j.id for j in first.jobs] == ids[:1] and not first.commit.failed
    # When one transaction's claim_take of two rows is held open
    a = sessions()
    cur = a.conn.cursor()
    cur.execute(QUERIES["claim_take"], {"queue": "q", "limit": 2})
    assert [r[0] for r in cur.fetchall()] == ids[1:3]
    # Then exactly those two rows are locked: not the peer's row it walked past, not the rows after
    b = sessions()
    assert _unlocked(b, ids) == {ids[0], *ids[3:]}
    # And a second claim_take skips them and takes the next ones
    cur_b = b.conn.cursor()
    cur_b.execute(QUERIES["claim_take"], {"queue": "q", "limit": 2})
    assert [r[0] for r in cur_b.fetchall()] == ids[3:5]
    b.conn.rollback()
    # And no gap is locked: puts before, among and after the locked entries, into this queue
    # and into another, go through at once (a wait would end in 1205 after a second)
    c = sessions()
    c_cur = c.conn.cursor()
    c_cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
    for queue, priority in (("q", 100), ("q", 0), ("q", -100), ("a", 0), ("z", 0)):
        c_cur.execute("INSERT INTO nq_job (queue, status, priority, run_at, max_attempts, payload) "
                      "VALUES (%(queue)s, 0, %(priority)s, NOW(6), 5, '{}')", {"queue": queue, "priority": priority})
    c.conn.commit()


def test_a_watchers_claim_is_drained_only_when_it_left_no_job_behind(db, sessions):
    cfg = db.config()
    session = sessions()
    # Given exactly a batch of ready jobs: the claim takes them all and has drained the queue
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(2)])
    claim = queries.claim(session, "q", OWNER, 2, 60, as_watcher=True)
    session.pipeline.read_reply()
    assert [j.id for j in claim.jobs] == ids and claim.drained
    # (it records the count it saw as watched)
    assert db.query("SELECT q.watched_seq = (SELECT SUM(seq) FROM nq_signal s WHERE s.queue = 'q') "
                    "FROM nq_queue q WHERE q.queue = 'q'") == [(1,)]
    # Given one job more than a batch: it takes a batch, is not drained, and the row it read to
    # know that is ready still, and let go with the COMMIT
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(3)])
    claim = queries.claim(session, "q", OWNER, 2, 60, as_watcher=True)
    session.pipeline.read_reply()
    assert [j.id for j in claim.jobs] == ids[:2] and not claim.drained
    assert db.scalar("SELECT status FROM nq_job WHERE id = %s", (ids[2],)) == 0
    assert _unlocked(sessions(), ids) == set(ids)


def test_a_watchers_claim_skips_a_peers_locked_rows_and_counts_them_taken(db, sessions):
    # Given two ready jobs, the first locked by a peer's claim under way
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(2)])
    peer = sessions()
    peer.conn.cursor().execute(QUERIES["claim_lock"], {"ids": ids[:1]})
    # When the watcher claims
    claim = queries.claim(sessions(), "q", OWNER, 10, 60, as_watcher=True)
    # Then it takes the other without waiting, and the queue is drained (the peer's job is taken)
    assert [j.id for j in claim.jobs] == ids[1:] and claim.drained


def test_a_watchers_claim_takes_a_due_job_of_a_better_priority_first(db, sessions):
    # Given a ready job and a scheduled one of a higher priority that has fallen due
    cfg = db.config()
    with Producer("q", cfg) as p:
        ready = p.put({"n": 1})
        due = p.put({"n": 2}, delay=3600, priority=5)
    _make_due(db, [due])
    # When the watcher claims
    claim = queries.claim(sessions(), "q", OWNER, 10, 60, as_watcher=True)
    # Then the due job is promoted and comes first
    assert [j.id for j in claim.jobs] == [due, ready] and claim.drained


def test_a_watchers_claim_of_a_paused_queue_takes_nothing_and_holds_nothing(db, sessions):
    # Given a paused queue with ready jobs
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(3)])
    session = sessions()
    queries.set_paused(session, "q", True)
    # When the watcher claims
    claim = queries.claim(session, "q", OWNER, 10, 60, as_watcher=True)
    # Then nothing is taken, and no row stays locked
    assert claim.paused and not claim.jobs
    assert _unlocked(sessions(), ids) == set(ids)
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 0") == 3
