"""The per-key counters through an upgrade (store/count_trust.py): a claim trusts them only while
every registered consumer of the queue keeps them. A consumer of an older version (no `counts`
member in its recorded flow settings, or no flow settings) or of this version with a config that
does not count starts jobs no counter holds: while it is registered, each key a claim takes is
recounted under its row's lock, so the key never runs more than its limit."""

from __future__ import annotations

import json
import math

from types import SimpleNamespace

import pytest

from notifyq.config.settings import QueueConfig
from notifyq.consume.presence import Presence
from notifyq.produce.producer import Producer
from notifyq.store import count_trust, queries
from notifyq.store.db import Session
from notifyq.store.flow import FlowClaims, FlowLimits

OWNER = "n" * 32  # the consumer of this version that claims
OLD = "0" * 32  # the one that does not keep the counters
SETTINGS = {"limit": 0, "limit_per_key": 2, "key_limits": [], "rate": "", "rate_per_key": "", "fair": False}


def _register(db, consumer_id: str, queues: str, flow: str | None) -> None:
    db.query("INSERT INTO nq_consumer (id, lock_name, host, pid, queues, flow) VALUES (%s, %s, 'h', 1, %s, %s)",
             (consumer_id, f"lock-{consumer_id}", queues, flow))


def _running(db) -> dict[str, int]:
    return {k: int(n) for k, n in db.query(
        "SELECT job_key, COUNT(*) FROM nq_job WHERE status = 2 AND job_key IS NOT NULL GROUP BY job_key")}


def _claim(session, flow):
    claim = queries.claim(session, "q", OWNER, 100, 60, flow=flow)
    session.pipeline.read_reply()
    return claim


@pytest.mark.parametrize("old_flow", [
    None,  # a version before schema 9: no flow settings recorded
    json.dumps({"q": SETTINGS}),  # schema 9's: no `counts` member
    json.dumps({"q": {**SETTINGS, "fair": True, "counts": False}}),  # this version, a config that does not count
], ids=["no-flow", "schema-9", "not-counting"])
def test_a_claim_trusts_no_counter_while_a_consumer_that_does_not_keep_them_is_registered(db, old_flow):
    # Given key a (limit_per_key = 2) with 8 ready jobs and its counter 0, recounted just now
    cfg = db.config()
    with Producer("q", cfg) as p:
        ids = p.put_many([{"n": i} for i in range(8)], key="a")
    db.query("INSERT IGNORE INTO nq_flow_key (queue, job_key) VALUES ('q', 'a')")
    db.query("UPDATE nq_flow_key SET running = 0, counted_at = NOW(6) WHERE queue = 'q'")
    # And this version's consumer registered (it keeps the counters), and a consumer that does
    # not, with 2 of a's jobs it claimed its way (status 2, a token without COUNTED_BIT)
    _register(db, OWNER, "q", json.dumps({"q": {**SETTINGS, "counts": True}}))
    _register(db, OLD, "q", old_flow)
    db.query("UPDATE nq_job SET status = 2, owner = %s, claim_token = 12345, "
             "lease_until = NOW(6) + INTERVAL 1 HOUR WHERE id IN (%s, %s)", (OLD, ids[0], ids[1]))
    session = Session(cfg.dsn)
    flow = FlowClaims(FlowLimits(limit_per_key=2))
    flow.forget = False  # (it started before those claims: its counters were given up then)
    try:
        # When this version's consumer claims, twice (the second with the registrations cached)
        first, second = _claim(session, flow), _claim(session, flow)
        # Then it takes none of a's jobs: the key runs 2 of 2, recounted under its row's lock
        assert first.jobs == [] and second.jobs == []
        assert _running(db) == {"a": 2}
        assert not flow.trust.all_count
        # When that consumer is gone (its jobs ended, its row deleted), and a consumer of another
        # queue that does not keep them is registered
        db.query("DELETE FROM nq_job WHERE id IN (%s, %s)", (ids[0], ids[1]))
        db.query("DELETE FROM nq_consumer WHERE id = %s", (OLD,))
        _register(db, OLD, "other", None)
        # and key a's counter says 1, recounted just now
        db.query("UPDATE nq_flow_key SET running = 1, counted_at = NOW(6) WHERE queue = 'q'")
        flow.trust.next_check = -math.inf  # (count_trust.CHECK_S passed)
        claim = _claim(session, flow)
        # Then the claim trusts the counter again: it takes the 1 free slot it says, reading lean
        assert flow.trust.all_count
        assert len(claim.jobs) == 1
        assert flow.lean_stats.get("lean") == 1
    finally:
        session.close()


def test_a_consumer_records_per_queue_whether_its_claims_keep_the_counters():
    # Given a consumer of queues limited per key only, fair too, with a `limit` too, unlimited
    qcs = {"keyed": QueueConfig(limit_per_key=2), "fair": QueueConfig(limit_per_key=2, fair=True),
           "capped": QueueConfig(limit_per_key=2, limit=10), "plain": QueueConfig()}
    consumer = SimpleNamespace(config=SimpleNamespace(queue=qcs.__getitem__), queues=list(qcs))
    # When it records its flow settings (its registration's)
    flow = Presence.flow_record(consumer)
    # Then only the queue limited per key only says its claims keep the counters
    assert {q: count_trust.keeps_counters(flow, q) for q in qcs} == {
        "keyed": True, "fair": False, "capped": False, "plain": False}
    # And a registration without them (an older version's), or damaged, does not
    assert not count_trust.keeps_counters(None, "keyed")
    assert not count_trust.keeps_counters("{not json", "keyed")
    assert not count_trust.keeps_counters(json.dumps({"keyed": SETTINGS}), "keyed")
