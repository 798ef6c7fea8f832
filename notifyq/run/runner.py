"""The long-running commands: process set-up (daemon mode, signals, logging) around the library.

Order matters under python-daemon: logging first (DaemonContext keeps its files open across the
fork, so even the pidfile's "stale" warning is a proper log line), then the fork and the pidfile,
then signals, then the database: a connection opened before the fork would be closed by
DaemonContext (2006).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import stat
import sys
from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from notifyq import errors, logs
from notifyq.config import Config, check_sections_kept
from notifyq.consume.service import ConsumeOptions
from notifyq.sharding.service import ConsumerService
from notifyq.run import echo

if TYPE_CHECKING:
    from notifyq.produce.lines import LineSource
    from notifyq.sharding.producer import Producer

log = logging.getLogger("notifyq.runner")

# What only some commands need is imported inside them: the producer's modules are no
# consumer's, run/daemon.py (python-daemon, sd_notify) no one-shot command's, and the metrics
# endpoint and the status pages only a consumer configured to serve them.


def produce_args(cfg: Config, queue: str, payloads: tuple[str, ...], *, priority: int, delay: float,
                 run_at: dt.datetime | None, max_attempts: int | None, dedup_key: str | None,
                 print_ids: bool, key: str | None = None, dedup: str = "keep") -> None:
    """All arguments are checked before anything is written: one bad one, nothing enqueued."""
    decoded = []
    for i, text in enumerate(payloads, 1):
        try:
            decoded.append(json.loads(text))
        except ValueError as e:
            raise errors.InputError(f"argument {i} is not valid JSON: {e}") from None
        except RecursionError:  # [[[[... 10,000 deep
            raise errors.InputError(f"argument {i} is not valid JSON: nested too deeply") from None
    if dedup_key and len(decoded) != 1:
        raise errors.InputError("--dedup-key needs exactly one JSON argument")
    from notifyq.sharding.producer import Producer, require_schema

    require_schema(cfg, queue, oneshot=True)
    # A command: its put retries for connect_retry_s (a one-shot command's), not the library's
    # producer.connect_retry_s
    with Producer(queue, cfg, retry_s=cfg.connect_retry(oneshot=True)) as producer:
        if dedup_key:
            ids = [producer.put(decoded[0], priority=priority, delay=delay, run_at=run_at,
                                max_attempts=max_attempts, dedup_key=dedup_key, key=key, dedup=dedup)]
        else:
            ids = producer.put_many(decoded, priority=priority, delay=delay, run_at=run_at,
                                    max_attempts=max_attempts, key=key)
    if print_ids:
        echo("\n".join(map(str, ids)))
    else:
        echo(f"enqueued {len(ids)}")


# ------------------------------------------------------------------ process set-up


def _setup_process(stack: ExitStack, cfg: Config, *, daemon: bool, pidfile: str | None,
                   log_file: str | None) -> None:
    """Logging, then (--daemon) detach and take the pidfile, or (foreground) just the pidfile.

    daemon_context() refuses in the parent when another instance holds the pidfile, so that
    error reaches the operator's terminal; DaemonContext takes the file after the fork."""
    from notifyq.run import daemon as daemon_mod

    path, use_syslog = log_file or cfg.log.file or None, cfg.log.syslog
    if daemon:
        if path is None and not use_syslog:
            if not _is_socket("/dev/log"):
                raise errors.ConfigError("--daemon needs somewhere to log: --log-file PATH, log.file, "
                                         "or log.syslog = true (there is no /dev/log here)")
            use_syslog = True  # a detached process's stderr is /dev/null
        path = os.path.abspath(path) if path else None
        if os.environ.get("NOTIFYQ_CONFIG"):  # reload re-reads it after DaemonContext's chdir("/")
            os.environ["NOTIFYQ_CONFIG"] = os.path.abspath(os.environ["NOTIFYQ_CONFIG"])
    logs.setup_logging(level=cfg.log.level, fmt=cfg.log.format, log_file=path, use_syslog=use_syslog)
    pid = daemon_mod.PidFile(pidfile) if pidfile else None
    if daemon:
        stack.enter_context(daemon_mod.daemon_context(pid, path))
    elif pid is not None:
        stack.enter_context(pid)  # --pidfile alone: a single-instance guard in the foreground


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


