"""Workflows against the real server: a child waits until its parents are done, and is released
exactly once, in the transaction that ends its parent (docs/workflows.md)."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import MySQLdb
import pytest
from conftest import cron_run, run_cli, wait_until
from test_effects import drain

import notifyq
from notifyq import errors
from notifyq.consume import batch as batch_mod
from notifyq.consume import handlers, reaper
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.ops import admin
from notifyq.produce import workflow as workflow_mod
from notifyq.produce.producer import Producer
from notifyq.store import queries, workflows
from notifyq.store.db import Session

WAITING, CANCELLED = 6, 5


@contextlib.contextmanager
def opened(db, retry_s: float = 30.0):
    session = Session(db.config().dsn, name="test", retry_s=retry_s)
    try:
        yield session
    finally:
        session.close()


def status(db, job_id):
    return db.scalar("SELECT status FROM nq_job WHERE id = %s", (job_id,))


def test_a_chain_runs_in_order_and_its_jobs_wait_until_then(db):
    # Given a chain of three jobs
    wf = notifyq.Workflow()
    refs = wf.chain("q", [{"n": 0}, {"n": 1}, {"n": 2}])
    with Producer("q", db.config()) as p:
        ids = p.put_workflow(wf)
    # Then the first is ready and the others wait (not claimable, not counted as ready)
    assert [r.id for r in refs] == ids
    assert [status(db, i) for i in ids] == [0, WAITING, WAITING]
    shown = run_cli(db.env, "status", "--json")
    assert shown.returncode == 0, shown.stderr
    figures = json.loads(shown.stdout)["queues"]["q"]
    assert (figures["ready"], figures["waiting"]) == (1, 2)
    # When a consumer drains the queue
    ran = []
    drain(db, lambda job: ran.append(job.payload["n"]))
    # Then each ran once, in order, and none is left
    assert ran == [0, 1, 2]
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    assert db.scalar("SELECT COUNT(*) FROM nq_edge WHERE state <> 2") == 0
    # And a reaper pass's sweep drops the edges of children that are gone
    reaper.reap_once(db.config().dsn)
    assert db.scalar("SELECT COUNT(*) FROM nq_edge") == 0


def test_one_cron_run_runs_a_chain_to_its_end(db):
    # Given a chain of three jobs on one queue
    wf = notifyq.Workflow()
    wf.chain("q", [{"n": 0}, {"n": 1}, {"n": 2}])
    with Producer("q", db.config()) as p:
        p.put_workflow(wf)
    # When ONE consumer run with --exit-when-empty drains the queue
    ran = []
    worker = cron_run(db.config(), "q", lambda job: ran.append(job.payload["n"]))
    # Then it did not stop while its own ack had released the next job: all three ran, in order
    assert worker.error is None, worker.error
    assert ran == [0, 1, 2]
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0


def test_a_batch_callback_runs_once_after_its_members_and_reads_their_results(db):
    # Given ten members and an on_success callback, and a queue that keeps results
    wf = notifyq.Workflow()
    members = [wf.add("q", {"n": i}) for i in range(10)]
    batch = wf.batch(members, on_success=("q", {"callback": True}))
    with Producer("q", db.config()) as p:
        p.put_workflow(wf)
        assert p.progress(batch.on_success.id) == {"done": 0, "failed": 0, "pending": 10, "awaited": 10}
        # And `notifyq jobs show` of the callback says where its batch is
        shown = run_cli(db.env, "jobs", "show", str(batch.on_success.id))
        assert shown.returncode == 0, shown.stderr
        assert "waiting" in shown.stdout and '"pending": 10' in shown.stdout
        seen = []

        def handler(job):
            if job.payload.get("callback"):
                seen.append((job.id, p.progress(job.id), p.parent_results(job.id)))
                return None
            return job.payload["n"] * 10

        # When the members are run (the callback among them, once released)
        drain(db, handler, result_ttl_s=3600)
    # Then the callback ran once, after them all, and read every member's result
    [(job_id, progress, results)] = seen
    assert job_id == batch.on_success.id
    assert progress == {"done": 10, "failed": 0, "pending": 0, "awaited": 0}
    assert sorted(results.values()) == [n * 10 for n in range(10)]


def test_a_dead_parent_cancels_its_waiting_children_and_a_retry_lets_them_go_on(db):
    # Given a parent with a child, a grandchild, a child that runs anyway, and callbacks
    wf = notifyq.Workflow()
    parent = wf.add("q", {"fail": True}, max_attempts=1)
    child = wf.add("q", {"n": 1}, after=[parent])
    grandchild = wf.add("q", {"n": 2}, after=[child])
    anyway = wf.add("q", {"n": 3}, after=[parent], run_anyway=True)
    batch = wf.batch([parent], on_success=("q", {"n": 4}), on_complete=("q", {"n": 5}), on_dead=("q", {"n": 6}))
    with Producer("q", db.config()) as p:
        p.put_workflow(wf)
    ran = []
    fail = [True]

    def handler(job):
        if job.payload.get("fail") and fail[0]:
            raise RuntimeError("boom")
        ran.append(job.payload.get("n", 0))

    # When the parent ends dead
    drain(db, handler, keep_done=True)
    # Then the children that need it done end cancelled with the reason, down the line
    assert status(db, parent.id) == 4
    for ref in (child, grandchild, batch.on_success):
        assert status(db, ref.id) == CANCELLED
    reason = db.scalar("SELECT last_error FROM nq_job WHERE id = %s", (child.id,))
    assert reason == f"not run: parent {parent.id} ended dead"
    # And those that run anyway, or on a death, ran once
    assert sorted(ran) == [3, 5, 6]
    # When the dead parent is retried and now succeeds
    fail[0] = False
    with opened(db) as session:
        assert admin.retry(session, parent.id) == "retried"
    drain(db, handler, keep_done=True)
    # Then the cancelled children waited again and ran, once each; the others did not run again
    assert sorted(ran) == [0, 1, 2, 3, 4, 5, 6]
    assert all(status(db, r.id) == 3 for r in (child, grandchild, batch.on_success))


def test_an_ack_run_again_releases_nothing_twice(db):
    # Given a child of two parents, both claimed
    with Producer("q", db.config()) as p:
        a, b = p.put_many([{"n": 0}, {"n": 1}])
        child = p.put({"n": 2}, after=[a, b])
    with opened(db) as session:
        claim = queries.claim(session, "q", "owner-1", 10, 30.0)
        session.conn  # the claim's COMMIT read
        assert sorted(j.id for j in claim.jobs) == [a, b]
        # When parent a's ack runs twice (a retry after a reply lost)
        assert queries.ack(session, [a], claim.token, keep=False) == 1
        queries.ack(session, [a], claim.token, keep=False)
        # Then the child still waits for b: counted down once, not twice
        assert (status(db, child), db.scalar("SELECT waits_on FROM nq_job WHERE id = %s", (child,))) == (WAITING, 1)
        # And b's ack releases it, once
        queries.ack(session, [b], claim.token, keep=False)
    assert status(db, child) == 0


def test_the_completion_in_the_handlers_transaction_releases_its_children(db):
    with Producer("q", db.config()) as p:
        [parent] = p.put_many([{"n": 0}])
        child = p.put({"n": 1}, after=[parent])

    def handler(job):
        if job.id == parent:
            with job.transaction() as cur:
                # Then inside the parent's transaction the child still waits
                cur.execute("SELECT status FROM nq_job WHERE id = %s", (child,))
                assert cur.fetchone()[0] == WAITING

    ran = drain(db, handler)
    assert ran.succeeded == 2
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0


def test_a_put_after_parents_that_ended_settles_at_once(db):
    with Producer("q", db.config()) as p:
        done, dead = p.put_many([{"n": 0}]), p.put_many([{"n": 1}], max_attempts=1)
        drain(db, lambda job: 1 / job.payload["n"] - 1 / 0 if job.payload["n"] else None)
        # When children are put after a parent done (its row deleted) and one dead
        released = p.put({"n": 2}, after=done)
        cancelled = p.put({"n": 3}, after=dead)
        anyway = p.put({"n": 4}, after=dead, run_anyway=True)
    # Then the first is ready at once, the second cancelled, the third ready
    assert [status(db, i) for i in (released, cancelled, anyway)] == [0, CANCELLED, 0]


@pytest.mark.parametrize("case", ["cycle", "unknown parent", "too many edges", "bad queue"])
def test_bad_input_is_one_clear_error_and_nothing_is_written(db, case, monkeypatch):
    wf = notifyq.Workflow()
    a = wf.add("q", {"n": 0})
    b = wf.add("q", {"n": 1}, after=[a])
    if case == "cycle":
        wf.after(a, [b])
        match = "cycle: jobs 1, 2"
    elif case == "unknown parent":
        wf.add("q", {"n": 2}, after=[999_999])
        match = "no job 999999"
    elif case == "too many edges":
        monkeypatch.setattr(workflow_mod, "MAX_EDGES", 2)
        with pytest.raises(errors.InputError, match="too many edges"):
            wf.add("q", {}, after=[a, b])
        return
    else:
        with pytest.raises(errors.InputError, match="queue"):
            wf.add("no such queue!", {})
        return
    with Producer("q", db.config()) as p:
        with pytest.raises(errors.InputError, match=match):
            p.put_workflow(wf)
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    assert db.scalar("SELECT COUNT(*) FROM nq_edge") == 0


@pytest.mark.parametrize("call", ["batch", "add", "after"])
def test_a_call_refused_for_too_many_edges_adds_nothing_and_the_put_stays_within_the_limit(db, monkeypatch, call):
    """Regression (an attack on the limits): a second batch's callback went past MAX_EDGES
    after its node and most of its edges were added; the put then wrote them all, the callback
    linked to all its members but the last (it could run before that one ended)."""
    # Given a workflow of 5 jobs, 5 edges short of its limit of 10
    monkeypatch.setattr(workflow_mod, "MAX_EDGES", 10)
    wf = notifyq.Workflow()
    members = [wf.add("q", {"n": n}) for n in range(5)]
    wf.batch(members, on_success=("q", {"cb": 1}))
    # When a call would add 6 more edges
    with pytest.raises(errors.InputError, match="too many edges"):
        if call == "batch":
            wf.batch(members, on_complete=("q", {"cb": 2}), on_dead=("q", {"cb": 3}))
        elif call == "add":
            wf.add("q", {"cb": 2}, after=members + [members[0]])
        else:
            wf.after(members[4], members[:4] + [members[0], members[1]])
    # Then it added nothing: the put writes the 6 jobs and 5 edges, every edge whole
    with Producer("q", db.config()) as p:
        p.put_workflow(wf)
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 6
    assert db.scalar("SELECT COUNT(*) FROM nq_edge") == 5


def test_a_workflow_put_twice_is_refused_and_nothing_more_is_written(db):
    # Given a workflow that was put
    wf = notifyq.Workflow()
    a = wf.add("q", {"n": 0})
    wf.add("q", {"n": 1}, after=[a])
    with Producer("q", db.config()) as p:
        ids = p.put_workflow(wf)
        # When it is put again, or grown
        with pytest.raises(errors.InputError, match="this workflow was put already"):
            p.put_workflow(wf)
        with pytest.raises(errors.InputError, match="this workflow was put already"):
            wf.add("q", {"n": 2}, after=[a])
    # Then nothing more was written, and its refs still name the jobs of the first put
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 2
    assert a.id == ids[0]


def test_a_workflow_on_the_callers_connection_is_part_of_its_transaction(db):
    conn = MySQLdb.connect(**db.config().dsn.connect_args())
    wf = notifyq.Workflow()
    wf.chain("q", [{"n": 0}, {"n": 1}])
    try:
        with Producer("q", db.config()) as p:
            # When a workflow is put in the caller's transaction, rolled back
            p.put_workflow(wf, conn=conn)
            conn.rollback()
            # Then nothing of it is stored; and put again and committed, it is
            assert db.scalar("SELECT COUNT(*) FROM nq_edge") == 0
            ids = p.put_workflow(wf, conn=conn)
            conn.commit()
    finally:
        conn.close()  # else the test database's DROP waits for its locks
    assert [status(db, i) for i in ids] == [0, WAITING]


def test_cancelling_a_parent_cancels_what_waits_for_it(db):
    with Producer("q", db.config()) as p:
        [parent] = p.put_many([{"n": 0}])
        child = p.put({"n": 1}, after=[parent])
    with opened(db) as session:
        assert admin.cancel(session, parent) == "cancelled"
    assert [status(db, parent), status(db, child)] == [CANCELLED, CANCELLED]


def test_the_sweep_settles_a_parent_whose_release_never_ran(db):
    # Given a child whose parent ended done, its release cut short (the edge still waiting)
    with Producer("q", db.config()) as p:
        [parent] = p.put_many([{"n": 0}])
        child = p.put({"n": 1}, after=[parent])
    db.query("UPDATE nq_job SET status = 3 WHERE id = %s", (parent,))
    assert status(db, child) == WAITING
    # When a reaper pass runs
    result = reaper.reap_once(db.config().dsn)
    # Then the sweep released the child
    assert result.settled == 1 and status(db, child) == 0


def test_a_released_child_wakes_an_idle_consumer(db):
    # Given an idle worker waiting on the queue, and a child waiting for a parent claimed elsewhere
    with Producer("q", db.config()) as p:
        [parent] = p.put_many([{"n": 0}])
        child = p.put({"n": 1}, after=[parent])
    with opened(db) as session:
        claim = queries.claim(session, "q", "owner-1", 10, 30.0)
        session.conn
        ran = []
        stop = threading.Event()
        cfg = db.config(wakeup={"poll_max_s": 30.0})
        worker = Worker(cfg, "q", handlers.PythonHandler(lambda job: ran.append(job.id), False), stop=stop,
                        budget=Budget(None), batch_size=10)
        t = threading.Thread(target=worker.run)
        t.start()
        try:
            # When the parent is acked
            queries.ack(session, [parent], claim.token, keep=False)
            # Then the idle worker runs the child well before its 30 s poll
            wait_until(lambda: ran == [child], 10, message="the child run")
        finally:
            stop.set()
            t.join(30)


@pytest.mark.parametrize("ends", ["acked", "completed in its transaction", "completed on the caller's connection"])
def test_a_child_released_on_another_queue_wakes_that_queues_idle_consumer(db, ends):
    # Given idle workers of two queues that poll only every 10 s, and a child on queue "other"
    # of a parent on queue "q" (whose handler ends it by its ack, in job.transaction(), or by
    # job.complete_in() on the application's own connection, which the application commits)
    cfg = db.config(wakeup={"poll_initial_s": 10.0, "poll_max_s": 10.0})
    with Producer("q", db.config()) as p:
        [parent] = p.put_many([{"n": 0}], delay=1.5)  # runs once both workers idle
        child = Producer("other", db.config())
        with child:
            [child_id] = child.put_many([{"n": 1}], after=[parent])
    ran: dict[int, float] = {}

    def handler(job):
        ran.setdefault(job.id, time.monotonic())
        if ends == "completed in its transaction":
            with job.transaction():
                pass
        elif ends == "completed on the caller's connection":
            conn = MySQLdb.connect(**db.config().dsn.connect_args())
            try:
                job.complete_in(conn)
                conn.commit()
            finally:
                conn.close()

    # When the parent runs and is acked; then the other queue's idle worker runs the child well
    # before its 10 s poll
    _child_runs_before_its_poll(cfg, handler, ran, parent, child_id)


def _child_runs_before_its_poll(cfg, handler, ran: dict[int, float], parent: int, child_id: int) -> None:
    """Idle workers of "q" and "other" (`cfg` polls every 10 s) run `handler`: once the parent
    on "q" ran, its child on "other" runs well within that poll, woken by the parent's worker."""
    stop = threading.Event()
    workers = [Worker(cfg, queue, handlers.PythonHandler(handler, False),
                      stop=stop, budget=Budget(None), batch_size=10) for queue in ("q", "other")]
    threads = [threading.Thread(target=w.run) for w in workers]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: parent in ran, 60, message="the parent run")
        wait_until(lambda: child_id in ran, 30, message="the child run")
        assert ran[child_id] - ran[parent] < 4.0, "the child waited for its consumer's poll"
        assert workers[0].release_wake.wakes >= 1
    finally:
        stop.set()
        for t in threads:
            t.join(30)


