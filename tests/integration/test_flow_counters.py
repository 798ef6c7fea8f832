"""The per-key counters of a queue limited per key only (nq_flow_key.running, schema 10): exact
after every path that ends a run and releases it (ack, ack carried by a claim, failure, retry,
burial, give-back), never low after a path that does not (a reaper's take-back and an operator's
purge leave it unknown, a row deleted outside notifyq high), recounted under the key row's lock when it is unknown or older than the trust
bound (COUNT_TRUST_S), and never trusted for jobs a claim that did not count started. A claim
that a counter held ready jobs back from says when that counter's trust ends (Claim.recount_s)."""

from __future__ import annotations

import threading

import pytest
from conftest import admin_connect, wait_until

from notifyq.produce.producer import Producer
from notifyq.store import admin_queries, liveness, queries
from notifyq.store.db import Session
from notifyq.store.flow import COUNT_TRUST_S, FlowClaims, FlowLimits
from notifyq.store.signal import SIGNAL_SLOTS

OWNER = "o" * 32


def _put_keyed(db, cfg, keys: list[str]) -> list[int]:
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(len(keys))])
    for job_id, key in zip(ids, keys):
        db.query("UPDATE nq_job SET job_key = %s WHERE id = %s", (key, job_id))
    for key in sorted(set(keys)):
        db.query("INSERT IGNORE INTO nq_flow_key (queue, job_key) VALUES ('q', %s)", (key,))
    return ids


def _running(db) -> dict[str, int]:
    return {k: int(n) for k, n in db.query(
        "SELECT job_key, COUNT(*) FROM nq_job WHERE status = 2 AND job_key IS NOT NULL GROUP BY job_key")}


def _counters(db) -> dict[str, int | None]:
    return {k: (None if n is None else int(n)) for k, n in db.query(
        "SELECT job_key, running FROM nq_flow_key WHERE queue = 'q' AND job_key <> ''")}


def _exact(db) -> None:
    """Every known counter is its key's running jobs."""
    running, counters = _running(db), _counters(db)
    assert {k: n for k, n in counters.items() if n is not None} == {k: running.get(k, 0) for k in counters
                                                                  if counters[k] is not None}, (counters, running)


def _never_low(db) -> None:
    running, counters = _running(db), _counters(db)
    for key, n in running.items():
        assert counters.get(key) is None or counters[key] >= n, (key, counters, running)


def _claim(session, flow, batch=100, acks=None):
    claim = queries.claim(session, "q", OWNER, batch, 60, acks=acks, flow=flow)
    session.pipeline.read_reply()
    return claim


def test_a_counter_is_exact_after_each_path_that_releases_it(db):
    # Given keys a, b, c with 6 ready jobs each and limit_per_key = 2: a claim runs 2 of each
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 6 + ["b"] * 6 + ["c"] * 6)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        claim = _claim(session, flow)
        assert _running(db) == {"a": 2, "b": 2, "c": 2}
        _exact(db)
        by_key = {k: [j.id for j in claim.jobs if j.key == k] for k in "abc"}
        # When one of a's jobs is acked on its own (queries.ack, without the queue's wake)
        assert queries.ack(session, [by_key["a"][0]], claim.token, keep=False) == 1
        # Then its counter is exact
        _exact(db)
        assert _counters(db)["a"] == 1
        # And after a retry (b), a burial (b), a give-back (c)
        queries.reschedule_or_bury(session, "q", claim.token, [(by_key["b"][0], 60.0, "boom")])
        _exact(db)
        queries.reschedule_or_bury(session, "q", claim.token, [(by_key["b"][1], None, "dead")])
        _exact(db)
        assert queries.give_back(session, "q", [by_key["c"][0]], claim.token) == 1
        _exact(db)
        assert _counters(db) == {"a": 1, "b": 0, "c": 1}
        # And a claim that carries the acks of the rest takes the freed slots, exactly
        acks = queries.Acks([by_key["a"][1], by_key["c"][1]], claim.token, False, wake="q",
                            keys=["a", "c"])
        again = _claim(session, flow, acks=acks)
        assert len(again.jobs) == 6
        assert _running(db) == {"a": 2, "b": 2, "c": 2}
        _exact(db)
        # And a failure of the same job sent twice (its outcome landed) releases it once
        job = again.jobs[0]
        queries.reschedule_or_bury(session, "q", again.token, [(job.id, 60.0, "boom")])
        queries.reschedule_or_bury(session, "q", again.token, [(job.id, 60.0, "boom")])
        _exact(db)
    finally:
        session.close()


def test_a_job_running_before_its_queue_counted_is_counted_before_a_claim_trusts_the_counter(db):
    # Given key a's row with a counter of 0 counted just now (from an earlier limited period),
    # and 2 of its jobs started since by a claim that did not count (the queue unlimited)
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 6)
    db.query("UPDATE nq_flow_key SET running = 0, counted_at = NOW(6) WHERE queue = 'q'")
    session = Session(cfg.dsn)
    try:
        unlimited = queries.claim(session, "q", OWNER, 2, 60)
        session.pipeline.read_reply()
        assert len(unlimited.jobs) == 2
        # When the queue is limited again (limit_per_key = 2) and claims
        claim = _claim(session, FlowClaims(FlowLimits(limit_per_key=2)))
        # Then it takes none of a's jobs: its counter was given up and recounted first
        assert claim.jobs == []
        assert _running(db) == {"a": 2}
        assert _counters(db) == {"a": 2}
        # And the uncounted jobs' acks take nothing off it (no counter added them): high, never low
        assert queries.ack(session, [j.id for j in unlimited.jobs], unlimited.token, keep=False) == 2
        assert _counters(db) == {"a": 2}
        _never_low(db)
    finally:
        session.close()


