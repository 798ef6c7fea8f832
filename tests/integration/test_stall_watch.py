"""No stall is silent (consume/stall.py): a call overdue for its reply is said in a WARNING, and a
reply the server is not going to send is not waited for until the read timeout."""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import threading
import time

import MySQLdb
import pytest
from conftest import admin_connect, wait_until

from notifyq import errors
from notifyq.consume import handlers
from notifyq.consume.service import ConsumeOptions, ConsumerService, Running
from notifyq.consume.stall import StallWatch
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer
from notifyq.store import advisory, locks
from notifyq.store.db import Session
from notifyq.store.pipeline import Pending

STALL_S = 0.5  # the tests' overdue mark (the service's is STALL_S, 5 s)


def _stuck_read(session: Session) -> threading.Thread:
    """A thread waiting for a reply the server will not send: the state a KILL QUERY between two
    statements of one query leaves (the server lists the session idle). Here the reply of a
    statement sent ahead is read behind the pipeline's back, which then waits for it."""
    cur = session.conn.cursor()
    cur.execute("DO 1")
    cur.close()
    session.pipeline.pending = Pending("test", commit=False)
    session._conn.send_query(b"DO 1")
    session._conn.read_query_result()
    thread = threading.Thread(target=session.pipeline.read_reply, daemon=True)
    thread.start()
    return thread


def _overdue(watch: StallWatch, session: Session) -> None:
    """Check until the watch has looked at the session's overdue call."""
    wait_until(lambda: (watch.check([("victim", session)], STALL_S), watch.stalls)[1], 10,
               message="the stall watch's look")


def test_a_reply_the_server_will_not_send_is_said_and_its_connection_ended_long_before_the_read_timeout(db, caplog):
    # Given a session waiting for the reply to a statement sent ahead whose reply was already
    # read elsewhere: the server lists the session idle, and no reply is coming (as after a KILL
    # QUERY that cut a multi-statement query short), with a 60 s read timeout
    session = Session(db.config().dsn, autocommit=True, name="victim", read_timeout_s=60)
    watch = StallWatch(db.config().dsn)
    started = time.monotonic()
    reader = _stuck_read(session)
    try:
        with caplog.at_level(logging.INFO, logger="notifyq.consumer"):
            # When the stall watch checks once the call is overdue
            _overdue(watch, session)
            # Then the read ends within seconds, its connection ended, and the log said so
            reader.join(10)
            assert not reader.is_alive(), "the read waited on"
            assert time.monotonic() - started < 15
            assert watch.ended == 1
            assert any(r.levelno == logging.WARNING and "not coming" in r.getMessage() and "victim" in r.getMessage()
                       for r in caplog.records)
            # And once the call ended, an INFO line says after how long
            watch.check([("victim", session)], STALL_S)
            assert any("no longer stalled" in r.getMessage() for r in caplog.records)
        # And the session works again, on a new connection
        assert advisory.lock_holder(session, "nq_test_nothing") is None and session.generation == 2
    finally:
        session.close()


def test_a_slow_statement_the_server_still_runs_is_said_and_left_alone(db, caplog):
    # Given a session in a statement that takes 3 s on the server, with no wait of its own declared
    session = Session(db.config().dsn, autocommit=True, name="victim")
    result: list = []
    runner = threading.Thread(target=lambda: result.append(
        session.run(lambda cur: (cur.execute("SELECT SLEEP(3)"), cur.fetchone())[1], what="slow")), daemon=True)
    watch = StallWatch(db.config().dsn)
    try:
        with caplog.at_level(logging.WARNING, logger="notifyq.consumer"):
            runner.start()
            # When the stall watch checks once it is overdue
            _overdue(watch, session)
            # Then it says the server still runs it, and ends nothing: the statement completes
            runner.join(10)
            assert result == [(0,)] and watch.ended == 0 and session.generation == 1
            assert any("still running" in r.getMessage() for r in caplog.records)
    finally:
        session.close()