def _in_its_poll(worker) -> bool:
    """Its watch statement waits out the poll: past its turn's first wait (FIRST_WAIT_S, rounded
    up to a second as the server's wait is)."""
    waiting = worker.waiter.session.waiting
    return waiting is not None and waiting.what == "watch" and waiting.wait_s >= 2


@pytest.mark.parametrize("ready", ["with no parent", "after a parent that is done"])
@pytest.mark.parametrize("put", ["on the producer's session", "on the caller's connection"])
def test_a_workflow_put_wakes_the_idle_consumers_of_the_other_queues_it_made_jobs_ready_on(db, put, ready):
    # Given an idle worker of queue "other" that polls only every 10 s, a producer of "q", and
    # (for a job put after it) a parent that is done already
    cfg = db.config(wakeup={"poll_initial_s": 10.0, "poll_max_s": 10.0})
    after = []
    if ready == "after a parent that is done":
        with Producer("q", db.config()) as p, opened(db) as session:
            after = [p.put({"n": -1})]
            claim = queries.claim(session, "q", "owner-1", 10, 30.0)
            queries.ack(session, after, claim.token, keep=False)
    ran: dict[int, float] = {}
    stop = threading.Event()
    worker = Worker(cfg, "other", handlers.PythonHandler(lambda job: ran.setdefault(job.id, time.monotonic()), False),
                    stop=stop, budget=Budget(None), batch_size=10)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: _in_its_poll(worker), 30, message="the other queue's watcher in its poll")
        # When it puts a workflow whose first job is on "other" (and a child on "q")
        wf = notifyq.Workflow()
        wf.add("q", {"n": 1}, after=[wf.add("other", {"n": 0}, after=after)])
        with Producer("q", db.config()) as p:
            put_at = time.monotonic()
            if put == "on the producer's session":
                root, _ = p.put_workflow(wf)
            else:  # the caller commits, then wakes (as the framework integrations do on commit)
                conn = MySQLdb.connect(**db.config().dsn.connect_args())
                try:
                    root, _ = p.put_workflow(wf, conn=conn)
                    conn.commit()
                finally:
                    conn.close()
                p.wake()
            # Then the other queue's idle worker runs it well before its 10 s poll
            wait_until(lambda: root in ran, 30, message="the workflow's first job run")
        assert ran[root] - put_at < 4.0, "the job waited for its consumer's poll"
    finally:
        stop.set()
        thread.join(30)


