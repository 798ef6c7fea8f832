"""Claims taken back, given back and extended, against a real server: who is charged for a crash,
suspects claimed alone, cancel requests honoured on every way back, leases of a live batch."""

from __future__ import annotations

import contextlib
import threading

import pytest
from conftest import admin_connect, wait_until

from notifyq.consume.service import ConsumeOptions, ConsumerService
from notifyq.jobs import Job
from notifyq.ops import admin
from notifyq.produce.producer import Producer
from notifyq.store import liveness, queries, schema
from notifyq.store.db import Session
from notifyq.store.sql import migrations, split_statements

OWNER = "d" * 32  # a consumer that "died": nothing holds its lock


@pytest.fixture
def session(db):
    s = Session(db.config().dsn)
    yield s
    s.close()


def put(db, n: int, max_attempts: int = 5) -> list[int]:
    with Producer("q", db.config()) as p:
        return p.put_many([{"n": i} for i in range(n)], max_attempts=max_attempts)


def state(db, ids: list[int]) -> list[tuple]:
    return db.query("SELECT status, attempts, suspect, owner FROM nq_job WHERE id IN %s ORDER BY id",
                    (tuple(ids),))


def take_back(db, session, how: str) -> int:
    """The reaper's two paths: a dead consumer's claims, or claims whose lease ran out."""
    if how == "dead consumer":
        # A lock-mode consumer whose liveness lock nobody holds: the reaper's verdict is to take it
        return liveness.reclaim_owner(session, OWNER, ["q"], lock_name=f"nq:test:{OWNER}")
    # The last claim's COMMIT is sent ahead (read with the session's next statement): until the
    # server ran it, a READ COMMITTED UPDATE skips its row as still ready (a semi-consistent read)
    if session.pipeline.pending is not None:
        session.pipeline.read_reply()
    db.query("UPDATE nq_job SET lease_until = NOW(6) - INTERVAL 1 SECOND WHERE status = 2")
    return liveness.reclaim_expired(session)


@pytest.mark.parametrize("how", ["dead consumer", "expired lease"])
def test_jobs_taken_back_together_are_not_charged_and_a_job_taken_back_alone_is(db, session, how):
    # Given a claim of 3 jobs and a claim of 1 job on its last attempt, both held by one consumer
    shared = put(db, 3, max_attempts=2)
    assert len(queries.claim(session, "q", OWNER, 3, 60).jobs) == 3
    alone = put(db, 1, max_attempts=1)
    assert [j.id for j in queries.claim(session, "q", OWNER, 3, 60).jobs] == alone

    # When they are taken back (the consumer died, or its leases ran out)
    assert take_back(db, session, how) == 4

    # Then the 3 taken back together are ready with their attempt undone, suspects from now on
    assert state(db, shared) == [(0, 0, 1, None)] * 3
    # And the one taken back alone keeps its attempt: out of attempts, it is dead with the reason
    assert state(db, alone) == [(4, 1, 1, None)]
    reason = "consumer died" if how == "dead consumer" else "lease expired"
    assert db.scalar("SELECT last_error FROM nq_job WHERE id = %s", alone) == f"{reason}; out of attempts"


def test_a_claim_whose_expired_rows_straddle_the_reapers_read_limit_is_taken_back_together(db, session):
    # Given a claim of 3 jobs on their last attempt and another claim of 999 jobs, all expired,
    # the first job of the 3 expired before the 999 and the other two after them
    trio = put(db, 3, max_attempts=1)
    assert len(queries.claim(session, "q", OWNER, 3, 60).jobs) == 3
    filler = put(db, 999)
    assert len(queries.claim(session, "q", "f" * 32, 999, 60).jobs) == 999
    db.query("UPDATE nq_job SET lease_until = NOW(6) - INTERVAL 3000 SECOND WHERE id = %s", (trio[0],))
    db.query("UPDATE nq_job SET lease_until = NOW(6) - INTERVAL 2000 SECOND WHERE id IN %s", (tuple(filler),))
    db.query("UPDATE nq_job SET lease_until = NOW(6) - INTERVAL 1000 SECOND WHERE id IN %s", (tuple(trio[1:]),))

    # When the reaper takes expired leases back (it reads them 1,000 at a time)
    while liveness.reclaim_expired(session):
        pass

    # Then the 3 came back together: none charged, none dead
    assert state(db, trio) == [(0, 0, 1, None)] * 3


