"""Issue 26's producer-side classes: threads in the harness process next to the workload.

shared_producer (item 1): THREADS threads put() through ONE Producer. Each put carries a tag
  (payload "u") that the handler echoes on its start line: the checker matches every returned
  id to the put that stored it, and finds any job of a put that raised.
rr_dedup (item 12): a caller's REPEATABLE READ transaction reads first; another producer then
  puts key K (delayed, so that job stays pending); the caller's put(K, conn=...) must return the
  same id. Every other round the caller's connection is autocommit instead.
"""

from __future__ import annotations

import threading
import time

import MySQLdb

from notifyq import errors
from notifyq.config import Config
from notifyq.produce.producer import Producer

from .history import Enqueue, Refused

THREADS = 4
BURST = 5  # puts per thread per round, all threads released together: they contend for the producer
DEDUP_EVERY_S = 2.0
DEDUP_DELAY_S = 2.0  # the first job of a key stays pending (scheduled) this long


class SharedProducer:
    def __init__(self, deploy: str, config: Config, queue: str, seed: int, jobs: int, duration_s: float):
        self.deploy, self.config, self.queue = deploy, config, queue
        self.rounds = max(1, jobs // (THREADS * BURST))
        self.pace_s = duration_s / self.rounds
        self.barrier = threading.Barrier(THREADS)
        self.enqueues: list[Enqueue] = []
        self.refused: list[Refused] = []
        self.unknown = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._put_loop, args=(i,), name=f"shared-put-{i}", daemon=True)
                        for i in range(THREADS)]

    def start(self) -> None:
        self.producer = Producer(self.queue, self.config)  # the one instance every thread uses
        for t in self.threads:
            t.start()

    def join(self, timeout_s: float) -> None:
        """Bounded: a put that hangs (a shared connection in a bad state) must not hang the run."""
        self.stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))
        try:
            self.producer.close()
        except Exception:  # noqa: BLE001 - a producer broken by the threads: the checker judges the puts
            pass

    def _put_loop(self, thread: int) -> None:
        for n in range(self.rounds):
            if self.stop.wait(self.pace_s * 0.5):  # pacing, not synchronisation
                self.barrier.abort()  # the others must not wait for this thread at the barrier
                return
            try:
                self.barrier.wait(timeout=30)  # every thread puts at once: the contention item 1 needs
            except threading.BrokenBarrierError:
                return  # a thread is stuck in a put: the others stop too
            for k in range(BURST):
                self._put(f"t{thread}-{n}-{k}")
        self.barrier.abort()

    def _put(self, tag: str) -> None:
        try:
            job = self.producer.put({"s": 0.0, "u": tag})
        except errors.OutcomeUnknown:
            self.unknown += 1
        except Exception as e:  # noqa: BLE001 - any exception (a raw driver error too) is a refusal
            self.refused.append(Refused(self.deploy, tag, type(e).__name__))
        else:
            self.enqueues.append(Enqueue(self.deploy, job, "", "shared", 0, 0.0, time.monotonic(), tag=tag))


class DedupCaller(threading.Thread):
    def __init__(self, deploy: str, config: Config, queue: str, duration_s: float):
        super().__init__(name="rr-dedup", daemon=True)
        self.deploy, self.config, self.queue, self.duration_s = deploy, config, queue, duration_s
        self.enqueues: list[Enqueue] = []
        self.errors = 0
        self.stop = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + self.duration_s
        with Producer(self.queue, self.config) as other, Producer(self.queue, self.config) as mine:
            n = 0
            while time.monotonic() < deadline and not self.stop.wait(DEDUP_EVERY_S):
                try:
                    self._round(other, mine, f"rr{n}", autocommit=n % 2 == 1)
                except (errors.NotifyqError, MySQLdb.Error):
                    self.errors += 1  # a fault hit it: nothing acknowledged, nothing owed
                n += 1

    def _round(self, other: Producer, mine: Producer, key: str, autocommit: bool) -> None:
        conn = MySQLdb.connect(**self.config.dsn.connect_args(), connect_timeout=5, autocommit=autocommit)
        try:
            cur = conn.cursor()
            if not autocommit:
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur.execute("START TRANSACTION")
                cur.execute("SELECT COUNT(*) FROM nq_job")  # the snapshot is taken here
            called = time.monotonic()
            first = other.put({"s": 0.0}, dedup_key=key, delay=DEDUP_DELAY_S)
            self.enqueues.append(Enqueue(self.deploy, first, "", "dedup", 0, DEDUP_DELAY_S, time.monotonic(),
                                         dedup=key, called_at=called))
            called = time.monotonic()
            second = mine.put({"s": 0.0}, dedup_key=key, delay=DEDUP_DELAY_S, conn=conn)
            conn.commit()
            self.enqueues.append(Enqueue(self.deploy, second, "", "rr_dedup", 0, DEDUP_DELAY_S, time.monotonic(),
                                         dedup=key, called_at=called))
        finally:
            conn.close()