def test_a_row_lock_wait_the_server_still_runs_is_left_alone(db):
    # Given a session waiting for a row lock another transaction holds (innodb_lock_wait_timeout 10 s)
    cfg = db.config()
    with Producer("q", cfg) as producer:
        job_id = producer.put({"n": 1})
    holder = admin_connect(db.admin, db.admin.database)
    holder.autocommit(False)
    holder.cursor().execute("SELECT id FROM nq_job WHERE id = %s FOR UPDATE", (job_id,))
    session = Session(cfg.dsn, name="victim")
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(session.run(
        lambda cur: (cur.execute("SELECT id FROM nq_job WHERE id = %s FOR UPDATE", (job_id,)), cur.fetchone())[1],
        what="locking read")), daemon=True)
    watch = StallWatch(cfg.dsn)
    try:
        waiter.start()
        # When the watch checks it, overdue, for 3 s (past its look and IDLE_S)
        _overdue(watch, session)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            watch.check([("victim", session)], STALL_S)
            waiter.join(0.1)
        # Then it ended nothing: once the lock is free, the statement has its row
        assert watch.ended == 0 and waiter.is_alive()
        holder.commit()
        waiter.join(10)
        assert got == [(job_id,)] and session.generation == 1
    finally:
        holder.close()
        session.close()


def test_a_wait_within_its_declared_bound_is_no_stall(db):
    # Given a session in a 2 s GET_LOCK wait (a lock another session holds)
    cfg = db.config()
    holder, waiter = Session(cfg.dsn, autocommit=True, name="holder"), Session(cfg.dsn, autocommit=True, name="w")
    watch = StallWatch(cfg.dsn)
    try:
        assert advisory.get_lock(holder, "nq_test_lock", 0) == 1
        got: list = []
        thread = threading.Thread(target=lambda: got.append(advisory.get_lock(waiter, "nq_test_lock", 2)), daemon=True)
        thread.start()
        wait_until(lambda: waiter.waiting is not None, 10, message="the wait")
        # When the watch checks all through it, past STALL_S
        while thread.is_alive():
            watch.check([("w", waiter)], STALL_S)
            thread.join(0.1)
        # Then nothing was said: the wait ended as it was asked to, by its timeout
        assert got == [0] and watch.stalls == 0
    finally:
        holder.close()
        waiter.close()


def test_a_peer_that_finds_jobs_the_watcher_never_handed_on_says_so_and_claims_them(db, caplog):
    """Regression: a consumer stuck holding the watch lock (a reply it waited for in vain) left its
    peers to find the ready jobs at their watch lock's timeout, and nothing said so."""
    cfg = db.config(wakeup={"idle_wait_s": 1.0})
    stuck = Session(cfg.dsn, autocommit=True, name="stuck-watcher")
    runs: list[int] = []
    worker = Worker(cfg, "q", handlers.PythonHandler(lambda job: runs.append(job.id), False),
                    stop=threading.Event(), budget=Budget(None))
    try:
        # Given a watcher that holds the queue's watch lock and never hands it on, and a ready job
        assert advisory.get_lock(stuck, locks.QueueLocks(cfg.dsn.database, "q").watch, 0) == 1
        with Producer("q", cfg) as p:
            job_id = p.put({"n": 1})
        worker.presence.ensure_registered(worker)
        with caplog.at_level(logging.WARNING, logger="notifyq.consumer"):
            # When an idle peer's wait for the watch lock times out
            busy = worker._idle()
            # Then it says the jobs were not handed on, and claims them itself
            assert busy is True
            assert any("not handed them on" in r.getMessage() for r in caplog.records)
        worker._claim_and_run()
        worker.acks.flush(worker.work)
        assert runs == [job_id]
    finally:
        stuck.close()
        worker.work.close()
        worker.presence.close()


