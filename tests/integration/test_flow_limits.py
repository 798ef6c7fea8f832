"""Concurrency limits and fairness inside the claim (store/flow.py) against a real server: a
key never runs more than its limit, whatever claims run at once; the queue's limit; overrides;
a key's sequence; fairness; and a held job stays ready, uncharged."""

from __future__ import annotations

import threading

from conftest import admin_connect, cron_run, wait_until

from notifyq.produce.producer import Producer
from notifyq.store import queries
from notifyq.store.db import Session
from notifyq.store.flow import DEEP_SKIPS, FlowClaims, FlowLimits
from notifyq.store.sql import QUERIES

OWNER = "o" * 32


def _put_keyed(db, cfg, keys: list[str | None], priority: int = 0) -> list[int]:
    """Jobs with these keys, in this order (the key set by SQL: put(key=) is another change's)."""
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(len(keys))], priority=priority)
    for job_id, key in zip(ids, keys):
        db.query("UPDATE nq_job SET job_key = %s WHERE id = %s", (key, job_id))
    return ids


def _claim(session, flow, batch=100):
    return queries.claim(session, "q", OWNER, batch, 60, flow=flow)


def _running(db) -> dict:
    return dict(db.query("SELECT job_key, COUNT(*) FROM nq_job WHERE status = 2 GROUP BY job_key"))


def test_a_key_runs_at_most_its_limit_and_a_held_job_stays_ready_uncharged(db):
    # Given 5 jobs of key a and 3 of b, with limit_per_key = 2
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 5 + ["b"] * 3)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        # When claims are made twice over
        first = _claim(session, flow)
        second = _claim(session, flow)
    finally:
        session.close()
    # Then 2 of each key run, the second claim takes nothing and says the queue is drained
    # (the rest is held back, not left behind), and the held jobs stay ready with no attempt
    assert len(first.jobs) == 4 and _running(db) == {"a": 2, "b": 2}
    assert first.drained
    assert second.jobs == [] and second.drained
    assert db.query("SELECT status, attempts, COUNT(*) FROM nq_job WHERE status = 0 GROUP BY status, attempts") \
        == [(0, 0, 4)]
    assert sorted(flow.last.held_keys) == ["a", "b"]


def test_a_limited_queues_claim_of_one_job_takes_an_unkeyed_one_past_a_few_that_peers_are_claiming(db):
    # Given a queue with limit_per_key whose 50 ready jobs have no key, and peers whose claims
    # hold the first 6 locked (rows locked, not yet committed): as many consumers claiming at once do
    cfg = db.config()
    ids = _put_keyed(db, cfg, [None] * 50)
    peer, mine = Session(cfg.dsn), Session(cfg.dsn)
    try:
        cur = peer.conn.cursor()
        cur.execute(QUERIES["claim_lock"], {"ids": ids[:6]})
        assert len(cur.fetchall()) == 6
        # When a consumer claims one job (a claim sized down for slower jobs)
        claim = _claim(mine, FlowClaims(FlowLimits(limit_per_key=2)), batch=1)
        # Then it takes the next ready job, past the few its peers hold, and says work is left
        assert [j.id for j in claim.jobs] == [ids[6]]
        assert not claim.drained
        peer.conn.rollback()
    finally:
        peer.close(), mine.close()


def test_unkeyed_jobs_behind_a_run_of_one_held_keys_jobs_are_claimed_not_left_ready(db):
    # Given a queue with limit_per_key = 2: a put_many of 40 jobs of one key (they sit in a row
    # at the head of the queue), then 10 jobs without a key
    cfg = db.config()
    keyed = _put_keyed(db, cfg, ["a"] * 40)
    unkeyed = _put_keyed(db, cfg, [None] * 10)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        # When two claims of 5 jobs are made
        first = _claim(session, flow, batch=5)
        second = _claim(session, flow, batch=5)
    finally:
        session.close()
    # Then the first takes the key's 2 and the first 3 unkeyed jobs, in claim order, and the
    # second the next 5 unkeyed: not nothing, saying the queue was drained, while the key's
    # limit held its head (the fleet then idled with the unkeyed jobs ready)
    assert [j.id for j in first.jobs] == keyed[:2] + unkeyed[:3]
    assert [j.id for j in second.jobs] == unkeyed[3:8]
    assert _running(db) == {"a": 2, None: 8}


