"""The `notifyq` command: a thin argparse layer over the library.

Every user error is one line on stderr and an exit code from errors.py; a traceback means a bug.
argparse, not click: it is in the standard library, and with only the given command's parser
built a consumer starts with fewer instructions (benchmarks/HISTORY.md, the start case).

Each command imports what it runs, inside its function: a command's machinery (the store with
the driver and tenacity, the producer, the consumer) weighs more than the whole of `notifyq
--help` (python -X importtime), and the other commands never pay for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from notifyq import config as config_mod
from notifyq import errors
from notifyq.config import values
from notifyq.run import args, cli_jobs, cli_options, echo

log = logging.getLogger("notifyq.cli")


@dataclasses.dataclass(frozen=True)
class Host:
    """An app that runs notifyq's commands as its own (contrib.django's `manage.py notifyq`):
    `load(overrides=, warn=, config_path=)` builds the config in place of config.load (the
    database from the app's settings), and consume_options go to every ConsumeOptions."""

    load: Callable[..., config_mod.Config] | None = None
    consume_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    no_dsn: str = ""  # set: --dsn is refused with this reason


class Context:
    """What the global options resolve to; commands load the config through it.

    The global options are accepted before and after the command name (`notifyq --dsn X status`
    and `notifyq status --dsn X`): parse() keeps the later one (add_global_options)."""

    def __init__(self, a: argparse.Namespace, host: Host | None = None) -> None:
        self.host = host or Host()
        self.flags: dict[str, Any] = {}
        if a.dsn is not None and self.host.no_dsn:
            raise errors.ConfigError(f"--dsn: {self.host.no_dsn}")
        if self.host.load is not None:
            pass  # the database is the app's
        elif a.dsn is not None:
            if _dsn_has_password(a.dsn):
                _warn("a password in --dsn is visible to every user in the process list: "
                      "use NOTIFYQ_PASSWORD, password_file or a systemd credential")
            self.flags["dsn"] = a.dsn
        elif os.environ.get("NOTIFYQ_DSN"):  # the demo reads the DSN from here
            self.flags["dsn"] = os.environ["NOTIFYQ_DSN"]
        log = {key: value for key, value in (("level", a.log_level), ("format", a.log_format)) if value}
        if log:
            self.flags["log"] = log
        # Absolute: a daemon re-reads it on SIGHUP after chdir("/"). (Its argparse type checked it.)
        self.config_path = os.path.abspath(a.config_file) if a.config_file else None
        self._config: config_mod.Config | None = None

    def config(self, **extra: Any) -> config_mod.Config:
        if self._config is None or extra:
            overrides = dict(self.flags)
            for key, value in extra.items():
                if isinstance(value, dict):
                    overrides[key] = {**overrides.get(key, {}), **value}
                else:
                    overrides[key] = value
            load = self.host.load or config_mod.load
            self._config = load(overrides=overrides, warn=_warn, config_path=self.config_path)
        return self._config

    def oneshot_config(self) -> config_mod.Config:
        """The config of a command that answers and exits, its logging set up: warnings only
        unless --log-level asks for more (log.level in the config file is the daemons')."""
        cfg = self.config()
        level = self.flags.get("log", {}).get("level") or "warning"
        cfg = dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, level=level))
        _setup_logging(cfg)
        return cfg

    def reload(self) -> config_mod.Config:
        self._config = None
        return self.config()


def _dsn_has_password(dsn: str) -> bool:
    try:
        return config_mod.DSN.parse(dsn).password is not None
    except errors.ConfigError:
        return False  # the config load reports it


def _warn(message: str) -> None:
    echo(f"notifyq: warning: {message}", err=True)


def _setup_logging(cfg: config_mod.Config, log_file: str | None = None, level: str | None = None) -> None:
    from notifyq import logs

    logs.setup_logging(level=level or cfg.log.level, fmt=cfg.log.format,
                       log_file=log_file or cfg.log.file or None, use_syslog=cfg.log.syslog)


# ------------------------------------------------------------------ init / config / status