def test_sigterm_does_not_wait_out_the_read_timeout_of_a_worker_stuck_in_a_read(db):
    """Regression: a consumer stuck in a read took 40-56 s to exit on SIGTERM (its read timeout)."""
    # Given a consumer service whose one worker waits for a reply that is not coming (60 s read timeout)
    cfg = db.config(consumer={"shutdown_grace_s": 30.0})
    service = ConsumerService(cfg, ConsumeOptions(queues=("q",), function=lambda job: None, workers=1))
    worker = Worker(cfg, "q", handlers.PythonHandler(lambda job: None, False), stop=service.stop,
                    budget=Budget(None), presence=service.presence)
    thread = _stuck_read(worker.work)
    service.running.append(Running(worker, thread))
    wait_until(lambda: worker.work.waiting is not None, 10, message="the stuck read")
    # When it shuts down, with 30 s of grace
    started = time.monotonic()
    service.begin_shutdown()
    service.finish_shutdown(started + 30)
    # Then the read ended within a few seconds: the stall watch ended its connection
    assert not thread.is_alive()
    assert time.monotonic() - started < 10
    assert service.stall_watch.ended == 1
    worker.work.close()


def test_a_worker_loop_that_stops_turning_outside_a_handler_and_any_database_call_is_said(db, caplog):
    """Before, the only sign was the systemd watchdog going unfed (healthy() false), silently."""
    # Given a consumer service whose one worker's loop last turned longer ago than an idle wait
    service = ConsumerService(db.config(), ConsumeOptions(queues=("q",), function=lambda job: None, workers=1))
    worker = Worker(service.config, "q", handlers.PythonHandler(lambda job: None, False), stop=service.stop,
                    budget=Budget(None), name="w1", presence=service.presence)
    release = threading.Event()
    thread = threading.Thread(target=release.wait, daemon=True)
    thread.start()
    service.running.append(Running(worker, thread))
    worker.work.conn  # (connected: not a worker waiting for its server)
    service.presence.session.conn
    try:
        with caplog.at_level(logging.INFO, logger="notifyq.consumer"):
            worker.last_turn = time.monotonic() - service.loop_limit_s() - 1
            # When the main loop turns
            service.turn()
            service.turn()
            # Then it says so, once
            said = [r for r in caplog.records if "loop has not turned" in r.getMessage()]
            assert len(said) == 1 and said[0].levelno == logging.WARNING and "w1" in said[0].getMessage()
            # And when the loop turns again, that too
            worker._turned()
            service.turn()
            assert any("turns again" in r.getMessage() for r in caplog.records)
    finally:
        release.set()
        worker.work.close()
        service.presence.close()


