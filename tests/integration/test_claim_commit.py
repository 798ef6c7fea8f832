"""A claim's COMMIT is sent ahead (Pipeline.send_commit): its jobs start while the COMMIT is on the
wire. When that COMMIT fails after all, the worker learns whether it landed and takes again what it
did not mark and nobody took meanwhile (queries.retake): the job that ran is then acked once. What
a peer took first is lost like a crash loses it: the job ran, its ack is fenced, it runs again
elsewhere, and nothing is lost."""

from __future__ import annotations

import threading

import pytest
from conftest import admin_connect, wait_until

from notifyq.consume import handlers
from notifyq.consume import batch as batch_module
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer
from notifyq.store import advisory, queries
from notifyq.store.db import Session

OWNER, PEER = "a" * 32, "b" * 32
HOLD_S = 20  # how long a claim may take to return while commits are blocked


@pytest.fixture
def backup_stage(db):
    """These tests hold COMMITs back with MariaDB's BACKUP STAGE; MySQL has no such statement."""
    if "mariadb" not in db.query("SELECT VERSION()")[0][0].lower():
        pytest.skip("needs MariaDB's BACKUP STAGE to hold a COMMIT back")


def test_a_claim_whose_commit_fails_after_its_job_started_loses_the_job_to_a_peer_not_to_nobody(db, backup_stage):
    # Given one ready job, and a server that holds every COMMIT back (MariaDB's backup stage)
    cfg = db.config()
    with Producer("q", cfg) as p:
        [job_id] = p.put_many([{"n": 1}])
    blocker = admin_connect(db.admin)
    blocker.cursor().execute("BACKUP STAGE START")
    blocker.cursor().execute("BACKUP STAGE BLOCK_COMMIT")
    work, peer = Session(cfg.dsn, name="work"), Session(cfg.dsn, name="peer")
    try:
        # When a consumer claims: claim() returns with the job while its COMMIT waits
        got: list = []
        claimer = threading.Thread(target=lambda: got.append(queries.claim(work, "q", OWNER, 10, 60)),
                                   daemon=True)
        claimer.start()
        wait_until(lambda: got, HOLD_S, message="claim() to return before its COMMIT could")
        claimer.join()
        claim = got[0]
        assert [j.id for j in claim.jobs] == [job_id]
        assert claim.commit is not None and not claim.commit.settled
        ran = [claim.jobs[0].id]  # the handler runs now, the COMMIT still in flight
        # ... and the claim's session dies before the COMMIT's reply is read
        killer = admin_connect(db.admin)
        try:
            killer.cursor().execute(f"KILL CONNECTION {int(work.connection_id)}")
        finally:
            killer.close()
        wait_until(lambda: not db.query("SELECT ID FROM information_schema.PROCESSLIST WHERE ID = %s",
                                        (work.connection_id,)), HOLD_S, message="the killed session gone")
        blocker.cursor().execute("BACKUP STAGE END")
        # Then the ack (the session's next statement) reads the COMMIT's failure first, and is
        # fenced out: the claim never became ours
        assert queries.ack(work, ran, claim.token, keep=False) == 0
        assert claim.commit.failed and work.pipeline.failed_commits == 1
        # And the job is claimable again, with the failed claim's attempt never counted: a peer
        # runs it, and its ack holds
        again = queries.claim(peer, "q", PEER, 10, 60)
        assert [(j.id, j.attempts) for j in again.jobs] == [(job_id, 1)]
        assert queries.ack(peer, [job_id], again.token, keep=False) == 1
        assert not again.commit.failed
        assert db.query("SELECT COUNT(*) FROM nq_job") == [(0,)]
    finally:
        blocker.close()  # ends the backup stage, if a failure above left it on
        work.close()
        peer.close()


def test_a_claim_returns_its_jobs_before_its_commit_and_settles_it_at_the_next_statement(db):
    # Given two ready jobs
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(2)])
    work = Session(cfg.dsn)
    try:
        # When a consumer claims them, its COMMIT is in flight until the next statement
        claim = queries.claim(work, "q", OWNER, 10, 60)
        assert sorted(j.id for j in claim.jobs) == ids and not claim.commit.settled
        # Then the next statement reads it first, and the claim is ours
        assert queries.extend_lease(work, ids, claim.token, 60) == ids
        assert claim.commit.settled and not claim.commit.failed and work.pipeline.failed_commits == 0
        assert db.query("SELECT COUNT(*) FROM nq_job WHERE status = 2 AND owner = %s", (OWNER,)) == [(2,)]
    finally:
        work.close()