def test_a_workflow_put_on_many_queues_wakes_them_on_one_session(db):
    """Regression (an attack on the wake of the other queues): each queue woken kept a session
    of its own for the producer's life; a workflow with first jobs on 300 queues took the
    server past max_connections (1040 to every other client)."""
    # Given a producer that has put once (its own sessions are open)
    def sessions() -> int:
        return db.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = %s",
                         (db.config().dsn.database,))

    with Producer("q", db.config()) as p:
        p.put({"n": 0})
        before = sessions()
        # When it puts a workflow whose first jobs are on 60 other queues
        wf = notifyq.Workflow()
        for n in range(60):
            wf.add(f"many{n:02d}", {"n": n})
        p.put_workflow(wf)
        # Then it holds one session more for those wakes, not 60
        assert sessions() - before <= 2, (before, sessions())


@pytest.mark.parametrize("ends", ["dead", "cancelled while it ran"])
def test_a_child_that_runs_anyway_released_by_a_failed_parent_wakes_its_queues_idle_consumer(db, ends):
    # Given idle workers of two queues that poll only every 10 s, and a child on queue "other"
    # that runs anyway after its parent on "q", whose one attempt fails (dead), or whose cancel
    # is asked while it runs
    cfg = db.config(wakeup={"poll_initial_s": 10.0, "poll_max_s": 10.0})
    with Producer("q", db.config()) as p:
        [parent] = p.put_many([{"n": 0}], delay=1.5, max_attempts=1)  # runs once both workers idle
        with Producer("other", db.config()) as child:
            child_id = child.put({"n": 1}, after=[parent], run_anyway=True)
    ran: dict[int, float] = {}

    def handler(job):
        ran.setdefault(job.id, time.monotonic())
        if job.queue == "q":
            if ends == "cancelled while it ran":
                with opened(db) as session:
                    assert admin.cancel(session, job.id) == "requested"
            raise RuntimeError("the parent fails")

    # When the parent runs and ends; then the other queue's idle worker runs the child well
    # before its 10 s poll
    _child_runs_before_its_poll(cfg, handler, ran, parent, child_id)
    assert status(db, parent) == (4 if ends == "dead" else 5)


