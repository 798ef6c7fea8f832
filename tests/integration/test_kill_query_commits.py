"""A statement a KILL QUERY cut short (the kill_query fault class; a DBA may send them too) never
lets a COMMIT store the rest of its transaction as if it had done its part.

A KILL QUERY does not always fail the statement it lands in: the server may answer a DELETE or
UPDATE it cut short with OK and no row changed, without an error (docs/proof-under-faults.md).
That answer is made here at will, once, by adding `AND 0 = 1` to the statement's WHERE on its
way to the server (an INSERT's VALUES row becomes a SELECT of no row). Before: the acks that
ride the next claim, and an ack on its own, committed the acked jobs' attempt records (done)
while the jobs stayed claimed, to run again once their lease ran out; a claim whose mark changed
no row was run as ours while its jobs were free for anyone; a failed job's record committed
without its retry, a reaper's records without the take-back; a put returned the id of a job it
never stored; a complete_in(conn) completion committed without its record (the worker then
read it as not committed)."""

from __future__ import annotations

import re

import MySQLdb
import pytest
from conftest import admin_connect, wait_until
from test_effects import put
from test_effects_kill_query import TOKEN, _claim, _job

from notifyq.produce.producer import Producer
from notifyq.store import liveness, queries
from notifyq.store.completion import Completion
from notifyq.store.db import Session

OWNER = "cut-short-consumer"


class CutShort:
    """The next query whose text matches `pattern` has that statement answered as a KILL QUERY
    may answer it: OK, no row changed (`replace` makes it change none)."""

    def __init__(self, monkeypatch, pattern: str, replace=lambda m: m.group(0) + b" AND 0 = 1"):
        self.pattern, self.replace, self.left = re.compile(pattern.encode(), re.S), replace, 1
        for name in ("query", "send_query"):
            real = getattr(MySQLdb.connections.Connection, name)
            monkeypatch.setattr(MySQLdb.connections.Connection, name,
                                lambda conn, q, _real=real: _real(conn, self._rewrite(q)))

    def _rewrite(self, query):
        text = bytes(query) if isinstance(query, (bytes, bytearray)) else query.encode()
        if self.left and self.pattern.search(text):
            self.left = 0
            return self.pattern.sub(self.replace, text, count=1)
        return query

    @property
    def done(self) -> bool:
        return self.left == 0


ACK_DELETE = (r"DELETE nq_job FROM nq_job FORCE INDEX \(PRIMARY\)\s+"
              r"WHERE id IN \([^)]*\) AND claim_token = \d+ AND status = 2")
CLAIM_MARK = r"SET status = 2, owner = .*?WHERE id IN \([^)]*\)"
RETRY_LATER = (r"SET status = IF\(cancel_requested, 5, 1\),\s+run_at = IF"
               r".*?WHERE id = \d+ AND claim_token = \d+ AND status = 2")
RETURN_SHARED = r"SET status = IF\(cancel_requested, 5, 0\),.*?WHERE id IN \([^)]*\) AND status = 2"
NO_VALUES = (lambda m: b"SELECT " + m.group(1) + b" FROM DUAL WHERE 0 = 1" + m.group(2))


@pytest.fixture
def work(db):
    session = Session(db.config().dsn, name="work")
    yield session
    session.close()


def _claim_all(session, n: int = 3, lease_s: float = 3600, acks=None) -> queries.Claim:
    claim = queries.claim(session, "q", OWNER, n, lease_s, acks=acks)
    session.pipeline.read_reply()
    return claim


def _done_and_gone(db, ids: list[int]) -> tuple[set[int], set[int]]:
    recorded = {i for (i,) in db.query("SELECT job_id FROM nq_attempt WHERE outcome = 'done'")}
    gone = set(ids) - {i for (i,) in db.query("SELECT id FROM nq_job")}
    return recorded, gone