def test_an_unknown_counter_is_recounted_under_its_lock_before_a_claim_keeps_a_job(db):
    # Given key a with 2 jobs running (put in status 2 by hand: no counter saw them) and its
    # counter unknown (NULL: a row made by an older version, or given up)
    cfg = db.config()
    ids = _put_keyed(db, cfg, ["a"] * 5)
    db.query("UPDATE nq_job SET status = 2, owner = %s, claim_token = 1, lease_until = NOW(6) + INTERVAL 1 HOUR "
             "WHERE id IN (%s, %s)", (OWNER, ids[0], ids[1]))
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    flow.forget = False  # (the counter is unknown already)
    try:
        # When a claim meets it
        claim = _claim(session, flow)
        # Then it kept none: the recount under the key's lock found the key full
        assert claim.jobs == []
        assert _counters(db) == {"a": 2}
    finally:
        session.close()


def test_a_counter_left_high_by_a_take_back_is_recounted_once_past_the_trust_bound(db):
    # Given key a with 2 jobs running under a counting claim (limit_per_key = 2)
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 5)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        first = _claim(session, flow)
        assert len(first.jobs) == 2
        # When a path that does not release takes one back (a reaper's, an expired lease's),
        # and an operator cancels... here: the rows put back to ready, as a take-back does
        db.query("UPDATE nq_job SET status = 0, owner = NULL, claim_token = NULL, lease_until = NULL "
                 "WHERE id = %s", (first.jobs[0].id,))
        # Then the counter is high (2 for 1 running), never low, and the key stays held while
        # the counter is trusted
        assert _running(db) == {"a": 1} and _counters(db) == {"a": 2}
        assert _claim(session, flow).jobs == []
        # And once its last recount is older than the trust bound, the next claim recounts it
        # under its lock and takes the freed slot
        db.query("UPDATE nq_flow_key SET counted_at = counted_at - INTERVAL 1 HOUR WHERE queue = 'q'")
        again = _claim(session, flow)
        assert len(again.jobs) == 1
        assert _running(db) == {"a": 2}
        _exact(db)
    finally:
        session.close()


@pytest.mark.parametrize("limits", [FlowLimits(limit_per_key=1), FlowLimits(key_limits=(("*", 1),))],
                         ids=["limit_per_key", "key_limits"])
def test_a_claim_says_when_to_claim_again_only_when_a_counter_held_ready_jobs_back(db, limits):
    # Given key a running 1 of 1 (a counting claim took its job: its counter is 1, just counted)
    cfg = db.config()
    _put_keyed(db, cfg, ["a"])
    session = Session(cfg.dsn)
    flow = FlowClaims(limits)
    try:
        assert len(_claim(session, flow).jobs) == 1
        # When a claim finds key a at its limit with no ready job of a (key b's job it takes)
        _put_keyed(db, cfg, ["b"])
        took = _claim(session, flow)
        # Then it drained the queue and holds nothing back: no claim is due for a's counter
        assert len(took.jobs) == 1 and took.drained
        assert took.recount_s is None
        # When a's next job is put: the claim holds it back by a's counter
        _put_keyed(db, cfg, ["a"])
        held = _claim(session, flow)
        # Then it says to claim again once that counter's trust ends (a row deleted outside
        # notifyq, or a take-back that found the key's row locked, leaves it high: only a claim
        # recounts it, and no wake-up may come)
        assert held.jobs == [] and held.drained
        assert held.recount_s == COUNT_TRUST_S
    finally:
        session.close()


def test_a_claim_of_one_job_whose_recount_holds_every_job_back_says_when_to_claim_again(db):
    # Given key a with limit_per_key = 2, running 2 (a counting claim took them), 4 more ready
    cfg = db.config()
    _put_keyed(db, cfg, ["a", "a"])
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        assert len(_claim(session, flow).jobs) == 2
        _put_keyed(db, cfg, ["a"] * 4)
        # And a's counter no longer trusted (its last recount older than the trust bound)
        db.query("UPDATE nq_flow_key SET counted_at = counted_at - INTERVAL 1 HOUR WHERE queue = 'q'")
        # When a claim of one job (the claim sizer's, for slow jobs) reads a's two slots as free,
        # and its recount under a's lock finds both taken
        held = _claim(session, flow, batch=1)
        # Then it takes nothing, and says to claim again once the counter's trust ends, whether or
        # not it calls the queue drained (it read more free slots than its one job: before, it
        # said nothing, and no claim came at the trust's end)
        assert held.jobs == []
        assert held.recount_s == COUNT_TRUST_S
    finally:
        session.close()


def test_a_claim_whose_recount_holds_a_key_whose_job_rows_another_session_holds_says_when_to_claim_again(db):
    # Given key a with limit_per_key = 2, running 2 (a counting claim took them), 2 more ready
    cfg = db.config()
    _put_keyed(db, cfg, ["a", "a"])
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    holders = []
    try:
        assert len(_claim(session, flow).jobs) == 2
        ready = _put_keyed(db, cfg, ["a"] * 2)
        # And a's counter no longer trusted, and the ready jobs' rows held by another session (a
        # peer's claim that could not lock a's row, and keeps none of them)
        db.query("UPDATE nq_flow_key SET counted_at = counted_at - INTERVAL 1 HOUR WHERE queue = 'q'")
        holders = [db.job_row_locked(job_id) for job_id in ready]
        # When a claim locks a's row and its recount finds both slots taken
        held = _claim(session, flow)
        # Then a's jobs are held back by the count, not taken by a peer: it says to claim again
        # once the counter's trust ends (before: it drained holding nothing, and said nothing)
        assert held.jobs == [] and held.drained
        assert held.recount_s == COUNT_TRUST_S
    finally:
        for conn in holders:
            conn.close()
        session.close()