def test_an_ack_frees_the_slot_and_bumps_the_signal(db):
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 3)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=1))
    try:
        first = _claim(session, flow)
        assert [j.id for j in first.jobs] and len(first.jobs) == 1
        before = db.scalar("SELECT COALESCE(SUM(seq), 0) FROM nq_signal WHERE queue = 'q'")
        queries.ack(session, [], 0, False, queries.Acks([first.jobs[0].id], first.token, False, wake="q"))
        after = db.scalar("SELECT COALESCE(SUM(seq), 0) FROM nq_signal WHERE queue = 'q'")
        second = _claim(session, flow)
    finally:
        session.close()
    assert after > before
    assert len(second.jobs) == 1 and second.jobs[0].id != first.jobs[0].id


def test_limit_per_key_one_runs_a_key_in_enqueue_order(db):
    cfg = db.config()
    ids = _put_keyed(db, cfg, ["a", "b", "a", "a", "b"])
    hi = _put_keyed(db, cfg, ["a"], priority=5)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=1))
    order = []
    try:
        while True:
            claim = _claim(session, flow)
            if not claim.jobs:
                break
            for job in claim.jobs:
                order.append(job.id)
                queries.ack(session, [job.id], claim.token, False)
    finally:
        session.close()
    a_order = [i for i in order if i in (ids[0], ids[2], ids[3], hi[0])]
    assert a_order == [hi[0], ids[0], ids[2], ids[3]]  # priority first, then enqueue order
    assert [i for i in order if i in (ids[1], ids[4])] == [ids[1], ids[4]]


def test_overrides_exact_key_then_first_matching_pattern(db):
    limits = FlowLimits(limit_per_key=2, key_limits=(("premium-*", 5), ("premium-42", 9), ("p?", 1)))
    assert limits.limit_for("premium-42") == 9
    assert limits.limit_for("premium-7") == 5
    assert limits.limit_for("px") == 1
    assert limits.limit_for("other") == 2
    assert limits.limit_for(None) == 0
    cfg = db.config()
    _put_keyed(db, cfg, ["premium-7"] * 8 + ["basic"] * 8)
    session = Session(cfg.dsn)
    try:
        _claim(session, FlowClaims(limits))
    finally:
        session.close()
    assert _running(db) == {"premium-7": 5, "basic": 2}


def test_the_queue_limit_counts_keyed_and_unkeyed_jobs(db):
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 4 + [None] * 4)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit=3))
    try:
        first = _claim(session, flow)
        second = _claim(session, flow)
    finally:
        session.close()
    assert len(first.jobs) == 3 and second.jobs == [] and second.drained
    assert flow.last.queue_full


def test_fair_takes_keys_round_robin_so_a_big_key_does_not_hide_a_small_one(db):
    # Given 2,000 ready jobs of key a enqueued before 10 of key b
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 2000)
    b = _put_keyed(db, cfg, ["b"] * 10)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(fair=True))
    try:
        claim = _claim(session, flow, batch=20)
    finally:
        session.close()
    # Then the first claim of 20 takes all 10 of b, alternating with a
    got = [j.id for j in claim.jobs]
    assert set(b) <= set(got)