@pytest.mark.parametrize("how", ["dead consumer", "expired lease", "given back"])
def test_a_job_cancelled_while_claimed_ends_cancelled_with_the_reason_on_every_way_back(db, session, how):
    # Given two claimed jobs, one of them asked to cancel while it ran
    cancelled, other = put(db, 2)
    claim = queries.claim(session, "q", OWNER, 2, 60)
    assert admin.cancel(session, cancelled) == "requested"

    # When the claim comes back without an outcome
    if how == "given back":
        assert queries.give_back(session, "q", [cancelled, other], claim.token) == 2
    else:
        take_back(db, session, how)

    # Then the cancelled job ends cancelled (not dead) with the reason, who asked and when, and
    # can never be claimed again
    status, error, by, at = db.query("SELECT status, last_error, cancelled_by, cancelled_at FROM nq_job "
                                     "WHERE id = %s", (cancelled,))[0]
    assert status == 5 and by and at is not None
    assert error.startswith("cancelled")
    assert db.scalar("SELECT status FROM nq_job WHERE id = %s", (other,)) == 0
    assert [j.id for j in queries.claim(session, "q", OWNER, 10, 60).jobs] == [other]


def test_give_back_returns_how_many_jobs_it_gave_back(db, session):
    # Given a claim of 7 jobs
    ids = put(db, 7)
    claim = queries.claim(session, "q", OWNER, 7, 60)
    # When all 7 are given back, then 7 is what it says (not the signal bump's row count)
    assert queries.give_back(session, "q", ids, claim.token) == 7
    assert state(db, ids) == [(0, 0, 0, None)] * 7


def test_a_suspect_is_claimed_alone_and_claim_order_still_holds(db, session):
    # Given 5 ready jobs, the 2nd and the 4th suspects
    ids = put(db, 5)
    db.query("UPDATE nq_job SET suspect = 1 WHERE id IN %s", ((ids[1], ids[3]),))

    # When a consumer claims batches of 10 until the queue is empty
    claims = []
    while True:
        claim = queries.claim(session, "q", "c" * 32, 10, 60)
        if not claim.jobs:
            break
        claims.append(([j.id for j in claim.jobs], claim.drained))

    # Then a suspect is never claimed with another job, and the order is kept
    assert [c[0] for c in claims] == [[ids[0]], [ids[1]], [ids[2]], [ids[3]], [ids[4]]]
    # And a claim that left jobs behind does not report the queue drained
    assert [c[1] for c in claims[:4]] == [False] * 4


def test_extend_lease_says_which_jobs_the_claim_still_holds(db, session):
    # Given a claim of 3 jobs, one of which was taken back after its lease ran out
    ids = put(db, 3)
    claim = queries.claim(session, "q", OWNER, 3, 60)
    db.query("UPDATE nq_job SET lease_until = NOW(6) - INTERVAL 1 SECOND WHERE id = %s", (ids[1],))
    assert liveness.reclaim_expired(session) == 1
    # When the claim extends its lease, then only the 2 it still holds are extended and named
    assert queries.extend_lease(session, ids, claim.token, 60) == [ids[0], ids[2]]


@contextlib.contextmanager
def consuming(cfg, function):
    service = ConsumerService(cfg, ConsumeOptions(queues=("q",), function=function, batch_size=3))
    stop = threading.Event()
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("rc", service.run(stop)), daemon=True)
    thread.start()
    try:
        wait_until(lambda: service.workers and all(w.consumer_id for w in service.workers), 30,
                   message="worker registered")
        yield service
    finally:
        stop.set()
        thread.join(30)
    assert outcome.get("rc") == 0, outcome