def _lose_the_claims_commit(db, blocker, worker: Worker, job, read_back: bool = True) -> bool | None:
    """Inside a handler, while `blocker`'s BACKUP STAGE holds the claim's COMMIT back: the work
    session dies, the stage ends, and (read_back) a statement on the work session reads the
    COMMIT's failure (a cancel check, whose answer it returns); without it the handler never
    touches that session."""
    conn_id = worker.work.connection_id
    blocker.cursor().execute(f"KILL CONNECTION {int(conn_id)}")
    wait_until(lambda: not db.query("SELECT ID FROM information_schema.PROCESSLIST WHERE ID = %s",
                                    (conn_id,)), HOLD_S, message="the killed session gone")
    blocker.cursor().execute("BACKUP STAGE END")
    return job.cancel_requested() if read_back else None


def test_a_worker_whose_claim_commit_fails_under_its_first_job_takes_the_claim_again_and_loses_nothing(
        db, backup_stage):
    # Given three ready jobs and a registered worker, whose next claim's COMMIT the server holds back
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(3)])
    blocker = admin_connect(db.admin)
    runs: list[tuple[int, int]] = []
    cancel_seen: list[bool | None] = []

    def handler(job) -> None:
        runs.append((job.id, job.attempts))
        if len(runs) == 1:  # the batch's first start, its claim's COMMIT still on the wire: the session dies
            cancel_seen.append(_lose_the_claims_commit(db, blocker, worker, job))

    worker = Worker(cfg, "q", handlers.PythonHandler(handler, False), stop=threading.Event(),
                    budget=Budget(None), batch_size=10, exit_when_empty=True)
    try:
        worker.presence.ensure_registered(worker)  # registered, as run() does first
        blocker.cursor().execute("BACKUP STAGE START")
        blocker.cursor().execute("BACKUP STAGE BLOCK_COMMIT")
        # When it claims and its first job starts, whose cancel check reads the COMMIT's failure
        got, _ = worker._claim_and_run()
        worker.acks.flush(worker.work)  # as run() does before anything but its next claim
        # Then the check first took the claim again (its rows were free), so it said no cancel
        # (not "no longer ours": the job would have ended as if cancelled); the batch ran on:
        # each job once, nothing fenced
        assert got == 3 and cancel_seen == [False]
        assert worker.work.pipeline.failed_commits == 1
        assert runs == [(job_id, 1) for job_id in ids]
        assert worker.stats.succeeded == 3 and worker.stats.lost_acks == 0
        assert worker._claim_and_run()[0] == 0
        assert db.query("SELECT COUNT(*) FROM nq_job") == [(0,)]
    finally:
        blocker.close()
        worker.work.close()
        worker.presence.close()


def test_a_worker_reads_its_claims_commit_before_the_second_job_starts_even_with_fast_jobs(
        db, backup_stage, monkeypatch):
    """Regression (CI, the Galera fault schedule): the claim's COMMIT was read only at the work
    session's next statement, an ack flush a second later, so fast jobs after the first started
    under a claim whose COMMIT had failed, while a peer (on Galera: the claim that won
    certification on another node) ran them too."""
    # Given three ready jobs, a worker whose acks would wait long, and a server that holds
    # its claim's COMMIT back
    monkeypatch.setattr(batch_module, "ACK_FLUSH_S", 3600.0)
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(3)])
    blocker = admin_connect(db.admin)
    runs: list[tuple[int, int]] = []

    peer = Session(cfg.dsn, name="peer")
    taken: list = []

    def handler(job) -> None:
        runs.append((job.id, job.attempts))
        if len(runs) == 1:  # the first start: the claim's session dies with its COMMIT unread,
            _lose_the_claims_commit(db, blocker, worker, job, read_back=False)
            taken.append(queries.claim(peer, "q", PEER, 10, 60))  # and a peer claims all three

    worker = Worker(cfg, "q", handlers.PythonHandler(handler, False), stop=threading.Event(),
                    budget=Budget(None), batch_size=10, exit_when_empty=True)
    try:
        worker.presence.ensure_registered(worker)
        blocker.cursor().execute("BACKUP STAGE START")
        blocker.cursor().execute("BACKUP STAGE BLOCK_COMMIT")
        # When it claims and runs the batch
        got, _ = worker._claim_and_run()
        worker.acks.flush(worker.work)
        # Then only the first job ran under the lost claim: the second waited for the COMMIT's
        # reply, read its failure, found the peer holding the claim's rows, and started nothing
        # more; the first job's ack was fenced out
        assert got == 3 and runs == [(ids[0], 1)]
        assert worker.work.pipeline.failed_commits == 1 and worker.stats.lost_acks == 1
        # And the peer's claim holds all three
        assert sorted(j.id for j in taken[0].jobs) == ids
        assert queries.ack(peer, ids, taken[0].token, keep=False) == 3
        assert db.query("SELECT COUNT(*) FROM nq_job") == [(0,)]
    finally:
        blocker.close()
        peer.close()
        worker.work.close()
        worker.presence.close()


