"""Retention's sweep of per-key bookkeeping (store/key_sweep.py): the key rows and rate logs
of one-off keys go once no job uses them, and a key in use keeps its."""

from __future__ import annotations

from notifyq.produce.producer import Producer
from notifyq.store import key_sweep, queries
from notifyq.store.db import Session
from notifyq.store.flow import FlowClaims, FlowLimits
from notifyq.store.rates import Rates


def test_one_off_keys_rows_go_once_unused_and_a_key_in_use_keeps_its(db):
    # Given a limited queue with a per-key rate whose 20 one-off keys' jobs all ran, and a key
    # "live" with a job running
    cfg = db.config(queue={"q": {"limit_per_key": 1, "rate_per_key": "2/100ms"}})
    qc = cfg.queue("q")
    with Producer("q", cfg) as producer:
        for i in range(20):
            producer.put({}, key=f"order-{i}")
    session = Session(cfg.dsn)
    try:
        flow = FlowClaims(FlowLimits.of(qc))
        while True:
            claim = queries.claim(session, "q", "o" * 32, 100, 60, rates=Rates.of(qc), flow=flow)
            db.query("DELETE FROM nq_job WHERE queue = 'q' AND status = 2")  # (their acks)
            if claim.drained and not claim.jobs and not db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = 'q'"):
                break
        with Producer("q", cfg) as producer:
            producer.put({}, key="live")
        queries.claim(session, "q", "o" * 32, 1, 60, rates=Rates.of(qc), flow=flow)  # names "live", runs it
        assert db.scalar("SELECT COUNT(*) FROM nq_flow_key WHERE queue = 'q' AND job_key LIKE 'order-%'") == 20
        assert db.scalar("SELECT COUNT(DISTINCT rate_key) FROM nq_rate WHERE queue = 'q' AND rate_key <> ''") == 21
        # When retention sweeps them, in chunks of 7, once a rate period has passed
        db.query("UPDATE nq_rate SET started_at = started_at - INTERVAL 1 SECOND WHERE queue = 'q'")
        flow_n, flow_after = key_sweep.sweep_flow_keys(session, "q", chunk=7)
        rate_n, rate_after = key_sweep.sweep_rate_keys(session, "q", qc.rates[1].period_s, chunk=7)
    finally:
        session.close()
    # Then the one-off keys' rows are gone (code before: no sweep, 20 and 40 rows for ever), and
    # "live" keeps its key row while its job runs; every rate slot more than a period old goes
    # (live's too: they hold no start)
    assert flow_n == 20 and flow_after == "" and rate_n == 2 * 21 and rate_after == ""
    assert db.query("SELECT job_key FROM nq_flow_key WHERE queue = 'q' ORDER BY job_key") == [("live",)]
    assert db.scalar("SELECT COUNT(*) FROM nq_rate WHERE queue = 'q' AND rate_key <> ''") == 0
    # And a swept key that comes back is found and claimed again, its rate made anew
    with Producer("q", cfg) as producer:
        job_id = producer.put({}, key="order-3")
    session = Session(cfg.dsn)
    try:
        claim = queries.claim(session, "q", "o" * 32, 10, 60, rates=Rates.of(qc), flow=FlowClaims(FlowLimits.of(qc)))
    finally:
        session.close()
    assert [j.id for j in claim.jobs] == [job_id]
    assert db.scalar("SELECT COUNT(*) FROM nq_rate WHERE queue = 'q' AND rate_key = 'order-3'") == 2