@pytest.mark.parametrize("alone", ["its worker stops", "its lease is due an extension"])
def test_a_child_released_by_an_ack_sent_on_its_own_wakes_its_queues_idle_consumer(db, monkeypatch, alone):
    # Given idle watchers of two queues that poll only every 30 s, and a workflow of a parent on
    # "q" and its child on "other", whose ack goes on its own, not with a next claim: its worker
    # stops as the parent runs, or the parent's run took a third of the lease (here: any run)
    if alone == "its lease is due an extension":
        monkeypatch.setattr(batch_mod, "EXTEND_EVERY", 0.0)
    cfg = db.config(wakeup={"poll_initial_s": 30.0, "poll_max_s": 30.0})
    stops = {queue: threading.Event() for queue in ("q", "other")}
    ran: dict[int, float] = {}

    def handler(job):
        ran.setdefault(job.id, time.monotonic())
        if job.queue == "q":
            # The ack is sent once the other queue's watcher waits out its poll: only a wake ends it
            wait_until(lambda: _in_its_poll(workers[1]), 30, message="the other queue's watcher in its poll")
            if alone == "its worker stops":
                stops["q"].set()

    workers = [Worker(cfg, queue, handlers.PythonHandler(handler, False), stop=stops[queue],
                      budget=Budget(None), batch_size=10) for queue in ("q", "other")]
    threads = [threading.Thread(target=w.run) for w in workers]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: all(w.waiter.watching for w in workers), 30, message="both queues watched")
        wf = notifyq.Workflow()
        wf.add("other", {"n": 1}, after=[wf.add("q", {"n": 0})])
        with Producer("q", db.config()) as p:
            parent, child = p.put_workflow(wf)
        # When the parent runs and its ack goes on its own
        wait_until(lambda: parent in ran, 30, message="the parent run")
        # Then that ack wakes the other queue's watcher: its child runs long before its 30 s poll
        wait_until(lambda: child in ran, 10, message="the child run, woken by its parent's ack")
        assert workers[0].release_wake.wakes == 1
    finally:
        for stop in stops.values():
            stop.set()
        for t in threads:
            t.join(30)


