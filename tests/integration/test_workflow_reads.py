"""What the operator's actions read of a workflow's job: its parents are counted (every edge read,
up to 100,000 for a batch's callback) only where the answer needs the count."""

from __future__ import annotations

import notifyq
from notifyq.ops import admin
from notifyq.produce.producer import Producer
from notifyq.store import admin_queries
from notifyq.store.db import Session
from notifyq.web import data


def test_a_callbacks_retry_counts_its_parents_once_and_its_purge_not_at_all(db, monkeypatch):
    # Given a batch's callback, cancelled (kept: a retry brings it back)
    wf = notifyq.Workflow()
    members = [wf.add("q", {"i": i}) for i in range(3)]
    callback = wf.batch(members, on_success=("q", {"callback": True})).on_success
    with Producer("q", db.config()) as producer:
        producer.put_workflow(wf)
    counted: list[int] = []
    count = admin_queries.job_progress
    monkeypatch.setattr(admin_queries, "job_progress", lambda session, job_id: (counted.append(job_id),
                                                                                count(session, job_id))[1])
    session = Session(db.config().dsn, name="test", retry_s=30)
    try:
        assert admin.cancel(session, callback.id) == "cancelled"
        # When it is retried
        said = admin.retry(session, callback.id)
        # Then its parents are counted once, for what the retry says
        assert said == "retried (it waits for 3 parents still pending)"
        assert counted == [callback.id]
        # And a retry of it while it waits counts them once too
        counted.clear()
        assert admin.retry(session, callback.id) == "already waiting for 3 parents still pending"
        assert counted == [callback.id]
        # When it is cancelled again and purged from the console
        assert admin.cancel(session, callback.id) == "cancelled"
        counted.clear()
        assert data._purge_one(session, callback.id) == f"job {callback.id}: purged"
        # Then its parents are not counted at all
        assert counted == []
    finally:
        session.close()