def _as_if_its_commit_failed(db, counted: bool = True) -> None:
    """As if the running claim's COMMIT did not land: its rows ready again (attempts as before)
    and, where the claim counted, the counter as before it (0)."""
    db.query("UPDATE nq_job SET status = 0, owner = NULL, claim_token = NULL, lease_until = NULL, "
             "attempts = attempts - 1 WHERE status = 2")
    if counted:
        db.query("UPDATE nq_flow_key SET running = 0, counted_at = NOW(6) WHERE queue = 'q'")


def test_a_counting_claim_retaken_after_its_commit_failed_leaves_the_counter_unknown_never_low(db):
    # Given a counting claim of 2 of a's jobs (limit_per_key = 2) whose COMMIT did not land: its
    # rows ready again (attempts as before), the counter as before it (0)
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 5)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        claim = _claim(session, flow)
        assert len(claim.jobs) == 2 and queries.counted_token(claim.token)
        _as_if_its_commit_failed(db)
        # When the claim takes them back (its first job had started: queries.retake) and acks them
        held = queries.retake(session, claim.jobs, claim.token, OWNER, 60, None, 0.0)
        assert sorted(held) == sorted(j.id for j in claim.jobs)
        assert queries.ack(session, held, claim.token, keep=False) == 2
        # Then the counter is not low (its ack released jobs no counter had added): the next
        # claim takes 2 of a's jobs, not more
        again = _claim(session, flow)
        assert len(again.jobs) == 2
        assert _running(db) == {"a": 2}
        _exact(db)
    finally:
        session.close()


@pytest.mark.parametrize("limits", [FlowLimits(limit_per_key=2), FlowLimits(limit=2)],
                         ids=["limit_per_key", "limit"])
def test_a_claim_retaken_after_its_commit_failed_takes_no_slot_a_peer_took_meanwhile(db, limits):
    # Given a claim of 2 of a's jobs (a limit of 2: the key's, or the queue's) whose COMMIT did
    # not land: its rows ready again (attempts as before), a counter as before it (0)
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 5)
    session, peer = Session(cfg.dsn), Session(cfg.dsn)
    try:
        claim = _claim(session, FlowClaims(limits))
        mine = [j.id for j in claim.jobs]
        assert len(mine) == 2
        _as_if_its_commit_failed(db, counted=limits.counts)  # (a queue with a `limit` keeps no counter)
        # And a peer's claim that then takes the limit's 2 slots with 2 other jobs of a (ours
        # out of its reach meanwhile: still locked by our transaction, say)
        db.query("UPDATE nq_job SET status = 1, run_at = NOW(6) + INTERVAL 1 HOUR WHERE id IN %s", (mine,))
        taken = queries.claim(peer, "q", "p" * 32, 100, 60, flow=FlowClaims(limits))
        peer.pipeline.read_reply()
        assert len(taken.jobs) == 2 and not set(mine) & {j.id for j in taken.jobs}
        db.query("UPDATE nq_job SET status = 0, run_at = NOW(6) WHERE id IN %s", (mine,))
        # When the first claim takes its jobs back (its first job had started: queries.retake)
        held = queries.retake(session, claim.jobs, claim.token, OWNER, 60, None, 0.0, limits=limits)
        # Then none is taken: the key still runs 2, the peer's (ours are someone else's to run)
        assert held == []
        assert _running(db) == {"a": 2}
        _never_low(db)
    finally:
        session.close()
        peer.close()


def test_a_claim_retaken_after_its_commit_failed_takes_back_what_its_key_has_room_for(db):
    # Given a counting claim of 2 of a's jobs (limit_per_key = 2) whose COMMIT did not land, and a
    # peer's claim that then took 1 of a's other jobs
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 5)
    session, peer = Session(cfg.dsn), Session(cfg.dsn)
    limits = FlowLimits(limit_per_key=2)
    try:
        claim = _claim(session, FlowClaims(limits))
        mine = [j.id for j in claim.jobs]
        _as_if_its_commit_failed(db)
        db.query("UPDATE nq_job SET status = 1, run_at = NOW(6) + INTERVAL 1 HOUR WHERE id IN %s", (mine,))
        taken = queries.claim(peer, "q", "p" * 32, 1, 60, flow=FlowClaims(limits))
        peer.pipeline.read_reply()
        assert len(taken.jobs) == 1
        db.query("UPDATE nq_job SET status = 0, run_at = NOW(6) WHERE id IN %s", (mine,))
        # When the first claim takes its jobs back, its started one first (claim.jobs' order)
        held = queries.retake(session, claim.jobs[::-1], claim.token, OWNER, 60, None, 0.0, limits=limits)
        # Then it holds the one its key has room for, and the counter is given up, never low
        assert held == [mine[1]]
        assert _running(db) == {"a": 2}
        assert _counters(db) == {"a": None}
    finally:
        session.close()
        peer.close()


def test_a_purge_or_cancel_of_running_jobs_leaves_the_counter_high_never_low(db):
    # Given key a with 2 jobs running under a counting claim
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 4)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        claim = _claim(session, flow)
        assert len(claim.jobs) == 2
        # When an operator cancels one (asked: it ends through its worker's outcome) and purges
        # the other's row
        assert admin_queries.cancel_job(session, claim.jobs[0].id) == "requested"
        db.query("DELETE FROM nq_job WHERE id = %s", (claim.jobs[1].id,))
        # Then the counter is high, never low; the cancelled job's outcome releases it exactly
        _never_low(db)
        queries.reschedule_or_bury(session, "q", claim.token, [(claim.jobs[0].id, None, "cancelled")])
        assert _running(db) == {} and _counters(db) == {"a": 1}
    finally:
        session.close()