def test_acks_riding_a_claim_whose_delete_changed_no_row_do_not_commit_their_records_alone(db, work, monkeypatch):
    # Given a batch of three claimed and run, whose acks ride the next claim
    ids = put(db, 6)
    first = _claim_all(work)
    acks = queries.Acks([j.id for j in first.jobs], first.token, keep=False)
    # When the ack's DELETE in that claim is answered OK with no row deleted
    cut = CutShort(monkeypatch, ACK_DELETE)
    second = _claim_all(work, acks=acks)
    # Then the claim's transaction ran again, and the three are acked with their records: never
    # a record of a job left claimed
    assert cut.done and not second.commit.failed
    assert second.commit.rowcounts[queries.Acks.COUNTED] == 3
    recorded, gone = _done_and_gone(db, ids)
    assert recorded == gone == set(acks.ids)
    assert len(second.jobs) == 3


def test_an_ack_on_its_own_whose_delete_changed_no_row_does_not_commit_its_records_alone(db, work, monkeypatch):
    # Given a claimed batch of three, run
    ids = put(db, 3)
    claim = _claim_all(work)
    # When its ack's DELETE is answered OK with no row deleted
    cut = CutShort(monkeypatch, ACK_DELETE)
    acked = queries.ack(work, ids, claim.token, False)
    # Then the ack ran again: all three acked, each with its record
    assert cut.done and acked == 3
    recorded, gone = _done_and_gone(db, ids)
    assert recorded == gone == set(ids)


def test_a_claim_whose_mark_changed_no_row_is_lost_not_run_as_ours(db, work, monkeypatch):
    # Given three ready jobs
    ids = put(db, 3)
    # When a claim's mark (sent with its COMMIT) is answered OK with no row changed
    cut = CutShort(monkeypatch, CLAIM_MARK)
    claim = _claim_all(work)
    # Then the claim reports its COMMIT failed (its jobs are not ours to start), as they are not
    assert cut.done and len(claim.jobs) == 3
    marked = db.query("SELECT COUNT(*) FROM nq_job WHERE claim_token = %s", (claim.token,))[0][0]
    assert marked == 0 and claim.commit.failed
    # And the next claim takes them
    again = _claim_all(work)
    assert sorted(j.id for j in again.jobs) == ids and not again.commit.failed


def test_a_failed_job_whose_retry_changed_no_row_does_not_commit_its_record_alone(db, work, monkeypatch):
    # Given a claimed job that failed
    [job_id] = put(db)
    claim = _claim_all(work)
    # When its retry_later is answered OK with no row changed
    cut = CutShort(monkeypatch, RETRY_LATER)
    owned = queries.reschedule_or_bury(work, "q", claim.token, [queries.Failure(job_id, 3600.0, "failed")])
    # Then the failure ran again: the job is back for its retry, with its one record
    assert cut.done and owned == [job_id]
    assert db.query("SELECT status FROM nq_job WHERE id = %s", (job_id,)) == [(1,)]
    assert db.query("SELECT outcome FROM nq_attempt WHERE job_id = %s", (job_id,)) == [("failed",)]


def test_a_give_back_that_changed_no_row_runs_again(db, work, monkeypatch):
    # Given a claim of three that never started (a shutdown)
    ids = put(db, 3)
    claim = _claim_all(work)
    # When its give-back is answered OK with no row changed
    cut = CutShort(monkeypatch, r"WHERE id IN \([^)]*\) AND claim_token = \d+ AND status = 2$")
    n = queries.give_back(work, "q", ids, claim.token)
    # Then it ran again: the three are ready now, not left claimed until their lease ends
    assert cut.done and n == 3
    assert db.query("SELECT status, claim_token FROM nq_job ORDER BY id") == [(0, None)] * 3


def test_results_kept_after_a_blocks_completion_whose_update_changed_no_row_are_written_again(db, work, monkeypatch):
    from notifyq.store import results

    # Given two jobs whose completion committed (their records written, with no result yet)
    ids = put(db, 2)
    claim = _claim_all(work, n=2)
    queries.ack(work, ids, claim.token, False)
    # When their results are kept, one UPDATE answered OK with no row changed
    cut = CutShort(monkeypatch, r"UPDATE nq_attempt SET result = '[^']*' WHERE job_id = \d+ AND claim_token = \d+")
    results.keep_results(work, claim.token, [(ids[0], '"a"'), (ids[1], '"b"')])
    # Then the writes ran again: both results are kept
    assert cut.done
    assert db.query("SELECT job_id, result FROM nq_attempt ORDER BY job_id") == [(ids[0], '"a"'), (ids[1], '"b"')]


