"""The producers of a fault-schedule run: threads in the harness process that enqueue throughout,
by every path a user has (put, put_many, delayed, priority, dedup, transactional `conn=`), and
record each enqueue the moment it is acknowledged (the call returned, or the caller's COMMIT did).

An enqueue that raised is not acknowledged and owes nothing; OutcomeUnknown is counted apart.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time

import MySQLdb

from notifyq import errors
from notifyq.config import Config
from notifyq.produce.producer import Producer

from .history import Enqueue

METHODS = ("put", "put_many", "delayed", "priority", "dedup", "transactional")
BURST_EVERY_S = 10.0  # due_priority: how often a due backlog with one urgent job arrives
BURST_JOBS = 400
FX_CALLS_SHARE, FX_CALLS_S = 0.5, 0.05  # effects: of those, calls inside the block, and the stay there after
UNENC_SHARE = 0.01  # effects: of the plain jobs, and of the fx ones, until their few are drawn
KEYS, KEYED_SHARE = 4, 0.3  # issue 38: this share of put/put_many calls carry one of KEYS keys (fleet.KEY_LIMIT)
# The rare kinds' most jobs a minute of the run: the short CI schedule's own counts (3,000 jobs in
# 60 s). Scaled by the job count alone, a 10-minute run of 100,000 jobs had 200 slow jobs (each up
# to five 5.5 s runs past its lease), 200 long ones (12 s) and 100 poison ones (a consumer restart
# per attempt): 9,000 consumer-seconds, more than its eight consumers had in the run.
RARE_PER_MINUTE = {"poison": 3, "slow": 6, "long": 6, "kanji": 3, "fork": 3}
# Where each rare kind's draws fall in Mix.payload's [0, 1) (a kind used up passes its draws on
# to the next band); the common kinds start at RARE_END
RARE_BANDS = {"poison": (0.0, 0.002), "slow": (0.002, 0.005), "long": (0.005, 0.008), "kanji": (0.008, 0.01),
              "fork": (0.01, 0.012)}
RARE_END = 0.012
FX_SHARE = 0.3  # effects: this share of the plain jobs  # more than any claim reads of due jobs (3 x the batch size)


def _substream(rng: random.Random, salt: int) -> random.Random:
    """A stream of its own, seeded from `rng`'s state without drawing from it. From a digest of
    the state, not hash(): Python 3.11 hashes None (in the state) by its address, which changes
    from process to process, so the same seed drew other rare jobs in each run."""
    digest = hashlib.sha256(repr((rng.getstate(), salt)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


class Mix:
    """What the next job is: kind, sleep and priority, from the workload's own seeded stream."""

    def __init__(self, rng: random.Random, classes: tuple[str, ...], lease_s: float, jobs: int,
                 duration_s: float | None = None):
        """duration_s: caps the rare kinds at RARE_PER_MINUTE of the run (None: no cap)."""
        self.rng, self.classes, self.lease_s = rng, classes, lease_s
        # A stream of its own, read only for a capped kind's draws: uncapped runs draw as before
        self.thin: dict[str, float] = {}
        self.thin_rng = _substream(rng, 35)
        self.poison_left = self._rare("poison", max(2, jobs // 1000), jobs, duration_s) if "poison" in classes else 0
        self.slow_left = self._rare("slow", max(2, jobs // 500), jobs, duration_s) if "slow" in classes else 0
        # issue 26: long jobs (busy consumers for kill_session), huge errors, forking handlers
        self.long_left = self._rare("long", max(4, jobs // 500), jobs, duration_s) if "kill_session" in classes else 0
        self.kanji_left = self._rare("kanji", max(2, jobs // 1000), jobs, duration_s) if "huge_error" in classes else 0
        self.fork_left = self._rare("fork", max(2, jobs // 1000), jobs, duration_s) if "fork" in classes else 0
        # issue 29: a share of the plain jobs write their effect through job.transaction(); drawn
        # from a stream of its own, so the other kinds are drawn as without the class
        self.fx_rng = _substream(rng, 29) if "effects" in classes else None
        # half of those call extend_lease() and the cancel checks inside their block, and stay
        # in it a while (nqfault "c"): a stream of its own again, so which jobs are fx is unchanged
        self.fx_calls_rng = _substream(rng, 291) if "effects" in classes else None
        # a few jobs whose result cannot be encoded (nested deeper than the JSON encoder goes; the
        # queues keep results): "unenc" ones return it, fx ones with "r" give it to
        # job.transaction(result=...). Dropped with a warning, the job done once: it once ended
        # the worker and stranded its batch. A stream of its own again: nothing else changes.
        self.unenc_rng = _substream(rng, 30) if "effects" in classes else None
        self.unenc_left = max(2, jobs // 1000) if "effects" in classes else 0
        self.fx_result_left = max(2, jobs // 1000) if "effects" in classes else 0

    def _rare(self, kind: str, by_jobs: int, jobs: int, duration_s: float | None) -> int:
        """How many jobs of a rare kind: by the job count, at most RARE_PER_MINUTE[kind] a minute
        of the run. A capped kind keeps only a share of its draws (_thinned), so that its jobs
        come through the run as an uncapped kind's do (its draws expect about 1.5 times its
        count: the last ones near two thirds of the run), not all in its first minutes."""
        if duration_s is None:
            return by_jobs
        left = min(by_jobs, max(RARE_PER_MINUTE[kind], round(RARE_PER_MINUTE[kind] * duration_s / 60)))
        if left < by_jobs:
            low, high = RARE_BANDS[kind]
            self.thin[kind] = min(1.0, 1.5 * left / ((high - low) * jobs))
        return left

    def _thinned(self, r: float) -> float:
        """The draw `r`, or, when it falls in a capped rare kind's band and is not kept, a new draw
        among the common kinds (on the thinning's own stream)."""
        for kind, (low, high) in RARE_BANDS.items():
            if low <= r < high:
                share = self.thin.get(kind)
                if share is None or self.thin_rng.random() < share:
                    return r
                return RARE_END + self.thin_rng.random() * (1.0 - RARE_END)
        return r

    def payload(self) -> tuple[str, dict]:
        r = self.rng.random()
        if self.thin and r < RARE_END:
            r = self._thinned(r)
        if self.poison_left and r < RARE_BANDS["poison"][1]:
            self.poison_left -= 1
            if self.poison_left % 2:  # every other one raises a BaseException instead of exiting
                return "unwind", {"k": "unwind"}
            return "poison", {"k": "poison"}
        if self.slow_left and r < RARE_BANDS["slow"][1]:
            self.slow_left -= 1
            return "slow", {"k": "slow", "s": round(self.lease_s + 1.5, 3)}
        if self.long_left and r < RARE_BANDS["long"][1]:
            self.long_left -= 1  # 3 leases long, extending every quarter lease
            return "long", {"k": "long", "s": round(self.lease_s * 3, 3), "x": round(self.lease_s / 4, 3)}
        if self.kanji_left and r < RARE_BANDS["kanji"][1]:
            self.kanji_left -= 1
            return "kanji", {"k": "kanji"}
        if self.fork_left and r < RARE_BANDS["fork"][1]:
            self.fork_left -= 1
            return "fork", {"k": "fork"}
        if "retry" in self.classes and r < 0.04:
            return "fail1", {"k": "fail1", "s": 0.002}
        if "polling" in self.classes and r < 0.09:
            return "", {"s": 0.1}
        sleep = self.rng.choice((0.0, 0.002, 0.005, 0.01))
        if self.fx_rng is not None and self.fx_rng.random() < FX_SHARE:
            extra = {}
            if self.fx_result_left and self.unenc_rng.random() < UNENC_SHARE:
                self.fx_result_left -= 1
                extra = {"r": 1}
            if self.fx_calls_rng.random() < FX_CALLS_SHARE:
                return "fx", {"k": "fx", "s": sleep, "c": FX_CALLS_S, **extra}
            return "fx", {"k": "fx", "s": sleep, **extra}
        if self.unenc_left and self.unenc_rng.random() < UNENC_SHARE:
            self.unenc_left -= 1
            return "unenc", {"k": "unenc", "s": sleep}
        return "", {"s": sleep}


class Workload(threading.Thread):
    """Enqueues `jobs` jobs on `queue` at an even pace over `duration_s`."""

    def __init__(self, deploy: str, config: Config, queue: str, seed: int, classes: tuple[str, ...],
                 jobs: int, duration_s: float, lease_s: float, methods: tuple[str, ...] = METHODS,
                 ring: bool = False, more=None):
        """ring: a second, long-lived producer that rings the consumers' bell (Producer(ring=True))
        takes every other enqueue, chosen at random; methods: the enqueue paths to use; more: a
        callable, true while the run still needs enqueues after the `jobs` (one at a time, at the
        same pace; the harness stops the workload at the latest a minute after `duration_s`)."""
        super().__init__(name=f"workload-{deploy}", daemon=True)
        self.deploy, self.config, self.queue = deploy, config, queue
        self.rng = random.Random(seed)
        self.mix = Mix(random.Random(seed + 1), classes, lease_s, jobs, duration_s)
        self.key_rng = random.Random(seed + 38)  # a stream of its own: the other draws are unchanged
        self.jobs, self.duration_s = jobs, duration_s
        self.methods, self.ring, self.more = methods, ring, more
        self.enqueues: list[Enqueue] = []
        self.unknown = 0
        self.errors = 0
        self.stop = threading.Event()
        self._conn = None

    def run(self) -> None:
        started = time.monotonic()
        rate = self.jobs / self.duration_s
        produced = 0
        next_burst = started + BURST_EVERY_S / 2 if "due_priority" in self.mix.classes else float("inf")
        with Producer(self.queue, self.config) as plain, Producer(self.queue, self.config, ring=self.ring) as ringer:
            while (produced < self.jobs or (self.more is not None and self.more())) and not self.stop.is_set():
                due = started + produced / rate
                if self.stop.wait(max(0.0, due - time.monotonic())):  # pacing, not synchronisation
                    break
                if time.monotonic() >= next_burst:
                    next_burst += BURST_EVERY_S
                    self._burst(plain)
                producer = ringer if self.ring and self.rng.random() < 0.5 else plain
                method = self.rng.choice(self.methods)
                n = self.rng.randint(5, 60) if method == "put_many" else 1
                n = min(n, self.jobs - produced) if produced < self.jobs else 1
                try:
                    self._enqueue(producer, method, n)
                except errors.OutcomeUnknown:
                    self.unknown += n
                except (errors.NotifyqError, MySQLdb.Error):
                    self.errors += 1  # not acknowledged: nothing is owed
                    self._drop_conn()
                produced += n
        self._drop_conn()

    def _enqueue(self, producer: Producer, method: str, n: int) -> None:
        kinds_payloads = [self.mix.payload() for _ in range(n)]
        priority = self.rng.choice((1, 5, 9)) if method == "priority" else 0
        delay = round(self.rng.uniform(0.2, 3.0), 3) if method == "delayed" else 0.0
        key = f"fk{self.key_rng.randrange(KEYS)}" if self.key_rng.random() < KEYED_SHARE else None
        if method == "put_many":
            ids = producer.put_many([p for _, p in kinds_payloads], key=key)
        elif method == "dedup":
            key = f"d{self.rng.randrange(30)}"
            ids = [producer.put(kinds_payloads[0][1], dedup_key=key)]
        elif method == "transactional":
            conn = self._caller_conn()
            ids = [producer.put(kinds_payloads[0][1], conn=conn)]
            conn.commit()
        else:
            ids = [producer.put(kinds_payloads[0][1], priority=priority, delay=delay, key=key)]
        acked = time.monotonic()
        for job_id, (kind, _) in zip(ids, kinds_payloads):
            self.enqueues.append(Enqueue(self.deploy, job_id, kind, method, priority, delay, acked))

    def _burst(self, producer: Producer) -> None:
        """A backlog of due low-priority jobs, then one urgent job due at the same moment."""
        try:
            ids = producer.put_many([{"s": 0.002}] * BURST_JOBS, delay=1.0)
            acked = time.monotonic()
            self.enqueues += [Enqueue(self.deploy, i, "", "burst", 0, 1.0, acked) for i in ids]
            urgent = producer.put({"s": 0.0}, priority=9, delay=1.0)
            self.enqueues.append(Enqueue(self.deploy, urgent, "", "burst", 9, 1.0, time.monotonic()))
        except errors.OutcomeUnknown:
            self.unknown += 1
        except (errors.NotifyqError, MySQLdb.Error):
            self.errors += 1

    def _caller_conn(self):
        """The application's own connection, for `put(conn=...)` inside its transaction."""
        if self._conn is None:
            self._conn = MySQLdb.connect(**self.config.dsn.connect_args(), connect_timeout=5)
        return self._conn

    def _drop_conn(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except MySQLdb.Error:
                pass
            self._conn = None