def test_an_operators_purge_of_a_running_job_leaves_the_counter_unknown_not_high(db):
    # Given key a with 2 jobs running under a counting claim, its counter trusted
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 4)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        claim = _claim(session, flow)
        assert len(claim.jobs) == 2 and _counters(db) == {"a": 2}
        # When an operator purges one of them (`notifyq jobs purge`: admin_queries.purge_jobs)
        assert admin_queries.purge_jobs(session, [claim.jobs[1].id], 2) == 1
        # Then its key's counter is unknown, and the next claim takes the freed slot at once
        assert _running(db) == {"a": 1} and _counters(db) == {"a": None}
        assert len(_claim(session, flow).jobs) == 1
        assert _running(db) == {"a": 2}
        _exact(db)
    finally:
        session.close()


@pytest.mark.parametrize("limits", [FlowLimits(limit_per_key=1), FlowLimits(limit_per_key=1, limit=5)],
                         ids=["limit_per_key", "limit"])
def test_a_limited_claim_that_promotes_due_jobs_and_takes_none_leaves_no_transaction_open(db, limits):
    # Given key a at its limit (one job running, a peer's) and another job of a that is due
    # (its run_at past, not promoted yet)
    cfg = db.config()
    ids = _put_keyed(db, cfg, ["a", "a"])
    session, peer = Session(cfg.dsn), Session(cfg.dsn)
    try:
        db.query("UPDATE nq_job SET status = 1, run_at = NOW(6) + INTERVAL 1 HOUR WHERE id = %s", (ids[1],))
        assert [j.id for j in _claim(peer, FlowClaims(limits)).jobs] == [ids[0]]
        db.query("UPDATE nq_job SET run_at = NOW(6) - INTERVAL 1 SECOND WHERE id = %s", (ids[1],))
        # When a claim promotes the due job (its own COMMIT, mid-claim) and the limit holds it back
        claim = _claim(session, FlowClaims(limits))
        assert claim.jobs == []
        assert db.scalar("SELECT status FROM nq_job WHERE id = %s", (ids[1],)) == 0
        # Then the claim's transaction is over: none is left open on its connection (one left
        # open held the key rows its claim had locked, and every peer's claim skipped them: the
        # key stalled while its consumer idled)
        open_trx = db.scalar("SELECT COUNT(*) FROM information_schema.innodb_trx "
                             "WHERE trx_mysql_thread_id = %s", (session.connection_id,))
        assert open_trx == 0
    finally:
        session.close()
        peer.close()


def test_a_queue_that_does_not_count_leaves_the_counters_alone(db):
    # Given keys with a `limit` too (not limited per key only): counted from its claimed rows
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 3 + ["b"] * 3)
    session = Session(cfg.dsn)
    try:
        claim = _claim(session, FlowClaims(FlowLimits(limit_per_key=2, limit=3)))
        assert len(claim.jobs) == 3 and not queries.counted_token(claim.token)
        assert queries.ack(session, [j.id for j in claim.jobs], claim.token, keep=False) == 3
        assert set(_counters(db).values()) == {None}
    finally:
        session.close()


def test_a_limited_claim_that_does_not_count_gives_up_the_counters_of_the_keys_it_takes(db):
    # Given key a (limit_per_key = 2) with 1 job running under a counting claim: its counter 1,
    # trusted (every registration says its consumer counts: a reload not recorded yet, say)
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 6)
    session = Session(cfg.dsn)
    counting = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        assert len(_claim(session, counting, batch=1).jobs) == 1
        assert _counters(db) == {"a": 1}
        # When a consumer whose config does not count (fair too: reloaded, say) takes the other slot
        other = _claim(session, FlowClaims(FlowLimits(limit_per_key=2, fair=True)), batch=1)
        assert len(other.jobs) == 1 and not queries.counted_token(other.token)
        # Then the counting consumer's next claim takes none of a's jobs: the key runs 2 of 2, not
        # 3 (the other claim gave a's counter up, its job being in no counter, and this one
        # recounted it before it trusted it)
        assert _claim(session, counting).jobs == []
        assert _running(db) == {"a": 2} and _counters(db) == {"a": 2}
    finally:
        session.close()


def test_a_reapers_take_back_leaves_the_counter_unknown_and_the_next_claim_takes_the_freed_slot(db):
    # Given key a with 2 jobs running under a counting claim (limit_per_key = 2), its counter
    # trusted (recounted just now)
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 5)
    session, reaper = Session(cfg.dsn), Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        first = _claim(session, flow)
        assert len(first.jobs) == 2 and _counters(db) == {"a": 2}

        # When a reaper takes one of them back (its consumer died: liveness.take_back)
        def take_back(cur) -> int:
            cur.execute("SELECT id, claim_token FROM nq_job WHERE id = %s FOR UPDATE", (first.jobs[0].id,))
            return liveness.take_back(cur, [(int(i), int(t)) for i, t in cur.fetchall()], "consumer died")

        assert reaper.run(take_back, what="take back") == 1
        # Then its key's counter is unknown, not left high: the next claim, within the trust
        # bound, recounts it under its lock and takes the freed slot at once (left high, the
        # key stayed held, and nothing woke a watcher when the trust ran out)
        assert _running(db) == {"a": 1} and _counters(db) == {"a": None}
        again = _claim(session, flow)
        assert len(again.jobs) == 1
        assert _running(db) == {"a": 2}
        _exact(db)
    finally:
        session.close()
        reaper.close()