def test_a_take_back_whose_return_changed_no_row_does_not_commit_its_records_alone(db, work, monkeypatch):
    # Given a claim of three whose lease ran out
    ids = put(db, 3)
    claim = _claim_all(work, lease_s=0.05)
    wait_until(lambda: db.query("SELECT COUNT(*) FROM nq_job WHERE lease_until < NOW(6)")[0][0] == 3, 10)
    # When the reaper's return of the three is answered OK with no row changed
    cut = CutShort(monkeypatch, RETURN_SHARED)
    n = liveness.reclaim_expired(work)
    # Then the take-back ran again: the three are ready, each with its one record
    assert cut.done and n == 3
    assert db.query("SELECT status, claim_token FROM nq_job ORDER BY id") == [(0, None)] * 3
    records = db.query("SELECT job_id, claim_token, outcome FROM nq_attempt ORDER BY job_id")
    assert records == [(i, claim.token, "taken back") for i in ids]


def test_a_put_whose_insert_stored_no_row_does_not_return_an_id(db, monkeypatch):
    # Given a producer
    with Producer("q", db.config()) as producer:
        # When its INSERT is answered OK with no row stored
        cut = CutShort(monkeypatch, r"VALUES \((.*?)\)(;\n(?:SET STATEMENT [^;]*?\n)?INSERT INTO nq_signal)", NO_VALUES)
        job_id = producer.put({"n": 1})
    # Then the put ran again: the id it returned is a stored job's
    assert cut.done
    assert db.query("SELECT id FROM nq_job") == [(job_id,)]


def test_a_unique_put_whose_key_take_changed_no_row_does_not_leave_the_key_free(db, monkeypatch):
    # Given a producer
    with Producer("q", db.config()) as producer:
        # When a unique put's taking of its key is answered OK with no row changed
        cut = CutShort(monkeypatch, r"UPDATE nq_dedup SET job_id = \d+ WHERE queue = .*? AND dedup_key = '[^']*'")
        first = producer.put({"n": 1}, dedup_key="k")
        # Then the put ran again: the key is the job's, and the next put with it gets that job
        second = producer.put({"n": 2}, dedup_key="k")
    assert cut.done and second == first
    assert db.query("SELECT id FROM nq_job") == [(first,)]


def test_complete_in_whose_record_stored_no_row_does_not_complete(db, work, monkeypatch):
    # Given a claimed job, completed on the caller's connection in its transaction
    [job_id] = put(db)
    _claim(db, job_id)
    conn = admin_connect(db.admin, db.admin.database)
    conn.autocommit(False)
    completion = Completion(work, TOKEN, keep=False)
    try:
        # When the completion's record is answered OK with no row stored
        cut = CutShort(monkeypatch, r"VALUES \(([^;]*)\)($)", NO_VALUES)
        with pytest.raises(MySQLdb.OperationalError):
            completion.complete_in(_job(job_id), conn)
        conn.rollback()
        # Then it raised, and nothing of it is stored: the job is still claimed, for its retry
        assert cut.done
        assert db.query("SELECT status, claim_token FROM nq_job WHERE id = %s", (job_id,)) == [(2, TOKEN)]
    finally:
        conn.close()


def test_an_operators_retry_of_the_dead_job_that_took_its_key_last_keeps_the_key(db, work):
    """Its key take changes no row (the key names the job already): that is no cut-short UPDATE."""
    from notifyq.store import admin_queries

    # Given a dead job that took its key last
    with Producer("q", db.config()) as producer:
        job_id = producer.put({"n": 1}, dedup_key="k")
    db.query("UPDATE nq_job SET status = 4 WHERE id = %s", (job_id,))
    # When an operator retries it
    n = admin_queries.retry_jobs(work, [(job_id, "q")])
    # Then it is ready again, holding its key: a put with that key gets it
    assert n == 1
    with Producer("q", db.config()) as producer:
        assert producer.put({"n": 2}, dedup_key="k") == job_id