def test_concurrent_claimers_never_exceed_a_key_limit(db):
    # Given 40 jobs over 4 keys with limit_per_key = 3, and 6 claimers at once
    cfg = db.config()
    _put_keyed(db, cfg, [f"k{i % 4}" for i in range(40)])
    peak: dict = {}
    errors: list = []
    stop = threading.Event()

    def claimer(n: int) -> None:
        session = Session(cfg.dsn)
        flow = FlowClaims(FlowLimits(limit_per_key=3))
        try:
            while not stop.is_set():
                claim = queries.claim(session, "q", f"{n:032d}", 5, 60, flow=flow)
                for key, count in _running(db).items():
                    peak[key] = max(peak.get(key, 0), count)
                if claim.jobs:
                    queries.ack(session, [j.id for j in claim.jobs], claim.token, False)
                elif db.scalar("SELECT COUNT(*) FROM nq_job") == 0:
                    return
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
        finally:
            session.close()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    assert not errors
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    assert peak and max(peak.values()) <= 3


def test_a_claim_that_read_a_key_only_up_to_its_share_does_not_say_drained(db):
    # Regression: a fair claim read 10 of key a's 200 jobs (its share) and called the queue
    # drained, so the worker went idle with jobs ready and nothing to wake it.
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 200 + ["b"] * 2 + ["c"] * 2)
    session = Session(cfg.dsn)
    try:
        claim = _claim(session, FlowClaims(FlowLimits(fair=True)), batch=30)
    finally:
        session.close()
    assert len(claim.jobs) == 10 + 2 + 2 and not claim.drained


def test_status_shows_limits_running_and_held_counts_per_key_and_why(db):
    from notifyq.ops import status

    cfg = db.config(queue={"q": {"limit_per_key": 2, "key_limits": {"big": 3}}})
    _put_keyed(db, cfg, ["a"] * 5 + ["big"] * 5 + ["c"])
    session = Session(cfg.dsn)
    try:
        _claim(session, FlowClaims(FlowLimits.of(cfg.queue("q"))))
        data = status.collect(session, None, configs=cfg.queues)
    finally:
        session.close()
    flow = data["queues"]["q"]["flow"]
    keys = {k["key"]: k for k in flow["keys"]}
    assert flow["limit_per_key"] == 2 and flow["running"] == 2 + 3 + 1
    assert keys["a"] == {"key": "a", "running": 2, "ready": 3, "limit": 2, "held": 3,
                         "why": "key at its limit (2 of 2 running)"}
    assert keys["big"]["limit"] == 3 and keys["big"]["held"] == 2
    assert "c" not in keys or keys["c"]["held"] == 0
    assert flow["held_in_top_keys"] == 5
    text = status.render(data)
    assert "flow control" in text and "held: key at its limit (2 of 2 running)" in text


def test_a_fair_claim_takes_jobs_while_another_claim_holds_the_key_rows(db):
    # Regression: every fair claim locked every key's row, so two claimers skipped each
    # other's keys and the one that lost took nothing, said drained, and went idle (a fair
    # drain ran at a few dozen jobs a second). A key without a limit is not locked now.
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 5 + ["b"] * 5)
    session = Session(cfg.dsn)
    try:
        _claim(session, FlowClaims(FlowLimits(fair=True)), batch=2)  # names the keys
        import MySQLdb

        other = MySQLdb.connect(**cfg.dsn.connect_args())
        try:
            other.cursor().execute("SELECT job_key FROM nq_flow_key FOR UPDATE")  # a claim in flight
            claim = _claim(session, FlowClaims(FlowLimits(fair=True)), batch=4)
        finally:
            other.rollback()
            other.close()
    finally:
        session.close()
    assert len(claim.jobs) == 4


def test_a_claim_over_a_limit_once_marked_is_refused_before_its_commit(db):
    # The check a flow claim runs after its mark, before its COMMIT: a count cut short (a KILL
    # QUERY's OK reply with rows missing) must not let a key run past its limit
    import MySQLdb
    import pytest

    cfg = db.config()
    ids = _put_keyed(db, cfg, ["a"] * 3 + ["b"])
    db.query("UPDATE nq_job SET status = 2, claim_token = 1 WHERE id IN %s", (tuple(ids),))
    conn = MySQLdb.connect(**cfg.dsn.connect_args())
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        cur = conn.cursor()
        cur.execute(QUERIES["flow_running"], {"queue": "q"})  # as the claim reads it, in its mark's query
        running = list(cur.fetchall())
        with pytest.raises(MySQLdb.OperationalError, match="key .a. would run 3 of 2"):  # cut_short: rerun
            flow.verify_marked(running, "q", ["a"])
        flow.verify_marked(running, "q", ["b"])  # b is within its limit
    finally:
        conn.close()


