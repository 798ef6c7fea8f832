"""Enqueue N jobs one at a time, each in atomic() with enqueue_on_commit, and print (JSON) how
long after each COMMIT the consumer's handler started it (CLOCK_MONOTONIC, one clock per host).
A first job, not measured, arms the process's bell (as a web worker's first request does): a
consumer waits on a bell from its next statement on."""
import json
import time

from django.core.management.base import BaseCommand
from django.db import transaction

from notifyq.contrib.django import enqueue_on_commit
from shop.models import Handled, Order


class Command(BaseCommand):
    def add_arguments(self, parser):
        parser.add_argument("--queue", default="pickup")
        parser.add_argument("--jobs", type=int, default=5)
        parser.add_argument("--timeout", type=float, default=30.0)

    def handle(self, *args, queue, jobs, timeout, **options):
        out = []
        for i in range(jobs + 1):
            stamps = []
            with transaction.atomic():
                transaction.on_commit(lambda: stamps.append(time.monotonic()))  # runs first
                Order.objects.create(name=f"o{i}")
                job_id = enqueue_on_commit(queue, {"n": i})
            committed = stamps[0]
            deadline = committed + timeout
            while True:
                row = Handled.objects.filter(job_id=job_id).first()
                if row is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.001)
            out.append(None if row is None else round((row.started - committed) * 1000, 2))
        self.stdout.write(json.dumps(out[1:]))
