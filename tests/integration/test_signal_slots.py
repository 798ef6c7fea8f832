"""A bump of a queue's counter never waits on a slot row another open transaction holds while a
slot is free: a producer stopped between its put and its COMMIT, or an application's own
transaction that put a job and goes on working, holds the slot its bump took until it ends.
A put that drew that slot waited on it for the lock wait timeout, retried, and drew again."""

from __future__ import annotations

import threading

import MySQLdb
import pytest
from conftest import cron_run

import notifyq
from notifyq.produce.producer import Producer
from notifyq.store import inserts, signal, slot_rows

FREE = 7  # the one slot row the other transaction leaves free
PROMPT_S = 2.0  # a bump that waited took the producer session's lock wait timeout (10 s)


def _caller(db, multi_statements: bool = True):
    """The application's own connection, in the server's default isolation (REPEATABLE READ)."""
    return MySQLdb.connect(**db.admin.connect_args(), autocommit=False, multi_statements=multi_statements)


def _in_callers_transaction(db, p, multi_statements: bool) -> None:
    conn = _caller(db, multi_statements)
    try:
        p.put({"n": 1}, conn=conn)
        p.put_many([{"n": 2}, {"n": 3}], conn=conn)
        conn.cursor().execute("SELECT 1")  # the application goes on working in it
        conn.commit()
    finally:
        conn.close()


def _in_transaction_block(db, p) -> None:
    conn = _caller(db)
    try:
        with p.transaction(conn) as tx:
            tx.put({"n": 1})
            tx.put_many([{"n": 2}, {"n": 3}])
    finally:
        conn.close()


def _workflow(db, p) -> None:
    wf = notifyq.Workflow()
    wf.chain("q", [{"n": 1}, {"n": 2}])
    p.put_workflow(wf)


PUTS = {
    "put": lambda db, p: p.put({"n": 1}),
    "put_delayed": lambda db, p: p.put({"n": 1}, delay=60),
    "put_dedup_key": lambda db, p: p.put({"n": 1}, dedup_key="k"),
    "put_many": lambda db, p: p.put_many([{"n": i} for i in range(3)]),
    "put_many_keys": lambda db, p: p.put_many([{"n": i} for i in range(3)], key="a"),
    "callers_transaction": lambda db, p: _in_callers_transaction(db, p, True),
    "callers_transaction_one_statement_at_a_time": lambda db, p: _in_callers_transaction(db, p, False),
    "transaction_block": _in_transaction_block,
    "put_workflow": _workflow,
}


def _start_at(monkeypatch, start: int) -> None:
    """Every bump's random slot is `start` (a held one, for the test to mean anything)."""
    monkeypatch.setattr(inserts, "_random", lambda: (start + 0.5) / signal.SIGNAL_SLOTS)
    monkeypatch.setattr(signal, "slot", lambda: start)


def _prompt(db, holder, body) -> tuple[bool, list]:
    """body() in a thread: (whether it was still running after PROMPT_S, what it returned). The
    holder is closed either way, which lets a waiting body go on (the test failed)."""
    done: list = []
    thread = threading.Thread(target=lambda: done.append(body()), daemon=True)
    try:
        thread.start()
        thread.join(PROMPT_S)
        waited = thread.is_alive()
    finally:
        holder.close()
    thread.join(120)
    return waited, done


def _counted(db) -> dict[int, int]:
    return dict(db.query("SELECT slot, seq FROM nq_signal WHERE queue = 'q' AND seq > 0"))


@pytest.mark.parametrize("start", [3, 12], ids=["after", "wrapping"])
@pytest.mark.parametrize("name", list(PUTS))
def test_a_put_never_waits_on_a_counter_slot_another_open_transaction_holds(db, monkeypatch, name, start):
    # Given a producer, and another session's open transaction holding 15 of the queue's 16
    # counter slots (a producer stopped inside its put's transaction, say); every bump's random
    # slot is a held one, and the free one comes after it (or, wrapping round, before it)
    with Producer("q", db.config()) as p:
        holder = db.signal_rows_locked("q", free=FREE)
        _start_at(monkeypatch, start)
        # When it puts jobs
        waited, done = _prompt(db, holder, lambda: PUTS[name](db, p))
    # Then the put returned at once, and the free slot counted its jobs
    assert not waited, f"{name} waited on a counter slot the other transaction held"
    assert done, f"{name} raised"
    assert set(_counted(db)) == {FREE}