def test_an_exit_when_empty_run_on_a_limited_queue_runs_every_job_and_keeps_the_limit(db):
    # Given 10 jobs on a queue limited to 2 running at once, and 6 of one key limited to 1
    for queue, limits, keys in (("q", {"limit": 2}, [None] * 10), ("k", {"limit_per_key": 1}, ["a"] * 6)):
        cfg = db.config(queue={queue: limits})
        with Producer(queue, cfg) as p:
            for key in keys:
                p.put({}, key=key)
        ran: list[int] = []
        # When a cron-style run (--exit-when-empty) drains it
        worker = cron_run(cfg, queue, lambda job: ran.append(job.id))
        # Then it ran every job before it exited (the batch it ran last held no slot any more)
        assert len(ran) == len(keys), (queue, ran, worker.error)
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = %s", (queue,)) == 0


def test_key_discovery_reads_without_locks_so_a_claim_never_waits_on_a_peers_locked_jobs(db):
    # Given ready jobs of keys a and b, and a peer transaction holding b's ready jobs locked
    # through ix_key (as a peer's claim holds the rows it marks until its COMMIT)
    cfg = db.config()
    _put_keyed(db, cfg, ["a", "b", "b"])
    peer = admin_connect(db.admin, db.admin.database)
    peer.autocommit(False)
    cur = peer.cursor()
    cur.execute("SELECT id FROM nq_job FORCE INDEX (ix_key) WHERE queue = 'q' AND ready_key = 'b' FOR UPDATE")
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=1))
    done = threading.Event()
    claimed = []
    worker = threading.Thread(target=lambda: (claimed.append(_claim(session, flow)), done.set()), daemon=True)
    try:
        # When a claim discovers the keys (its dives pass b's entries) meanwhile
        worker.start()
        # Then it does not wait for the peer: a dive that took shared locks (SET @v = (SELECT ...))
        # waited here until the peer ended, and deadlocked with peers' marks
        finished = done.wait(10)
    finally:
        peer.rollback()
        peer.close()
        worker.join(60)
        session.close()
    assert finished, "the claim waited on the peer's locked rows"
    assert [j.key for j in claimed[0].jobs] == ["a"]


def test_status_counts_every_running_job_of_the_queue_not_only_the_top_keys(db):
    # Regression: the running total (and the queue limit's "why") summed the top keys' rows
    # only: 13 keys running one job each showed 11 running
    from notifyq.ops import status

    cfg = db.config(queue={"q": {"limit_per_key": 1, "limit": 13}})
    _put_keyed(db, cfg, [f"k{i:02d}" for i in range(13)] * 2)
    session = Session(cfg.dsn)
    flow_claims = FlowClaims(FlowLimits.of(cfg.queue("q")))
    try:
        for _ in range(10):  # a few claims: the first ones discover the keys a few at a time
            if sum(_running(db).values()) == 13:
                break
            _claim(session, flow_claims)
        data = status.collect(session, None, configs=cfg.queues)
    finally:
        session.close()
    flow = data["queues"]["q"]["flow"]
    assert _running(db) == {f"k{i:02d}": 1 for i in range(13)}
    assert flow["running"] == 13
    assert len(flow["keys"]) == 10
    assert all(k["why"] == "key at its limit (1 of 1 running)" for k in flow["keys"])