def test_a_lean_claims_netted_ack_that_a_take_back_cut_short_is_released_from_the_servers_rows(db):
    # Given key a with 6 ready jobs and limit_per_key = 2: my claim runs a's first two
    cfg = db.config()
    ids = _put_keyed(db, cfg, ["a"] * 6)
    session, peer = Session(cfg.dsn), Session(cfg.dsn)
    mine, theirs = FlowClaims(FlowLimits(limit_per_key=2)), FlowClaims(FlowLimits(limit_per_key=2))
    try:
        first = _claim(session, mine)
        assert sorted(j.id for j in first.jobs) == ids[:2]
        # When the first is taken back (its counter left high) and, its counter past the trust
        # bound, a peer's claim recounts it and takes it
        db.query("UPDATE nq_job SET status = 0, owner = NULL, claim_token = NULL, lease_until = NULL "
                 "WHERE id = %s", (ids[0],))
        db.query("UPDATE nq_flow_key SET counted_at = NOW(6) - INTERVAL 1 HOUR WHERE queue = 'q'")
        other = _claim(peer, theirs, batch=1)
        assert [j.id for j in other.jobs] == [ids[0]]
        assert _counters(db) == {"a": 2}
        # And my next claim carries the acks of both my jobs (its lean read nets them: Acks.net)
        acks = queries.Acks(ids[:2], first.token, False, wake="q", keys=["a", "a"])
        again = _claim(session, mine, acks=acks)
        # Then only the job its ack deleted is taken off the counter: it takes one slot, not two
        assert [j.id for j in again.jobs] == [ids[2]]
        assert _running(db) == {"a": 2}
        _exact(db)
    finally:
        session.close()
        peer.close()


def test_a_lean_claims_netted_ack_is_released_when_the_queue_is_paused(db):
    # Given key a with 6 ready jobs and limit_per_key = 2: my claim runs a's first two
    cfg = db.config()
    ids = _put_keyed(db, cfg, ["a"] * 6)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        first = _claim(session, flow)
        assert sorted(j.id for j in first.jobs) == ids[:2]
        # When the queue is paused and my next claim carries both acks (netted: Acks.net)
        db.query("UPDATE nq_queue SET paused = 1 WHERE queue = 'q'")
        acks = queries.Acks(ids[:2], first.token, False, wake="q", keys=["a", "a"])
        again = _claim(session, flow, acks=acks)
        # Then it takes nothing, and its acks land with their release: the counter is exact
        assert again.paused and again.jobs == []
        assert _running(db) == {}
        _exact(db)
    finally:
        session.close()


def _name_idle(db, n: int) -> None:
    """`n` named keys without jobs, their counters known (0) and fresh."""
    rows = ", ".join(f"('q', 'idle{i:05d}', 0, NOW(6))" for i in range(n))
    db.query(f"INSERT INTO nq_flow_key (queue, job_key, running, counted_at) VALUES {rows}")


def _rows_read(session) -> int:
    """The rows this session's statements read so far (its Handler_read_* counters)."""
    cur = session.cursor()
    cur.execute("SHOW SESSION STATUS LIKE %s", ("Handler_read%",))
    return sum(int(n) for name, n in cur.fetchall() if name != "Handler_read_retry")


def test_a_lean_claim_reads_the_key_rows_of_its_head_not_every_key_of_the_queue(db):
    # Given a queue of 4,000 named keys (a key per customer), all but three without ready jobs,
    # and keys a, b, c with 6 ready jobs each, limit_per_key = 2
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 6 + ["b"] * 6 + ["c"] * 6)
    _name_idle(db, 4000)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        first = _claim(session, flow, batch=10)  # (gives the counters up, recounts a, b, c)
        assert len(first.jobs) == 6
        # When a lean claim carries their acks and takes the next ones
        acks = queries.Acks([j.id for j in first.jobs], first.token, False, wake="q",
                            keys=[j.key for j in first.jobs])
        before = _rows_read(session)
        again = _claim(session, flow, batch=10, acks=acks)
        read = _rows_read(session) - before
        # Then it read rows bounded by its head (32 jobs), not the 4,000 keys, and decided lean
        # (the first claim's lean read found more keys than its head holds jobs: the claims of
        # this queue look their head's keys up from then on)
        assert read < 1000, read
        assert flow.lean_stats.get("lean") == 1 and flow.lean_stats.get("many_keys") == 1, flow.lean_stats
        assert sorted(j.key for j in again.jobs) == ["a", "a", "b", "b", "c", "c"]
        _exact(db)
    finally:
        session.close()


def test_a_lean_claim_recounts_a_counter_it_may_not_trust_under_its_lock_without_the_full_read(db):
    # Given a queue of 4,000 named keys, all but three without ready jobs, and keys a, b, c with
    # 6 ready jobs each, limit_per_key = 2, after a first claim (2 jobs of each)
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 6 + ["b"] * 6 + ["c"] * 6)
    _name_idle(db, 4000)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        first = _claim(session, flow, batch=10)
        assert len(first.jobs) == 6
        # When a's counter is past the trust bound, and too high (a slot a path that does not
        # release it left taken): the lean read cannot tell a's free slots
        db.query("UPDATE nq_flow_key SET running = running + 2, counted_at = NOW(6) - INTERVAL 1 HOUR "
                 "WHERE queue = 'q' AND job_key = 'a'")
        acks = queries.Acks([j.id for j in first.jobs], first.token, False, wake="q",
                            keys=[j.key for j in first.jobs])
        before = _rows_read(session)
        again = _claim(session, flow, batch=10, acks=acks)
        read = _rows_read(session) - before
        # Then the claim decides lean, a's counter recounted under its row's lock (its KeyGate),
        # and takes the next jobs within the limits, reading rows bounded by its head, not the
        # 4,000 keys
        assert flow.lean_stats.get("lean_recount") == 1 and "untrusted" not in flow.lean_stats, flow.lean_stats
        assert sorted(j.key for j in again.jobs) == ["a", "a", "b", "b", "c", "c"]
        assert read < 1000, read
        _exact(db)
    finally:
        session.close()


