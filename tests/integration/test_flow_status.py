"""`notifyq status` of a limited queue names what holds its jobs back: a key at its limit, or
the queue at its `limit` (its jobs without a key included)."""

from __future__ import annotations

from notifyq.ops import status
from notifyq.produce.producer import Producer
from notifyq.store import queries
from notifyq.store.db import Session
from notifyq.store.flow import FlowClaims, FlowLimits


def test_status_names_the_queue_at_its_limit_and_the_jobs_without_a_key_it_holds(db):
    # Given a queue limited to 1 running, 4 jobs without a key, and one of them claimed
    cfg = db.config(queue={"g": {"limit": 1}})
    with Producer("g", cfg) as producer:
        producer.put_many([{}] * 4)
    session = Session(cfg.dsn)
    try:
        claim = queries.claim(session, "g", "o" * 32, 10, 60, flow=FlowClaims(FlowLimits.of(cfg.queue("g"))))
        assert len(claim.jobs) == 1
        data = status.collect(session, None, configs=cfg.queues)
    finally:
        session.close()
    # Then status says the queue's limit holds the other 3 (code before: held=0, no reason)
    flow = data["queues"]["g"]["flow"]
    assert flow["running"] == 1 and flow["held_in_top_keys"] == 3
    assert flow["queue_held"] == "queue at its limit (1 of 1 running)"
    assert flow["unkeyed"] == {"running": 1, "ready": 3, "held": 3}
    text = status.render(data)
    assert "held=3  held: queue at its limit (1 of 1 running)" in text
    assert "(no key)  running=1  ready=3  held: queue at its limit (1 of 1 running)" in text
