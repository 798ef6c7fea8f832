"""`notifyq demo`: producers and consumers as separate processes, with a live progress line.

With no DSN it uses the local server (root over the Debian socket) or, failing that, starts a
private MariaDB in a temp dir. With a DSN it uses that server, never that database: it creates
a database of its own (`notifyq_demo_<random>`, marked as the demo's) and drops it at the end
unless --keep. A user's queue is never touched.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import shutil
import statistics
import sys
import tempfile
import threading
import time

from notifyq import config as config_mod
from notifyq import errors
from notifyq.config import DSN
from notifyq.consume.service import ConsumeOptions, ConsumerService
from notifyq.jobs import Job
from notifyq.produce.producer import Producer
from notifyq.ops import status
from notifyq.run import localserver
from notifyq.store import schema
from notifyq.store.db import Session, address

QUEUE = "demo"
REPORT_S = 0.5


def _resolve_server(dsn: str | None, tmp: str) -> tuple[DSN, localserver.LocalServer | None]:
    """The server to work on; its database name is never used (the demo makes its own)."""
    if dsn:
        return DSN.parse(dsn), None
    found = localserver.find_local_server()
    server = None
    if found is None:
        if localserver.find_server_binaries() is None:
            raise errors.DatabaseError("no MariaDB/MySQL server found: install mariadb-server, "
                                       "or pass --dsn mysql://user:pw@host:port/db")
        print("demo: starting a private MariaDB in", tmp, flush=True)
        server = localserver.LocalServer(tmp)
        server.start()
        found = server.dsn
    return DSN.parse(found), server


def _quiet_child() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    logging.getLogger("notifyq").setLevel(logging.ERROR)  # keep the progress line readable


def _consumer(dsn: DSN, reports: mp.Queue, stop: mp.Event) -> None:
    _quiet_child()
    latencies: list[float] = []
    lock = threading.Lock()

    def handle(job: Job) -> None:
        lag = time.time() - job.payload["t"]
        with lock:
            latencies.append(lag)

    cfg = _config(dsn)
    service = ConsumerService(cfg, ConsumeOptions(queues=(QUEUE,), function=handle, workers=1))
    stopper = threading.Event()

    def report() -> None:
        while not stopper.wait(REPORT_S):
            with lock:
                batch, latencies[:] = latencies[:], []
            reports.put(("done", os.getpid(), batch))

    threading.Thread(target=report, daemon=True).start()
    threading.Thread(target=lambda: (stop.wait(), stopper.set()), daemon=True).start()
    service.run(stopper)
    with lock:
        reports.put(("done", os.getpid(), list(latencies)))


def _producer(dsn: DSN, rate: float, reports: mp.Queue, stop: mp.Event) -> None:
    _quiet_child()
    cfg = _config(dsn)
    tick = 0.01  # commit every 10 ms: rate is met with a few jobs per commit, latency stays low
    owed = 0.0
    with Producer(QUEUE, cfg, ring=True) as producer:
        next_at = time.monotonic()
        while not stop.is_set():
            owed += rate * tick
            n = int(owed)
            if n:
                owed -= n
                now = time.time()
                producer.put_many([{"t": now} for _ in range(n)])
                reports.put(("produced", os.getpid(), n))
            next_at += tick
            delay = next_at - time.monotonic()
            if delay > 0:
                stop.wait(delay)
            else:
                next_at = time.monotonic()  # behind: do not try to catch up in a burst


def _config(dsn: DSN) -> config_mod.Config:
    return dataclasses.replace(config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"}), dsn=dsn)


def _pct(values: list[float], q: int) -> float | None:
    """The q-th percentile, or None before the first job."""
    if not values:
        return None
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def _ms(seconds: float | None, width: int = 0) -> str:
    """Milliseconds for the progress line: "-" until there is a value (never nan)."""
    return ("-" if seconds is None else f"{seconds * 1e3:.1f}").rjust(width)


def progress_line(elapsed_s: float, produced: int, done: int, rate: float, depth: int,
                  latencies: list[float]) -> str:
    """The demo's live line: at most 79 characters below ten million jobs and ten-second latencies."""
    p50, p95, p99 = (_ms(_pct(latencies, q)) for q in (50, 95, 99))
    return (f"{elapsed_s:6.1f}s produced {produced:>7} done {done:>7} {rate:5.0f}/s "
            f"depth {depth:>5} ms {p50}/{p95}/{p99}")