# What a SIGHUP cannot change in a running process: (what to call it, how to read it). The
# consumer service keeps, and reports, a changed dsn, connect_retry_s and wakeup.use_locks itself.
_FIXED = [("log.format", lambda c: c.log.format),
          ("log.file", lambda c: c.log.file), ("log.syslog", lambda c: c.log.syslog),
          ("wakeup.use_locks", lambda c: c.wakeup.use_locks)]


def _warn_fixed(old: Config, new: Config, extra: list[tuple[str, Callable[[Config], Any]]] = ()) -> None:
    for name, get in [*_FIXED, *extra]:
        if get(old) != get(new):
            log.warning("reload: %s changed; restart the service to apply it", name)


# ------------------------------------------------------------------ produce from a stream


# What a stream's producer reads once, at its start (its sessions' connect retry, the Waker's
# choice of wake-up), besides _FIXED: a reload that changes one says it needs a restart. The
# other [wakeup] keys are the consumers' (their polling): a producer reads none of them.
_PRODUCER_FIXED = [("dsn", lambda c: c.dsn), ("shards", lambda c: c.shards),
                   ("connect_retry_s", lambda c: c.connect_retry(oneshot=False)),
                   ("wakeup.instant_wake", lambda c: c.wakeup.instant_wake)]


def _kept_by_producer(old: Config, new: Config) -> Config:
    """`new` with what only a restart changes in a stream's producer kept as it runs."""
    wakeup = dataclasses.replace(new.wakeup, instant_wake=old.wakeup.instant_wake, use_locks=old.wakeup.use_locks)
    return dataclasses.replace(new, dsn=old.dsn, shards=old.shards, connect_retry_s=old.connect_retry_s,
                               wakeup=wakeup)


def max_line_bytes(cfg: Config) -> int:
    """Where a stream cuts a line (then rejected): past what any payload within
    producer.max_payload_bytes can take, as escapes and spaces widen a line."""
    return max(65536, 8 * cfg.producer.max_payload_bytes)


def _is_utf8(text: str) -> bool:
    return not any("\udc80" <= ch <= "\udcff" for ch in text)