def test_a_lean_claim_names_every_unnamed_key_of_its_head_at_once(db):
    # Given ten keys with 3 ready jobs each, no row naming any of them, limit_per_key = 2
    cfg = db.config()
    _put_keyed(db, cfg, [f"k{i}" for i in range(10)] * 3)
    db.query("DELETE FROM nq_flow_key WHERE queue = 'q'")
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        # When a consumer's first claim runs (batch 100)
        claim = _claim(session, flow, batch=100)
        # Then it named the head's ten keys before it ran again, and took two jobs of each (the
        # full read named the few keys its discovery met: 4, and took 8 jobs)
        assert sorted(j.key for j in claim.jobs) == sorted([f"k{i}" for i in range(10)] * 2)
        assert flow.lean_stats.get("unnamed") == 1, flow.lean_stats
        _exact(db)
    finally:
        session.close()


def test_a_lean_claim_whose_head_held_too_few_grantable_jobs_reads_a_longer_head_next(db):
    # Given key a's 40 ready jobs, then key b's 20 (its first 2 running: b at its limit), then
    # key c's 20, limit_per_key = 2, batch 4 (a head of 32 jobs)
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 40 + ["b"] * 20 + ["c"] * 20)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        first = _claim(session, flow, batch=4)
        assert sorted(j.key for j in first.jobs) == ["a", "a", "b", "b"]
        acks = queries.Acks([j.id for j in first.jobs if j.key == "a"], first.token, False, wake="q",
                            keys=["a", "a"])
        # When lean claims carry a's acks: their head (32 jobs) holds a's jobs alone, 2 of them free
        second = _claim(session, flow, batch=4, acks=acks)
        # Then the next claim's head is twice as long (64 jobs), and reaches c's jobs
        assert flow.lean_head == 64
        assert [j.key for j in second.jobs].count("a") == 2
        _exact(db)
    finally:
        session.close()


def test_a_lean_claim_whose_full_head_is_held_finds_a_free_key_behind_it_among_many_keys(db):
    # Given key a's 40 ready jobs, then key b's 3 (behind a head of a's jobs), among 4,000 named
    # keys without jobs, limit_per_key = 2, after a first claim (a's first two, b's)
    cfg = db.config()
    _put_keyed(db, cfg, ["a"] * 40 + ["b"] * 3)
    _name_idle(db, 4000)
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    try:
        first = _claim(session, flow, batch=10)
        assert sorted(j.key for j in first.jobs) == ["a", "a", "b", "b"]
        # When a lean claim carries their acks: its head (32 jobs) is a's alone, two of them free
        acks = queries.Acks([j.id for j in first.jobs], first.token, False, wake="q",
                            keys=[j.key for j in first.jobs])
        short, before = flow.lean_stats.get("short_head_keys", 0), _rows_read(session)
        again = _claim(session, flow, batch=10, acks=acks)
        read = _rows_read(session) - before
        # Then it reads fully for the free keys behind its head, takes b's last job with a's
        # next two, and read rows bounded by its head and its window of keys
        assert flow.lean_stats.get("short_head_keys") == short + 1, flow.lean_stats
        assert sorted(j.key for j in again.jobs) == ["a", "a", "b"]
        assert read < 1000, read
        _exact(db)
    finally:
        session.close()


def test_a_limited_claim_carrying_acks_wakes_for_its_freed_slots_only_when_a_consumer_watches(db):
    # Given key a with 6 ready jobs, limit_per_key = 2, and a worker's pending acks whose slot
    # wake (Outcomes.freed) is counted: my claim runs a's first two
    from notifyq.config.settings import QueueConfig
    from notifyq.consume.acking import PendingAcks
    from notifyq.consume.outcomes import Outcomes
    from notifyq.consume.stats import Stats
    from notifyq.store.locks import QueueLocks

    cfg = db.config()
    ids = _put_keyed(db, cfg, ["a"] * 6)
    session, watcher = Session(cfg.dsn), Session(cfg.dsn, autocommit=True)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    outcomes = Outcomes("q", QueueConfig(limit_per_key=2), Stats())
    wakes: list[bool | None] = []  # what each slot wake was told: did a consumer watch?
    outcomes.freed = lambda watched=None: wakes.append(watched)
    pending = PendingAcks(outcomes)
    watch = QueueLocks(cfg.dsn.database, "q").watch
    try:
        first = pending.claim(session, "q", OWNER, 100, 60, flow=flow, watch=watch)
        assert sorted(j.id for j in first.jobs) == ids[:2]
        # When its next claim carries their acks and no consumer watches the queue
        pending.keep(queries.Acks(ids[:2], first.token, False, wake="q", keys=["a", "a"]))
        second = pending.claim(session, "q", OWNER, 100, 60, flow=flow, watch=watch)
        # Then the claim read that with its mark, and told its slot wake nobody watched
        assert sorted(j.id for j in second.jobs) == ids[2:4]
        assert second.watched is False and wakes == [False]
        # And when a consumer watches (holds the queue's watch lock), the next one wakes it
        cur = watcher.cursor()
        cur.execute("SELECT GET_LOCK(%s, 0)", (watch,))
        assert list(cur.fetchall()) == [(1,)]
        pending.keep(queries.Acks(ids[2:4], second.token, False, wake="q", keys=["a", "a"]))
        third = pending.claim(session, "q", OWNER, 100, 60, flow=flow, watch=watch)
        assert sorted(j.id for j in third.jobs) == ids[4:6]
        assert third.watched is True and wakes == [False, True]
        # And a claim told of no watch lock (the instant wake off) reads none: its wake looks itself
        pending.keep(queries.Acks(ids[4:6], third.token, False, wake="q", keys=["a", "a"]))
        fourth = pending.claim(session, "q", OWNER, 100, 60, flow=flow)
        assert fourth.watched is None and wakes == [False, True, None]
        session.pipeline.read_reply()
        _exact(db)
    finally:
        session.close()
        watcher.close()


