"""The long-running commands: process set-up (daemon mode, signals, logging) around the library.

Order matters under python-daemon: fork first, then the pidfile, then logging, then the
database: a connection opened before the fork would be closed by DaemonContext (2006).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import click

from notifyq import errors, schema
from notifyq.config import Config
from notifyq.db import Session
from notifyq.producer import Producer, produce_lines
from notifyq.service import ConsumeOptions, ConsumerService

log = logging.getLogger("notifyq.runner")


def _require_schema(cfg: Config) -> None:
    session = Session(cfg.dsn, retry_s=cfg.connect_retry_s, name="startup")
    try:
        schema.require_current(session)
    finally:
        session.close()


def produce_args(cfg: Config, queue: str, payloads: tuple[str, ...], *, priority: int, delay: float,
                 run_at: dt.datetime | None, max_attempts: int | None, dedup_key: str | None,
                 print_ids: bool) -> None:
    """All arguments are checked before anything is written: one bad one, nothing enqueued."""
    decoded = []
    for i, text in enumerate(payloads, 1):
        try:
            decoded.append(json.loads(text))
        except ValueError as e:
            raise errors.InputError(f"argument {i} is not valid JSON: {e}") from None
    if dedup_key and len(decoded) != 1:
        raise errors.InputError("--dedup-key needs exactly one JSON argument")
    _require_schema(cfg)
    with Producer(queue, cfg) as producer:
        if dedup_key:
            ids = [producer.put(decoded[0], priority=priority, delay=delay, run_at=run_at,
                                max_attempts=max_attempts, dedup_key=dedup_key)]
        else:
            ids = producer.put_many(decoded, priority=priority, delay=delay, run_at=run_at,
                                    max_attempts=max_attempts)
    if print_ids:
        click.echo("\n".join(map(str, ids)))
    else:
        click.echo(f"enqueued {len(ids)}")


def _daemonize(stack: ExitStack, pidfile: str | None, log_file: str | None) -> None:
    from notifyq import daemon

    pid = daemon.PidFile(pidfile) if pidfile else None
    if pid is not None:
        pid.check()  # refuse before forking, so the error reaches the terminal
    stack.enter_context(daemon.daemon_context(pid, log_file))
    if pid is not None:
        stack.enter_context(pid)


def _lines(input_path: str | None, follow: bool, stop: threading.Event) -> Iterator[str]:
    if input_path is None:
        yield from sys.stdin
        return
    while not stop.is_set():
        try:
            with open(input_path, encoding="utf-8", errors="replace") as f:  # blocks for a FIFO writer
                yield from f
        except OSError as e:
            raise errors.InputError(f"--input {input_path}: {e.strerror}") from None
        if not follow:
            return


def produce_stream(cfg: Config, queue: str, *, priority: int, delay: float, run_at: dt.datetime | None,
                   input_path: str | None, follow: bool, reject_file: str | None, print_ids: bool,
                   daemon: bool, pidfile: str | None, log_file: str | None) -> None:
    """`notifyq produce` without arguments: a long-running producer that rings the bell."""
    from notifyq import daemon as daemon_mod
    from notifyq import logs

    with ExitStack() as stack:
        if daemon:
            if input_path is None:
                raise errors.ConfigError("--daemon needs --input (stdin is closed when detached)")
            _daemonize(stack, pidfile, log_file)
        logs.setup_logging(level=cfg.log.level, fmt=cfg.log.format,
                           log_file=log_file or cfg.log.file or None, use_syslog=cfg.log.syslog)
        signals = stack.enter_context(daemon_mod.StopSignals())
        notifier = daemon_mod.SystemdNotifier()
        _require_schema(cfg)
        rejects = stack.enter_context(open(reject_file, "a", encoding="utf-8")) if reject_file else None
        producer = stack.enter_context(Producer(queue, cfg, ring=True))
        notifier.ready(f"producing to {queue}")
        counts = {"enqueued": 0}

        def on_ids(ids: list[int]) -> None:
            counts["enqueued"] += len(ids)
            if print_ids:
                click.echo("\n".join(map(str, ids)))
            notifier.status(f"queue={queue} enqueued={counts['enqueued']}")

        def on_reject(number: int, text: str, why: str) -> None:
            click.echo(f"notifyq: rejected line {number}: {why}", err=True)
            if rejects is not None:
                rejects.write(text + "\n")
                rejects.flush()

        stats = produce_lines(producer, _lines(input_path, follow, signals.stop_requested),
                              on_ids=on_ids, on_reject=on_reject, priority=priority, delay=delay,
                              run_at=run_at, stop=signals.stop_requested)
        notifier.stopping()
        log.info("producer finished queue=%s lines=%d enqueued=%d rejected=%d", queue, stats.lines,
                 stats.enqueued, stats.rejected)
        if not print_ids:
            click.echo(f"enqueued {stats.enqueued}" + (f", rejected {stats.rejected}" if stats.rejected else ""))
        if stats.rejected:
            raise SystemExit(errors.EXIT_INPUT)


def consume(ctx: Any, options: ConsumeOptions, *, daemon: bool, pidfile: str | None,
            log_file: str | None) -> int:
    from notifyq import daemon as daemon_mod
    from notifyq import logs

    cfg = ctx.config()
    service = ConsumerService(cfg, options)  # validates queue names before any fork
    with ExitStack() as stack:
        if daemon:
            _daemonize(stack, pidfile, log_file)
        logs.setup_logging(level=cfg.log.level, fmt=cfg.log.format,
                           log_file=log_file or cfg.log.file or None, use_syslog=cfg.log.syslog)
        signals = stack.enter_context(daemon_mod.StopSignals())
        service.notifier = daemon_mod.SystemdNotifier()
        if cfg.consumer.metrics_port:
            from notifyq import metrics

            metrics.serve(service, cfg.consumer.metrics_port)

        def reload() -> Config:
            new = ctx.reload()
            logs.set_level(new.log.level)
            return new

        return service.run(signals.stop_requested, signals.reload_requested, reload)