def test_a_failed_watch_hand_on_frees_the_watch_lock_and_keeps_the_session_and_its_liveness_lock(db):
    """Regression (issue 16): the hand-on's share lock failed (on Galera a remote write set aborts
    it, 1213; here a lock wait timeout), and the failure ended the watcher's connection: on the
    first queue's watcher, which holds the process's liveness lock, that freed the lock, and a
    reaper took a live consumer's jobs back."""
    cfg = db.config()
    with Producer("q", cfg) as p:
        p.put_many([{"n": 1}])  # (the queue's nq_queue row exists from here)
    home = Session(cfg.dsn, autocommit=True, name="home")
    blocker = admin_connect(db.admin, db.admin.database)
    live, watch = "nq_test_liveness", "nq_test_watch"
    try:
        # Given the watcher session holding a liveness lock and the watch lock, whose row-lock
        # waits end after 1 s, and another transaction holding the queue's row
        assert advisory.get_lock(home, live, 0) == 1 and advisory.get_lock(home, watch, 0) == 1
        home.run(lambda cur: cur.execute("SET SESSION innodb_lock_wait_timeout = 1"), what="t")
        generation, conn_id = home.generation, home.connection_id
        cur = blocker.cursor()
        cur.execute("BEGIN")
        cur.execute("SELECT 1 FROM nq_queue WHERE queue = 'q' FOR UPDATE")
        # When the watch is handed on and its share lock times out
        advisory.hand_watch_on(home, watch, "q")
        # Then the session's next statement (which reads the hand-on's reply first, the timeout)
        # finds the same connection, still holding the liveness lock
        assert advisory.lock_holder(home, live) == conn_id and home.generation == generation
        # And the watch lock was released all the same
        assert db.query("SELECT IS_USED_LOCK(%s)", (watch,)) == [(None,)]
    finally:
        blocker.close()
        home.close()


def _commits(session: Session) -> int:
    """COMMITs this session has sent, by the server's own count of it."""
    return int(session.run(lambda cur: (cur.execute("SHOW SESSION STATUS LIKE 'Com_commit'"),
                                        cur.fetchone())[1][1], what="count commits"))


def test_a_busy_worker_acks_each_batch_in_the_next_claims_commit_one_commit_per_batch(db):
    # Given ten ready jobs and a worker that claims two at a time
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(10)])
    runs: list[int] = []
    worker = Worker(cfg, "q", handlers.PythonHandler(lambda job: runs.append(job.id), False),
                    stop=threading.Event(), budget=Budget(None), batch_size=2, exit_when_empty=True)
    try:
        worker.presence.ensure_registered(worker)
        before = _commits(worker.work)
        # When it drains the queue, claim after claim
        batches = 0
        while worker._claim_and_run()[0]:
            batches += 1
            # Then each batch's acks wait for the next claim: its jobs are still claimed
            assert db.query("SELECT COUNT(*) FROM nq_job WHERE id IN %s AND status = 2",
                            (tuple(runs[-2:]),)) == [(2,)]
        worker.acks.flush(worker.work)
        # Then every job ran once and is gone, acked in the next claim's COMMIT: one COMMIT per
        # claim (the last one, which found nothing, carried the last batch's acks)
        assert sorted(runs) == ids and batches == 5
        assert db.query("SELECT COUNT(*) FROM nq_job") == [(0,)]
        assert worker.stats.succeeded == 10 and worker.stats.lost_acks == 0
        assert _commits(worker.work) - before - 1 == batches + 1  # - 1: the count's own COMMIT
    finally:
        worker.work.close()
        worker.presence.close()