def init(obj: Context, a: argparse.Namespace) -> None:
    from notifyq.sharding import servers
    from notifyq.store import schema

    cfg = obj.oneshot_config()
    if a.grant_user:
        echo("\n".join(schema.grants(cfg.dsn.database, a.grant_user)))
        return
    for shard, dsn in servers.dsns(cfg).items():  # with [shards]: every shard, each its own schema
        where = f" on shard {shard}" if shard else ""
        before, after = schema.init(dsn, cfg.connect_retry(oneshot=True), retry_log_level=logging.DEBUG)
        if before == after:
            echo(f"schema of {dsn.database}{where} is up to date (version {after})")
        else:
            echo(f"schema of {dsn.database}{where}: version {before or 'none'} -> {after}")


def show_config(obj: Context, a: argparse.Namespace) -> None:
    data = obj.config().masked_dict()
    if a.as_json:
        echo(json.dumps(data, indent=2, default=str))
        return
    for key in ("dsn", "password_file", "connect_retry_s", "sources"):
        if key in data:
            echo(f"{key} = {json.dumps(data[key])}")
    for section in ("shards", "log", "wakeup", "consumer", "producer", "defaults"):
        if section not in data:
            continue
        echo(f"\n[{section}]")
        for k, v in data[section].items():
            echo(f"{k} = {json.dumps(v)}")
    for name, section in data["queue"].items():
        echo(f"\n[queue.{name}]")
        for k, v in section.items():
            echo(f"{k} = {json.dumps(v)}")


def status(obj: Context, a: argparse.Namespace) -> None:
    from notifyq.sharding import servers
    from notifyq.sharding import status as status_mod

    cfg = obj.oneshot_config()
    queue = a.queue
    if queue is not None:  # `-q ''` is a bad name, not "all queues"
        config_mod.validate_queue_name(queue)
    with servers.Servers.oneshot(cfg, "status") as every:
        data, down = status_mod.collect(every, queue, a.locks)
    echo(json.dumps(data, indent=2) if a.as_json else status_mod.render(data))
    servers.fail_if_down(down)  # the shards that answered are shown; the exit code says not all did


def pause(obj: Context, a: argparse.Namespace) -> None:
    _set_paused(obj, a.queue, True)


def resume(obj: Context, a: argparse.Namespace) -> None:
    _set_paused(obj, a.queue, False)


def _set_paused(obj: Context, queue: str, paused: bool) -> None:
    from notifyq.ops import admin
    from notifyq.sharding import servers

    cfg = obj.oneshot_config()
    config_mod.validate_queue_name(queue)
    with servers.Servers.oneshot(cfg, "admin") as every:
        answers, down = every.each(lambda session: admin.set_paused(session, queue, paused), every.shards_of(queue))
    servers.fail_if_down(down)  # every shard of the queue, or an error naming the ones not reached
    created = all(answers.values())
    state = "paused" if paused else "resumed"
    if created:  # a typo would otherwise pause nothing, in silence
        state = f"created {'paused' if paused else 'running'} (no job or consumer had used this queue yet)"
    echo(f"{queue}: {state}")


# ------------------------------------------------------------------ produce

def produce(obj: Context, a: argparse.Namespace) -> None:
    from notifyq.run import runner

    cfg = obj.config()
    queue = _queue_or_profile(cfg, a.queue, a.profile)
    config_mod.validate_queue_name(queue)
    when = _parse_at(a.run_at)
    if a.dedup_key and len(a.payloads) != 1:
        raise args.UsageError("--dedup-key needs exactly one JSON argument", "notifyq produce")
    if a.dedup == "replace" and not a.dedup_key:
        raise args.UsageError("--dedup replace needs --dedup-key", "notifyq produce")
    # Checked once here: in a stream, a bad key would otherwise reject every line
    key = None if a.key is None else values.job_key("--key", a.key)
    if a.payloads:
        cfg = obj.oneshot_config()
        runner.produce_args(cfg, queue, tuple(a.payloads), priority=a.priority, delay=a.delay, run_at=when,
                            max_attempts=a.max_attempts, dedup_key=a.dedup_key, key=key, dedup=a.dedup,
                            print_ids=a.print_ids is not False)
        return
    if _interactive_stream(a.daemon or a.follow or bool(a.log_file)):
        cfg = obj.oneshot_config()
    runner.produce_stream(cfg, queue, priority=a.priority, delay=a.delay, run_at=when, key=key,
                          input_path=a.input_path, follow=a.follow, reject_file=a.reject_file,
                          print_ids=bool(a.print_ids), daemon=a.daemon, pidfile=a.pidfile,
                          log_file=a.log_file, reload=obj.reload)