def test_a_release_whose_count_down_changed_nothing_rolls_the_ack_back(db, monkeypatch):
    # Given a child of a claimed parent, and a count-down that changes nothing (as a KILL QUERY
    # that cut it short replies: OK, no row)
    with Producer("q", db.config()) as p:
        [parent] = p.put_many([{"n": 0}])
        child = p.put({"n": 1}, after=[parent])
    with opened(db, retry_s=0.5) as session:
        claim = queries.claim(session, "q", "owner-1", 10, 30.0)
        session.conn
        monkeypatch.setitem(workflows.Q, "children_count_down", "DO 0")
        # When the parent is acked, Then the ack fails before its COMMIT (each try, until it gives up)
        with pytest.raises(errors.TransientDBError, match="0 of 1 counted down"):
            queries.ack(session, [parent], claim.token, keep=False)
    # And nothing of it landed: the parent is still claimed, the child waits for it, its edge too
    assert status(db, parent) == 2 and status(db, child) == WAITING
    assert db.scalar("SELECT state FROM nq_edge WHERE parent_id = %s", (parent,)) == 0


def test_the_test_drainer_runs_a_workflow_to_its_end(db):
    # Given a chain of three and a batch callback (an app's test, with notifyq.testing.drain)
    from notifyq import testing

    wf = notifyq.Workflow()
    steps = wf.chain("q", [{"n": 0}, {"n": 1}, {"n": 2}])
    wf.batch(steps, on_success=("q", {"n": 3}))
    with Producer("q", db.config()) as p:
        p.put_workflow(wf)
    assert len(testing.jobs(db.config(), "q")) == 4  # waiting jobs are pending
    ran = []
    # When the test drains the queue
    testing.drain(db.config(), "q", lambda job: ran.append(job.payload["n"]))
    # Then every job ran once, in order, none left waiting
    assert ran == [0, 1, 2, 3]
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0


def test_a_put_after_a_parent_done_since_the_callers_snapshot_began_counts_it_done(db):
    # Given an application connection in REPEATABLE READ whose transaction read the jobs table
    # (its snapshot begins), and a parent that is done and gone after that (its record stays)
    app = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
    try:
        cur = app.cursor()
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("SELECT COUNT(*) FROM nq_job")
        cur.fetchall()
        parent = 10_000_000
        db.query("INSERT INTO nq_attempt (job_id, claim_token, attempt, queue, outcome, ended_at) "
                 "VALUES (%s, 1, 1, 'q', 'done', NOW(6))", (parent,))
        # When a child is put after it on that connection
        with Producer("q", db.config()) as p:
            child = p.put({"c": 1}, after=[parent], conn=app)
        app.commit()
    finally:
        app.close()
    # Then the parent counts as done (it is not "unknown"), and the child is ready to run
    assert db.scalar("SELECT status FROM nq_job WHERE id = %s", (child,)) == 0


def test_a_put_in_an_older_snapshot_after_a_parent_put_since_takes_it_and_locks_nothing(db):
    # Given an application connection in REPEATABLE READ whose snapshot began before a parent
    # was put, and another job done since (its record newer than the snapshot too)
    app = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
    try:
        cur = app.cursor()
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("SELECT COUNT(*) FROM nq_job")
        cur.fetchall()
        with Producer("q", db.config()) as p:
            [done] = p.put_many([{"n": 0}])
            drain(db, lambda job: None)
            [parent] = p.put_many([{"n": 1}])
            # When children are put after them on that connection, left uncommitted
            child = p.put({"c": 0}, after=[parent], conn=app)
            after_done = p.put({"c": 1}, after=[done], conn=app)
            # Then both parents are known (not "no job N"), and nothing of the put holds up a
            # claim and the ack of the parent, nor the ack of another job
            with opened(db, retry_s=1.0) as session:
                claim = queries.claim(session, "q", "owner-1", 10, 30.0)
                session.conn
                assert parent in [j.id for j in claim.jobs]
                assert finishes_alone(lambda: queries.ack(session, [j.id for j in claim.jobs], claim.token,
                                                          keep=False)), "an ack waited for the put"
            app.commit()
            p.wake()
    finally:
        app.close()
    assert [status(db, i) for i in (child, after_done)] == [0, 0]