def test_acks_that_rode_in_a_claim_whose_commit_failed_are_sent_again_and_their_jobs_never_rerun(db, backup_stage):
    # Given four ready jobs, a worker that claims two at a time, and its first batch run
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(4)])
    blocker = admin_connect(db.admin)
    runs: list[tuple[int, int]] = []

    def handler(job) -> None:
        runs.append((job.id, job.attempts))
        if len(runs) == 3:  # the second batch's first start: its claim's COMMIT (with the first
            _lose_the_claims_commit(db, blocker, worker, job)  # batch's acks) held back, the session dies

    worker = Worker(cfg, "q", handlers.PythonHandler(handler, False), stop=threading.Event(),
                    budget=Budget(None), batch_size=2, exit_when_empty=True)
    try:
        worker.presence.ensure_registered(worker)
        assert worker._claim_and_run()[0] == 2
        first = [job_id for job_id, _ in runs]
        blocker.cursor().execute("BACKUP STAGE START")
        blocker.cursor().execute("BACKUP STAGE BLOCK_COMMIT")
        # When the next claim, carrying the first batch's acks, loses its COMMIT
        assert worker._claim_and_run()[0] == 2
        worker.acks.flush(worker.work)
        assert worker.work.pipeline.failed_commits == 1
        # Then the first batch's acks went out again on their own and hold, and the second
        # batch, its claim taken again, ran on and was acked
        assert worker.stats.succeeded == 4 and worker.stats.lost_acks == 0
        assert db.query("SELECT COUNT(*) FROM nq_job WHERE id IN %s", (tuple(first),)) == [(0,)]
        # And the queue is drained with no job run twice
        assert worker._claim_and_run()[0] == 0
        worker.acks.flush(worker.work)
        assert sorted(job_id for job_id, _ in runs) == sorted(ids)
        assert db.query("SELECT COUNT(*) FROM nq_job") == [(0,)]
    finally:
        blocker.close()
        worker.work.close()
        worker.presence.close()


def test_carried_acks_that_lose_a_deadlock_fail_the_claim_before_its_jobs_start_and_it_runs_again(db):
    # Given four ready jobs, a worker that claims two at a time, its first batch run, and a
    # server on which the next ack's DELETE loses a deadlock once (a trigger signals 1213, as a
    # peer's reaper locking the claimed range in index order can make it)
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(4)])
    definer = f"'{db.dsn.user}'@'%'"
    db.query(f"GRANT TRIGGER ON nq_job TO {definer}")
    db.query(f"""
        CREATE DEFINER = {definer} TRIGGER nq_test_deadlock BEFORE DELETE ON nq_job FOR EACH ROW
        BEGIN
          IF @nq_test_deadlock = 1 THEN
            SET @nq_test_deadlock = 0;
            SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'test: deadlock';
          END IF;
        END""")
    runs: list[tuple[int, int]] = []
    worker = Worker(cfg, "q", handlers.PythonHandler(lambda job: runs.append((job.id, job.attempts)), False),
                    stop=threading.Event(), budget=Budget(None), batch_size=2, exit_when_empty=True)
    try:
        worker.presence.ensure_registered(worker)
        assert worker._claim_and_run()[0] == 2
        worker.work.run(lambda cur: cur.execute("SET @nq_test_deadlock = 1"), what="arm")
        # When the next claim carries the first batch's acks and its DELETE loses the deadlock
        while worker._claim_and_run()[0]:
            pass
        worker.acks.flush(worker.work)
        # Then that claim failed before any of its jobs started, and ran again: every job ran
        # once, on its first attempt, and nothing was lost or fenced
        assert sorted(runs) == [(job_id, 1) for job_id in ids]
        assert worker.work.pipeline.failed_commits == 0
        assert worker.stats.succeeded == 4 and worker.stats.lost_acks == 0
        assert db.query("SELECT COUNT(*) FROM nq_job") == [(0,)]
    finally:
        worker.work.close()
        worker.presence.close()


def test_a_worker_that_goes_idle_acks_its_last_batch_before_it_waits(db):
    # Given a long-running worker, idle and watching the empty queue
    cfg = db.config(wakeup={"poll_initial_s": 0.01, "poll_max_s": 0.05})
    runs: list[int] = []
    stop = threading.Event()
    worker = Worker(cfg, "q", handlers.PythonHandler(lambda job: runs.append(job.id), False),
                    stop=stop, budget=Budget(None), batch_size=2)
    thread = threading.Thread(target=worker.run, daemon=True)
    try:
        thread.start()
        wait_until(lambda: worker.waiter.watching, HOLD_S, message="the worker watching")
        # When one job arrives: the watcher claims it, drains the queue (so it records the count
        # as watched and will not wake again), runs it and goes back to watching
        with Producer("q", cfg) as p:
            [job_id] = p.put_many([{"n": 1}])
        wait_until(lambda: runs == [job_id], HOLD_S, message="the job run")
        # Then its ack does not wait for a next claim that may never come: the job is gone
        wait_until(lambda: db.query("SELECT COUNT(*) FROM nq_job") == [(0,)], HOLD_S,
                   message="the job acked while the worker idles")
        # The worker counts the ack once its reply is read, a moment after the row is gone
        wait_until(lambda: worker.stats.succeeded == 1, HOLD_S, message="the ack counted")
        assert worker.stats.lost_acks == 0 and not worker.finished
    finally:
        stop.set()
        thread.join(30)


