"""The `notifyq` command: a thin argparse layer over the library.

Every user error is one line on stderr and an exit code from errors.py; a traceback means a bug.
argparse, not click: it is in the standard library, and with only the given command's parser
built, a consumer process runs 9 % fewer instructions than it did on click (callgrind, the
start case of benchmarks/bench.py).
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
from notifyq import errors, values
from notifyq.run import args, cli_jobs, echo

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


# ------------------------------------------------------------------ value checks
# Flags go through the same checks as the config (notifyq.values): a bad value is a usage
# error (exit 2) in one line, named by its flag (argparse puts "argument --flag: " before it).

def _seconds(name: str, text: str) -> float:
    """Seconds, or a duration with a unit as --older-than takes: 90s, 5m, 2h, 7d, 2w."""
    try:
        number = float(text)
    except ValueError:
        number = values.duration_text(text)
        if number is None:
            raise errors.InputError(f"{values.shown(text)} is not a valid number of seconds "
                                    "(or a duration like 90s, 5m, 2h, 7d)") from None
    return values.seconds(name, number, positive=False)


def _not_empty(name: str, value: str) -> str:
    if not value.strip():
        raise errors.InputError(f"{name}: must not be empty")
    return value


# ------------------------------------------------------------------ global options

GLOBAL_HELP = {
    "dsn": "mysql://user[:password]@host[:port][/database][?unix_socket=PATH&ssl_ca=FILE]; default "
           f"{config_mod.DEFAULT_DSN} (no database named: {config_mod.DEFAULT_DATABASE}); "
           "env NOTIFYQ_DSN. Percent-encode / ? # @ in the password.",
    "config": "Config file instead of $NOTIFYQ_CONFIG (default /etc/notifyq/notifyq.toml).",
}


def add_global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """--dsn, --config, --log-level, --log-format: on `notifyq` and on every command, where
    they are only set when given (argparse.SUPPRESS), so the later one wins."""
    default = None if top else argparse.SUPPRESS
    group = parser.add_argument_group("global options (before or after the command)" if top else None)
    group.add_argument("--dsn", metavar="URL", default=default, help=GLOBAL_HELP["dsn"] if top else argparse.SUPPRESS)
    group.add_argument("--config", dest="config_file", metavar="FILE", default=default,
                       type=args.checked("--config", values.readable_file),
                       help=GLOBAL_HELP["config"] if top else argparse.SUPPRESS)
    group.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=default,
                       help="Overrides log.level." if top else argparse.SUPPRESS)
    group.add_argument("--log-format", choices=["auto", "kv", "json"], default=default,
                       help="Overrides log.format." if top else argparse.SUPPRESS)


# ------------------------------------------------------------------ init / config / status

def init(obj: Context, a: argparse.Namespace) -> None:
    from notifyq.store import schema

    cfg = obj.oneshot_config()
    if a.grant_user:
        echo("\n".join(schema.grants(cfg.dsn.database, a.grant_user)))
        return
    for shard in cfg.shard_names():  # with [shards]: every shard, each its own schema
        dsn = cfg.on_shard(shard).dsn
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
    from notifyq.ops import status as status_mod
    from notifyq.run import fanout

    cfg = obj.oneshot_config()
    queue = a.queue
    if queue is not None:  # `-q ''` is a bad name, not "all queues"
        config_mod.validate_queue_name(queue)
    answers, down = fanout.on_shards(cfg, "status", lambda session: status_mod.collect(session, queue))
    data = status_mod.merge(answers, down) if cfg.shards else answers[""]
    echo(json.dumps(data, indent=2) if a.as_json else status_mod.render(data))
    fanout.fail_if_down(down)  # the shards that answered are shown; the exit code says not all did


def pause(obj: Context, a: argparse.Namespace) -> None:
    _set_paused(obj, a.queue, True)


def resume(obj: Context, a: argparse.Namespace) -> None:
    _set_paused(obj, a.queue, False)


def _set_paused(obj: Context, queue: str, paused: bool) -> None:
    from notifyq import shards
    from notifyq.run import fanout
    from notifyq.store import queries

    cfg = obj.oneshot_config()
    config_mod.validate_queue_name(queue)
    answers, down = fanout.on_shards(cfg, "admin", lambda session: queries.set_paused(session, queue, paused),
                                     shards.Placement(cfg).shards_of(queue))
    fanout.fail_if_down(down)  # every shard of the queue, or an error naming the ones not reached
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
    if a.payloads:
        cfg = obj.oneshot_config()
        runner.produce_args(cfg, queue, tuple(a.payloads), priority=a.priority, delay=a.delay, run_at=when,
                            max_attempts=a.max_attempts, dedup_key=a.dedup_key,
                            print_ids=a.print_ids is not False)
        return
    if _interactive_stream(a.daemon or a.follow or bool(a.log_file)):
        cfg = obj.oneshot_config()
    runner.produce_stream(cfg, queue, priority=a.priority, delay=a.delay, run_at=when,
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

    cfg = obj.config()
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


def demo(obj: Context, a: argparse.Namespace) -> None:
    from notifyq import logs
    from notifyq.run import demo as demo_mod

    logs.setup_logging(level=obj.flags.get("log", {}).get("level") or "warning")  # the progress is the output
    sys.exit(demo_mod.run(obj.flags.get("dsn"), producers=a.producers, consumers=a.consumers,
                          rate=a.rate, duration=a.duration, keep=a.keep))


# ------------------------------------------------------------------ the parsers
# Only the parser of the command given is built: argparse spends about a millisecond per
# parser and per option (gettext, the terminal width), which every consumer process would pay.

DESCRIPTION = """\
notifyq: a durable job queue in MySQL 8.0+ / MariaDB 10.6+.

