"""What a handler does inside its job.transaction() block, and what a stale call may still do:
nothing of the block commits before the completion, a block whose transaction ended early fails
loudly, and a call past its timeout_s loses its transaction and its locks. Against a real server."""

from __future__ import annotations

import logging
import threading

import MySQLdb
import pytest
from conftest import RUNTIME_USER, admin_connect, wait_until
from test_effects import _lose_connection_before_commit, charge, charges, drain, put  # noqa: F401 - charges is a fixture

import notifyq
from notifyq.store import queries


def _grant(db, privileges: str, on: str) -> None:
    conn = admin_connect(db.admin)
    for host in ("%", "localhost"):
        conn.cursor().execute(f"GRANT {privileges} ON {on} TO '{RUNTIME_USER}'@'{host}'")
    conn.close()


def _lease_until(db, job_id: int):
    return db.scalar("SELECT lease_until FROM nq_job WHERE id = %s", (job_id,))


CALLS = {
    "extend_lease": lambda job: job.extend_lease(),
    "cancel_requested": lambda job: job.cancel_requested(),
    "cancelled": lambda job: notifyq.cancelled([job]),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_call_inside_a_block_commits_nothing_of_it(db, charges, call):
    # Given a job whose first run writes its row in its block, calls extend_lease(),
    # cancel_requested() or cancelled() there (what a long handler does), and then dies
    # inside the block (as a SIGKILL would: nothing after the call commits)
    [job_id] = put(db)
    seen_from_outside: list[int] = []
    leases: list[tuple] = []

    def handler(job):
        with job.transaction() as cur:
            charge(job, cur)
            if job.attempts == 1:
                before = _lease_until(db, job_id)
                CALLS[call](job)
                leases.append((before, _lease_until(db, job_id)))
                seen_from_outside.append(db.scalar("SELECT COUNT(*) FROM charge"))
                raise RuntimeError("killed inside the block")

    # When workers run it until it is done
    drain(db, handler)

    # Then nobody saw the first run's row while its block was open, and only the second run's
    # row is stored: exactly one effect
    assert seen_from_outside == [0]
    assert charges() == [(job_id, 2)]
    # And the extension itself landed at once (through a session of its own)
    if call == "extend_lease":
        [(before, after)] = leases
        assert after > before


# Each statement, and how many of the block's two rows it leaves stored: the one before it when
# it commits; none after a ROLLBACK; both with autocommit on. What it leaves open is rolled back.
STATEMENTS = {"COMMIT": 1, "ROLLBACK": 0, "START TRANSACTION": 1, "SET autocommit = 1": 2,
              "LOCK TABLES charge WRITE": 1, "ANALYZE TABLE charge": 1}


@pytest.mark.parametrize("statement", sorted(STATEMENTS))
def test_a_block_whose_transaction_ends_inside_it_fails_loudly_and_its_job_is_not_run_again(db, charges,
                                                                                         statement):
    # Given a job whose block writes a row, runs a statement that ends its transaction (an
    # implicit or explicit COMMIT or ROLLBACK), and writes another row
    _grant(db, "LOCK TABLES", f"`{db.admin.database}`.*")
    [job_id] = put(db, max_attempts=3)
    raised: list[str] = []

    def handler(job):
        try:
            with job.transaction() as cur:
                charge(job, cur)
                cur.execute(statement)
                charge(job, cur)
        except notifyq.NotifyqError as e:
            raised.append(type(e).__name__)
            raise

    # When workers run it
    totals = drain(db, handler)

    # Then the block raised TransactionEnded instead of completing the job, and the job ended
    # dead after its one run (a rerun would store again what the first stored)
    assert raised == ["TransactionEnded"]
    assert totals.succeeded == 0 and totals.failed == 1
    [(status, error)] = db.query("SELECT status, last_error FROM nq_job WHERE id = %s", (job_id,))
    assert status == 4 and "ended inside the job.transaction() block" in error
    # And what the block left open was rolled back with its connection (no completion with it)
    assert len(charges()) == STATEMENTS[statement]
    assert db.scalar("SELECT COUNT(*) FROM nq_attempt WHERE job_id = %s AND outcome = 'done'", (job_id,)) == 0


def test_a_handler_past_its_timeout_loses_its_transaction_and_its_locks_and_its_retry_never_waits(db):
    # Given a job whose first run takes a row lock in its block (a unique key) and then hangs
    # there past the queue's timeout_s; its retry writes the same key
    db.query("CREATE TABLE ledger (job_id BIGINT PRIMARY KEY, attempt INT NOT NULL)")
    _grant(db, "SELECT, INSERT", f"`{db.admin.database}`.`ledger`")
    [job_id] = put(db, max_attempts=2)
    release, stray = threading.Event(), []

    def write(job, cur) -> None:
        cur.execute("INSERT INTO ledger (job_id, attempt) VALUES (%s, %s)", (job.id, job.attempts))

    def handler(job):
        if job.attempts > 1:
            with job.transaction() as cur:
                write(job, cur)
            return
        try:
            with job.transaction() as cur:
                write(job, cur)
                release.wait(30)  # hung inside its block
                stray.append(("cancel_requested", job.cancel_requested(max_age_s=0)))
                write(job, cur)
        except (MySQLdb.Error, notifyq.NotifyqError) as e:
            stray.append(("block", type(e).__name__))
        try:
            with job.transaction() as cur:
                write(job, cur)
        except notifyq.ClaimLost:
            stray.append(("transaction", "ClaimLost"))

    try:
        # When workers run it: the first run times out, the second follows at once
        drain(db, handler, timeout_s=1.5)
        # Then the retry did not wait on the hung run's lock: it stored its row, and the job is done
        assert db.query("SELECT job_id, attempt FROM ledger") == [(job_id, 2)]
        assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
        assert db.query("SELECT attempt, outcome FROM nq_attempt WHERE job_id = %s ORDER BY attempt",
                        (job_id,)) == [(1, "failed"), (2, "done")]
        # And the hung run holds no transaction any more
        assert db.scalar("SELECT COUNT(*) FROM information_schema.innodb_trx t JOIN information_schema.PROCESSLIST p "
                         "ON p.ID = t.trx_mysql_thread_id WHERE p.USER = %s", (RUNTIME_USER,)) == 0
    finally:
        release.set()
    # And when it goes on, what it asks is refused and nothing of it lands
    wait_until(lambda: len(stray) == 3, 10, message="the stray call ran to its end")
    # (the block's own statement found its connection ended: the block raises ClaimLost, as documented)
    assert stray == [("cancel_requested", True), ("block", "ClaimLost"), ("transaction", "ClaimLost")]
    assert db.query("SELECT job_id, attempt FROM ledger") == [(job_id, 2)]


def _until_the_timeout_ended(db, cur) -> None:
    conn_id = cur.connection.thread_id()
    wait_until(lambda: not db.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s",
                                     (conn_id,)), 30, message="the timeout ended the block's connection")