class _Stream:
    """One `notifyq produce` stream: live figures for STATUS=, the reject report, SIGHUP."""

    def __init__(self, producer: Producer, source: LineSource, notifier: Any, signals: Any,
                 reload: Callable[[], Config] | None, rejects: Any, print_ids: bool, quiet: bool):
        self.producer, self.source, self.notifier, self.signals = producer, source, notifier, signals
        self._reload, self.rejects, self.print_ids, self.quiet = reload, rejects, print_ids, quiet
        self.enqueued = self.rejected = self.batches = 0
        # A refused reload, said in every STATUS= until one applies (as a consumer's status_line)
        self.reload_failed = False

    def status(self) -> str:
        return (f"queue={self.producer.queue} enqueued={self.enqueued} rejected={self.rejected} "
                f"batches={self.batches}" + (" reload=failed" if self.reload_failed else ""))

    def on_ids(self, ids: list[int]) -> None:
        self.enqueued += len(ids)
        self.batches += 1
        if self.print_ids:
            echo("\n".join(map(str, ids)))
        log.debug("batch enqueued queue=%s n=%d first_job=%d last_job=%d", self.producer.queue,
                  len(ids), ids[0], ids[-1])
        if log.isEnabledFor(logging.DEBUG):
            for job_id in ids:
                log.debug("job enqueued queue=%s job=%d", self.producer.queue, job_id)
        self.notifier.status(self.status())

    def on_reject(self, number: int, text: str, why: str) -> None:
        self.rejected += 1
        if number in self.source.cut:
            why = f"line longer than {self.source.max_line_bytes} bytes (cut there)"
            text = text.removesuffix("\0")
        elif not _is_utf8(text):
            why = "not valid UTF-8"
        if self.quiet:  # stderr is the log file or the journal: one key=value line per event
            log.warning("rejected line queue=%s line=%d reason=%r", self.producer.queue, number, why)
        else:
            echo(f"notifyq: rejected line {number}: {why}", err=True)
        if self.rejects is not None:
            self.rejects.write(text + "\n")
            self.rejects.flush()
        self.notifier.status(self.status())

    def between_reads(self) -> None:
        """Runs on the reader thread, at least every POLL_S while the input is quiet."""
        if not self.signals.reload_requested.is_set():
            return
        self.signals.reload_requested.clear()
        if self._reload is None:
            return

        self.notifier.reloading("reloading config")
        old = self.producer.config
        try:
            new = self._reload()
            # As a consumer's: the queue's section gone would put jobs with the defaults'
            # max_attempts (and, sharded, place them by its name's hash), in silence
            check_sections_kept(old, new, [self.producer.queue])
        except Exception as e:  # on the reader thread: a failed reload must not end the stream
            log.error("reload failed, keeping the old config error=%s", e,
                      exc_info=not isinstance(e, errors.NotifyqError))
            self.reload_failed = True
            self.notifier.ready(self.status())
            return
        _warn_fixed(old, new, _PRODUCER_FIXED)
        new = _kept_by_producer(old, new)
        logs.set_level(new.log.level)
        # Read per batch and per row: the next batch uses them (stream._batches).
        self.producer.reload(new)
        # Here, on the reader thread that cuts lines: a raised payload limit lets longer lines in
        self.source.max_line_bytes = max_line_bytes(new)
        self.reload_failed = False
        log.info("reloaded config sources=%s batch_lines=%d batch_wait_s=%g max_payload_bytes=%d log_level=%s",
                 ",".join(new.sources), new.producer.batch_lines, new.producer.batch_wait_s,
                 new.producer.max_payload_bytes, new.log.level)
        self.notifier.ready(self.status())


def produce_stream(cfg: Config, queue: str, *, priority: int, delay: float, run_at: dt.datetime | None,
                   key: str | None = None,
                   input_path: str | None, follow: bool, reject_file: str | None, print_ids: bool,
                   daemon: bool, pidfile: str | None, log_file: str | None,
                   reload: Callable[[], Config] | None = None) -> None:
    """`notifyq produce` without arguments: a long-running producer that rings the bell.

    Exit 4 when a stream that ended (EOF) had rejected lines; a stream stopped by a signal
    exits 0 (a service's stop is no failure; each reject was reported when it happened)."""
    from notifyq.produce.lines import LineSource
    from notifyq.produce.stream import produce_lines
    from notifyq.run.stream_watch import StreamStallWatch
    from notifyq.sharding.producer import Producer, require_schema
    from notifyq.run import daemon as daemon_mod

    if daemon and input_path is None:
        raise errors.ConfigError("--daemon needs --input (stdin is closed when detached)")
    # Resolved now: the daemon runs in "/". A detached producer has nobody to restart it at
    # its input's EOF, so it follows.
    input_path = os.path.abspath(input_path) if input_path else None
    reject_file = os.path.abspath(reject_file) if reject_file else None
    follow = follow or daemon
    with ExitStack() as stack:
        _setup_process(stack, cfg, daemon=daemon, pidfile=pidfile, log_file=log_file)
        signals = stack.enter_context(daemon_mod.StopSignals())
        notifier = daemon_mod.SystemdNotifier()
        source = stack.enter_context(LineSource(input_path, follow, max_line_bytes(cfg)))
        require_schema(cfg, queue, oneshot=False)
        rejects = None
        if reject_file:
            rejects = stack.enter_context(open(reject_file, "a", encoding="utf-8", errors="surrogateescape"))
        # A daemon: a put retries for connect_retry_s (a daemon's), not the library's
        producer = stack.enter_context(Producer(queue, cfg, ring=True, retry_s=cfg.connect_retry(oneshot=False),
                                                retry_setting="connect_retry_s"))
        # A put whose reply is not coming (a frozen server) is ended, not waited for a minute
        stack.enter_context(StreamStallWatch(producer.sessions))
        quiet = daemon or logs.under_journald(sys.stderr)  # reports go through the log then
        stream = _Stream(producer, source, notifier, signals, reload, rejects, print_ids, quiet)
        notifier.ready(stream.status())
        log.info("producer started queue=%s input=%s follow=%s", queue, input_path or "stdin", follow)
        try:
            stats = produce_lines(producer, source.lines(signals.stop_requested, stream.between_reads),
                                  on_ids=stream.on_ids, on_reject=stream.on_reject, more=source.ready,
                                  priority=priority, delay=delay, run_at=run_at, key=key)
        except errors.DatabaseError:
            # The server is gone, or does not answer: the way out says nothing to it (releasing
            # the bell's lock would wait out a read timeout, a minute, on a frozen server)
            producer.drop()
            raise
        stopped = signals.stop_requested.is_set()
        notifier.stopping(stream.status())
        log.info("producer finished queue=%s lines=%d enqueued=%d rejected=%d batches=%d reason=%s",
                 queue, stats.lines, stats.enqueued, stats.rejected, stats.batches,
                 "stop" if stopped else "eof")
        if not quiet and (not print_ids or stats.rejected):
            # With --print-ids stdout is the ids: the counts go to stderr, when a line was rejected.
            echo(f"enqueued {stats.enqueued}" + (f", rejected {stats.rejected}" if stats.rejected else ""),
                 err=print_ids)
        if stats.rejected and not stopped:
            raise SystemExit(errors.EXIT_INPUT)


