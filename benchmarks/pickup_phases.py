"""Where pick-up from idle goes: one idle Worker, a bell-ringing Producer, single-job rings.

Times each phase of every ring, in one process (one clock), and prints medians:
  put()                      the producer's whole call (bell, INSERT+bump, COMMIT, ring sent)
  commit -> watch returns    put() returned until the watcher's statement came back granted
  watch -> claim start       the watcher's own Python between the two
  claim                      queries.claim: 3 round trips, the COMMIT riding with the last, unwaited
  claim -> handler           hand-off and dispatch to the handler
  commit -> handler          the total, as benchmarks/wakeup.py measures it

    python benchmarks/pickup_phases.py [--dsn mysql://root@host/] [--rings 200]

Without --dsn it starts a private MariaDB (notifyq.localserver), as bench.py does.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from notifyq import config as config_mod  # noqa: E402
from notifyq.config import DSN  # noqa: E402
from notifyq.consume.stats import Budget  # noqa: E402
from notifyq.consume.worker import Worker  # noqa: E402
from notifyq.produce.producer import Producer  # noqa: E402
from notifyq.run.localserver import LocalServer  # noqa: E402
from notifyq.store import bells, queries, schema  # noqa: E402


class Marks:
    """Times the watch statements and claims return, by wrapping the two store functions."""

    def __init__(self):
        self.watch_returned: list[float] = []
        self.claims: list[tuple[float, float]] = []
        self._watch, self._claim = bells.watch, queries.claim
        bells.watch, queries.claim = self.watch, self.claim

    def watch(self, *a, **kw):
        result = self._watch(*a, **kw)
        self.watch_returned.append(time.monotonic())
        return result

    def claim(self, *a, **kw):
        start = time.monotonic()
        result = self._claim(*a, **kw)
        self.claims.append((start, time.monotonic()))
        return result


class Stamp:
    per_batch = False

    def __init__(self):
        self.started: dict[int, float] = {}

    def __call__(self, jobs, extend) -> None:
        for job in jobs:
            self.started[job.id] = time.monotonic()


def measure(url: str, rings: int) -> dict[str, list[float]]:
    schema.init(DSN.parse(url))
    cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"},
                          overrides={"dsn": url, "log": {"level": "warning"}})
    marks, handler, stop = Marks(), Stamp(), threading.Event()
    worker = Worker(cfg, "phases", handler, stop=stop, budget=Budget(None))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    phases: dict[str, list[float]] = {k: [] for k in (
        "put()", "commit -> watch returns", "watch -> claim start", "claim", "claim -> handler",
        "commit -> handler")}
    with Producer("phases", cfg, ring=True) as producer:
        first = producer.put({})  # arms the ringer
        _wait(lambda: first in handler.started)
        for _ in range(rings):
            time.sleep(0.02)  # idle gap: the watcher is back in GET_LOCK on the bell
            before = time.monotonic()
            job_id = producer.put({})
            committed = time.monotonic()
            _wait(lambda: job_id in handler.started)
            claim_start, claim_end = marks.claims[-1]
            watch = next((t for t in marks.watch_returned if t >= committed), claim_start)
            phases["put()"].append(committed - before)
            phases["commit -> watch returns"].append(watch - committed)
            phases["watch -> claim start"].append(claim_start - watch)
            phases["claim"].append(claim_end - claim_start)
            phases["claim -> handler"].append(handler.started[job_id] - claim_end)
            phases["commit -> handler"].append(handler.started[job_id] - committed)
            marks.watch_returned.clear()
    stop.set()
    thread.join(10)  # its watch wait is bounded by the backoff cap; then it unregisters
    return phases


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("a job was not picked up within 10 s")
        time.sleep(0.0002)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", help="root DSN of a server to use (default: a private MariaDB)")
    ap.add_argument("--rings", type=int, default=200)
    args = ap.parse_args()
    server = None
    if args.dsn:
        url = args.dsn.rstrip("/") + "/nq_phases"
    else:
        server = LocalServer(Path(tempfile.mkdtemp(prefix="nqphases-")) / "server", redo_log_mb=96)
        server.start()
        url = server.dsn + "nq_phases"
    try:
        phases = measure(url, args.rings)
    finally:
        if server is not None:
            server.cleanup()
    print(f"{'phase':26s} {'p50 ms':>8s} {'p95 ms':>8s}")
    for name, values in phases.items():
        values.sort()
        print(f"{name:26s} {statistics.median(values) * 1e3:8.2f} {values[int(len(values) * .95)] * 1e3:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