class BlackHole:
    """A TCP relay to the test server whose path can go black without closing anything, as a dead
    network path does: after freeze(), the server's replies on every connection open then are
    dropped (read, never passed on: the server has sent them and lists the session idle); while
    `unreachable` is set, new connections are accepted but never reach the server (no handshake).
    freeze_on(data): the first connection that sends `data` next is frozen as it does (once)."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.unreachable = threading.Event()
        self._lock = threading.Lock()
        self._open: set[int] = set()  # connections (by number) passing replies on
        self._frozen: set[int] = set()  # connections whose replies are dropped
        self._sockets: list[socket.socket] = []
        self._trigger: bytes | None = None
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze_on(self, data: bytes) -> None:
        with self._lock:
            self._trigger = data

    def freeze(self) -> None:
        with self._lock:
            self._frozen |= self._open

    def thaw(self) -> None:
        """Later replies pass again (the dropped ones stay lost)."""
        with self._lock:
            self._frozen.clear()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _accept(self) -> None:
        number = 0
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._sockets.append(client)
            if self.unreachable.is_set():
                continue  # held open, never answered
            server = socket.create_connection(self.target)
            number += 1
            with self._lock:
                self._sockets.append(server)
                self._open.add(number)
            threading.Thread(target=self._pass, args=(client, server, None, number), daemon=True).start()
            threading.Thread(target=self._pass, args=(server, client, number), daemon=True).start()

    def _pass(self, src: socket.socket, dst: socket.socket, number: int | None, sent_on: int | None = None) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    if sent_on is not None and self._trigger is not None and self._trigger in data:
                        self._trigger = None
                        self._frozen.add(sent_on)
                if number is None or number not in self._frozen:
                    dst.sendall(data)
        except OSError:
            pass
        if number is None or number not in self._frozen:  # (a black hole passes no close on either)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


def _through(db, relay: BlackHole, **overrides):
    return db.config(dsn=f"mysql://nq_runtime@127.0.0.1:{relay.port}/{db.dsn.database}", **overrides)


def test_ready_jobs_run_within_seconds_when_the_path_to_the_server_goes_black(db, caplog):
    """Regression: the watch KILLed the connection of a call whose reply a black-holed path had lost,
    but the server's close never reached the client: the call returned only at its read timeout
    (56 s), and the ready jobs waited that long, twice over (the watcher's, then the claim's)."""
    admin = db.config().dsn
    relay = BlackHole(admin.host, admin.port)
    cfg = _through(db, relay, wakeup={"idle_wait_s": 1.0})
    runs: list[int] = []
    service = ConsumerService(cfg, ConsumeOptions(queues=("q",), function=lambda job: runs.append(job.id),
                                                  workers=1))
    stop = threading.Event()
    runner = threading.Thread(target=service.run, args=(stop,), daemon=True)
    try:
        runner.start()
        wait_until(lambda: service.workers and all(w.waiter.watching for w in service.workers), 30,
                   message="the consumer watching the queue")
        with caplog.at_level(logging.INFO, logger="notifyq.consumer"):
            # Given a consumer whose every connection goes black: the server's replies are lost,
            # nothing is closed (60 s read timeout)
            relay.freeze()
            # When jobs are put meanwhile (by a producer whose path works)
            put_at = time.monotonic()
            with Producer("q", db.config()) as producer:
                ids = [producer.put({"n": n}) for n in range(2)]
            # Then the stall watch ends the stalled calls (on the client's side too), the consumer
            # reconnects, and the jobs run within seconds, not after the read timeout
            wait_until(lambda: sorted(runs) == sorted(ids), 30, message="the jobs run")
            assert time.monotonic() - put_at < 30
            assert service.stall_watch.ended >= 1
            assert any("not coming" in r.getMessage() for r in caplog.records)
    finally:
        relay.thaw()
        stop.set()
        runner.join(30)
        relay.close()
    assert not runner.is_alive()


def test_a_call_behind_a_black_hole_to_a_server_that_cannot_be_reached_returns_within_seconds(db, caplog):
    """Regression: a server that cannot be reached at all could only be said ("could not be asked
    why"), looked at again, and the call waited out its read timeout (56 s)."""
    admin = db.config().dsn
    relay = BlackHole(admin.host, admin.port)
    dsn = _through(db, relay).dsn
    session = Session(dsn, autocommit=True, name="victim", read_timeout_s=60, retry_s=1)
    watch = StallWatch(dsn)
    outcome: list = []

    def call() -> None:
        try:
            outcome.append(session.run(lambda cur: (cur.execute("SELECT 1"), cur.fetchone())[1], what="probe"))
        except errors.NotifyqError as e:
            outcome.append(e)

    try:
        session.conn  # connected through the relay
        # Given a session whose path goes black, for its connection and for any new one
        relay.unreachable.set()
        relay.freeze()
        with caplog.at_level(logging.WARNING, logger="notifyq.consumer"):
            # When a call is made and the watch checks it once overdue
            started = time.monotonic()
            caller = threading.Thread(target=call, daemon=True)
            caller.start()
            wait_until(lambda: (watch.check([("victim", session)], STALL_S), not caller.is_alive())[1], 30,
                       message="the call returned")
            # Then it returned within seconds (failed: its server cannot be reached), not at its
            # read timeout, its connection ended on this side, and the log said so
            assert time.monotonic() - started < 20
            assert watch.ended == 1 and isinstance(outcome[0], errors.DatabaseError), outcome
            assert any("cannot be reached" in r.getMessage() for r in caplog.records)
        # And once the path works again, the next call reconnects and is answered
        relay.unreachable.clear()
        relay.thaw()
        assert session.run(lambda cur: (cur.execute("SELECT 1"), cur.fetchone())[1], what="probe") == (1,)
        assert session.generation == 2
    finally:
        session.discard()
        relay.close()


def _service_with_worker(cfg, handler, exit_when_empty: bool = False) -> tuple[ConsumerService, Worker, threading.Thread]:
    """A consumer service (its stall watch, its sessions) with one worker of `handler`, not started."""
    service = ConsumerService(cfg, ConsumeOptions(queues=("q",), function=lambda job: None, workers=1))
    worker = Worker(cfg, "q", handlers.PythonHandler(handler, False), stop=service.stop, budget=Budget(None),
                    exit_when_empty=exit_when_empty, presence=service.presence)
    thread = threading.Thread(target=worker.run, daemon=True)
    service.running.append(Running(worker, thread))
    return service, worker, thread



def _ended_then_run_again(db, caplog, service: ConsumerService, thread: threading.Thread, job_id: int,
                          raised: list[str], what: str) -> None:
    """Start the worker, its block's call (`what`) waiting for a reply that is not coming; the
    stall watch must end its connection within seconds, and the job's next run complete it."""
    watch, started = service.stall_watch, time.monotonic()
    with caplog.at_level(logging.INFO, logger="notifyq.consumer"):
        thread.start()
        # When the stall watch checks the service's sessions
        wait_until(lambda: (watch.check(service.sessions(), STALL_S), watch.ended)[1], 20,
                   message="the stall watch ended the block's connection")
        # Then it said the reply is not coming and ended the connection, long before the read
        # timeout; the block raised, nothing was stored, and the job's next run completes it
        wait_until(lambda: raised == ["TransientDBError", "completed"], 20, message="the job's two runs")
        assert time.monotonic() - started < 20
        assert any(r.levelno == logging.WARNING and "not coming" in r.getMessage()
                   and what in r.getMessage() for r in caplog.records)
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job WHERE id = %s", (job_id,)) == 0, 10,
                   message="the job done")