def _completion_sent_once_the_timeout_ended(db, cur) -> None:
    """The block's next statement (its completion and COMMIT) is sent only once the timeout ended
    its connection: as when timeout_s strikes while that query is on its way."""
    real = cur.execute

    def execute(query, args=None):
        _until_the_timeout_ended(db, cur)
        return real(query, args)

    cur.execute = execute


@pytest.mark.parametrize("struck", ["in the block", "at the completion", "at its own statement"])
def test_a_handler_past_its_timeout_that_leaves_its_block_gets_claim_lost_and_no_lost_commit_is_said(
        db, charges, caplog, struck):
    """Regression: a block left after timeout_s had ended its connection sent its completion and
    COMMIT there, and raised TransientDBError ("connection lost during the COMMIT ... the job runs
    again"), the consumer logging a lost COMMIT as if the server had failed; documented: ClaimLost.
    And one whose own statement found the connection gone raised the driver's OperationalError
    (2013) out of the block."""
    # Given a job whose first run writes in its block and leaves it without an error once timeout_s
    # struck and its connection is gone: before the block's end, or with its completion on the way
    [job_id] = put(db, max_attempts=2)
    raised: list[str] = []

    def handler(job):
        try:
            with job.transaction() as cur:
                charge(job, cur)
                if job.attempts == 1 and struck == "in the block":
                    _until_the_timeout_ended(db, cur)
                elif job.attempts == 1 and struck == "at its own statement":
                    _until_the_timeout_ended(db, cur)
                    charge(job, cur)
                elif job.attempts == 1:
                    _completion_sent_once_the_timeout_ended(db, cur)
        except BaseException as e:
            raised.append(type(e).__name__)
            raise
        raised.append("completed")

    with caplog.at_level(logging.INFO, logger="notifyq.consumer"):
        # When workers run it: the first run times out, the second completes it
        drain(db, handler, timeout_s=1)
        wait_until(lambda: len(raised) == 2, 30, message="the stray call left its block")
    # Then the stray call got ClaimLost, as documented, and only the second run's write is stored
    assert sorted(raised) == ["ClaimLost", "completed"]
    assert charges() == [(job_id, 2)]
    assert db.query("SELECT attempt, outcome FROM nq_attempt WHERE job_id = %s ORDER BY attempt",
                    (job_id,)) == [(1, "failed"), (2, "done")]
    # And no lost COMMIT was said: the timeout ended that connection, not the server
    assert not [r for r in caplog.records if "COMMIT" in r.getMessage()]