@contextlib.contextmanager
def claim_in_flight(db, job_id):
    """A claim between its locking read and its COMMIT (queries.claim sends its mark and COMMIT
    without waiting, its jobs started): the job's row locked as claim_lock locks it."""
    conn = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
    try:
        cur = conn.cursor()
        cur.execute("SELECT id FROM nq_job FORCE INDEX (PRIMARY) WHERE id = %s AND status = 0 FOR UPDATE",
                    (job_id,))
        assert cur.fetchone() is not None
        yield conn
    finally:
        conn.rollback()
        conn.close()


def finishes_alone(fn, timeout: float = 5.0) -> bool:
    """Whether fn() returns within `timeout` seconds (run in a thread: one that waits on a lock
    ends once the lock is let go, after the caller's answer)."""
    thread = threading.Thread(target=fn)
    thread.start()
    try:
        wait_until(lambda: not thread.is_alive(), timeout, message="done")
        return True
    except AssertionError:
        return False


def test_a_release_waits_for_no_row_a_claim_in_flight_holds(db):
    # Given children put after a running parent, a parent done (gone), and ready jobs of
    # another queue (a small table: the optimizer would rather read it whole than by key)
    with Producer("p", db.config()) as p:
        running, done = p.put_many([{"n": 0}, {"n": 1}])
    with Producer("q", db.config()) as q:
        ready = q.put_many([{"r": i} for i in range(5)])
        with opened(db) as session:
            claim = queries.claim(session, "p", "owner-1", 10, 30.0)
            session.conn  # the claim's COMMIT read
            assert queries.ack(session, [done], claim.token, keep=False) == 1
            children = q.put_many([{"c": i} for i in range(8)], after=[running])
            # When a claim of another consumer holds a ready job's row (its jobs may start
            # before its mark and COMMIT land: a deadlock that took it then ran them twice)
            with claim_in_flight(db, ready[2]):
                # Then the parent's ack releases its child without waiting for that row
                assert finishes_alone(lambda: queries.ack(session, [running], claim.token, keep=False)), \
                    "the ack's release waited for a row a claim holds"
                # And so does a put after a parent that is done already (its release is the put's)
                put = []
                assert finishes_alone(lambda: put.extend(q.put_many([{"c": i} for i in range(8)], after=[done]))), \
                    "the put's release waited for a row a claim holds"
    assert [status(db, i) for i in children + put] == [0] * 16


def test_a_workflow_put_holds_no_lock_on_its_queue_row(db):
    # Given a parent, and a workflow put after it in a caller's transaction, not committed
    with Producer("q", db.config()) as p:
        [parent] = p.put_many([{"n": 0}])
        app = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
        try:
            p.put({"c": 0}, after=[parent], conn=app)
            # When a watcher's claim marks the queue watched (mark_watched: it is not waited
            # for, and its jobs may have started; a lock wait there that became a deadlock
            # rolled the claim back), with a short lock wait
            other = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
            try:
                cur = other.cursor()
                cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
                # Then the queue row is not the put's: the update does not wait
                cur.execute("UPDATE nq_queue SET watched_seq = GREATEST(watched_seq, 0) WHERE queue = 'q'")
                other.commit()
            finally:
                other.close()
            app.commit()
        finally:
            app.close()


def test_a_parents_ack_never_waits_for_a_put_after_it_still_open(db):
    # Given a claimed parent, and an application transaction that put a child after it and
    # stays open (put(after=, conn=): it could stay open longer than innodb_lock_wait_timeout)
    with Producer("q", db.config()) as p:
        [parent] = p.put_many([{"n": 0}])
        with opened(db, retry_s=1.0) as session:
            claim = queries.claim(session, "q", "owner-1", 10, 30.0)
            session.conn
            app = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
            try:
                child = p.put({"c": 0}, after=[parent], conn=app)
                # When the parent's consumer acks it
                # Then the ack commits without waiting for the application's transaction
                acked = []
                assert finishes_alone(lambda: acked.append(
                    queries.ack(session, [parent], claim.token, keep=False))), "the ack waited for the put"
                assert acked == [1]
                app.commit()
            finally:
                app.close()
    # And the child, whose edge the ack could not see, is released by the next reaper pass's sweep
    assert status(db, child) == WAITING
    reaper.reap_once(db.config().dsn)
    assert status(db, child) == 0


def test_waiting_for_the_result_of_a_cancelled_callback_answers_at_once(db):
    # Given a batch whose member died, so that its on_success callback ended cancelled
    wf = notifyq.Workflow()
    member = wf.add("q", {"n": 0, "fail": True}, max_attempts=1)
    batch = wf.batch([member], on_success=("q", {"n": 1}))
    with Producer("q", db.config()) as p:
        p.put_workflow(wf)
        run(db, "q", [])
        assert status(db, batch.on_success.id) == CANCELLED
        # When a caller waits for its result (as long as a batch may take)
        started = time.monotonic()
        # Then it is told at once that it was cancelled, and why (not "has not finished")
        with pytest.raises(errors.InputError, match=f"job {batch.on_success.id} was cancelled: not run: parent"):
            p.result(batch.on_success.id, wait=20)
        assert time.monotonic() - started < 10