def test_a_workflow_release_never_waits_on_a_counter_slot_another_open_transaction_holds(db, monkeypatch):
    # Given a chain of two jobs, and 15 of the queue's 16 counter slots held by another session's
    # open transaction; every bump's random slot is a held one
    with Producer("q", db.config()) as p:
        _workflow(db, p)
    before = _counted(db)
    holder = db.signal_rows_locked("q", free=FREE)
    _start_at(monkeypatch, 3)
    ran: list = []
    # When a cron run drains the queue (the first job's ack releases the second)
    waited, done = _prompt(db, holder, lambda: cron_run(db.config(), "q", lambda job: ran.append(job.payload["n"]),
                                                        timeout=60))
    # Then it did not wait on a held slot: both ran, and the release's bump counted on the free slot
    assert not waited, "the release waited on a counter slot the other transaction held"
    assert done[0].error is None, done[0].error
    assert ran == [1, 2]
    assert {slot for slot, seq in _counted(db).items() if seq != before.get(slot)} == {FREE}


def test_a_put_takes_its_random_slot_when_nobody_holds_it_else_the_next_free_one(db, monkeypatch):
    # Given a producer whose bumps' random slot is 3: a free slot is taken as drawn, so
    # concurrent producers stay spread over the slots as a plain random bump spread them
    _start_at(monkeypatch, 3)
    with Producer("q", db.config()) as p:
        p.put({"n": 1})
        p.put_many([{"n": 2}, {"n": 3}])
        assert _counted(db) == {3: 3}
        # When another open transaction holds slot 3, the next free slot counts the puts (put()'s
        # bump refused on slot 3, then bump_signal; put_many's bump_signal at once)
        holder = admin_connect_holding(db, [3])
        try:
            p.put({"n": 4})
            p.put_many([{"n": 5}, {"n": 6}])
        finally:
            holder.close()
    assert _counted(db) == {3: 3, 4: 3}


def admin_connect_holding(db, slots: list[int]):
    """Another session's open transaction holding these slot rows of queue q's counter (every
    slot row made first, as a queue in use soon has them)."""
    for slot in range(signal.SIGNAL_SLOTS):
        db.query("INSERT IGNORE INTO nq_signal (queue, slot, seq) VALUES ('q', %s, 0)", (slot,))
    conn = MySQLdb.connect(**db.admin.connect_args(), autocommit=False)
    cur = conn.cursor()
    for slot in slots:
        cur.execute("INSERT INTO nq_signal (queue, slot, seq) VALUES ('q', %s, 0) "
                    "ON DUPLICATE KEY UPDATE seq = seq", (slot,))
    return conn


@pytest.mark.parametrize("name", ["put", "put_many"])
def test_a_put_on_a_new_queue_never_waits_on_the_one_slot_row_an_open_transaction_made(db, monkeypatch, name):
    """Regression (an outside attack: 2 puts in 40 on new queues waited 10 s, then failed): on a
    queue whose slot rows were not all made, an application's open transaction that put a job
    made and held one row; a put whose random slot was that one found no row nobody holds, and
    bump_signal's own fallback, the random slot, waited on it. The queue's 16 rows are now made
    before the application's put, outside its transaction."""
    # Given a new queue, and an application's open transaction that put a job (its bump took
    # slot 3 and holds it); every bump's random slot is 3
    _start_at(monkeypatch, 3)
    with Producer("q", db.config()) as p:
        holder = _caller(db)
        p.put({"n": 0}, conn=holder)
        # When the producer puts through its own session
        body = {"put": lambda: p.put({"n": 1}), "put_many": lambda: p.put_many([{"n": 1}, {"n": 2}])}[name]
        waited, done = _prompt(db, holder, body)
    # Then it returned at once, counted on another slot
    assert not waited, f"{name} waited on the slot row the open transaction held"
    assert done, f"{name} raised"
    assert 3 not in _counted(db) and len(_counted(db)) == 1
    # And the rows were made, and committed, outside the application's transaction
    assert db.query("SELECT COUNT(*) FROM nq_signal WHERE queue = 'q'") == [(signal.SIGNAL_SLOTS,)]