def test_a_worker_never_starts_a_job_whose_lease_ran_out_and_counts_a_fenced_ack_as_lost(db, session):
    # Given a 1 s lease and a batch of 3 jobs whose first handler runs past it
    cfg = db.config(defaults={"lease_s": 1.0})
    ids = put(db, 3)
    reclaimed = threading.Event()
    ran: list[tuple[int, int]] = []

    def handler(job: Job) -> None:
        ran.append((job.id, job.attempts))
        if len(ran) == 1:
            assert reclaimed.wait(30)

    with consuming(cfg, handler) as service:
        wait_until(lambda: ran, 30, message="the first job started")
        # When a reaper takes the batch back once its leases ran out, then the first handler ends
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE lease_until < NOW(6)") == 3,
                   30, message="the 3 leases expired")
        assert liveness.reclaim_expired(session) == 3
        reclaimed.set()
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0, 30, message="all done")
    totals = service.totals()  # once stopped: a worker counts an ack just after its COMMIT

    # Then the 2 jobs that waited were never started under the claim they had lost: each ran
    # once, under a claim of its own; only the job whose handler overran its lease ran twice
    assert sorted(ran) == sorted([(ids[0], 1), (ids[0], 1), (ids[1], 1), (ids[2], 1)])
    # And the overrunning job's fenced-out ack is counted as lost, not as done
    assert (totals.succeeded, totals.lost_acks) == (3, 1)


def test_an_ack_fenced_out_by_the_claim_token_counts_as_lost_not_as_done(db, session):
    # Given a 1 s lease and a job whose first run outlives it
    cfg = db.config(defaults={"lease_s": 1.0})
    [job_id] = put(db, 1)
    reclaimed = threading.Event()
    ran: list[int] = []

    def handler(job: Job) -> None:
        ran.append(job.attempts)
        if len(ran) == 1:
            assert reclaimed.wait(30)

    with consuming(cfg, handler) as service:
        wait_until(lambda: ran, 30, message="the job started")
        # When a reaper takes it back before the handler returns (it then runs again, alone)
        wait_until(lambda: db.scalar("SELECT lease_until < NOW(6) FROM nq_job"), 30, message="lease expired")
        assert liveness.reclaim_expired(session) == 1
        reclaimed.set()
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0, 30, message="the job done")
    totals = service.totals()  # once stopped: a worker counts an ack just after its COMMIT

    # Then the first run's ack, fenced out, is counted as lost; only the second run is done
    assert ran == [1, 2]  # taken back alone: the overrun counted as an attempt
    assert (totals.succeeded, totals.lost_acks) == (1, 1)


def test_init_upgrades_a_version_1_database_and_migration_2_can_run_twice(db):
    # Given a database at schema version 1 with a job in it
    db.query("ALTER TABLE nq_job DROP COLUMN suspect")
    db.query("UPDATE nq_meta SET value = '1' WHERE name = 'schema_version'")
    db.query("INSERT INTO nq_job (queue, status, run_at, max_attempts, payload) VALUES ('q', 0, NOW(6), 5, '{}')")

    # When `notifyq init` runs, then the column is there and the job is no suspect
    assert schema.init(db.admin) == (1, schema.code_version())
    assert db.query("SELECT suspect FROM nq_job") == [(0,)]
    # And an init interrupted after the ALTER (version not yet recorded) can simply run again
    version, text = migrations()[1]
    assert version == 2
    conn = admin_connect(db.admin, db.admin.database)  # one session: the statements share @nq_ddl
    try:
        for statement in split_statements(text):
            conn.cursor().execute(statement)
    finally:
        conn.close()
    assert db.scalar("SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                     "AND TABLE_NAME = 'nq_job' AND COLUMN_NAME = 'suspect'", (db.admin.database,)) == 1