def test_a_slot_wake_told_nobody_watched_sends_no_look_and_keeps_its_quiet_window(db):
    # Given a limited queue's slot wake (its instant wake looks for a watcher before a KILL)
    from notifyq.consume.slots import SlotWake
    from notifyq.store.locks import QueueLocks

    cfg = db.config()
    wake = SlotWake(cfg, "q", QueueLocks(cfg.dsn.database, "q"))
    try:
        assert wake.watch_lock() == QueueLocks(cfg.dsn.database, "q").watch
        look = wake.waker.instant.look
        # When a claim's mark found nobody watching
        wake.freed(False)
        # Then no look is sent, and its quiet window runs as after a look that saw nobody
        assert look.taken == 0 and not look.due() and wake.wakes == 0
        # And a wake inside that window sends none either, as before; one past it looks itself
        wake.freed()
        assert look.taken == 0
        look.forget()
        wake.freed()
        assert look.taken == 1 and wake.wakes == 2
    finally:
        wake.close()


def test_a_keys_first_ready_jobs_another_session_holds_hold_up_its_later_jobs_but_no_other_key(db):
    # Given limit_per_key = 2, key a with 4 ready jobs, key b with 2, and one job without a key
    cfg = db.config()
    a = _put_keyed(db, cfg, ["a"] * 4)
    b = _put_keyed(db, cfg, ["b"] * 2)
    with Producer("q", cfg) as p:
        [plain] = p.put_many([{"n": 0}])
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    # And another session holding a's first ready job (an application's SELECT ... FOR UPDATE)
    holder = db.job_row_locked(a[0])
    try:
        # When a claim runs
        taken = {j.id for j in _claim(session, flow).jobs}
        # Then it takes a's second job only (a's two free slots went to its first two jobs, one
        # of them held): a's later jobs wait, though one of a runs; b and the unkeyed job go
        assert taken == {a[1], *b, plain}
        # And once the session lets go, the next claim takes a's first job, in a's order
        holder.close()
        holder = None
        assert [j.id for j in _claim(session, flow).jobs] == [a[0]]
    finally:
        if holder is not None:
            holder.close()
        session.close()


def _rows_held(db, ids: list[int]) -> bool:
    """Whether another transaction holds every one of the jobs' rows (a locking read that skips
    locked rows finds none of them)."""
    return not db.query("SELECT id FROM nq_job WHERE id IN %s FOR UPDATE SKIP LOCKED", (tuple(ids),))


def _running_statement(db, session) -> bool:
    """Whether the session is in the middle of a statement (not idle between them)."""
    return db.scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE id = %s AND command = 'Query'",
                     (session.connection_id,)) == 1


class KeyRowHeldPastLease:
    """A counting claim of key k's three jobs on a 1 s lease (limit_per_key = 5), then a peer's
    claim holding k's row while a statement of the claiming session waits for it until the
    lease of the jobs it holds ran out, and a reaper pass meanwhile: the outcome's and the
    retake's wait for their keys' rows."""

    def __init__(self, db):
        self.db = db
        cfg = db.config()
        _put_keyed(db, cfg, ["k"] * 3)
        self.session, self.reaper = Session(cfg.dsn), Session(cfg.dsn)
        self.limits = FlowLimits(limit_per_key=5)
        self.peer = admin_connect(db.admin, db.admin.database)
        self.waiting: threading.Thread | None = None

    def claim_three(self) -> None:
        self.claim = queries.claim(self.session, "q", OWNER, 10, 1.0, flow=FlowClaims(self.limits))
        self.session.pipeline.read_reply()
        self.ids = sorted(j.id for j in self.claim.jobs)
        assert len(self.ids) == 3 and queries.counted_token(self.claim.token)

    def hold_key_row(self) -> None:
        """A peer's claim holds k's row (as its KeyGate does until its COMMIT)."""
        cur = self.peer.cursor()
        cur.execute("BEGIN")
        cur.execute("SELECT running FROM nq_flow_key WHERE queue = 'q' AND job_key = 'k' FOR UPDATE")

    def reap_while_waiting(self, statement, held: list[int], what: str) -> int:
        """Run `statement` on a thread of its own; once it waits for k's row and the lease of
        `held` ran out, a reaper pass: the jobs it took back."""
        self.waiting = threading.Thread(target=statement, name=what, daemon=True)
        self.waiting.start()
        # (seen as the held jobs' rows held and the statement still running: the server
        # does not always list such a wait as LOCK WAIT, nor only this test's)
        wait_until(lambda: _rows_held(self.db, held) and _running_statement(self.db, self.session), 10,
                   message=f"the {what} waits")
        wait_until(lambda: self.db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2 AND lease_until < NOW(6)")
                   == len(held), 10, message="the held jobs' lease ran out")
        return liveness.reclaim_expired(self.reaper)

    def free_key_row(self) -> None:
        """The peer's claim ends: the waiting statement goes on, and ends."""
        self.peer.rollback()
        self.waiting.join(15)

    def close(self) -> None:
        self.peer.close()
        if self.waiting is not None:
            self.waiting.join(15)
        self.session.close()
        self.reaper.close()


@pytest.fixture
def key_row_wait(db):
    """KeyRowHeldPastLease, its claim made."""
    wait = KeyRowHeldPastLease(db)
    try:
        wait.claim_three()
        yield wait
    finally:
        wait.close()