def test_a_limited_claim_carrying_acks_takes_the_slots_they_free_in_its_own_transaction(db):
    # Given 4 jobs of key a, limited to 2, and a claim that took 2 of them
    cfg = db.config()
    ids = _put_keyed(db, cfg, ["a"] * 4)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        first = _claim(session, flow)
        assert sorted(j.id for j in first.jobs) == ids[:2]
        # When the next claim carries their acks (a limited queue's: they wake its watcher)
        acks = queries.Acks([j.id for j in first.jobs], first.token, False, wake="q")
        second = queries.claim(session, "q", OWNER, 100, 60, acks=acks, flow=flow)
        session.pipeline.read_reply()
    finally:
        session.close()
    # Then the slots they freed are its own: it takes the other 2, and its COMMIT landed the
    # acks (their row count where a plain claim's is); a then runs 2, never more
    assert sorted(j.id for j in second.jobs) == ids[2:]
    assert not second.commit.failed and second.commit.rowcounts[queries.Acks.COUNTED] == 2
    assert _running(db) == {"a": 2}
    assert db.query("SELECT COUNT(*) FROM nq_job WHERE id IN %s", (tuple(ids[:2]),)) == [(0,)]


def test_a_limited_claim_finds_a_hundred_new_keys_within_five_claims(db):
    # Given 100 keys no claim has named yet, 2 jobs each, limited to 1 per key
    cfg = db.config()
    with Producer("q", cfg) as p:
        p.put_many([{"n": i} for i in range(200)])
    db.query("UPDATE nq_job SET job_key = CONCAT('k', LPAD(id MOD 100, 3, '0')) WHERE queue = 'q'")
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=1))
    try:
        # When five claims of 100 are made (none acked)
        taken = [len(_claim(session, flow).jobs) for _ in range(5)]
    finally:
        session.close()
    # Then every key runs one job: discovery doubled its dives while each found a new key (four
    # a claim found 20 keys in five claims)
    assert sum(taken) == 100, taken
    assert _running(db) == {f"k{i:03d}": 1 for i in range(100)}


def test_two_limited_claims_at_once_both_take_a_batch_when_there_are_keys_enough(db, monkeypatch):
    # Given 20 keys of 2 ready jobs each, limit_per_key = 2, every key named already, and a
    # claim of 10 jobs paused right after its locking read (its transaction open: whatever key
    # rows it locked, it holds)
    cfg = db.config()
    keys = [f"k{i:02d}" for i in range(20)]
    _put_keyed(db, cfg, [k for k in keys for _ in range(2)])
    for key in keys:
        db.query("INSERT INTO nq_flow_key (queue, job_key) VALUES ('q', %s)", (key,))
    locked_in, may_go_on = threading.Event(), threading.Event()
    real_lock_windows = queries.lock_windows

    def pausing_lock_windows(*args, **kwargs):
        out = real_lock_windows(*args, **kwargs)
        if threading.current_thread().name == "first":
            locked_in.set()
            may_go_on.wait(30)
        return out

    monkeypatch.setattr(queries, "lock_windows", pausing_lock_windows)
    first_session, second_session = Session(cfg.dsn), Session(cfg.dsn)
    outcome: list = []

    def first_claim() -> None:
        try:
            outcome.append(queries.claim(first_session, "q", "f" * 32, 10, 60,
                                         flow=FlowClaims(FlowLimits(limit_per_key=2))))
        except Exception as e:  # the test's verdict below
            outcome.append(e)

    thread = threading.Thread(target=first_claim, name="first", daemon=True)
    try:
        thread.start()
        assert locked_in.wait(30), "the first claim's locking read"
        # When a second consumer claims 10 jobs while the first claim is under way
        second = queries.claim(second_session, "q", "s" * 32, 10, 60, flow=FlowClaims(FlowLimits(limit_per_key=2)))
        second_session.pipeline.read_reply()  # its COMMIT
        may_go_on.set()
        thread.join(30)
    finally:
        may_go_on.set()
        first_session.close()
        second_session.close()
    # Then each takes a whole batch, of keys the other did not lock (the first locked only the
    # keys of the jobs it took), and no key runs more than its limit
    [first] = outcome
    assert not isinstance(first, Exception), first
    assert len(first.jobs) == 10 and len(second.jobs) == 10
    assert not {j.key for j in first.jobs} & {j.key for j in second.jobs}
    assert max(_running(db).values()) == 2 and sum(_running(db).values()) == 20