def _backlog(session: Session) -> int:
    """The real depth: jobs ready (due scheduled included) or claimed, read from the database."""
    figures = status.depths(session, [QUEUE])[QUEUE]
    return figures["ready"] + figures["claimed"]


def run(dsn: str | None, *, producers: int, consumers: int, rate: int, duration: float,
        keep: bool = False) -> int:
    with tempfile.TemporaryDirectory(prefix="notifyq-demo-") as tmp:
        server_dsn, server = _resolve_server(dsn, tmp)
        try:
            target, token = schema.create_demo_database(server_dsn)
            print(f"demo: created database {target.database} on {address(target)} for this run"
                  + (" (the database named in --dsn is never used)" if dsn else ""), flush=True)
            try:
                schema.init(target, retry_log_level=logging.DEBUG)
                return _run(target, producers, consumers, rate, duration)
            finally:
                if keep and server is None:
                    print(f"demo: kept database {target.database} (--keep); drop it when done: "
                          f"DROP DATABASE {target.database}", flush=True)
                else:
                    schema.drop_database(target, token)
                    print(f"demo: dropped database {target.database}", flush=True)
        finally:
            if server is not None:
                server.cleanup()


def _run(dsn: DSN, producers: int, consumers: int, rate: int, duration: float) -> int:
    ctx = mp.get_context("spawn")  # no inherited connections or threads
    reports, stop = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_consumer, args=(dsn, reports, stop), daemon=True) for _ in range(consumers)]
    procs += [ctx.Process(target=_producer, args=(dsn, rate / producers, reports, stop), daemon=True)
              for _ in range(producers)]
    print(f"demo: {producers} producers offering {rate} jobs/s, {consumers} consumers, queue {QUEUE!r} "
          f"in {dsn.masked()} (Ctrl-C stops)", flush=True)
    for p in procs:
        p.start()
    produced = done = 0
    window: list[float] = []
    all_lat: list[float] = []
    started = last = time.monotonic()
    last_done = 0
    live = sys.stdout.isatty()  # redraw one line in a terminal; a pipe or file gets plain lines
    depth_session = Session(dsn, retry_s=5, name="demo-depth")
    try:
        while duration <= 0 or time.monotonic() - started < duration:
            try:
                kind, _pid, value = reports.get(timeout=0.2)
                if kind == "produced":
                    produced += value
                else:
                    done += len(value)
                    window += value
            except Exception:
                pass
            now = time.monotonic()
            if now - last >= 1.0:
                rate_now = (done - last_done) / (now - last)
                all_lat += window
                line = progress_line(now - started, produced, done, rate_now, _backlog(depth_session), window)
                if live:  # one line that fits the terminal, redrawn (an 80-column one too)
                    width = shutil.get_terminal_size().columns - 1
                    sys.stdout.write(f"\r{line[:width].ljust(width)}")
                else:
                    sys.stdout.write(f"{line}\n")
                sys.stdout.flush()
                window, last, last_done = [], now, done
    except KeyboardInterrupt:
        pass
    print(("\n" if live else "") + "demo: stopping (consumers drain what they hold)...", flush=True)
    stop.set()
    deadline = time.monotonic() + 30
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    for p in procs:  # none should be left; one that is must not hold the database open
        if p.is_alive():
            p.terminate()
            p.join(5)
    while True:
        try:
            kind, _pid, value = reports.get(timeout=0.2)
        except Exception:
            break
        if kind == "produced":
            produced += value
        else:
            done += len(value)
            all_lat += value
    elapsed = time.monotonic() - started
    try:
        left = _backlog(depth_session)
    finally:
        depth_session.close()
    print(f"demo: {done} jobs done of {produced} produced in {elapsed:.1f}s "
          f"({done / elapsed:.0f} jobs/s); latency commit->handler p50 {_ms(_pct(all_lat, 50))} ms, "
          f"p99 {_ms(_pct(all_lat, 99))} ms; {left} still queued")
    return errors.EXIT_OK
