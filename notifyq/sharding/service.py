"""notifyq.ConsumerService: one-server ConsumerServices (notifyq/consume/service.py) under one
supervision loop. Without [shards], one, for the config's server, run as it runs alone; with
[shards], one per shard, each with the queues that live there, sharing the process's stop, its
--max-jobs budget and the loop.

What sharding adds to the one-server services: they start together (a shard down at start is
passed over and its workers retry, unless every shard is down), a worker whose shard is gone is
restarted after a pause instead of ending the process, one shard down keeps the watchdog fed,
and the status line names the shards that are down. It composes them through their public
methods; they know nothing of shards.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time

from notifyq import errors
from notifyq.config import Config, validate_queue_name
from notifyq.consume import service as one_server
from notifyq.consume.service import ConsumeOptions
from notifyq.consume.stats import Budget, Stats
from notifyq.consume.summary import Summary
from notifyq.consume.supervisor import Supervisor
from notifyq.consume.worker import Worker
from notifyq.figures import ServiceFigures
from notifyq.sharding.placement import Placement

log = logging.getLogger("notifyq.service")
PROBE_GRACE_S = 3.0  # at start, how long the other shards may take once one has answered
RESPAWN_S = 5.0  # a shard's failed worker (its server gone past the connect retry) starts again after this


class ConsumerService(Supervisor):
    """Run the jobs of `options.queues` in this process: what `notifyq consume` runs.

        service = notifyq.ConsumerService(config, notifyq.ConsumeOptions(queues=("emails",), function=send))
        stop = threading.Event()       # set it from a signal handler, or another thread
        service.run(stop)              # returns once stop is set and running jobs finished

    `run(stop)` registers the consumer, starts its workers (`workers` threads per queue), claims
    and runs jobs until `stop` is set, then stops claiming, gives back the jobs it has not started,
    lets running handlers finish within `consumer.shutdown_grace_s` and unregisters. It returns
    0, or the exit code of what stopped it. With `[shards]` in the config, it consumes the
    queues on every shard that holds them.
    """

    def __init__(self, config: Config, options: ConsumeOptions, notifier=None):
        if not options.queues:
            raise errors.ConfigError("no queue: pass -q QUEUE (or --profile NAME)")
        for q in options.queues:
            validate_queue_name(q)
        self.config = config
        self.options = options
        self.notifier = notifier
        self.stop = threading.Event()
        self.budget = Budget(options.max_jobs)
        self.placement = Placement(config)
        self.summary = Summary(config.log.summary_s)
        self.sharded = bool(config.shards)  # else one service, for the one server: "" below
        # Per shard, the service of the queues whose jobs live there.
        self.services: dict[str, one_server.ConsumerService] = {}
        for shard in config.shard_names():
            mine = tuple(q for q in options.queues if shard in self.placement.shards_of(q))
            if mine:
                self.services[shard] = one_server.ConsumerService(
                    self._shard_config(config, shard), dataclasses.replace(options, queues=mine),
                    stop=self.stop, budget=self.budget, name=shard)
        # (shard, slot) of a worker its server's outage ended -> when to start it again
        self._respawn_at: dict[tuple[str, int], float] = {}

    def _shard_config(self, config: Config, shard: str) -> Config:
        """What a shard's service runs with: its dsn, and only the periodic entries of the queues
        whose home it is (a spread queue's ticks are enqueued once, on its home)."""
        if not self.sharded:
            return config
        homed = {q: e for q, e in config.periodic.items() if self.placement.home(q) == shard}
        return dataclasses.replace(config.on_shard(shard), periodic=homed)

    @property
    def workers(self) -> list[Worker]:
        return [w for service in self.services.values() for w in service.workers]

    def threads(self) -> list[threading.Thread]:
        return [t for service in self.services.values() for t in service.threads()]

    def every_stats(self) -> list[Stats]:
        return [s for service in self.services.values() for s in service.every_stats()]

    # -------------------------------------------------------- start

    def start(self, stop_requested: threading.Event | None = None) -> None:
        up = self._probe(stop_requested)
        if up is None:
            return  # stopped before any shard answered: nothing started, a clean exit
        n = 1
        for shard, service in self.services.items():
            n = service.start_workers(first=n, unchecked=None if shard in up else f"shard {shard}")
        if self.sharded:
            where = "shards=" + ",".join(f"{s}={self.config.shards[s].masked()}" for s in self.config.shard_names())
        else:
            where = f"database={self.config.dsn.masked()}"
        log.info("consumer started pid=%d queues=%s workers=%d %s", os.getpid(),
                 ",".join(self.options.queues), n - 1, where)

    def _probe(self, stop_requested: threading.Event | None) -> list[str] | None:
        """Every shard's schema checked at once; the shards that answer, or None when stopped.
        A shard down at start is logged and its workers retry; all of them down is an error.
        One server: its probe's answer, on this thread, as a service alone starts."""
        if not self.sharded:
            (only, service), = self.services.items()
            return [only] if service.probe(stop_requested) else None
        outcome: dict[str, BaseException | None] = {}

        def probe(shard: str) -> None:
            try:
                outcome[shard] = None if self.services[shard].probe(stop_requested) else \
                    errors.TransientDBError("stopped")
            except Exception as e:
                outcome[shard] = e

        names = list(self.services)
        threads = [threading.Thread(target=probe, args=(s,), name=f"notifyq-probe-{s}", daemon=True)
                   for s in names]
        for thread in threads:
            thread.start()
        # Once one shard answered, the others get PROBE_GRACE_S more: a shard that is down must
        # not hold back the start on the others for the whole connect retry.
        grace_until = None
        while any(t.is_alive() for t in threads):
            for thread in threads:
                thread.join(0.05)
            if grace_until is None and any(outcome.get(s, 1) is None for s in names):
                grace_until = time.monotonic() + PROBE_GRACE_S
            if grace_until is not None and time.monotonic() > grace_until:
                break
        if stop_requested is not None and stop_requested.is_set():
            if any(isinstance(e, errors.TransientDBError) for e in outcome.values()):
                return None
        failed = {s: outcome.get(s) or errors.TransientDBError("no answer yet") for s in names
                  if outcome.get(s, True) is not None}
        for e in failed.values():
            if not isinstance(e, errors.DatabaseError) or len(failed) == len(names):
                raise e
        for shard, e in failed.items():
            log.warning("shard down at start, its workers retry shard=%s error=%s", shard, e)
        return [s for s in names if s not in failed]

    # -------------------------------------------------------- supervision

    @property
    def restarting(self) -> bool:
        """Whether a worker its shard's outage ended is started again (else the error ends the
        process, as it does on one server, where systemd restarts it)."""
        return self.sharded and not self.options.exit_when_empty

    def failed(self) -> bool:
        """A worker's error ends the process, except its shard's server gone (restarted here)."""
        if not self.restarting:
            return any(w.error for w in self.workers) or self.gone() is not None
        return any(w.error is not None and not isinstance(w.error, errors.DatabaseError) for w in self.workers)

    def gone(self) -> errors.DatabaseError | None:
        """A server given up on (one_server.ConsumerService.gone); not one shard's of several,
        whose workers are restarted as the shard comes back."""
        if self.restarting:
            return None
        return next((e for e in (s.gone() for s in self.services.values()) if e is not None), None)

    def finished(self) -> bool:
        return all(not r.thread.is_alive() and not (self.restarting and service.lost(r))
                   for service in self.services.values() for r in service.running) and not self._respawn_at

    def turn(self) -> None:
        for shard, service in self.services.items():
            if self.restarting:
                self._restart_lost_workers(shard, service)
            try:  # one shard's server gone must not stop the others' ticks, nor the process
                service.turn()
            except errors.DatabaseError as e:
                if not self.sharded:
                    raise
                log.warning("periodic: shard unreachable shard=%s error=%s", shard, e)

    def _restart_lost_workers(self, shard: str, service: one_server.ConsumerService) -> None:
        """A worker whose shard's server is gone is started again after RESPAWN_S, while the
        other shards' go on."""
        now = time.monotonic()
        for i, r in enumerate(service.running):
            if not service.lost(r):
                continue
            due = self._respawn_at.setdefault((shard, i), now + RESPAWN_S)
            if now >= due:
                del self._respawn_at[(shard, i)]
                log.warning("shard down, restarting its worker shard=%s queue=%s worker=%s",
                            shard, r.worker.queue, r.worker.name)
                service.restart_worker(i)

    def healthy(self) -> bool:
        return all(service.healthy(outage_is_healthy=self.sharded) for service in self.services.values())

    def shards_down(self) -> list[str]:
        """Shards whose workers are all reconnecting or waiting to restart."""
        if not self.sharded:
            return []
        return sorted(shard for shard, service in self.services.items() if service.is_down())

    def status_line(self) -> str:
        down = self.shards_down()
        return self._status(f" shards_down={','.join(down)}" if down else "")

    def figures(self) -> ServiceFigures:
        parts = [service.figures() for service in self.services.values()]
        periodic: dict[str, dict[str, int]] = {}
        for part in parts:  # a queue's figures summed over its shards
            for queue, figures in part.periodic.items():
                mine = periodic.setdefault(queue, dict.fromkeys(figures, 0))
                for key, value in figures.items():
                    mine[key] += value
        return ServiceFigures(
            queues=tuple(dict.fromkeys(self.options.queues)),
            healthy=bool(self.workers) and self.healthy(),
            workers=[w for part in parts for w in part.workers],
            watchers=[w for part in parts for w in part.watchers], periodic=periodic,
            reclaimed=sum(part.reclaimed for part in parts), conflicts=sum(part.conflicts for part in parts),
            shards_of={q: self.placement.shards_of(q) for q in self.options.queues},
            reloads=self.reload_counts())  # this loop's: the shards' services never reload on their own

    def reload(self, new: Config) -> None:
        # Every shard's handlers made before any shard applies: one that cannot be refuses all
        made = {shard: service.reload_handlers(self._shard_config(new, shard))
                for shard, service in self.services.items()}
        placement = Placement(new)  # the same shards: queue shard = ... needs a restart
        self.config, self.placement = new, placement
        for shard, service in self.services.items():
            service.reload(self._shard_config(new, shard), made[shard])

    # -------------------------------------------------------- shutdown

    def end_handlers(self) -> None:
        for service in self.services.values():
            service.end_handlers()

    def shutdown(self, grace_s: float | None = None) -> None:
        grace = self.config.consumer.shutdown_grace_s if grace_s is None else grace_s
        deadline = time.monotonic() + grace  # from the stop: begin_shutdown may wait for a server
        if self.notifier:
            self.notifier.stopping(f"stopping: waiting up to {grace:g}s for running handlers")
        for service in self.services.values():
            service.begin_shutdown(deadline)
        for service in self.services.values():
            service.finish_shutdown(deadline)
        t = self.totals()
        log.info("consumer stopped claimed=%d done=%d failed=%d dead=%d given_back=%d lost_acks=%d cancelled=%d",
                 t.claimed, t.succeeded, t.failed, t.dead, t.given_back, t.lost_acks, t.cancelled)
