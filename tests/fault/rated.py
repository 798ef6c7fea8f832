"""The `rate` class (issue 38): a deployment of its own ("rated", its own database) whose queue
has a rate and a rate per key, served by two consumers through the schedule's server faults and
KILLs of sessions. A producer puts keyed jobs (and a few without a key) a little faster than
the rate allows, so a backlog builds and both rates hold jobs back all along; the checker's
`rate` rule then wants no window of one period with more than N starts of the queue, or of one
key (History.rates, History.job_keys).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import MySQLdb

from notifyq import config as config_mod
from notifyq import errors
from notifyq.produce.producer import Producer

from .fleet import write_config
from .history import Enqueue

DEPLOY = "rated"
QUEUE = "fr"
RATE = (10, 1.0)  # rate = "10/1s"
RATE_PER_KEY = (3, 1.0)  # rate_per_key = "3/1s"
KEYS = ("k0", "k1", "k2", "k3", "k4", None)  # None: a job without a key (held by the queue's rate only)
CONSUMERS = 2
OVERFILL = 1.2  # the producer's pace, as a multiple of the rate: a backlog builds
EVERY_S = 0.5


def limits() -> list[tuple[int, float, bool]]:
    """What History.rates holds for the deployment."""
    return [(*RATE, False), (*RATE_PER_KEY, True)]


def write_rated_config(path: Path, lease_s: float) -> Path:
    write_config(path, lease_s, polling=False)
    with path.open("a") as f:
        f.write(f'[queue.{QUEUE}]\nrate = "{RATE[0]}/{RATE[1]:g}s"\nrate_per_key = "{RATE_PER_KEY[0]}/{RATE_PER_KEY[1]:g}s"\n')
    return path


class RatedProducer(threading.Thread):
    """Puts keyed jobs every EVERY_S for the schedule's duration; records each acknowledged one
    and its key."""

    def __init__(self, config: config_mod.Config, seed: int, duration_s: float):
        super().__init__(name="workload-rated", daemon=True)
        self.config, self.duration_s = config, duration_s
        self.rng = random.Random(seed + 38)
        self.enqueues: list[Enqueue] = []
        self.keys: dict[tuple[str, int], str] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        per_put = max(1, round(RATE[0] / RATE[1] * OVERFILL * EVERY_S))
        started = time.monotonic()
        with Producer(QUEUE, self.config) as producer:
            while time.monotonic() - started < self.duration_s and not self.stop.wait(EVERY_S):
                for _ in range(per_put):
                    key = self.rng.choice(KEYS)
                    try:
                        job_id = producer.put({"s": 0.002}, key=key)
                    except (errors.NotifyqError, MySQLdb.Error):
                        continue  # not acknowledged: nothing is owed
                    self.enqueues.append(Enqueue(DEPLOY, job_id, "", "put", 0, 0.0, time.monotonic()))
                    if key is not None:
                        self.keys[(DEPLOY, job_id)] = key