def test_complete_in_refuses_a_connection_in_autocommit_mode(db, charges):
    # Given a job whose handler writes its row on a connection in autocommit mode and completes
    # the job there (each statement would commit apart)
    [job_id] = put(db)
    raised: list[str] = []

    def handler(job):
        conn = MySQLdb.connect(**db.config().dsn.connect_args(), autocommit=True)
        try:
            charge(job, conn.cursor())
            try:
                job.complete_in(conn)
            except notifyq.NotifyqError as e:
                raised.append(f"{type(e).__name__}: {e}")
        finally:
            conn.close()

    # When a worker runs it
    drain(db, handler)
    # Then complete_in refused, in one line that says why, and did not complete the job (the
    # worker acked it as a plain success: its attempt record is the worker's, not complete_in's)
    assert len(raised) == 1 and raised[0].startswith("InputError: ") and "autocommit" in raised[0]
    assert "\n" not in raised[0]
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0


def test_a_lost_commit_whose_connection_outlives_its_kill_is_unknown_not_reported_as_not_stored(db, charges,
                                                                                                monkeypatch):
    # Given a job whose first block writes many rows (rolling them back takes the server a
    # while) and whose connection is killed as the completion's COMMIT goes out (its
    # outcome unknown): when the worker asks whether it landed, the old connection is still
    # there, past the wait for it (0 s here; 30 s in production)
    db.query("CREATE TABLE big (n INT NOT NULL)")
    _grant(db, "SELECT, INSERT", f"`{db.admin.database}`.`big`")
    monkeypatch.setattr(queries, "END_CONNECTION_WAIT_S", 0.0)
    # (on a server up for less than the time since the COMMIT went out, its restart would have
    # settled the outcome, and the check would read at once: not the case under test)
    wait_until(lambda: int(db.query("SHOW GLOBAL STATUS LIKE 'Uptime'")[0][1]) >= 3, 10, message="uptime 3 s")
    [job_id] = put(db)
    results: list[str] = []

    def handler(job):
        try:
            with job.transaction() as cur:
                charge(job, cur)
                if job.attempts == 1:
                    cur.execute("INSERT INTO big VALUES (1)")
                    for _ in range(18):  # 262,144 rows
                        cur.execute("INSERT INTO big SELECT n FROM big")
                    _lose_connection_before_commit(db, cur)
        except notifyq.NotifyqError as e:
            results.append(type(e).__name__)
            raise
        results.append("ok")

    # When workers run it
    drain(db, handler)
    # Then the first run's outcome is unknown, not "did not land" (the old connection could still
    # have committed); the rerun stores the one row
    assert results == ["OutcomeUnknown", "ok"]
    assert charges() == [(job_id, 2)]


def test_a_handler_past_its_timeout_after_complete_in_loses_its_callers_transaction_and_its_retry_never_waits(
        db, charges):
    """Issue 35: under a loaded machine the retry's own run (a connect, an INSERT, complete_in)
    once took longer than the 1.5 s timeout_s meant for the hung first run, and its complete_in()
    was refused at once, as any call past its timeout is (ClaimLost). Each run's connection is
    opened before the drain now, and the timeout leaves the retry room: only the hang outlasts it."""
    # Given a job whose first run completes it on its own connection with complete_in() and then
    # hangs past the queue's timeout_s before its COMMIT (its transaction holds the job's row)
    [job_id] = put(db, max_attempts=3)
    release = threading.Event()
    bound = threading.Timer(20, release.set)  # ends the hung run whatever happens (on the code before)
    second_run_saw_release: list[bool] = []
    completed: list[int] = []  # the attempts whose complete_in() returned
    conns = {attempt: MySQLdb.connect(**db.config().dsn.connect_args()) for attempt in (1, 2)}

    def handler(job):
        conn = conns.get(job.attempts) or MySQLdb.connect(**db.config().dsn.connect_args())
        try:
            if job.attempts > 1:
                second_run_saw_release.append(release.is_set())
            charge(job, conn.cursor())
            job.complete_in(conn)
            completed.append(job.attempts)
            if job.attempts == 1:
                release.wait(30)  # hung before its COMMIT
            conn.commit()
        except MySQLdb.Error:
            pass  # the hung run's connection was ended under it
        finally:
            conn.close()

    bound.start()
    try:
        # When workers run it
        drain(db, handler, timeout_s=4.0)
    finally:
        release.set()
        bound.cancel()
    # Then the second run started while the first still hung (nothing waited on its row), and
    # stored the one row: the first's transaction was ended, not committed
    assert completed == [1, 2]
    assert second_run_saw_release == [False]
    assert charges() == [(job_id, 2)]
    assert db.query("SELECT attempt, outcome FROM nq_attempt WHERE job_id = %s ORDER BY attempt", (job_id,)) == [
        (1, "failed"), (2, "done")]
