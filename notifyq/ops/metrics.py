"""Prometheus endpoint of a consumer process (`consumer.metrics_port`).

Nothing here keeps state of its own and nothing touches prometheus_client's global registry:
a scrape asks the consumer for a snapshot of its figures (figures.ServiceFigures: its workers'
counters, why they woke, the periodic schedulers) and renders it into a CollectorRegistry
owned by this endpoint. Queue depth and the oldest ready job's age come from the database (one
indexed read per queue, cached for DEPTH_CACHE_S so several scrapers do not multiply it).

    /metrics  the text exposition format
    /healthz  200 while every worker loop turns (what the systemd watchdog is fed), else 503
    /...      with consumer.metrics_pages, the status pages, read-only (handed to notifyq.web)
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from notifyq import errors
from notifyq.figures import (NO_TASK, TASK_COUNTERS, ServiceFigures, WorkerFigures, batch_size_histogram,
                             handler_seconds_histogram, queue_wait_histogram)
from notifyq.store.admin_queries import DEPTH_HISTORY_CAP

# prometheus_client and http.server weigh more than the rest of a consumer's imports: a
# consumer loads this module only when it serves metrics (run/runner.py).

log = logging.getLogger("notifyq.metrics")

DEPTH_CACHE_S = 2.0
COUNTERS = (
    ("claimed", "Jobs claimed (each claim is one attempt)."),
    ("succeeded", "Jobs acked as done."),
    ("failed", "Jobs whose attempt failed (retried + dead)."),
    ("retried", "Failed jobs rescheduled with backoff."),
    ("dead", "Failed jobs out of attempts (or not retryable)."),
    ("given_back", "Claimed jobs returned unstarted: at shutdown, or from behind a long job."),
    ("lost_acks", "Outcomes dropped because the claim had been taken back (lease or reaper)."),
    ("snoozed", "Jobs the handler put back for later (job.snooze, notifyq.Snooze): no attempt spent."),
    ("cancelled", "Jobs that ended cancelled: their cancel was requested while they ran (not failed)."),
)


# A depth reader: given where each queue's jobs are (ServiceFigures.shards_of), the queues' depth
# figures by server (status.depths()) and whether each server answered ("" for one server).
Depths = Callable[[dict[str, tuple[str, ...]]], tuple[dict[str, dict[str, dict[str, Any]]], dict[str, bool]]]


class ServiceCollector:
    """Renders a consumer's figures when scraped: `figures` is ConsumerService.figures, `depths`
    what reads its queues' depth (sharding/servers.py QueueDepths: one session per server)."""

    def __init__(self, figures: Callable[[], ServiceFigures], depths: Depths):
        self.figures = figures
        self.depths = depths
        self._depth: tuple[dict[str, dict[str, dict[str, Any]]], dict[str, bool]] = ({}, {})
        self._depth_at = -DEPTH_CACHE_S
        self._lock = threading.Lock()

    def describe(self) -> list:
        return []  # registering must not scrape (the service may not have started)

    def collect(self) -> Iterator[Any]:

        now = self.figures()
        running = [w for w in now.workers if w.running]
        # Counters and histograms count every worker this process ran, the ones replaced after a
        # shard outage too (a counter never goes down); the gauges, the workers running now.
        yield from self._job_counters(self._groups(now, now.workers))
        yield from self._histograms(self._groups(now, now.workers))
        yield from self._task_histograms(self._groups(now, now.workers))
        yield from self._wakeups(now, self._groups(now, running))
        yield from self._depth_gauges(now)
        yield from self._periodic(now)
        yield CounterMetricFamily("notifyq_reaper_reclaimed", "Jobs this process's reaper took back "
                                  "from dead consumers or expired leases (any queue).", value=now.reclaimed)
        yield CounterMetricFamily("notifyq_db_conflicts", "Transactions of this process's workers rerun "
                                  "after error 1213: deadlocks, or on Galera certification conflicts "
                                  "(a steady rate: writes through a second node).", value=now.conflicts)
        reloads = CounterMetricFamily("notifyq_reloads", "SIGHUP reloads of the config: applied, or "
                                      "refused (the old config runs on): alert on refused.", labels=["result"])
        for result in ("applied", "refused"):
            reloads.add_metric([result], now.reloads.get(result, 0))
        yield reloads
        yield GaugeMetricFamily("notifyq_healthy", "1 while every worker loop turns (watchdog view).",
                                value=int(now.healthy))

    @staticmethod
    def _groups(now: ServiceFigures, workers: list[WorkerFigures]) -> tuple[list[str], dict[tuple[str, ...], list]]:
        """The labels of the per-worker families and their workers: per queue and server (a
        `shard` label when the servers have names: sum by (queue) for the queue)."""
        groups: dict[tuple[str, str], list] = {(q, s): [] for q in now.queues for s in now.shards_of.get(q, ("",))}
        for w in workers:
            groups.setdefault((w.queue, w.shard), []).append(w)
        return _by_server(["queue"], groups)

    def _job_counters(self, groups) -> Iterator[Any]:

        labels, by_label = groups
        for name, doc in COUNTERS:
            if name in TASK_COUNTERS:
                yield self._by_task(name, doc, labels, by_label)
                continue
            family = CounterMetricFamily(f"notifyq_jobs_{name}", doc, labels=labels)
            for key, mine in by_label.items():
                family.add_metric(list(key), sum(w.counters[name] for w in mine))
            yield family
        batches = CounterMetricFamily("notifyq_claim_batches", "Non-empty claims.", labels=labels)
        for key, mine in by_label.items():
            batches.add_metric(list(key), sum(w.counters["batches"] for w in mine))
        yield batches

    @staticmethod
    def _by_task(name: str, doc: str, labels: list[str], by_label) -> CounterMetricFamily:
        """A job counter per queue and task (a `task` label: the tasks the consumer runs, at most
        figures.TASKS_KEPT per worker, then "(other)"). Jobs of plain handlers, and any the
        worker could not tell apart (an ack of several jobs of which some were lost), count
        under the empty task, which Prometheus shows as no label: the queue's own series, as
        before tasks had one, and `sum by (queue)` is the queue's total whatever the split."""
        family = CounterMetricFamily(f"notifyq_jobs_{name}", doc + " By task (`task`).", labels=_with_task(labels))
        for key, mine in by_label.items():
            total = sum(w.counters[name] for w in mine)
            per_task: dict[str, int] = {}
            for w in mine:
                for task, figures in w.by_task.items():
                    if task != NO_TASK:
                        per_task[task] = per_task.get(task, 0) + figures.counters[name]
            family.add_metric(_keyed(key, NO_TASK), total - sum(per_task.values()))
            for task, n in sorted(per_task.items()):
                family.add_metric(_keyed(key, task), n)
        return _no_empty_task(family)

    @staticmethod
    def _task_histograms(groups) -> Iterator[Any]:
        """Per job, per queue and task: its run time, and its wait in the queue (from its due
        time, the enqueue's, its delay's or its retry's, to its start)."""
        labels, by_label = groups
        for attr, metric, doc, make in (
                ("job_seconds", "notifyq_job_seconds", "Run time per job, by task (a per-batch "
                 "handler's jobs each count its whole call).", handler_seconds_histogram),
                ("queue_wait", "notifyq_queue_wait_seconds", "Time from a job's due time (its "
                 "enqueue, delay or retry backoff) to its start, by task.", queue_wait_histogram)):
            family = HistogramMetricFamily(metric, doc, labels=_with_task(labels))
            for key, mine in by_label.items():
                totals: dict[str, Any] = {NO_TASK: make()}
                for w in mine:
                    for task, figures in w.by_task.items():
                        totals.setdefault(task, make()).add(getattr(figures, attr))
                for task, total in sorted(totals.items()):
                    family.add_metric(_keyed(key, task), total.buckets(), sum_value=total.sum)
            yield _no_empty_task(family)

    def _histograms(self, groups) -> Iterator[Any]:
        """Per queue; with [shards] per queue and shard, as the job counters."""

        labels, by_label = groups
        for attr, metric, doc, make in (
                ("handler_seconds", "notifyq_handler_seconds",
                 "Handler run time per call (one job, or one batch with --per-batch).",
                 handler_seconds_histogram),
                ("batch_sizes", "notifyq_claim_batch_size", "Jobs per non-empty claim.",
                 batch_size_histogram)):
            family = HistogramMetricFamily(metric, doc, labels=labels)
            for key, mine in by_label.items():
                total = make()
                for w in mine:
                    total.add(getattr(w, attr))
                family.add_metric(list(key), total.buckets(), sum_value=total.sum)
            yield family

    @staticmethod
    def _wakeups(now: ServiceFigures, groups) -> Iterator[Any]:

        labels, by_label = groups
        wakeups = CounterMetricFamily(
            "notifyq_wakeups", "Why an idle worker went to claim: bell (producer rang), signal "
            "(count moved, found by polling), due (a scheduled job came due, a rate refilled, or held "
            "jobs' counters are recounted), timeout (safety poll), locked (claiming again ready jobs "
            "another session held locked).",
            labels=[*labels, "kind"])
        locks = GaugeMetricFamily("notifyq_wakeup_locks", "Workers using the advisory-lock "
                                  "wake-up channel.", labels=labels)
        polling = GaugeMetricFamily("notifyq_wakeup_polling", "Workers fallen back to polling "
                                    "(advisory locks refused): alert when above 0.", labels=labels)
        watching = GaugeMetricFamily("notifyq_watching", "Workers holding the queue's watch lock "
                                     "(at most 1 across all hosts, per shard).", labels=labels)
        busy = GaugeMetricFamily("notifyq_workers_busy", "Workers inside a handler.", labels=labels)
        count = GaugeMetricFamily("notifyq_workers", "Worker threads.", labels=labels)
        for key, mine in by_label.items():
            key = list(key)
            # The queue's watcher, shared by the queue's workers on one database.
            watchers = [x for x in now.watchers if [x.queue, x.shard][:len(key)] == key]
            for kind in ("bell", "signal", "due", "timeout", "locked"):
                wakeups.add_metric([*key, kind], sum(x.wakeups.get(kind, 0) for x in watchers))
            locks.add_metric(key, sum(1 for w in mine if w.use_locks))
            polling.add_metric(key, sum(1 for w in mine if not w.use_locks))
            watching.add_metric(key, sum(1 for x in watchers if x.watching))
            busy.add_metric(key, sum(1 for w in mine if w.busy))
            count.add_metric(key, len(mine))
        yield from (wakeups, locks, polling, watching, busy, count)

    def _depth_gauges(self, now: ServiceFigures) -> Iterator[Any]:
        """Per queue and server (a `shard` label when the servers have names: sum by (queue) for
        the queue), and notifyq_db_up per server."""


        depth, ok = self._read_depth(now)
        extra, up_by = _by_server([], {(s,): v for s, v in ok.items()})
        up = GaugeMetricFamily("notifyq_db_up", "1 if the last depth read reached the database"
                               + (" (per shard)." if extra else "."), labels=extra)
        for key, answered in up_by.items():
            up.add_metric(list(key), int(answered))
        jobs = GaugeMetricFamily("notifyq_queue_jobs", "Jobs in the queue by state (ready includes "
                                 "due scheduled jobs; delayed = not yet due; done, dead and cancelled are counted "
                                 f"up to {DEPTH_HISTORY_CAP}).", labels=["queue", "state", *extra])
        age = GaugeMetricFamily("notifyq_oldest_ready_age_seconds", "How long the oldest claimable "
                                "job has been waiting (0 when none).", labels=["queue", *extra])
        paused = GaugeMetricFamily("notifyq_queue_paused", "1 while the queue is paused.", labels=["queue", *extra])
        for server, figures in sorted(depth.items()):
            label = [server] if extra else []
            for q in now.queues:
                d = figures.get(q)
                if d is None:
                    continue
                for state in ("ready", "delayed", "claimed", "dead", "done", "cancelled"):
                    jobs.add_metric([q, state, *label], d[state])
                age.add_metric([q, *label], d["oldest_ready_age_s"] or 0.0)
                paused.add_metric([q, *label], int(d["paused"]))
        yield from (up, jobs, age, paused)

    def _read_depth(self, now: ServiceFigures) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, bool]]:
        """The last read, or a new one when it is older than DEPTH_CACHE_S."""
        with self._lock:
            if time.monotonic() - self._depth_at >= DEPTH_CACHE_S:
                self._depth = self.depths(now.shards_of)
                self._depth_at = time.monotonic()
            return self._depth

    @staticmethod
    def _periodic(now: ServiceFigures) -> Iterator[Any]:

        leader = GaugeMetricFamily("notifyq_periodic_leader", "1 where this process enqueues the "
                                   "queue's periodic jobs.", labels=["queue"])
        enqueued = CounterMetricFamily("notifyq_periodic_enqueued", "Periodic ticks enqueued here.",
                                       labels=["queue"])
        skipped = CounterMetricFamily("notifyq_periodic_skipped", "Missed ticks not enqueued "
                                      "(catch-up enqueues only the most recent).", labels=["queue"])
        purged = CounterMetricFamily("notifyq_retention_purged", "Done/dead jobs deleted by "
                                     "retention.", labels=["queue"])
        for q, figures in now.periodic.items():
            leader.add_metric([q], min(1, figures["leader"]))
            enqueued.add_metric([q], figures["enqueued"])
            skipped.add_metric([q], figures["skipped"])
            purged.add_metric([q], figures["purged"])
        yield from (leader, enqueued, skipped, purged)

    def close(self) -> None:
        close = getattr(self.depths, "close", None)
        if close is not None:
            with self._lock:
                close()