def _retry(db, p):
    """A job whose handler fails once: its failure's transaction retries it and bumps the queue."""
    p.put({"n": 1})
    return lambda: cron_run(db.config(), "q", _fail_first, timeout=60)


def _fail_first(job):
    raise RuntimeError("a failure, retried")


def _promotion(db, p):
    """A scheduled job fallen due: a claim promotes it, and bumps the queue as it commits that."""
    [job_id] = p.put_many([{"n": 1}], delay=600)
    db.query("UPDATE nq_job SET run_at = NOW(6) - INTERVAL 1 SECOND WHERE id = %s", (job_id,))
    return lambda: cron_run(db.config(), "q", lambda job: None, timeout=60)


def _release(db, p):
    """A chain of two jobs: the first one's ack releases the second, and bumps the queue."""
    _workflow(db, p)
    return lambda: cron_run(db.config(), "q", lambda job: None, timeout=60)


OUTCOMES = {"retry": _retry, "due_promotion": _promotion, "workflow_release": _release}


@pytest.mark.parametrize("name", list(OUTCOMES))
def test_an_outcome_on_a_new_queue_never_waits_on_the_slot_row_an_open_transaction_holds(db, monkeypatch, name):
    """Regression: a new queue's slot rows were made only as bumps drew them. A put made one
    (slot 3), an application's open transaction that put a job bumped that one and held it, and
    a retry, a due job's promotion or a workflow's release found no row nobody held: it took
    its random slot, the held one (1 bump in 16), and waited on it for the lock wait timeout,
    again after each retry. A queue's 16 rows are now made before its first bump."""
    # Given a new queue whose bumps all draw slot 3, its jobs put, and an application's open
    # transaction that put a job too, holding the slot row its bump took
    _start_at(monkeypatch, 3)
    with Producer("q", db.config()) as p:
        run = OUTCOMES[name](db, p)
        holder = _caller(db)
        p.put({"n": 0}, conn=holder)
        # When a worker runs the queue's jobs: a retry, a promotion or a release bumps the queue
        waited, done = _prompt(db, holder, run)
    # Then it did not wait on the held row: the run ended at once, and its bump counted elsewhere
    assert not waited, f"the {name}'s bump waited on the counter slot the open transaction held"
    assert done[0].error is None, done[0].error
    assert set(_counted(db)) - {3}, _counted(db)


def test_a_release_on_a_queue_first_used_by_the_children_never_waits_on_a_row_an_open_transaction_made(
        db, monkeypatch):
    """Regression: the children of a workflow waited on a queue nothing had bumped yet; an
    application's open transaction that put a job there made its first slot row and held it,
    and the release's bump, finding no other, waited on that one. put_workflow now makes the
    rows of every queue of the workflow, the children's too."""
    # Given a parent on queue a and its child on queue q, and an application's open transaction
    # that then put a job on q; every bump draws slot 3
    _start_at(monkeypatch, 3)
    with Producer("a", db.config()) as p:
        wf = notifyq.Workflow()
        wf.add("q", {"n": 2}, after=[wf.add("a", {"n": 1})])
        p.put_workflow(wf)
    with Producer("q", db.config()) as q:
        holder = _caller(db)
        q.put({"n": 0}, conn=holder)
        # When a worker runs the parent, whose ack releases the child
        waited, done = _prompt(db, holder, lambda: cron_run(db.config(), "a", lambda job: None, timeout=60))
    # Then the release did not wait on the held row
    assert not waited, "the release's bump waited on the counter slot the open transaction held"
    assert done[0].error is None, done[0].error
    assert db.query("SELECT status FROM nq_job WHERE queue = 'q'") == [(0,)]  # the child, ready


