"""Rate limits against a real server (store/rates.py): a claim starts only what the sliding log
of the queue's and the key's last N starts allows, across sessions; a held claim tells the
watcher when to wake; consume_rate spends the same budget. Time passing is simulated by moving
the log's times back (no sleeps), except where the worker's own wake at the refill is the point."""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import pytest
from conftest import cron_run, notifyq_cmd, wait_until

from notifyq import errors
from notifyq.config import Config
from notifyq.consume import handlers
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer
from notifyq.store import bells, queries, rates
from notifyq.store.db import Session
from notifyq.store.flow import FlowClaims
from notifyq.store.locks import QueueLocks

OWNER = "o" * 32


def _config(db, **queue) -> Config:
    return db.config(queue={"q": queue})


def _claim(session: Session, cfg: Config, batch: int = 10, token_owner: str = OWNER) -> queries.Claim:
    return queries.claim(session, "q", token_owner, batch, 60, rates=rates.Rates.of(cfg.queue("q")))


def _age_log(db, seconds: float) -> None:
    """As if `seconds` passed for the rates: every start in the log moves back."""
    db.query("UPDATE nq_rate SET started_at = started_at - INTERVAL %s MICROSECOND", (int(seconds * 1e6),))


def _put(cfg: Config, n: int, keys: list[str | None] | None = None) -> list[int]:
    with Producer("q", cfg) as p:
        if keys is None:
            return p.put_many([{"i": i} for i in range(n)])
        return [p.put({"i": i}, key=key) for i, key in enumerate(keys)]


def test_a_queue_rate_starts_n_per_period_across_sessions_and_the_next_when_the_oldest_ages_out(db):
    # Given a queue limited to 3 starts per 10 s and 10 ready jobs
    cfg = _config(db, rate="3/10s")
    ids = _put(cfg, 10)
    a, b = Session(cfg.dsn), Session(cfg.dsn)
    try:
        # When one session claims, then another
        first = _claim(a, cfg)
        second = _claim(b, cfg)
        # Then the first takes 3 in claim order and the second none: the budget is one, in the database
        assert [j.id for j in first.jobs] == ids[:3]
        assert second.jobs == [] and second.drained  # held, not left behind: the watcher waits for the refill
        # ... the held jobs are still ready and were not charged an attempt
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 0 AND attempts = 0") == 7
        # ... and the queue's watcher is told when the oldest start ages out (10 s after it)
        state = bells.watch(b, "q", QueueLocks(cfg.dsn.database, "q"), None, 0, use_bell=False)
        assert state.due_in_s is not None and 8.0 < state.due_in_s <= 10.0
        # When 9.5 s pass, nothing more starts; at 10 s, three more do
        _age_log(db, 9.5)
        assert _claim(b, cfg).jobs == []
        _age_log(db, 0.5)
        assert [j.id for j in _claim(a, cfg).jobs] == ids[3:6]
    finally:
        a.close()
        b.close()


def test_a_key_rate_holds_each_key_apart_and_jobs_without_a_key_are_not_held_by_it(db):
    # Given rate_per_key 2 per hour and jobs of keys A and B and without a key
    cfg = _config(db, rate_per_key="2/1h")
    keys = ["A", "A", "A", "B", None, "B", "B", None]
    ids = _put(cfg, len(keys), keys)
    s = Session(cfg.dsn)
    try:
        # When a claim asks for all of them
        got = [j.id for j in _claim(s, cfg).jobs]
        # Then it takes two of each key, in claim order, and every job without a key
        assert got == [ids[i] for i in (0, 1, 3, 4, 5, 7)]
        # ... and a second claim, none
        assert _claim(s, cfg).jobs == []
        assert db.scalar("SELECT COUNT(DISTINCT rate_key) FROM nq_rate") == 2
    finally:
        s.close()


def test_queue_and_key_rates_together_a_start_needs_both(db):
    cfg = _config(db, rate="3/1h", rate_per_key="1/1h")
    ids = _put(cfg, 5, ["A", "A", "B", "C", "D"])
    s = Session(cfg.dsn)
    try:
        # A's second job waits for A's budget, D for the queue's
        assert [j.id for j in _claim(s, cfg).jobs] == [ids[0], ids[2], ids[3]]
    finally:
        s.close()