def _with_task(labels: list[str]) -> list[str]:
    """A per-worker family's labels with `task` after the queue's."""
    return [labels[0], "task", *labels[1:]]


def _keyed(key: tuple[str, ...], task: str) -> list[str]:
    return [key[0], task, *key[1:]]


def _no_empty_task(family: Any) -> Any:
    """The family's samples of no task without the label (what Prometheus makes of an empty one
    anyway): a queue of plain handlers is exposed exactly as before tasks had a label."""
    family.samples = [s if s.labels.get("task") != NO_TASK
                      else s._replace(labels={k: v for k, v in s.labels.items() if k != "task"})
                      for s in family.samples]
    return family


def _by_server(labels: list[str], groups: dict[tuple[str, ...], Any]) -> tuple[list[str], dict[tuple[str, ...], Any]]:
    """Groups keyed by (..., server): the `shard` label when the servers have names, else none
    (one server is "")."""
    if any(key[-1] for key in groups):
        return [*labels, "shard"], groups
    return labels, {key[:-1]: value for key, value in groups.items()}


class MetricsServer:
    """The endpoint: a threading HTTP server answering from a registry of its own."""

    def __init__(self, addr: tuple[str, int], collector: ServiceCollector, healthy: Callable[[], bool],
                 pages: Any = None):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.collector = collector
        self.healthy = healthy
        self.pages = pages  # answer(request) for every other GET, or None
        server_class = ThreadingHTTPServer
        if ":" in addr[0]:  # an IPv6 address ("::" is every interface, both families on Linux)
            server_class = type("ThreadingHTTPServer6", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
        self.httpd = server_class(addr, Handler)
        self.httpd.daemon_threads = True
        self.httpd.endpoint = self  # type: ignore[attr-defined]  # how a request finds us

    @property
    def server_port(self) -> int:
        return self.httpd.server_port

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.collector.close()
        if self.pages is not None:
            self.pages.close()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        endpoint: MetricsServer = self.server.endpoint  # type: ignore[attr-defined]
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, generate_latest(endpoint.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            ok = endpoint.healthy()
            self._send(200 if ok else 503, b"ok\n" if ok else b"unhealthy\n", "text/plain")
        elif endpoint.pages is not None:
            endpoint.pages(self)
        else:
            self._send(404, b"not found: try /metrics or /healthz\n", "text/plain")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("metrics request " + format, *args)


def serve(service: Any, depths: Depths, port: int, addr: str = "127.0.0.1", pages: Any = None) -> MetricsServer:
    """Start the endpoint on a daemon thread; port 0 picks a free one (see server_port).
    `depths`: what reads the queues' depth (ServiceCollector); `pages`: what answers the other
    paths (the status pages, notifyq.web.server.mount).

    Loopback by default (consumer.metrics_addr): counters and queue names are nobody else's
    business unless the operator opens them up ("0.0.0.0", "::", or one interface's address).
    `service`: a ConsumerService; its figures() and healthy() are all the endpoint uses."""
    try:
        server = MetricsServer((addr, port), ServiceCollector(service.figures, depths), service.healthy,
                               pages)
    except (OSError, OverflowError) as e:
        why = getattr(e, "strerror", None) or str(e)
        raise errors.ConfigError(f"consumer.metrics_addr {addr!r} port {port}: cannot listen: {why}") from None
    threading.Thread(target=server.serve_forever, name="notifyq-metrics", daemon=True).start()
    log.info("metrics endpoint listening addr=%s port=%d", addr, server.server_port)
    return server
