"""A KILL QUERY aimed at the work session while a job.transaction() block completes (the
kill_query fault class; a DBA may send them too) never lets the block's writes commit without
its job's completion: the block's transaction commits with the fenced completion or not at all.

A KILL QUERY does not always fail the statement it lands in: the server may answer a DELETE or
UPDATE it cut short with OK and no row changed, and read a subquery it cut short as NULL, without
an error. The completion query carried its own guard (a SELECT failing when the completion
changed no row) and the COMMIT: a KILL landing in both the completion and the guard let the
COMMIT run, storing the block's writes while the job stayed claimed (seed 3 of the fault
schedule: an effect committed twice)."""

from __future__ import annotations

import datetime as dt
import random
import threading
import time

import MySQLdb
from conftest import admin_connect
from test_effects import charge, charges, put  # noqa: F401 - charges is a fixture

from notifyq import errors
from notifyq.jobs import Job
from notifyq.store.completion import Completion
from notifyq.store.db import Session

TOKEN = 4242


def _claim(db, job_id: int) -> None:
    db.query("UPDATE nq_job SET status = 2, claim_token = %s, attempts = 1, "
             "lease_until = NOW(6) + INTERVAL 1 HOUR WHERE id = %s", (TOKEN, job_id))


def _job(job_id: int) -> Job:
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    return Job(id=job_id, queue="q", payload={}, priority=0, attempts=1, max_attempts=5, run_at=now, created_at=now)


class Storm:
    """KILL QUERY at the session's current connection, every 0.15 ms on average."""

    def __init__(self, db, session: Session, seed: int):
        self.session, self.rng = session, random.Random(seed)
        self.killer = admin_connect(db.admin, db.admin.database)
        self.stop = threading.Event()
        self.kills = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.rng.random() / 3000):
            conn_id = self.session.connection_id
            if conn_id is None:
                continue
            try:
                self.killer.query(f"KILL QUERY {int(conn_id)}".encode())
                self.kills += 1
            except MySQLdb.Error:
                pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
        self.killer.close()
        return False


def _run_blocks(completion: Completion, jobs, seconds: float, *, committed: int = 0,
                at_most_s: float = 0.0) -> dict[str, int]:
    """Each job's block (one effect row) again and again for `seconds`, and on, up to
    `at_most_s`, until `committed` blocks committed (a loaded machine gets through fewer blocks
    a second: a killed read waits out its read timeout); how each one ended."""
    ends: dict[str, int] = {}
    started = time.monotonic()

    def more() -> bool:
        elapsed = time.monotonic() - started
        return elapsed < seconds or (ends.get("committed", 0) < committed and elapsed < at_most_s)

    while more():
        job = jobs()
        if job is None:
            break
        try:
            with completion.transaction(job) as cur:
                charge(job, cur)
            end = "committed"
        except (errors.NotifyqError, MySQLdb.Error) as e:
            end = type(e).__name__
        ends[end] = ends.get(end, 0) + 1
    return ends


def test_a_block_whose_claim_was_taken_back_never_commits_under_a_storm_of_kill_query(db, charges):
    # Given a job claimed under another token (its claim was taken back: every completion of
    # this run matches no row), and a storm of KILL QUERY at the work session
    [job_id] = put(db)
    _claim(db, job_id)
    session = Session(db.config().dsn, name="work", read_timeout_s=1)
    completion = Completion(session, TOKEN + 1, keep=False)
    try:
        with Storm(db, session, seed=3) as storm:
            # When the stale run's block writes its row and completes, again and again, for 8 s
            ends = _run_blocks(completion, lambda: _job(job_id), 8)
        # Then no block committed: not one effect row, and the job is still claimed by its token
        assert storm.kills > 1000, storm.kills
        assert ends.get("ClaimLost", 0) > 20, ends
        assert "committed" not in ends, ends
        assert charges() == [], ends
        assert db.query("SELECT status, claim_token FROM nq_job WHERE id = %s", (job_id,)) == [(2, TOKEN)]
    finally:
        session.close()


def test_a_block_under_a_storm_of_kill_query_commits_with_its_completion_or_not_at_all(db, charges):
    # Given claimed jobs, and a storm of KILL QUERY at the work session
    ids = put(db, 400)
    for job_id in ids:
        _claim(db, job_id)
    session = Session(db.config().dsn, name="work", read_timeout_s=1)
    completion = Completion(session, TOKEN, keep=False)
    todo = iter(ids)
    try:
        with Storm(db, session, seed=5):
            # When each one's block writes its row and completes it
            ends = _run_blocks(completion, lambda: next((_job(i) for i in todo), None), 20,
                               committed=51, at_most_s=90)
        # Then a job's effect row is stored exactly when its completion is: never one without
        # the other
        stored = {job_id for job_id, _ in charges()}
        left = {job_id for (job_id,) in db.query("SELECT id FROM nq_job")}
        ran = set(ids) - {i for i in todo}
        assert ends.get("committed", 0) > 50, ends
        assert stored & left == set(), ends
        assert ran - stored - left == set(), ends
    finally:
        session.close()


def test_a_completion_whose_reply_is_not_coming_is_ended_by_the_stall_watch_and_stores_nothing(db, charges):
    """A KILL QUERY between two statements of the completion query makes the server drop the
    rest unanswered: the read then held the job's row lock until its read timeout (a minute; the
    reaper's reclaim failed with 1205 meanwhile). The call is watched as any of the session's."""
    from notifyq.consume.stall import StallWatch

    # Given a claimed job whose block's completion query gets no reply: the server ran it and
    # lists the session idle (here the reply is read behind the driver's back), 60 s read timeout
    [job_id] = put(db)
    _claim(db, job_id)
    session = Session(db.config().dsn, name="work", read_timeout_s=60)
    completion = Completion(session, TOKEN, keep=False)
    watch = StallWatch(db.config().dsn)
    ends: list[str] = []

    def block() -> None:
        try:
            with completion.transaction(_job(job_id)) as cur:
                charge(_job(job_id), cur)
                real = cur.execute

                def execute(query, args=None):
                    if b"RELEASE SAVEPOINT" not in (query if isinstance(query, bytes) else query.encode()):
                        return real(query, args)
                    real(query, args)
                    while cur.nextset():
                        pass
                    cur.connection.read_query_result()  # a reply that is not coming
                    return None

                cur.execute = execute
            ends.append("committed")
        except errors.NotifyqError as e:
            ends.append(type(e).__name__)

    started = time.monotonic()
    thread = threading.Thread(target=block, daemon=True)
    thread.start()
    try:
        # When the stall watch checks the work session once the call is overdue
        deadline = time.monotonic() + 10
        while not watch.ended and time.monotonic() < deadline:
            watch.check([("work", session)], 0.5)
            time.sleep(0.1)
        thread.join(10)
        # Then its connection was ended within seconds, not at the read timeout, and nothing of
        # the block is stored: the job is still claimed, for its next run
        assert not thread.is_alive() and time.monotonic() - started < 15
        assert watch.ended == 1 and ends == ["TransientDBError"]
        assert charges() == []
        assert db.query("SELECT status, claim_token FROM nq_job WHERE id = %s", (job_id,)) == [(2, TOKEN)]
    finally:
        session.close()