def test_a_parent_that_ends_while_a_put_after_it_commits_is_settled_by_that_put_or_wake(db, monkeypatch):
    # Given a parent that is done, and a put after it that read it while it still ran (it ended
    # between the put's read and its COMMIT: its ack could not see the new edge)
    with Producer("q", db.config()) as p:
        [parent] = p.put_many([{"n": 0}])
        drain(db, lambda job: None)
        real = workflows.parents_state
        reads = []

        def read_before_its_end(cur, ids, missing=None):
            reads.append(ids)
            return {i: "pending" for i in ids} if len(reads) == 1 else real(cur, ids, missing)

        monkeypatch.setattr(workflows, "parents_state", read_before_its_end)
        # When the put commits (on the producer's connection; on the caller's, then wake())
        child = p.put({"c": 0}, after=[parent])
        app = MySQLdb.connect(**db.dsn.connect_args(), autocommit=False)
        try:
            reads.clear()
            in_app = p.put({"c": 1}, after=[parent], conn=app)
            app.commit()
            assert status(db, in_app) == WAITING
            p.wake()
        finally:
            app.close()
    # Then the producer settles that parent itself: the children are ready, no sweep needed
    assert status(db, child) == 0
    assert status(db, in_app) == 0


# ---------------------------------------------------------------- retry and cancel of a workflow's jobs

def run(db, queue, ran):
    """Every due job of `queue` run here (notifyq.testing.drain), its payload's "n" noted in
    `ran`; a job whose payload says "fail" fails (max_attempts=1: it dies)."""
    from notifyq import testing

    def handler(job):
        if job.payload.get("fail"):
            raise RuntimeError("boom")
        ran.append(job.payload["n"])

    testing.drain(db.config(), queue, handler, raise_on_failure=False)


def test_cancelling_a_waiting_job_keeps_it_and_its_retry_lets_it_and_its_children_go_on(db):
    # Given a chain a -> p -> c, nothing run yet
    wf = notifyq.Workflow()
    a, p, c = wf.chain("q", [{"n": "a"}, {"n": "p"}, {"n": "c"}])
    with Producer("q", db.config()) as producer:
        producer.put_workflow(wf)
    with opened(db) as session:
        # When the waiting p is cancelled
        assert admin.cancel(session, p.id, by="ann@ops") == "cancelled"
        # Then it ends cancelled with its row kept, and so does what waits for it, with the reason
        assert db.query("SELECT status, cancelled_by, last_error FROM nq_job WHERE id = %s", (p.id,)) == [
            (CANCELLED, "ann@ops", "not run: cancelled by ann@ops")]
        assert db.query("SELECT status, last_error FROM nq_job WHERE id = %s", (c.id,)) == [
            (CANCELLED, f"not run: parent {p.id} ended cancelled")]
        # When the operator changes their mind and retries p
        assert admin.retry(session, p.id) == "retried (it waits for 1 parent still pending)"
        # Then p waits for a again, and c for p; a retry of a waiting job changes nothing
        assert [status(db, r.id) for r in (a, p, c)] == [0, WAITING, WAITING]
        assert admin.retry(session, c.id) == "already waiting for 1 parent still pending"
    # And the chain runs to its end, in order, each job once
    ran = []
    run(db, "q", ran)
    assert ran == ["a", "p", "c"]
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0


def test_a_cancelled_workflow_comes_back_whole_with_a_retry_of_its_root(db):
    # Given a workflow whose root is ready: a chain, and a batch of the chain's end with callbacks
    wf = notifyq.Workflow()
    root = wf.add("q", {"n": "root"})
    chain = wf.chain("q", [{"n": "c1"}, {"n": "c2"}], after=[root])
    batch = wf.batch([chain[-1]], on_success=("q", {"n": "ok"}), on_dead=("q", {"n": "dead"}))
    with Producer("q", db.config()) as producer:
        producer.put_workflow(wf)
    with opened(db) as session:
        # When the workflow is cancelled (its root: what has not run is cancelled with it)
        assert admin.cancel(session, root.id) == "cancelled"
        assert [status(db, r.id) for r in (root, *chain, batch.on_success)] == [CANCELLED] * 4
        # (its on_dead callback is the one that runs: a member ended cancelled)
        assert status(db, batch.on_dead.id) == 0
        ran = []
        run(db, "q", ran)
        assert ran == ["dead"]
        # When the root is retried
        assert admin.retry(session, root.id) == "retried"
    # Then what the cancel cancelled runs, in order; the on_dead callback ran once only
    run(db, "q", ran)
    assert ran == ["dead", "root", "c1", "c2", "ok"]


def test_a_retry_of_a_job_a_dead_parent_cancelled_runs_it_without_that_parent_but_after_the_others(db):
    # Given p after a (it dies) and b (on a queue not run yet), and c after p
    wf = notifyq.Workflow()
    a = wf.add("q", {"n": "a", "fail": True}, max_attempts=1)
    b = wf.add("later", {"n": "b"})
    p = wf.add("q", {"n": "p"}, after=[a, b])
    c = wf.add("q", {"n": "c"}, after=[p])
    with Producer("q", db.config()) as producer:
        producer.put_workflow(wf)
    ran = []
    run(db, "q", ran)
    assert [status(db, r.id) for r in (a, p, c)] == [4, CANCELLED, CANCELLED]
    # When p is retried
    with opened(db) as session:
        assert admin.retry(session, p.id) == ("retried (it waits for 1 parent still pending; "
                                               "it runs without 1 parent that ended dead or cancelled)")
    # Then p waits for b, still pending (it does not run before it), and c waits for p
    assert [status(db, r.id) for r in (p, c)] == [WAITING, WAITING]
    run(db, "q", ran)
    assert ran == [] and status(db, p.id) == WAITING
    # And once b is done, p runs, then c
    run(db, "later", ran)
    run(db, "q", ran)
    assert ran == ["b", "p", "c"]