def _queue_or_profile(cfg: config_mod.Config, queue: str | None, profile: str | None) -> str:
    if profile:
        _check_profile(cfg, profile)
        if queue not in (None, profile):
            raise args.UsageError("give -q QUEUE or --profile NAME, not both", "notifyq produce")
        queue = profile
    if queue is None:
        raise args.UsageError("missing option -q QUEUE (or --profile NAME)", "notifyq produce")
    return queue


def _check_profile(cfg: config_mod.Config, profile: str) -> None:
    config_mod.validate_queue_name(profile)
    if profile not in cfg.queues:
        raise errors.ConfigError(f"--profile {profile}: no [queue.{profile}] section in the config")


def _interactive_stream(service: bool) -> bool:
    """`seq 10 | notifyq produce -q q` ends at EOF like any one-shot command, and is as quiet;
    a service (--daemon, --follow, --log-file, or stderr on the journal) logs at log.level."""
    from notifyq import logs

    return not service and not logs.under_journald(sys.stderr)


def _parse_at(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise errors.InputError(f"--at {values.shown(text)}: expected an ISO-8601 time like "
                                "2026-01-31T08:00:00+00:00") from None
    return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


# ------------------------------------------------------------------ consume

def consume(obj: Context, a: argparse.Namespace) -> None:
    from notifyq.consume.service import ConsumeOptions
    from notifyq.run import runner

    if a.code_version is not None:  # a flag, so a reload keeps it (it wins over the files)
        obj.flags["consumer"] = {**obj.flags.get("consumer", {}), "version": a.code_version}
    cfg = obj.reload() if a.code_version is not None else obj.config()
    queues = tuple(a.queues)
    if a.profile:
        _check_profile(cfg, a.profile)
        queues = (*queues, a.profile) if a.profile not in queues else queues
    if a.handler and a.command:
        raise args.UsageError("give --handler or --command, not both", "notifyq consume")
    if a.tasks and (a.handler or a.command):
        raise args.UsageError("give --tasks or --handler/--command, not both", "notifyq consume")
    if not queues:
        raise args.UsageError("missing option -q QUEUE (or --profile NAME)", "notifyq consume")
    options = ConsumeOptions(queues=tuple(dict.fromkeys(queues)), handler=a.handler, command=a.command,
                             per_batch=a.per_batch, workers=a.workers, batch_size=a.batch_size,
                             exit_when_empty=a.exit_when_empty, max_jobs=a.max_jobs,
                             tasks=tuple(dict.fromkeys(a.tasks)), concurrency=a.concurrency,
                             **obj.host.consume_options)
    sys.exit(runner.consume(obj, options, daemon=a.daemon, pidfile=a.pidfile, log_file=a.log_file))


def web(obj: Context, a: argparse.Namespace) -> None:
    from notifyq.web import auth, server

    token = auth.load_token(a.token_file)  # a file or $NOTIFYQ_WEB_TOKEN, never a flag's value
    cfg = obj.config()
    _setup_logging(cfg)
    sys.exit(server.run(cfg, a.port, a.bind, token))


def demo(obj: Context, a: argparse.Namespace) -> None:
    from notifyq import logs
    from notifyq.run import demo as demo_mod

    logs.setup_logging(level=obj.flags.get("log", {}).get("level") or "warning")  # the progress is the output
    sys.exit(demo_mod.run(obj.flags.get("dsn"), producers=a.producers, consumers=a.consumers,
                          rate=a.rate, duration=a.duration, keep=a.keep))


# name -> (what runs it, its help: the first line is its summary, what adds its options)
Commands = dict[str, tuple[Callable[[Context, argparse.Namespace], None], str,
                           Callable[[argparse.ArgumentParser], None]]]
COMMANDS: Commands = {
    "init": (init, "Create the database schema, or upgrade it. Safe to run again and on many hosts at once.",
             cli_options.init_options),
    "config": (show_config, "Print the effective configuration (the password is masked).", cli_options.config_options),
    "status": (status, "Per queue: ready, delayed, claimed, dead, oldest ready age; and the live consumers.",
               cli_options.status_options),
    "pause": (pause, "Stop consumers claiming from QUEUE (they go back to waiting, without polling).",
              cli_options.queue_option),
    "resume": (resume, "Let consumers claim from QUEUE again; the watcher wakes at once.", cli_options.queue_option),
    "produce": (produce, "Enqueue JSON payloads given as arguments, or JSON lines from stdin until EOF.",
                cli_options.produce_options),
    "consume": (consume, "Claim and run jobs until stopped (SIGTERM/SIGINT drain gracefully; SIGHUP reloads).",
                cli_options.consume_options),
    "web": (web, "Status pages in a browser: queues, consumers, jobs, dead jobs, periodic (needs notifyq[web]).\n\n"
            "Read-only unless an actions token is given (--actions-token-file or NOTIFYQ_WEB_TOKEN).", cli_options.web_options),
    "demo": (demo, "Live demo: producers and consumers against a local (or private) MariaDB.\n\n"
             "It works in a new database of its own (notifyq_demo_<random>) on that server, never in the\n"
             "database of --dsn, and drops it at the end unless --keep.", cli_options.demo_options),
}
GROUPS = {"jobs": ("Inspect, retry, cancel and purge jobs.", cli_jobs.COMMANDS)}


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line: global options, the command (`jobs` takes one more), its options."""
    names = {**{n: doc for n, (_, doc, _) in COMMANDS.items()}, **{n: doc for n, (doc, _) in GROUPS.items()}}
    top = cli_options.group_parser("notifyq", cli_options.DESCRIPTION, names, top=True)
    a = top.parse_args(args.dash_values_attached(top, argv, until_command=True))
    prog, commands = f"notifyq {a.command_name}", COMMANDS
    if a.command_name in GROUPS:
        doc, commands = GROUPS[a.command_name]
        group = cli_options.group_parser(prog, doc, {n: d for n, (_, d, _) in commands.items()}, top=False)
        group.parse_args(args.dash_values_attached(group, a.rest, until_command=True), namespace=a)
        prog = f"{prog} {a.command_name}"
    run, doc, add_options = commands[a.command_name]
    parser = args.make_parser(prog, doc)
    add_options(parser)
    cli_options.add_global_options(parser, top=False)
    parser.parse_intermixed_args(args.dash_values_attached(parser, a.rest), namespace=a)
    a.run = run
    return a


def _one_line(message: str) -> str:
    """A message holding what the user typed stays one line, whatever they typed."""
    return message.translate({i: f"\\x{i:02x}" for i in range(32)})


def main(argv: list[str] | None = None, host: Host | None = None) -> None:
    """Entry point: map errors to one line and an exit code."""
    try:
        a = parse(sys.argv[1:] if argv is None else list(argv))
        a.run(Context(a, host), a)
    except args.UsageError as e:
        echo(f"notifyq: error: {_one_line(str(e))} (see '{e.prog} --help')", err=True)
        sys.exit(errors.EXIT_USAGE)
    except errors.NotifyqError as e:
        echo(f"notifyq: error: {e}", err=True)
        sys.exit(e.exit_code)
    except BrokenPipeError:  # before Exception, which it is: `notifyq status | head -1`
        # The reader has what it wanted. Python would fail again flushing stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(errors.EXIT_OK)
    except Exception as e:
        from notifyq.store import driver  # only here: `notifyq --help` never loads the driver

        if not isinstance(e, driver.DriverError):
            raise
        echo(f"notifyq: error: database: {driver.describe(e)}", err=True)
        sys.exit(errors.EXIT_DB)
    except KeyboardInterrupt:
        sys.exit(errors.EXIT_KILLED)