def test_a_worker_whose_claim_commit_is_lost_with_its_session_takes_the_claim_again_and_runs_each_job_once(
        db, backup_stage):
    """Regression (issue 35, test_kill_connection: job 103 of 200 ran twice): a KILL of the work
    session cut the claim's COMMIT before it landed, while the batch's first job ran; the rows
    unlocked, the job's ack was fenced out, and the worker's next claim ran it again."""
    # Given three ready jobs and a registered worker whose claim's COMMIT the server holds back
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(3)])
    blocker = admin_connect(db.admin)
    runs: list[tuple[int, int]] = []

    def handler(job) -> None:
        runs.append((job.id, job.attempts))
        if len(runs) == 1:  # the first start: the session dies, the COMMIT never lands
            _lose_the_claims_commit(db, blocker, worker, job, read_back=False)

    worker = Worker(cfg, "q", handlers.PythonHandler(handler, False), stop=threading.Event(),
                    budget=Budget(None), batch_size=10, exit_when_empty=True)
    try:
        worker.presence.ensure_registered(worker)
        blocker.cursor().execute("BACKUP STAGE START")
        blocker.cursor().execute("BACKUP STAGE BLOCK_COMMIT")
        # When it claims, its first job runs, and the claim's COMMIT is lost with its session
        got, _ = worker._claim_and_run()
        worker.acks.flush(worker.work)
        # Then the worker found the claim had not landed, took its rows again under its token
        # (nobody held them), and ran the batch on: each job once, on its first attempt
        assert got == 3 and worker.work.pipeline.failed_commits == 1
        assert runs == [(job_id, 1) for job_id in ids]
        assert worker.stats.succeeded == 3 and worker.stats.lost_acks == 0
        assert worker._claim_and_run()[0] == 0
        assert db.query("SELECT COUNT(*) FROM nq_job") == [(0,)]
    finally:
        blocker.close()
        worker.work.close()
        worker.presence.close()


def test_a_claim_whose_commit_landed_but_whose_reply_was_lost_stays_the_workers_and_its_batch_runs_on(
        db, backup_stage):
    # Given three ready jobs and a registered worker whose claim's COMMIT the server holds back
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(3)])
    blocker = admin_connect(db.admin)
    runs: list[tuple[int, int]] = []

    def handler(job) -> None:
        runs.append((job.id, job.attempts))
        if len(runs) == 1:  # the first start: the client's socket is cut, then the COMMIT lands
            assert worker.work.cut_socket()
            blocker.cursor().execute("BACKUP STAGE END")
            wait_until(lambda: db.query("SELECT COUNT(*) FROM nq_job WHERE status = 2") == [(3,)], HOLD_S,
                       message="the claim's COMMIT landed")

    worker = Worker(cfg, "q", handlers.PythonHandler(handler, False), stop=threading.Event(),
                    budget=Budget(None), batch_size=10, exit_when_empty=True)
    try:
        worker.presence.ensure_registered(worker)
        blocker.cursor().execute("BACKUP STAGE START")
        blocker.cursor().execute("BACKUP STAGE BLOCK_COMMIT")
        # When it claims and runs the batch
        got, _ = worker._claim_and_run()
        worker.acks.flush(worker.work)
        # Then the lost reply failed the COMMIT as the worker saw it, but the claim was found
        # its own: nothing was given back, and each job ran once in this batch
        assert got == 3 and worker.work.pipeline.failed_commits == 1
        assert runs == [(job_id, 1) for job_id in ids]
        assert worker.stats.given_back == 0 and worker.stats.succeeded == 3 and worker.stats.lost_acks == 0
        assert db.query("SELECT COUNT(*) FROM nq_job") == [(0,)]
    finally:
        blocker.close()
        worker.work.close()
        worker.presence.close()


def test_a_failed_claim_whose_jobs_were_all_taken_back_has_nothing_to_retake(db):
    """Regression (a 4-minute fault run, consumer_exit): a batch whose only job was taken back
    while its process was stopped, and whose claim's COMMIT then failed, asked which of no jobs
    it held: `id IN ()`, error 1064, and the worker exited."""
    session = Session(db.config().dsn)
    try:
        assert queries.retake(session, [], 1, "o" * 32, 30.0, None, 0.0) == []
    finally:
        session.close()