def _complete_in_a_block(job, locked: threading.Event, entered: threading.Event) -> None:
    with job.transaction() as cur:
        cur.execute("DO 1")
        entered.set()
        assert locked.wait(10)


def _complete_in_the_handlers_connection(job, locked: threading.Event, entered: threading.Event,
                                         dsn=None) -> None:
    conn = MySQLdb.connect(**dsn.connect_args())
    try:
        entered.set()
        assert locked.wait(10)
        job.complete_in(conn)
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize("how, what", [("transaction", "complete a job in its transaction"),
                                       ("complete_in", "complete a job on the caller's connection")])
def test_a_job_completion_waiting_on_a_lock_is_said_like_an_ack(db, caplog, how, what):
    """Regression: the completion and COMMIT of a job.transaction() block, and the completion
    job.complete_in(conn) writes on the handler's connection, ran outside the calls the stall
    watch reads (Session.waiting): stuck on a lock, or on a reply that is not coming, nothing was
    said, where an ack stuck the same way logs `stalled:`."""
    # Given a consumer service's worker whose handler completes its job (in its block, or on its
    # own connection) once another session holds the job's row lock: the completion waits on it
    cfg = db.config()
    with Producer("q", cfg) as p:
        job_id = p.put({"n": 1})
    entered, locked, done = threading.Event(), threading.Event(), []
    complete = (_complete_in_a_block if how == "transaction"
                else functools.partial(_complete_in_the_handlers_connection, dsn=cfg.dsn))

    def handler(job):
        complete(job, locked, entered)
        done.append(job.id)

    service, worker, thread = _service_with_worker(cfg, handler, exit_when_empty=True)
    watch = service.stall_watch
    holder = admin_connect(db.admin, db.admin.database)
    try:
        with caplog.at_level(logging.INFO, logger="notifyq.consumer"):
            thread.start()
            assert entered.wait(10), "the handler did not start"
            cur = holder.cursor()
            cur.execute("BEGIN")
            cur.execute("SELECT id FROM nq_job WHERE id = %s FOR UPDATE", (job_id,))
            locked.set()
            # When the stall watch checks the service's sessions once the completion is overdue
            # (well within the lock's wait, innodb_lock_wait_timeout = 10 s)
            wait_until(lambda: (watch.check(service.sessions(), STALL_S), watch.stalls)[1], 6,
                       message="the stall watch said the completion's wait")
            # Then it says the completion's call, which the server still runs, and ends nothing
            said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                    and r.getMessage().startswith("stalled:")]
            assert len(said) == 1 and "still running" in said[0] and what in said[0], said
            assert watch.ended == 0
            # And once the lock goes, the job completes and the watch says the call ended
            holder.rollback()
            thread.join(15)
            assert not thread.is_alive() and worker.error is None and done == [job_id]
            watch.check(service.sessions(), STALL_S)
            assert any("no longer stalled" in r.getMessage() for r in caplog.records)
        assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    finally:
        locked.set()
        holder.close()
        thread.join(15)
        worker.work.close()
        service.presence.close()


