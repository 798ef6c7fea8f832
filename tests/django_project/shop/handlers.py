"""Handlers that use the ORM, as a Django app's would."""
import time

from django.db import connection

from shop.models import Handled, Order


def record(job) -> None:
    started = time.monotonic()
    Order.objects.filter(name="nothing").exists()  # the ORM's connection, reused across jobs
    with connection.cursor() as cur:
        cur.execute("SELECT CONNECTION_ID()")
        (conn_id,) = cur.fetchone()
    Handled.objects.create(job_id=job.id, connection_id=conn_id, started=started)