Config: /etc/notifyq/notifyq.toml and conf.d/*.toml (or --config FILE, or $NOTIFYQ_CONFIG),
then NOTIFYQ_* variables, then flags. The global options also work after the command.
"""

EXIT_CODES = """\
Exit codes:
  0  ok                        6  schema missing or of another version
  1  internal error (a bug)    7  server unsupported
  2  usage (bad or missing     8  handler cannot be loaded
     flag or argument)         9  an enqueue's outcome is unknown
  3  configuration            10  another instance holds the pidfile
  4  bad input (data)        130  killed by a second signal
  5  database unreachable
"""


def _init_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--print-grants", dest="grant_user", metavar="USER",
                   help="Print the GRANTs a runtime user needs (DML on notifyq tables only) and exit.")


def _config_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", dest="as_json", action="store_true", help="Print JSON instead of TOML-ish text.")


def _status_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--queue", help="Only this queue.")
    p.add_argument("--json", dest="as_json", action="store_true", help="Machine-readable output.")


def _queue_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--queue", required=True)


def _process_options(p: argparse.ArgumentParser, daemon_help: str) -> None:
    p.add_argument("--daemon", action="store_true", help=daemon_help)
    p.add_argument("--pidfile", metavar="FILE", type=args.checked("--pidfile", values.writable_file),
                   help="Refuse to start while another holds it.")
    p.add_argument("--log-file", metavar="FILE", type=args.checked("--log-file", values.writable_file), help="Log to this file.")


def _produce_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("payloads", nargs="*", metavar="JSON", help="One job each; none: JSON lines from stdin.")
    p.add_argument("-q", "--queue", help="Queue to put the jobs on.")
    p.add_argument("--profile", metavar="NAME", help="Config section [queue.NAME]: its queue (the systemd instance name).")
    p.add_argument("--priority", metavar="N", type=args.int_range(-32768, 32767), default=0, help="Higher runs first (default 0).")
    p.add_argument("--delay", metavar="SECONDS", type=args.checked("--delay", _seconds), default=0.0,
                   help="Seconds before the jobs may run, or a duration: 90s, 5m, 2h, 7d.")
    p.add_argument("--at", dest="run_at", metavar="TIME", type=args.checked("--at", _not_empty),
                   help="Run at this ISO-8601 time (with offset; naive means UTC).")
    p.add_argument("--max-attempts", metavar="N", type=args.int_range(1, 65535), help="Runs before the job is dead.")
    p.add_argument("--dedup-key", metavar="KEY", type=args.checked("--dedup-key", _not_empty),
                   help="Skip if a pending job on the queue has this key (one JSON only).")
    p.add_argument("--input", dest="input_path", metavar="FILE", type=args.checked("--input", values.readable_file),
                   help="Read JSON lines from this file or FIFO instead of stdin.")
    p.add_argument("--follow", action="store_true",
                   help="With --input: keep reading a FIFO whose writers come and go (a file: tail it).")
    p.add_argument("--reject-file", metavar="FILE", type=args.checked("--reject-file", values.writable_file),
                   help="Append rejected lines here.")
    # A pair of flags on one setting, the later one winning (as click's --print-ids/--count did).
    p.add_argument("--print-ids", dest="print_ids", action="store_true", default=None,
                   help="Print each id (default with JSON arguments).")
    p.add_argument("--count", dest="print_ids", action="store_false",
                   help="Print only a final count (default for streams).")
    _process_options(p, "Detach (classic daemon mode; not under systemd); needs --input, implies --follow.")


def _consume_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--queue", dest="queues", metavar="QUEUE", action="append", default=[],
                   help="Queue to consume (repeatable).")
    p.add_argument("--profile", metavar="NAME", help="Config section [queue.NAME] to run (the systemd instance name).")
    p.add_argument("--handler", metavar="MODULE:FUNCTION", help="Python callable pkg.module:function, called with each Job.")
    p.add_argument("--tasks", metavar="MODULE", action="append", default=[],
                   help="Run each job by the @notifyq.task function of MODULE it names (repeatable).")
    p.add_argument("--command", metavar="COMMAND", help="Command run per job with the payload JSON on stdin; exit 0 = done.")
    p.add_argument("--per-batch", dest="per_batch", action="store_true", default=None,
                   help="Hand the handler whole batches.")
    p.add_argument("--per-job", dest="per_batch", action="store_false", help="One job per call (the later flag wins).")
    p.add_argument("--workers", metavar="N", type=args.int_range(1, 256), help="Worker threads per queue.")
    p.add_argument("--concurrency", metavar="N", type=args.int_range(1, 10000),
                   help="Jobs an async def handler runs at once, per worker (per job only; default 1).")
    p.add_argument("--batch-size", metavar="N", type=args.int_range(1, 10000), help="Jobs per claim.")
    p.add_argument("--exit-when-empty", action="store_true", help="Exit once a claim finds no ready job.")
    p.add_argument("--max-jobs", metavar="N", type=args.int_range(1), help="Exit after this many jobs.")
    _process_options(p, "Detach (classic daemon mode; not under systemd).")


def _demo_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--producers", metavar="N", type=args.int_range(1, 32), default=2, help="(default 2)")
    p.add_argument("--consumers", metavar="N", type=args.int_range(1, 64), default=10, help="(default 10)")
    p.add_argument("--rate", metavar="N", type=args.int_range(1), default=2000, help="Jobs per second offered in all (default 2000).")
    p.add_argument("--duration", metavar="SECONDS", type=args.checked("--duration", _seconds), default=0.0,
                   help="Seconds to run (0: until Ctrl-C; the default).")
    p.add_argument("--keep", action="store_true", help="Keep the demo's database at the end (it is dropped otherwise).")


# name -> (what runs it, its help: the first line is its summary, what adds its options)
Commands = dict[str, tuple[Callable[[Context, argparse.Namespace], None], str,
                           Callable[[argparse.ArgumentParser], None]]]
COMMANDS: Commands = {
    "init": (init, "Create the database schema, or upgrade it. Safe to run again and on many hosts at once.",
             _init_options),
    "config": (show_config, "Print the effective configuration (the password is masked).", _config_options),
    "status": (status, "Per queue: ready, delayed, claimed, dead, oldest ready age; and the live consumers.",
               _status_options),
    "pause": (pause, "Stop consumers claiming from QUEUE (they go back to waiting, without polling).",
              _queue_option),
    "resume": (resume, "Let consumers claim from QUEUE again; the watcher wakes at once.", _queue_option),
    "produce": (produce, "Enqueue JSON payloads given as arguments, or JSON lines from stdin until EOF.",
                _produce_options),
    "consume": (consume, "Claim and run jobs until stopped (SIGTERM/SIGINT drain gracefully; SIGHUP reloads).",
                _consume_options),
    "demo": (demo, "Live demo: producers and consumers against a local (or private) MariaDB.\n\n"
             "It works in a new database of its own (notifyq_demo_<random>) on that server, never in the\n"
             "database of --dsn, and drops it at the end unless --keep.", _demo_options),
}
GROUPS = {"jobs": ("Inspect, retry, cancel and purge jobs.", cli_jobs.COMMANDS)}


class _Version(argparse.Action):
    """--version: the installed package's, read only when asked (importlib.metadata is slow)."""

    def __init__(self, **kw: Any):
        super().__init__(nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values_, option_string=None):  # noqa: ANN001
        from importlib.metadata import version

        echo(f"notifyq, version {version('notifyq')}")
        parser.exit()


def _group_parser(prog: str, description: str, names: dict[str, str], top: bool) -> args.Parser:
    """`notifyq` or `notifyq jobs`: global options, then COMMAND and what follows it, unparsed."""
    width = max(map(len, names)) + 2
    listing = "\n".join(f"  {name.ljust(width)}{summary.splitlines()[0]}" for name, summary in names.items())
    parser = args.make_parser(prog, f"{description}\ncommands:\n{listing}\n", EXIT_CODES if top else None)
    parser.usage = f"%(prog)s [-h]{' [--version] [global options]' if top else ''} COMMAND ..."
    if top:
        parser.add_argument("--version", action=_Version, help="Print the version and exit.")
    add_global_options(parser, top=top)
    parser.add_argument("command_name", metavar="COMMAND", choices=list(names), help=argparse.SUPPRESS)
    rest = parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    rest.required = False  # a missing COMMAND is the error to report, not this
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line: global options, the command (`jobs` takes one more), its options."""
    names = {**{n: doc for n, (_, doc, _) in COMMANDS.items()}, **{n: doc for n, (doc, _) in GROUPS.items()}}
    top = _group_parser("notifyq", DESCRIPTION, names, top=True)
    a = top.parse_args(args.dash_values_attached(top, argv, until_command=True))
    prog, commands = f"notifyq {a.command_name}", COMMANDS
    if a.command_name in GROUPS:
        doc, commands = GROUPS[a.command_name]
        group = _group_parser(prog, doc, {n: d for n, (_, d, _) in commands.items()}, top=False)
        group.parse_args(args.dash_values_attached(group, a.rest, until_command=True), namespace=a)
        prog = f"{prog} {a.command_name}"
    run, doc, add_options = commands[a.command_name]
    parser = args.make_parser(prog, doc)
    add_options(parser)
    add_global_options(parser, top=False)
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