def test_a_job_transaction_completion_whose_reply_is_not_coming_is_said_and_its_connection_ended(db, caplog):
    """Regression: a block's completion waiting for a reply that is not coming (a lost COMMIT's)
    was silent until the read timeout, a minute."""
    # Given a consumer service's worker whose first run's block waits, as its completion, for a
    # reply the server will not send (the server lists the session without a statement)
    cfg = db.config(defaults={"retry_base_s": 0.01, "retry_max_s": 0.01})
    with Producer("q", cfg) as p:
        job_id = p.put({"n": 1})
    raised: list[str] = []

    def handler(job):
        try:
            with job.transaction() as cur:
                cur.execute("DO 1")
                if job.attempts == 1:
                    conn = cur.connection
                    cur.execute = lambda query, args=None: conn.read_query_result()  # nothing was sent
        except Exception as e:
            raised.append(type(e).__name__)
            raise
        raised.append("completed")

    service, worker, thread = _service_with_worker(cfg, handler)
    try:
        _ended_then_run_again(db, caplog, service, thread, job_id, raised, "complete a job in its transaction")
    finally:
        worker.stop.set()
        if thread.is_alive() and worker.work.connection_id:  # (on the code before: the read waits on)
            try:
                db.query(f"KILL CONNECTION {int(worker.work.connection_id)}")
            except MySQLdb.OperationalError as e:
                if e.args[0] != 1094:  # gone already: the worker was between its last statement and its exit
                    raise
        thread.join(15)
        worker.work.close()
        service.presence.close()


def test_a_complete_in_whose_reply_is_not_coming_is_ended_on_the_callers_side_too(db, caplog):
    """Regression: behind a path gone black, the watch said the completion complete_in wrote on
    the handler's connection and KILLed it on the server, but the server's close never reached
    the caller: the call never returned (the driver has no read timeout), its worker wedged."""
    # Given a worker whose handler completes its job on a connection of its own through a relay
    # whose path goes black once the handler holds it
    cfg = db.config(defaults={"max_attempts": 1})
    admin = cfg.dsn
    relay = BlackHole(admin.host, admin.port)
    through = _through(db, relay).dsn
    with Producer("q", cfg) as p:
        p.put({"n": 1})
    entered, go, raised = threading.Event(), threading.Event(), []

    def handler(job):
        conn = MySQLdb.connect(**through.connect_args())
        try:
            entered.set()
            assert go.wait(10)
            try:
                job.complete_in(conn)
            except Exception as e:
                raised.append(e)
                raise
            conn.commit()
        finally:
            conn.close()

    service, worker, thread = _service_with_worker(cfg, handler, exit_when_empty=True)
    watch = service.stall_watch
    try:
        with caplog.at_level(logging.INFO, logger="notifyq.consumer"):
            thread.start()
            assert entered.wait(10), "the handler did not start"
            relay.freeze()
            started = time.monotonic()
            go.set()
            # When the stall watch checks the service's sessions
            wait_until(lambda: (watch.check(service.sessions(), STALL_S), raised)[1], 20,
                       message="complete_in raised")
            # Then it ended the caller's connection on this side too: complete_in raised within
            # seconds, as a lost connection (nothing of the caller's transaction is stored)
            assert time.monotonic() - started < 15
            assert isinstance(raised[0], errors.TransientDBError), raised
            assert watch.ended == 1
            assert any(r.levelno == logging.WARNING and "not coming" in r.getMessage()
                       and "complete a job on the caller's connection" in r.getMessage() for r in caplog.records)
            # And the worker goes on: the job failed (its only attempt), nothing is left claimed
            thread.join(15)
            assert not thread.is_alive() and worker.error is None
            watch.check(service.sessions(), STALL_S)
            assert any("no longer stalled" in r.getMessage() for r in caplog.records)
        assert db.query("SELECT status, owner FROM nq_job") == [(4, None)]
    finally:
        go.set()
        relay.close()
        thread.join(15)
        worker.work.close()
        service.presence.close()