def test_a_claim_keeps_only_the_slots_the_count_under_its_key_lock_leaves(db, monkeypatch):
    # Given key a with 4 ready jobs, limit_per_key = 2, and a claim whose candidate read (plain,
    # no key locked yet) saw a's 2 slots free, after which 2 other jobs of a started and committed
    cfg = db.config()
    ids = _put_keyed(db, cfg, ["a"] * 4)
    db.query("INSERT INTO nq_flow_key (queue, job_key) VALUES ('q', 'a')")
    real_candidates = FlowClaims.candidates

    def candidates_then_a_peer_starts_two(self, cur, queue, batch_size):
        grant = real_candidates(self, cur, queue, batch_size)
        assert sorted(grant.ids) == ids[:2]
        db.query("UPDATE nq_job SET status = 2 WHERE id IN %s", (tuple(ids[2:]),))
        return grant

    monkeypatch.setattr(FlowClaims, "candidates", candidates_then_a_peer_starts_two)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        # When the claim locks its jobs (and their key)
        claim = _claim(session, flow, batch=10)
    finally:
        session.close()
    # Then it keeps none of them: the count under a's lock leaves no slot, and a is held
    assert claim.jobs == [] and _running(db) == {"a": 2}
    assert flow.last.held_keys == ["a"]


def test_unkeyed_jobs_put_behind_a_keyed_head_are_claimed_within_the_deep_skips(db):
    # Given limit_per_key = 2, 40 jobs of key a at the head of the queue (held at its limit after
    # the first claim), then 30 jobs of key c, whose 2 slots each claim takes again (the last
    # claim's acked), and a consumer whose first claim of 5 read deep for unkeyed jobs behind
    # the head and found none
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 40 + ["c"] * 30)
    for key in ("a", "c"):
        db.query("INSERT INTO nq_flow_key (queue, job_key) VALUES ('q', %s)", (key,))
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        first = _claim(session, flow, batch=5)
        assert len(first.jobs) == 4 and not flow.deep_found
        # When 3 jobs without a key are put, behind the head, and the consumer claims on (each
        # claim short of its batch: c's 2 slots)
        unkeyed = _put_keyed(db, cfg, [None] * 3)
        claims = [first]
        while len(claims) <= DEEP_SKIPS + 1 and not set(unkeyed) & {j.id for j in claims[-1].jobs}:
            done = [j.id for j in claims[-1].jobs if j.key == "c"]
            queries.ack(session, done, claims[-1].token, False)
            claims.append(_claim(session, flow, batch=5))
    finally:
        session.close()
    # Then a claim within DEEP_SKIPS + 1 takes them (the claims before it, which did not read
    # deep, said they left jobs behind), and no key ran more than its limit
    assert set(unkeyed) <= {j.id for j in claims[-1].jobs}
    assert 1 < len(claims) <= DEEP_SKIPS + 2
    assert all(not c.drained for c in claims[1:-1])
    assert _running(db) == {"a": 2, "c": 2, None: 3}


def test_a_claim_never_names_again_a_key_whose_row_a_peers_claim_holds(db):
    # Given 4 named keys with a ready job each, limit_per_key = 2, and a peer's claim under way
    # holding k3's row (flow_lock); a claim of one job reads 3 named keys (3 x its batch), and
    # its discovery dives meet k3 beyond them
    cfg = db.config()
    keys = ["k0", "k1", "k2", "k3"]
    _put_keyed(db, cfg, keys)
    for key in keys:
        db.query("INSERT INTO nq_flow_key (queue, job_key) VALUES ('q', %s)", (key,))
    peer = admin_connect(db.admin, db.admin.database)
    peer.autocommit(False)
    peer.cursor().execute("SELECT job_key FROM nq_flow_key WHERE queue = 'q' AND job_key = 'k3' FOR UPDATE")
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    done = threading.Event()
    claimed: list = []

    def claim_one() -> None:
        try:
            claimed.append(_claim(session, flow, batch=1))
        except Exception as e:  # the test's verdict below
            claimed.append(e)
        done.set()

    worker = threading.Thread(target=claim_one, daemon=True)
    try:
        # When it claims meanwhile
        worker.start()
        # Then it does not wait for the peer: an INSERT IGNORE of k3 (to name it) waited for the
        # peer's COMMIT, with the acks the claim carried (in a fault run, 10 s and a 1205)
        finished = done.wait(5)
    finally:
        peer.rollback()
        peer.close()
        worker.join(60)
        session.close()
    assert finished, "the claim waited on the peer's key row"
    [claim] = claimed
    assert not isinstance(claim, Exception), claim
    assert [j.key for j in claim.jobs] == ["k0"]