def test_a_queues_slot_rows_are_made_without_waiting_on_one_an_open_transaction_made(db, monkeypatch):
    # Given a new queue whose one slot row (3) another session's open transaction made and holds
    holder = _caller(db)
    holder.cursor().execute("INSERT INTO nq_signal (queue, slot, seq) VALUES ('q', 3, 1)")
    with Producer("q", db.config()) as p:
        # When a producer puts its first job there (the rows are made first)
        _start_at(monkeypatch, 3)
        waited, done = _prompt(db, holder, lambda: p.put({"n": 1}))
    # Then it did not wait on that row, and made the other 15 (3 went with the rollback)
    assert not waited, "making the slot rows waited on the one the open transaction made"
    assert done, "the put raised"
    assert [r[0] for r in db.query("SELECT slot FROM nq_signal WHERE queue = 'q' ORDER BY slot")] == [
        s for s in range(signal.SIGNAL_SLOTS) if s != 3]


def test_a_consumer_makes_its_queues_slot_rows_before_its_first_bump(db, monkeypatch):
    """A queue whose rows an earlier version left few (a row made only as a bump drew it): a
    consumer makes the rest when it registers, before its retries or promotions bump it."""
    # Given a queue with one slot row (3), which an application's open transaction holds, and
    # a job there; a process that made no slot rows yet, whose bumps all draw slot 3
    _start_at(monkeypatch, 3)
    with Producer("q", db.config()) as p:
        run = _retry(db, p)
    db.query("DELETE FROM nq_signal WHERE queue = 'q' AND slot <> 3")
    monkeypatch.setattr(slot_rows, "_MADE", set())
    holder = admin_connect_holding_only(db, 3)
    # When a worker runs the job, whose failure retries it and bumps the queue
    waited, done = _prompt(db, holder, run)
    # Then its bump did not wait on the held row
    assert not waited, "the retry's bump waited on the counter slot the open transaction held"
    assert done[0].error is None, done[0].error
    assert db.scalar("SELECT COUNT(*) FROM nq_signal WHERE queue = 'q'") == signal.SIGNAL_SLOTS


def admin_connect_holding_only(db, slot: int):
    """Another session's open transaction holding one slot row of queue q's counter, as it is."""
    conn = MySQLdb.connect(**db.admin.connect_args(), autocommit=False)
    conn.cursor().execute("UPDATE nq_signal SET seq = seq WHERE queue = 'q' AND slot = %s", (slot,))
    return conn


def test_a_put_on_the_callers_connection_goes_on_when_its_slot_rows_cannot_be_made(db, caplog):
    """Regression (an outside attack): the rows are made on a session of the producer's DSN; a
    put(conn=...) needs nothing else of that DSN, and with it unreachable the put raised after
    the producer's retries. Making the rows is best effort: the put goes on, its bump taking
    its random slot as before rows were made, and a warning says so."""
    # Given a producer whose DSN names a port nobody listens on, and the application's own
    # connection to the database
    unreachable = db.config(dsn=f"mysql://{db.dsn.user}@127.0.0.1:1/{db.dsn.database}")
    conn = _caller(db)
    try:
        with Producer("q", unreachable) as p:
            # When it puts a job in the application's transaction, which then commits
            p.put({"n": 1}, conn=conn)
            conn.commit()
    finally:
        conn.close()
    # Then the job is stored, and the rows it could not make were logged, not raised
    assert db.query("SELECT COUNT(*) FROM nq_job WHERE queue = 'q'") == [(1,)]
    assert any("signal slot rows of q not made" in r.getMessage() for r in caplog.records), caplog.text
