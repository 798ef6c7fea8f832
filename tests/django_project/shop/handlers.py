"""Handlers that use the ORM, as a Django app's would."""
import time

from django.db import connection, transaction

from shop.models import Handled, Order


def record(job) -> None:
    started = time.monotonic()
    Order.objects.filter(name="nothing").exists()  # the ORM's connection, reused across jobs
    with connection.cursor() as cur:
        cur.execute("SELECT CONNECTION_ID()")
        (conn_id,) = cur.fetchone()
    Handled.objects.create(job_id=job.id, connection_id=conn_id, started=started)


def charge_once(job) -> None:
    """An effect written through the ORM and the job's completion, in one atomic() block: they
    commit together. A job marked "lose_claim" has its claim taken back before its first run
    completes it: ClaimLost leaves the block, which rolls the order back; one marked "swallow"
    too, but its handler catches ClaimLost inside the block; one marked "nested" catches it in
    an inner atomic() block (a savepoint)."""
    import contextlib
    import json
    import os

    import notifyq

    with transaction.atomic():
        Order.objects.create(name=f"charge-{job.id}-{job.attempts}")
        if job.payload.keys() & {"lose_claim", "swallow", "nested"} and job.attempts == 1:
            _take_back(job.id)
        with transaction.atomic() if job.payload.get("nested") else contextlib.nullcontext():
            try:
                job.complete_in(connection)
            except notifyq.ClaimLost as e:
                with open(os.environ["NQ_DJANGO_OUT"], "a") as out:
                    out.write(json.dumps({"job": job.id, "attempt": job.attempts, "raised": type(e).__name__}) + "\n")
                if job.payload.get("lose_claim"):
                    raise


def _take_back(job_id: int) -> None:
    """What a reaper does to a job whose lease ran out, done now, on a session of its own."""
    from notifyq.contrib.django import get_config
    from notifyq.store import liveness
    from notifyq.store.db import Session

    session = Session(get_config().dsn, name="take-back")
    try:
        session.run(lambda cur: cur.execute("UPDATE nq_job SET lease_until = NOW(6) - INTERVAL 1 SECOND "
                                            "WHERE id = %s", (job_id,)), what="expire the lease")
        assert liveness.reclaim_expired(session) == 1
    finally:
        session.close()