def test_a_claim_whose_keys_first_jobs_a_peer_claims_meanwhile_keeps_the_key_within_its_limit(db, monkeypatch):
    # Given key a with 6 ready jobs, limit_per_key = 2, two consumers running one job each (the
    # first and second), each about to claim again carrying its ack: consumers that claim at
    # once read the same committed counts and the same first jobs
    cfg = db.config()
    ids = _put_keyed(db, cfg, ["a"] * 6)
    db.query("INSERT INTO nq_flow_key (queue, job_key) VALUES ('q', 'a')")
    peer, mine = Session(cfg.dsn), Session(cfg.dsn)
    peer_flow, my_flow = FlowClaims(FlowLimits(limit_per_key=2)), FlowClaims(FlowLimits(limit_per_key=2))
    real_candidates = FlowClaims.candidates
    peers: list = []
    peer_thread: list[threading.Thread] = []
    try:
        peers.append(queries.claim(peer, "q", "p" * 32, 1, 60, flow=peer_flow))
        peer.pipeline.read_reply()
        mine_first = queries.claim(mine, "q", "m" * 32, 1, 60, flow=my_flow)
        mine.pipeline.read_reply()
        assert [j.id for j in peers[0].jobs] == ids[:1] and [j.id for j in mine_first.jobs] == ids[1:2]

        def peer_claims() -> None:
            acks = queries.Acks([j.id for j in peers[0].jobs], peers[0].token, False, wake="q")
            peers.append(queries.claim(peer, "q", "p" * 32, 1, 60, acks=acks, flow=peer_flow))
            peer.pipeline.read_reply()

        def candidates_then_the_peer_claims(self, cur, queue, batch_size):
            grant = real_candidates(self, cur, queue, batch_size)
            if self is my_flow and not peer_thread:
                # ... and my claim read its candidates (my ack freed a slot: the key's next
                # ready job), then the peer's claim, its ack freeing a slot too, goes on at
                # once: its ack's release of the key's counter waits for my claim's COMMIT (the
                # key's row is held by my ack's release)
                peer_thread.append(threading.Thread(target=peer_claims, daemon=True))
                peer_thread[0].start()
                wait_until(lambda: _lock_waits(db) > 0, message="the peer's claim waiting on the key's row")
            return grant

        monkeypatch.setattr(FlowClaims, "candidates", candidates_then_the_peer_claims)
        # When my claim, carrying my ack, goes on
        acks = queries.Acks([j.id for j in mine_first.jobs], mine_first.token, False, wake="q")
        claim = queries.claim(mine, "q", "m" * 32, 1, 60, acks=acks, flow=my_flow)
        mine.pipeline.read_reply()
        peer_thread[0].join(30)
    finally:
        peer.close(), mine.close()
    # Then my claim took the key's next job and the peer's the one after it: both acks freed a
    # slot, each claim took one, and the key runs 2, never more
    assert [j.id for j in claim.jobs] == ids[2:3]
    assert [j.id for j in peers[1].jobs] == ids[3:4]
    assert _running(db) == {"a": 2}
    assert _counters(db) == {"a": 2}


def _lock_waits(db) -> int:
    return int(db.query("SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS")[0][0])