@pytest.mark.parametrize("outcome", ["ack", "failure"])
def test_an_outcome_waiting_for_its_keys_row_keeps_its_jobs_from_a_reaper_past_their_lease(db, key_row_wait, outcome):
    """Regression (fault schedule, seed 43: three jobs ran twice, attempt 1 both times, no fault on
    either consumer): a counting claim's outcome takes its jobs off their keys' counters first
    (flow_count_release), and that statement locked the key's row, waiting for it while a peer's
    claim held it (a stopped process's claim holds it for as long as it is stopped), before it
    read the jobs' rows. Their lease ran out meanwhile, a reaper took them back (together:
    uncharged), the outcome found them gone, and the jobs that had run ran again elsewhere. The
    jobs' rows are locked first now: the reaper passes over them, and the outcome lands."""
    # Given a counting claim of key k's three jobs, on a 1 s lease
    session, claim, ids = key_row_wait.session, key_row_wait.claim, key_row_wait.ids
    # And a peer's claim holding k's row
    key_row_wait.hold_key_row()
    # When the jobs' outcome is sent, and waits for that row until their lease has run out
    sent: dict[str, object] = {}

    def send() -> None:
        if outcome == "ack":
            sent["n"] = queries.ack(session, ids, claim.token, keep=False)
        else:
            sent["n"] = len(queries.reschedule_or_bury(session, "q", claim.token,
                                                       [(i, 60.0, "boom") for i in ids]))

    # And a reaper pass runs meanwhile
    taken = key_row_wait.reap_while_waiting(send, ids, "outcome")
    # Then it takes none of them back
    assert taken == 0
    # And once the peer's claim ends, the outcome lands on each job, charged once
    key_row_wait.free_key_row()
    assert sent == {"n": 3}
    if outcome == "ack":
        assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE id IN %s", (tuple(ids),)) == 0
    else:
        assert db.query("SELECT status, attempts, suspect FROM nq_job WHERE id IN %s",
                        (tuple(ids),)) == [(1, 1, 0)] * 3
    assert _counters(db) == {"k": 0}


def test_a_counting_claims_failure_and_give_back_bump_a_signal_slot_no_other_transaction_holds(db):
    """Regression (the key_lock fault class): a counting claim's failure or give-back holds its
    keys' rows (their counters' release) and bumped a random signal slot, waiting for one that a
    claim held (its own acks' bump) while that claim waited for one of those key rows: a
    deadlock, whose victim, the claim, let go of the jobs its acks had held past their lease,
    and a reaper gave them back to run again. Its bump now takes a slot nobody holds."""
    # Given a counting claim of key k's three jobs, and a claim under way elsewhere holding
    # every signal slot of the queue but one
    cfg = db.config()
    _put_keyed(db, cfg, ["k"] * 3)
    for n in range(SIGNAL_SLOTS):
        db.query("INSERT IGNORE INTO nq_signal (queue, slot, seq) VALUES ('q', %s, 0)", (n,))
    session = Session(cfg.dsn)
    holder = admin_connect(db.admin, db.admin.database)
    sender = None
    try:
        claim = queries.claim(session, "q", OWNER, 10, 60, flow=FlowClaims(FlowLimits(limit_per_key=5)))
        session.pipeline.read_reply()
        ids = sorted(j.id for j in claim.jobs)
        assert len(ids) == 3 and queries.counted_token(claim.token)
        cur = holder.cursor()
        cur.execute("BEGIN")
        cur.execute("SELECT slot FROM nq_signal WHERE queue = 'q' AND slot > 0 FOR UPDATE")
        # When one job fails (a retry) and another is given back
        done = threading.Event()

        def outcomes() -> None:
            queries.reschedule_or_bury(session, "q", claim.token, [(ids[0], 60.0, "boom")])
            queries.give_back(session, "q", [ids[1]], claim.token)
            done.set()

        sender = threading.Thread(target=outcomes, name="outcomes", daemon=True)
        sender.start()
        # Then neither waits for the held slots
        assert done.wait(5), "an outcome waited for a signal slot another transaction holds"
        assert db.query("SELECT status FROM nq_job WHERE id IN %s ORDER BY id", (tuple(ids[:2]),)) == [(1,), (0,)]
    finally:
        holder.rollback()
        holder.close()
        if sender is not None:
            sender.join(15)
        session.close()


def test_a_retake_waiting_for_its_keys_row_keeps_what_its_claim_holds_from_a_reaper(db, key_row_wait):
    """A claim retaken after its COMMIT failed (queries.retake) reads what it still holds, then
    waits for its keys' rows to take again what it does not. It read them plainly: while a
    peer's claim held a key's row past the jobs' lease, a reaper took them back, and the retake
    still called them its own (their next starts ran jobs that were anyone's). Locked now."""
    # Given a counting claim of key k's three jobs on a 1 s lease, one of them given back (not
    # held: the retake takes it again, after k's row)
    session, claim, ids = key_row_wait.session, key_row_wait.claim, key_row_wait.ids
    assert queries.give_back(session, "q", ids[:1], claim.token) == 1
    # And a peer's claim holding k's row
    key_row_wait.hold_key_row()
    # When the claim is retaken, and waits for that row until the held jobs' lease ran out
    held: dict[str, object] = {}

    def retake() -> None:
        held["ids"] = queries.retake(session, claim.jobs, claim.token, OWNER, 60, None, 0.0,
                                     limits=key_row_wait.limits)

    # And a reaper pass runs meanwhile
    taken = key_row_wait.reap_while_waiting(retake, ids[1:], "retake")
    # Then it takes none of them back, and the retake holds all three once the row is free
    assert taken == 0
    key_row_wait.free_key_row()
    assert sorted(held["ids"]) == ids
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 2 AND claim_token = %s", (claim.token,)) == 3