def test_a_rerun_claim_counts_what_its_own_earlier_committed_try_spent_as_free(db):
    # Given a claim's first try that spent the whole budget and committed (its jobs then handed
    # back unstarted, as queries.claim's rerun does)
    cfg = _config(db, rate="2/1h")
    _put(cfg, 4)
    limits = rates.Rates.of(cfg.queue("q"))
    s = Session(cfg.dsn)
    try:
        def attempt(token: int):
            def body(cur):
                cur.execute("SELECT id FROM nq_job WHERE status = 0 ORDER BY id FOR UPDATE")
                return rates.admit(cur, "q", token, limits, [(r[0],) for r in cur.fetchall()], False)
            return s.run(body, what="test admit")

        assert len(attempt(42).rows) == 2
        # When the same claim runs again: its own spend is free again; another claim's is not
        assert len(attempt(42).rows) == 2
        assert len(attempt(43).rows) == 0
    finally:
        s.close()


def test_a_hold_whose_time_came_is_cleared_by_the_next_claim_so_the_watcher_does_not_wake_for_it_again(db):
    cfg = _config(db, rate="1/1h")
    _put(cfg, 2)
    s = Session(cfg.dsn)
    try:
        assert len(_claim(s, cfg).jobs) == 1
        assert _claim(s, cfg).jobs == []  # held: a hold is written
        assert db.scalar("SELECT wake_at IS NOT NULL FROM nq_rate_hold WHERE queue = 'q'") == 1
        _age_log(db, 3600)
        db.query("UPDATE nq_rate_hold SET wake_at = NOW(6) - INTERVAL 1 SECOND")
        assert len(_claim(s, cfg).jobs) == 1  # the refill: nothing held now
        assert db.scalar("SELECT wake_at FROM nq_rate_hold WHERE queue = 'q'") is None
        state = bells.watch(s, "q", QueueLocks(cfg.dsn.database, "q"), None, 0, use_bell=False)
        assert state.due_in_s is None
    finally:
        s.close()


def test_consume_rate_spends_the_budget_claims_spend_and_waits_for_the_refill_at_most_wait(db):
    cfg = _config(db, rate="2/1h", rate_per_key="5/1h")
    _put(cfg, 3)
    with Producer("q", cfg) as p:
        # Spending the queue's whole budget from outside leaves none for jobs
        assert p.consume_rate(2, key="customer-42") is True
        s = Session(cfg.dsn)
        try:
            assert _claim(s, cfg).jobs == []
        finally:
            s.close()
        # No room: False without waiting (wait=0), and after a short wait, nothing spent
        started = time.monotonic()
        assert p.consume_rate(wait=0) is False
        assert p.consume_rate(wait=0.2) is False
        assert 0.15 <= time.monotonic() - started < 5
        assert db.scalar("SELECT COUNT(*) FROM nq_rate WHERE rate_key = 'customer-42' AND claim_token <> 0 "
                         "OR rate_key = 'customer-42' AND started_at > '1970-01-01'") == 2
        # More than a period allows can never be granted: an error, not a wait forever
        with pytest.raises(errors.InputError, match="more than the rate allows"):
            p.consume_rate(3)
        with pytest.raises(errors.InputError, match="key"):
            p.consume_rate(1, key="")


def test_consume_rate_on_a_queue_without_rates_always_allows(db):
    cfg = db.config()
    with Producer("q", cfg) as p:
        assert p.consume_rate(5, key="k", wait=0) is True


@pytest.mark.parametrize("use_locks", [True, False], ids=["watcher", "polling"])
def test_a_worker_under_a_rate_wakes_at_each_refill_and_never_starts_more_than_n_in_a_period(db, use_locks):
    # Given 12 jobs on a queue limited to 4 starts per second (one worker: the watcher, or a
    # poller without advisory locks; poll_max_s 5 s, so only the refill's wake keeps the pace)
    cfg = db.config(queue={"q": {"rate": "4/1s"}}, wakeup={"use_locks": use_locks, "poll_max_s": 5.0})
    _put(cfg, 12)
    starts: list[float] = []

    def handler(job):
        starts.append(time.monotonic())

    stop = threading.Event()
    worker = Worker(cfg, "q", handlers.PythonHandler(handler, False), stop=stop, budget=Budget(12))
    thread = threading.Thread(target=worker.run, daemon=True)
    began = time.monotonic()
    thread.start()
    try:
        thread.join(30)
    finally:
        stop.set()
        thread.join(10)
    # Then all 12 ran, in about 3 periods (the refill woke the worker: no poll_max_s, no 60 s
    # safety wait), and no window of one second held more than 4 starts
    assert len(starts) == 12, worker.error
    assert time.monotonic() - began < 10
    starts.sort()
    assert all(starts[i + 4] - starts[i] >= 1.0 - 0.05 for i in range(len(starts) - 4)), starts
    assert worker.waiter.wakeups["due"] >= 1