def _counters(db) -> dict[str, int | None]:
    """Each key's counter (nq_flow_key.running) of queue q."""
    return {k: (None if n is None else int(n)) for k, n in db.query(
        "SELECT job_key, running FROM nq_flow_key WHERE queue = 'q' AND job_key <> ''")}


def test_a_limited_claim_takes_whole_keys_slots_so_two_consumers_split_the_keys(db):
    # Given 4 keys of 4 jobs each, put in turn (a, b, c, d, a, b, ...), limit_per_key = 2
    cfg = db.config()
    ids = _put_keyed(db, cfg, ["a", "b", "c", "d"] * 4)
    first_session, second_session = Session(cfg.dsn), Session(cfg.dsn)
    try:
        # When two consumers claim 4 jobs each
        first = _claim(first_session, FlowClaims(FlowLimits(limit_per_key=2)), batch=4)
        second = _claim(second_session, FlowClaims(FlowLimits(limit_per_key=2)), batch=4)
    finally:
        first_session.close(), second_session.close()
    # Then the first takes both slots of the keys of the oldest jobs, a and b, their first two
    # jobs each (not one job of every key: its claim then locked every key's row, and a peer's
    # claim at that moment skipped them all), and the second takes c's and d's
    assert [j.id for j in first.jobs] == [ids[0], ids[1], ids[4], ids[5]]
    assert [j.id for j in second.jobs] == [ids[2], ids[3], ids[6], ids[7]]
    assert _running(db) == {"a": 2, "b": 2, "c": 2, "d": 2}


def test_a_limited_claim_carrying_acks_never_waits_on_a_counter_slot_a_stopped_peer_holds(db, monkeypatch):
    """Regression (a long fault run: a limited claim waited 10 s, the lock wait timeout, behind a
    peer SIGSTOPped inside its claim): a limited queue's acks bump the queue's counter in the
    claim's transaction, and a peer's transaction holds the slot its own bump took. The bump took
    a random slot; it takes one nobody holds now."""
    from notifyq.store import signal

    # Given 4 jobs of key a, limited to 2, a claim that took 2 of them, and every slot of the
    # queue's counter but one held by a peer's open transaction; the random slot is a held one
    cfg = db.config()
    ids = _put_keyed(db, cfg, ["a"] * 4)
    for slot in range(signal.SIGNAL_SLOTS):
        db.query("INSERT IGNORE INTO nq_signal (queue, slot, seq) VALUES ('q', %s, 0)", (slot,))
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    first = _claim(session, flow)
    session.pipeline.read_reply()
    peer = admin_connect(db.admin, db.admin.database)
    cur = peer.cursor()
    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    cur.execute("BEGIN")
    for slot in range(signal.SIGNAL_SLOTS):
        if slot != 7:
            cur.execute("UPDATE nq_signal SET seq = seq + 1 WHERE queue = 'q' AND slot = %s", (slot,))
    monkeypatch.setattr(signal, "slot", lambda: 3)
    # (the put bumped a random slot by its 4 jobs: slot 7 one time in 16)
    free_before = db.scalar("SELECT seq FROM nq_signal WHERE queue = 'q' AND slot = 7")
    done: list = []

    def second_claim() -> None:
        acks = queries.Acks([j.id for j in first.jobs], first.token, False, wake="q")
        claim = queries.claim(session, "q", OWNER, 100, 60, acks=acks, flow=flow)
        session.pipeline.read_reply()
        done.append(claim)

    try:
        # When the next claim carries their acks
        thread = threading.Thread(target=second_claim, daemon=True)
        thread.start()
        thread.join(5.0)
        waited = thread.is_alive()
    finally:
        peer.close()  # (lets a waiting claim go: the test failed)
    thread.join(30)
    session.close()
    # Then it did not wait: it took the slots they freed, and the free slot counted them
    assert not waited, "the claim waited on a counter slot the peer held"
    assert sorted(j.id for j in done[0].jobs) == ids[2:]
    assert not done[0].commit.failed
    assert db.scalar("SELECT seq FROM nq_signal WHERE queue = 'q' AND slot = 7") == free_before + 2