def test_a_retried_dead_parent_is_waited_for_again_by_the_children_that_run_anyway(db):
    # Given x (runs anyway) and an on_dead callback after a (it dies) and b (not run yet)
    wf = notifyq.Workflow()
    a = wf.add("q", {"n": "a", "fail": True}, max_attempts=1)
    b = wf.add("later", {"n": "b"})
    x = wf.add("q", {"n": "x"}, after=[a, b], run_anyway=True)
    batch = wf.batch([a, b], on_dead=("q", {"n": "dead"}))
    with Producer("q", db.config()) as producer:
        producer.put_workflow(wf)
    ran = []
    run(db, "q", ran)
    assert status(db, a.id) == 4
    # When a is retried and now succeeds
    db.query("UPDATE nq_job SET payload = %s WHERE id = %s", (json.dumps({"n": "a"}), a.id))
    with opened(db) as session:
        assert admin.retry(session, a.id) == "retried"
    run(db, "q", ran)
    # Then x and the callback still wait for b: a's retry took its failure back
    assert ran == ["a"]
    assert [status(db, r.id) for r in (x, batch.on_dead)] == [WAITING, WAITING]
    # And once b is done, x runs; the on_dead callback is not needed (no member failed in the end)
    run(db, "later", ran)
    run(db, "q", ran)
    assert ran == ["a", "b", "x"]
    assert db.query("SELECT status, last_error FROM nq_job WHERE id = %s", (batch.on_dead.id,)) == [
        (CANCELLED, "not run: no parent ended dead or cancelled")]


def test_a_member_retried_after_its_batch_ended_reopens_the_batch_and_each_callback_runs_once(db):
    # Given a batch of a (it dies) and b, with its three callbacks, run to its end: on_dead and
    # on_complete ran, on_success was cancelled
    wf = notifyq.Workflow()
    a = wf.add("q", {"n": "a", "fail": True}, max_attempts=1)
    b = wf.add("q", {"n": "b"})
    batch = wf.batch([a, b], on_success=("q", {"n": "success"}), on_complete=("q", {"n": "complete"}),
                     on_dead=("q", {"n": "dead"}))
    with Producer("q", db.config()) as producer:
        producer.put_workflow(wf)
    ran = []
    run(db, "q", ran)
    assert sorted(ran) == ["b", "complete", "dead"]
    assert status(db, batch.on_success.id) == CANCELLED
    # When a is retried and now succeeds
    db.query("UPDATE nq_job SET payload = %s WHERE id = %s", (json.dumps({"n": "a"}), a.id))
    with opened(db) as session:
        assert admin.retry(session, a.id) == "retried"
    assert status(db, batch.on_success.id) == WAITING  # the batch is open again
    run(db, "q", ran)
    # Then on_success runs too (every member is done now), and the callbacks that ran already
    # (on_dead, on_complete) do not run again: each callback ran at most once
    assert sorted(ran) == ["a", "b", "complete", "dead", "success"]
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 6") == 0
    assert db.scalar("SELECT COUNT(*) FROM nq_edge WHERE state NOT IN (2, 3)") == 0


def test_a_dead_parent_whose_dedup_key_is_taken_stays_dead_and_so_do_the_jobs_it_cancelled(db):
    # Given a dead parent with a dedup key and a child it cancelled, a new job holding the key,
    # and another dead job
    with Producer("q", db.config()) as producer:
        parent = producer.put({"n": "a", "fail": True}, dedup_key="k", max_attempts=1)
        child = producer.put({"n": "c"}, after=[parent])
        other = producer.put({"n": "o", "fail": True}, max_attempts=1)
        ran = []
        run(db, "q", ran)
        holder = producer.put({"n": "h"}, dedup_key="k")
    assert [status(db, i) for i in (parent, child, other, holder)] == [4, CANCELLED, 4, 0]
    # When every dead job is retried
    with opened(db) as session:
        assert admin.retry_dead(session, "q") == (1, 1)
        # Then the parent stays dead, and the child it cancelled stays cancelled
        assert [status(db, i) for i in (parent, child, other)] == [4, CANCELLED, 0]
        # And retrying a running job is one clear error
        db.query("UPDATE nq_job SET status = 2 WHERE id = %s", (holder,))
        with pytest.raises(errors.InputError, match=f"job {holder} is running"):
            admin.retry(session, holder)


def test_a_job_cancelled_by_an_operator_stays_cancelled_when_its_parent_is_retried(db):
    # Given p waiting for a; an operator cancels p, then a dies
    wf = notifyq.Workflow()
    a = wf.add("q", {"n": "a", "fail": True}, max_attempts=1)
    p = wf.add("q", {"n": "p"}, after=[a])
    with Producer("q", db.config()) as producer:
        producer.put_workflow(wf)
    with opened(db) as session:
        assert admin.cancel(session, p.id, by="ann@ops") == "cancelled"
        ran = []
        run(db, "q", ran)
        assert [status(db, a.id), status(db, p.id)] == [4, CANCELLED]
        # When a is retried
        db.query("UPDATE nq_job SET payload = %s WHERE id = %s", (json.dumps({"n": "a"}), a.id))
        assert admin.retry(session, a.id) == "retried"
        # Then p stays cancelled: the operator's cancel stands
        assert status(db, p.id) == CANCELLED
        # And once p itself is retried, it waits for a, and runs after it
        assert admin.retry(session, p.id) == "retried (it waits for 1 parent still pending)"
    run(db, "q", ran)
    assert ran == ["a", "p"]
