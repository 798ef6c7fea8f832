"""job.complete_in(conn) with SQLAlchemy 2.x as it is (issue 29, item 2): a Session or a
Connection; the job is done only if the caller's transaction commits."""

from __future__ import annotations

import threading

import pytest

sqlalchemy = pytest.importorskip("sqlalchemy", reason="SQLAlchemy not installed: pip install 'notifyq[sqlalchemy]'")

from conftest import RUNTIME_USER, admin_connect  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

import notifyq  # noqa: E402
from notifyq.consume import handlers  # noqa: E402
from notifyq.consume.stats import Budget  # noqa: E402
from notifyq.consume.worker import Worker  # noqa: E402
from notifyq.produce.producer import Producer  # noqa: E402
from notifyq.store import liveness  # noqa: E402
from notifyq.store.db import Session as NqSession  # noqa: E402


@pytest.fixture
def engine(db):
    db.query("CREATE TABLE charge (id INT AUTO_INCREMENT PRIMARY KEY, job_id BIGINT NOT NULL, attempt INT NOT NULL)")
    conn = admin_connect(db.admin)
    for host in ("%", "localhost"):
        conn.cursor().execute(f"GRANT SELECT, INSERT ON `{db.admin.database}`.`charge` TO '{RUNTIME_USER}'@'{host}'")
    conn.close()
    d = db.dsn
    url = sqlalchemy.engine.URL.create("mysql+mysqldb", username=d.user, password=d.password, host=d.host,
                                       port=d.port, database=d.database)
    engine = create_engine(url)
    yield engine
    engine.dispose()


def _run(db, handler) -> Worker:
    worker = Worker(db.config(), "q", handlers.PythonHandler(handler, False), stop=threading.Event(),
                    budget=Budget(None), batch_size=10, exit_when_empty=True)
    worker.run()
    assert worker.error is None, worker.error
    return worker


def _take_claim_back(db, job_id: int, reaper) -> None:
    """The job's lease expired and taken back by a reaper, while its handler runs."""
    db.query("UPDATE nq_job SET lease_until = NOW(6) - INTERVAL 1 SECOND WHERE id = %s", (job_id,))
    liveness.reclaim_expired(reaper)


def test_complete_in_a_session_and_a_connection_commits_the_job_with_the_callers_writes(db, engine):
    # Given two jobs: one completed in a Session, one in a Connection, each with a write
    with Producer("q", db.config()) as p:
        in_session, in_connection = p.put_many([{"n": 1}, {"n": 2}])

    def handler(job):
        insert = text("INSERT INTO charge (job_id, attempt) VALUES (:j, :a)")
        if job.id == in_session:
            with Session(engine) as session:
                session.execute(insert, {"j": job.id, "a": job.attempts})
                job.complete_in(session)
                session.commit()
        else:
            with engine.connect() as conn:
                conn.execute(insert, {"j": job.id, "a": job.attempts})
                job.complete_in(conn)
                conn.commit()

    worker = _run(db, handler)
    # Then both writes are stored once, both jobs are done and none was acked again
    assert db.query("SELECT job_id FROM charge ORDER BY job_id") == [(in_session,), (in_connection,)]
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    assert worker.stats.succeeded == 2 and worker.stats.lost_acks == 0


def test_complete_in_a_session_whose_claim_was_taken_back_raises_and_the_session_rolls_back(db, engine):
    # Given a job whose claim is taken back before its handler completes it in a Session
    with Producer("q", db.config()) as p:
        job_id = p.put({"n": 1})
    reaper = NqSession(db.config().dsn, name="reaper")
    raised = []

    def handler(job):
        if job.attempts > 1:
            return
        _take_claim_back(db, job_id, reaper)
        with pytest.raises(notifyq.ClaimLost):
            with Session(engine) as session, session.begin():  # rolls back as ClaimLost leaves it
                session.execute(text("INSERT INTO charge (job_id, attempt) VALUES (:j, 1)"), {"j": job.id})
                job.complete_in(session)
        raised.append(True)

    try:
        _run(db, handler)
    finally:
        reaper.close()
    # Then the stale write never landed
    assert raised == [True]
    assert db.scalar("SELECT COUNT(*) FROM charge") == 0


def test_a_stale_claims_writes_never_land_even_when_the_handler_catches_claim_lost_in_its_block(db, engine):
    # Given a job whose claim is taken back before its handler completes it in a Session, and a
    # handler that catches ClaimLost inside the Session's transaction block
    with Producer("q", db.config()) as p:
        job_id = p.put({"n": 1})
    reaper = NqSession(db.config().dsn, name="reaper")
    caught = []

    def handler(job):
        if job.attempts > 1:
            return
        _take_claim_back(db, job_id, reaper)
        with Session(engine) as session, session.begin():  # would commit at the block's end
            session.execute(text("INSERT INTO charge (job_id, attempt) VALUES (:j, 1)"), {"j": job.id})
            try:
                job.complete_in(session)
            except notifyq.ClaimLost:
                caught.append(True)

    try:
        _run(db, handler)
    finally:
        reaper.close()
    # Then the stale write never landed
    assert caught == [True]
    assert db.scalar("SELECT COUNT(*) FROM charge") == 0


def test_orm_objects_added_but_not_flushed_never_land_when_the_handler_catches_claim_lost_in_its_block(db, engine):
    # Given a job whose claim is taken back before its handler completes it in a Session, and a
    # handler that adds an ORM object (not flushed yet) and catches ClaimLost inside
    # session.begin(), whose end would flush and commit the object
    from sqlalchemy import Column, Integer
    from sqlalchemy.orm import declarative_base

    class Charge(declarative_base()):
        __tablename__ = "charge"
        id = Column(Integer, primary_key=True)
        job_id = Column(Integer, nullable=False)
        attempt = Column(Integer, nullable=False)

    with Producer("q", db.config()) as p:
        job_id = p.put({"n": 1})
    reaper = NqSession(db.config().dsn, name="reaper")
    seen: list[str] = []

    def handler(job):
        if job.attempts > 1:
            return
        _take_claim_back(db, job_id, reaper)
        with Session(engine) as session, session.begin():
            session.add(Charge(job_id=job.id, attempt=1))
            try:
                job.complete_in(session)
            except notifyq.ClaimLost:
                seen.append("caught")

    try:
        _run(db, handler)
    finally:
        reaper.close()
    # Then the stale run's object never landed
    assert seen == ["caught"]
    assert db.scalar("SELECT COUNT(*) FROM charge") == 0