def test_the_savepoint_a_job_transaction_opens_with_is_watched(db, caplog):
    """Regression: the reply to the SAVEPOINT a job.transaction() block opens with, lost behind a
    path gone black, was waited for unsaid until the read timeout (60 s): only the block's
    completion and COMMIT were watched."""
    # Given a consumer whose work session goes through a relay that loses every reply on the
    # connection once it sends the block's SAVEPOINT (once)
    admin = db.config().dsn
    relay = BlackHole(admin.host, admin.port)
    cfg = _through(db, relay, defaults={"retry_base_s": 0.01, "retry_max_s": 0.01})
    with Producer("q", db.config()) as p:
        job_id = p.put({"n": 1})
    raised: list[str] = []

    def handler(job):
        try:
            with job.transaction() as cur:
                cur.execute("DO 1")
        except Exception as e:
            raised.append(type(e).__name__)
            raise
        raised.append("completed")

    service, worker, thread = _service_with_worker(cfg, handler)
    relay.freeze_on(b"SAVEPOINT nq_block")
    try:
        _ended_then_run_again(db, caplog, service, thread, job_id, raised, "open a job's transaction")
    finally:
        worker.stop.set()
        relay.close()
        thread.join(15)
        worker.work.close()
        service.presence.close()


def test_an_ack_whose_reply_is_lost_and_that_landed_is_counted_done_not_lost(db, caplog):
    """Regression: an ack whose reply was lost (its connection ended by the watch) was retried on
    a new connection and found the rows gone, because its first try had landed: the consumer
    logged `acks lost: jobs were reclaimed from us` and counted lost_acks=1, done=0, for a job
    this very claim had acked (one attempt record, done)."""
    # Given a consumer whose work session goes through a relay that loses the reply to its
    # first ack (the statements of an ack begin with the jobs' 'done' records)
    admin = db.config().dsn
    relay = BlackHole(admin.host, admin.port)
    cfg = _through(db, relay)
    with Producer("q", db.config()) as p:
        job_id = p.put({"n": 1})
    service, worker, thread = _service_with_worker(cfg, lambda job: None)
    watch = service.stall_watch
    relay.freeze_on(b"'done', owner")
    try:
        with caplog.at_level(logging.INFO, logger="notifyq.consumer"):
            thread.start()
            # When the worker acks the job (idle after it), and the stall watch ends the ack's
            # connection, its reply not coming
            wait_until(lambda: (watch.check(service.sessions(), STALL_S), worker.stats.succeeded
                                + worker.stats.lost_acks)[1], 20, message="the ack counted")
            # Then the job is counted done, not lost: its ack landed on the try whose reply was lost
            assert watch.ended == 1
            assert (worker.stats.succeeded, worker.stats.lost_acks) == (1, 0)
            assert not [r for r in caplog.records if "acks lost" in r.getMessage()]
        assert db.query("SELECT attempt, outcome FROM nq_attempt WHERE job_id = %s", (job_id,)) == [(1, "done")]
    finally:
        service.stop.set()
        relay.close()
        thread.join(15)
        worker.work.close()
        service.presence.close()