def test_a_rated_claim_starts_nothing_until_its_commit_lands_and_a_lost_commit_spends_nothing(db):
    # Given one ready job on a rated queue, and a server that holds every COMMIT back (MariaDB's
    # BACKUP STAGE; MySQL has none)
    if "mariadb" not in db.query("SELECT VERSION()")[0][0].lower():
        pytest.skip("needs MariaDB's BACKUP STAGE to hold a COMMIT back")
    from conftest import admin_connect

    cfg = _config(db, rate="1/1h")
    [job_id] = _put(cfg, 1)
    blocker = admin_connect(db.admin)
    blocker.cursor().execute("BACKUP STAGE START")
    blocker.cursor().execute("BACKUP STAGE BLOCK_COMMIT")
    work, peer = Session(cfg.dsn, name="work"), Session(cfg.dsn, name="peer")
    try:
        # When a consumer claims: claim() does not return while its COMMIT waits (an unrated
        # claim returns its jobs at once, test_claim_commit.py), so no job of it can start
        got: list = []
        claimer = threading.Thread(target=lambda: got.append(_claim(work, cfg)), daemon=True)
        claimer.start()
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                                     "WHERE ID = %s AND STATE LIKE '%%backup lock%%'", (work.connection_id,)) == 1,
                   10, message="the claim's COMMIT held back")
        claimer.join(1.0)  # an unrated claim would be back by now (its COMMIT's reply is not waited for)
        assert claimer.is_alive() and got == []
        # ... and the COMMIT is lost: the session dies with it
        killer = admin_connect(db.admin)
        try:
            killer.cursor().execute(f"KILL CONNECTION {int(work.connection_id)}")
        finally:
            killer.close()
        claimer.join(10)
        blocker.cursor().execute("BACKUP STAGE END")
        # Then the claim comes back with no job to start
        assert got and got[0].jobs == [] and got[0].commit.failed
        # And the budget was not spent: a peer claims the job and its start
        assert [j.id for j in _claim(peer, cfg).jobs] == [job_id]
        assert db.scalar("SELECT COUNT(*) FROM nq_rate WHERE started_at > '1970-01-01'") == 1
    finally:
        blocker.close()
        work.close()
        peer.close()


def test_an_exit_when_empty_run_on_a_rated_queue_waits_for_each_refill_and_runs_every_job(db):
    # Given 9 jobs on a queue limited to 4 starts per second
    cfg = db.config(queue={"q": {"rate": "4/1s"}})
    _put(cfg, 9)
    starts: list[float] = []
    # When a cron-style run (--exit-when-empty) drains it
    worker = cron_run(cfg, "q", lambda job: starts.append(time.monotonic()))
    # Then it ran all 9 before it exited (the rate held jobs back: they were not gone), never
    # more than 4 in a second, and nothing is left
    assert len(starts) == 9, worker.error
    starts.sort()
    assert all(starts[i + 4] - starts[i] >= 1.0 - 0.05 for i in range(len(starts) - 4)), starts
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0


def _flow_claims(session: Session, cfg: Config, batch: int, n: int) -> list[queries.Claim]:
    """Claims as a consumer's worker makes them, one after the other: with the queue's flow state
    (a per-key rate reads its candidates key by key, store/flow.py), until one says the queue is
    drained, or n of them."""
    flow = FlowClaims.for_queue(cfg.queue("q"))
    got = []
    while len(got) < n and not (got and got[-1].drained):
        got.append(queries.claim(session, "q", OWNER, batch, 60, rates=rates.Rates.of(cfg.queue("q")), flow=flow))
    return got