# ------------------------------------------------------------------ consume


def consume(ctx: Any, options: ConsumeOptions, *, daemon: bool, pidfile: str | None,
            log_file: str | None) -> int:
    from notifyq.consume import commands
    from notifyq.run import daemon as daemon_mod

    cfg = ctx.config()
    service = ConsumerService(cfg, options)  # validates queue names before any fork
    with ExitStack() as stack:
        _setup_process(stack, cfg, daemon=daemon, pidfile=pidfile, log_file=log_file)
        # A second stop exits at once: the commands' process groups are killed first, or they
        # would run on while the reaper gives their jobs to another consumer.
        signals = stack.enter_context(daemon_mod.StopSignals(before_exit_now=commands.kill_all_groups))
        service.notifier = daemon_mod.SystemdNotifier()
        if cfg.consumer.metrics_port:
            from notifyq.ops import metrics
            from notifyq.sharding.servers import QueueDepths

            pages = None
            if cfg.consumer.metrics_pages:  # the status pages, read-only, beside the metrics
                from notifyq.web import server as web_server

                pages = web_server.mount(cfg, cfg.consumer.metrics_addr)
            metrics.serve(service, QueueDepths(cfg), cfg.consumer.metrics_port, cfg.consumer.metrics_addr, pages)

        def reloaded(old: Config, new: Config) -> None:
            """Once the service applied a reload (batch sizes, backoff, wakeup timing, handlers):
            what it cannot change says so, and the log level follows."""
            fixed = [("consumer.metrics_port", lambda c: c.consumer.metrics_port),
                     ("consumer.metrics_addr", lambda c: c.consumer.metrics_addr),
                     ("consumer.metrics_pages", lambda c: c.consumer.metrics_pages),
                     ("consumer.version", lambda c: c.consumer.version)]  # the code's: a restart runs new code
            if not options.workers:
                fixed += [(f"queue.{q}.workers", lambda c, q=q: c.queue(q).workers) for q in options.queues]
            _warn_fixed(old, new, fixed)
            logs.set_level(new.log.level)

        service.on_reloaded = reloaded
        code = service.run(signals.stop_requested, signals.reload_requested, ctx.reload)
        if code and service.failure is not None:
            # The last line on stderr, as every command's error is (the log said it on its own
            # terms already): what a script or an operator reading `systemctl status` looks for
            echo(f"notifyq: error: {service.failure}", err=True)
        return code