def test_a_key_whose_rate_is_spent_does_not_hold_back_the_keys_with_room(db):
    # Given rate_per_key 2 an hour, and a backlog of key A put first (30 jobs), then 3 of B and 3 of C
    cfg = _config(db, rate_per_key="2/1h")
    keys = ["A"] * 30 + ["B"] * 3 + ["C"] * 3
    ids = _put(cfg, len(keys), keys)
    s = Session(cfg.dsn)
    try:
        # When claims of 2 follow each other within the hour
        got = _flow_claims(s, cfg, 2, 6)
        # Then A's budget spent, the next claims take B's two, then C's two: every key with room
        # gets its starts, not only once A's refill came (A's backlog filled every claim's locking
        # read, its jobs held back, and B and C waited for the hour)
        taken = [[keys[ids.index(j.id)] for j in c.jobs] for c in got]
        assert taken == [["A", "A"], ["B", "B"], ["C", "C"], []], taken
        assert [c.drained for c in got] == [False, False, False, True]
        # ... the last claim found only held jobs: the watcher is told to wake at the refill
        assert got[3].held_s is not None and 3500 < got[3].held_s <= 3600
        assert db.scalar("SELECT wake_at IS NOT NULL FROM nq_rate_hold WHERE queue = 'q'") == 1
        # ... and no held job was charged an attempt
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 0 AND attempts = 0") == 30
    finally:
        s.close()


def test_a_fair_queue_with_a_key_rate_gives_every_key_with_room_its_turn_in_one_period(db):
    # Given a fair queue with rate_per_key 2 an hour, 10 jobs each of A, B and C, and claims of 2
    # (fewer than the keys)
    cfg = _config(db, rate_per_key="2/1h", fair=True)
    keys = ["A"] * 10 + ["B"] * 10 + ["C"] * 10
    ids = _put(cfg, len(keys), keys)
    s = Session(cfg.dsn)
    try:
        # When claims of 2 follow each other within the hour, until one says the queue is drained
        got = _flow_claims(s, cfg, 2, 8)
        taken = [[keys[ids.index(j.id)] for j in c.jobs] for c in got]
        # Then every key starts its 2 before the refill (the keys read first, A and B, held their
        # spent jobs in every claim's locking read, and C waited for the hour), round-robin: a
        # claim takes one job of a key (its share of a batch of 2 among 3 keys)
        assert sorted(k for c in taken for k in c) == ["A", "A", "B", "B", "C", "C"], taken
        assert all(len(set(c)) == len(c) for c in taken), taken
        assert taken[-1] == [] and got[-1].drained and got[-1].held_s is not None, taken
    finally:
        s.close()


def test_consumer_processes_start_the_other_keys_while_a_hot_keys_backlog_waits_for_its_rate(db, tmp_path):
    # Given rate_per_key 2 a second, a backlog of 60 jobs of key A put first, then 6 each of B and
    # C (behind more of A than a claim of 10 reads), and two `notifyq consume` processes
    (tmp_path / "notifyq.toml").write_text('[queue.q]\nrate_per_key = "2/1s"\nbatch_size = 10\n')
    env = {**db.env, "NOTIFYQ_CONFIG": str(tmp_path / "notifyq.toml"), "NQ_TEST_OUT": str(tmp_path)}
    cfg = _config(db, rate_per_key="2/1s")
    with Producer("q", cfg) as p:
        for key, n in (("A", 60), ("B", 6), ("C", 6)):
            p.put_many([{"i": i} for i in range(n)], key=key)
    procs = [subprocess.Popen(notifyq_cmd("consume", "-q", "q", "--handler", "nqhandlers:record_start"),
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]

    def starts() -> list[tuple[float, str]]:
        lines = [line.split() for f in tmp_path.glob("*.log") for line in f.read_text().splitlines()]
        return sorted((float(t), key) for _, key, t in lines)

    try:
        first = wait_until(starts, 60, 0.05, "the first start")[0][0]
        # When B and C have each started their 6 (three periods of 2: about 2 s)
        wait_until(lambda: sum(k != "A" for _, k in starts()) == 12, 20, 0.05, "B's and C's jobs all started")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(30) for p in procs]
    assert codes == [0, 0], [p.stderr.read() for p in procs]
    # Then they started beside A's backlog, within its first periods (before the fix they waited
    # for A's 60 jobs: 30 s)
    done = starts()
    last_other = max(t for t, k in done if k != "A")
    assert last_other - first < 6.0, [(round(t - first, 2), k) for t, k in done]
    # ... and no key started more than 2 in any second (a start's line comes up to a few hundred
    # ms after its claim on a loaded machine: docs/flow-control.md, "Checked under faults")
    for key in "ABC":
        times = [t for t, k in done if k == key]
        assert all(times[i + 2] - times[i] >= 1.0 - 0.25 for i in range(len(times) - 2)), (key, times)
