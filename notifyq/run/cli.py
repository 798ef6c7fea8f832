"""The `notifyq` command: a thin click layer over the library.

Every user error is one line on stderr and an exit code from errors.py; a traceback means a bug.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from notifyq import config as config_mod
from notifyq import errors, values
from notifyq.run import cli_jobs

log = logging.getLogger("notifyq.cli")


class Context:
    """What the global options resolve to; commands load the config through it.

    The global options are accepted before and after the command name (`notifyq --dsn X status`
    and `notifyq status --dsn X`): both set the same fields here, the later one winning."""

    def __init__(self) -> None:
        self.flags: dict[str, Any] = {}
        self.config_path: str | None = None
        self._config: config_mod.Config | None = None

    def set_global(self, name: str, value: Any, from_command_line: bool = True) -> None:
        if value is None:
            return
        if name == "dsn":
            if from_command_line and _dsn_has_password(value):
                _warn("a password in --dsn is visible to every user in the process list: "
                      "use NOTIFYQ_PASSWORD, password_file or a systemd credential")
            self.flags["dsn"] = value
        elif name == "config":
            # Absolute: a daemon re-reads it on SIGHUP after chdir("/").
            self.config_path = os.path.abspath(values.readable_file("--config", value, errors.ConfigError))
        else:
            self.flags.setdefault("log", {})[name.removeprefix("log_")] = value
        self._config = None

    def config(self, **extra: Any) -> config_mod.Config:
        if self._config is None or extra:
            overrides = dict(self.flags)
            for key, value in extra.items():
                if isinstance(value, dict):
                    overrides[key] = {**overrides.get(key, {}), **value}
                else:
                    overrides[key] = value
            self._config = config_mod.load(overrides=overrides, warn=_warn, config_path=self.config_path)
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
    click.echo(f"notifyq: warning: {message}", err=True)


def _setup_logging(cfg: config_mod.Config, log_file: str | None = None, level: str | None = None) -> None:
    from notifyq import logs

    logs.setup_logging(level=level or cfg.log.level, fmt=cfg.log.format,
                       log_file=log_file or cfg.log.file or None, use_syslog=cfg.log.syslog)


# ------------------------------------------------------------------ option checks
# Flags go through the same checks as the config (notifyq.values): a bad value is a usage
# error (exit 2) in one line, named by its flag.

def _check(fn: Callable[[str, Any], Any]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            return None
        name = param.opts[-1]
        try:
            return fn(name, value)
        except errors.NotifyqError as e:  # click names the flag itself
            raise click.BadParameter(str(e).removeprefix(f"{name}: ").removeprefix(f"{name} "),
                                     ctx=ctx, param=param) from None
    return callback


def _not_empty(name: str, value: str) -> str:
    if not value.strip():
        raise errors.InputError(f"{name}: must not be empty")
    return value


_seconds = _check(lambda name, v: values.seconds(name, v, positive=False))
_writable = _check(values.writable_file)
_readable = _check(values.readable_file)
_nonempty = _check(_not_empty)


def _global(name: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if ctx.obj is None:
            ctx.obj = Context()
        source = ctx.get_parameter_source(param.name)
        try:
            ctx.obj.set_global(name, value, from_command_line=source == click.core.ParameterSource.COMMANDLINE)
        except errors.NotifyqError as e:
            raise click.BadParameter(str(e), ctx=ctx, param=param) from None
    return callback


def _global_options(envvar: bool) -> list[click.Option]:
    """--dsn, --config, --log-level, --log-format: on the group and, without their variables
    (the group reads those once), on every command."""
    return [
        click.Option(["--dsn"], envvar="NOTIFYQ_DSN" if envvar else None, show_envvar=envvar,
                     expose_value=False, callback=_global("dsn"),
                     help="mysql://user[:password]@host[:port][/database][?unix_socket=PATH&ssl_ca=FILE]; "
                          f"default {config_mod.DEFAULT_DSN} (no database named: "
                          f"{config_mod.DEFAULT_DATABASE}). Percent-encode / ? # @ in the password."),
        click.Option(["--config", "config_file"], metavar="FILE", expose_value=False, callback=_global("config"),
                     help="Config file instead of $NOTIFYQ_CONFIG (default /etc/notifyq/notifyq.toml)."),
        click.Option(["--log-level"], type=click.Choice(["debug", "info", "warning", "error"]),
                     expose_value=False, callback=_global("log_level"), help="Overrides log.level."),
        click.Option(["--log-format"], type=click.Choice(["auto", "kv", "json"]),
                     expose_value=False, callback=_global("log_format"), help="Overrides log.format."),
    ]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(package_name="notifyq")
@click.pass_context
def main_group(ctx: click.Context) -> None:
    """notifyq: a durable job queue in MySQL 8.0+ / MariaDB 10.6+.

    Config: /etc/notifyq/notifyq.toml and conf.d/*.toml (or --config FILE, or $NOTIFYQ_CONFIG),
    then NOTIFYQ_* variables, then flags. The global options also work after the command.

    \b
    Exit codes:
      0  ok                        6  schema missing or of another version
      1  internal error (a bug)    7  server unsupported
      2  usage (bad or missing     8  handler cannot be loaded
         flag or argument)         9  an enqueue's outcome is unknown
      3  configuration            10  another instance holds the pidfile
      4  bad input (data)        130  killed by a second signal
      5  database unreachable
    """
    if ctx.obj is None:
        ctx.obj = Context()


main_group.params[:0] = _global_options(envvar=True)


# ------------------------------------------------------------------ init / config / status

@main_group.command()
@click.option("--print-grants", "grant_user", metavar="USER",
              help="Print the GRANTs a runtime user needs (DML on notifyq tables only) and exit.")
@click.pass_obj
def init(obj: Context, grant_user: str | None) -> None:
    """Create the database schema, or upgrade it. Safe to run again and on many hosts at once."""
    from notifyq.store import schema

    cfg = obj.oneshot_config()
    if grant_user:
        click.echo("\n".join(schema.grants(cfg.dsn.database, grant_user)))
        return
    for shard in cfg.shard_names():  # with [shards]: every shard, each its own schema
        dsn = cfg.on_shard(shard).dsn
        where = f" on shard {shard}" if shard else ""
        before, after = schema.init(dsn, cfg.connect_retry(oneshot=True), retry_log_level=logging.DEBUG)
        if before == after:
            click.echo(f"schema of {dsn.database}{where} is up to date (version {after})")
        else:
            click.echo(f"schema of {dsn.database}{where}: version {before or 'none'} -> {after}")


@main_group.command("config")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of TOML-ish text.")
@click.pass_obj
def show_config(obj: Context, as_json: bool) -> None:
    """Print the effective configuration (the password is masked)."""
    data = obj.config().masked_dict()
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        return
    for key in ("dsn", "password_file", "connect_retry_s", "sources"):
        if key in data:
            click.echo(f"{key} = {json.dumps(data[key])}")
    for section in ("shards", "log", "wakeup", "consumer", "producer", "defaults"):
        if section not in data:
            continue
        click.echo(f"\n[{section}]")
        for k, v in data[section].items():
            click.echo(f"{k} = {json.dumps(v)}")
    for name, section in data["queue"].items():
        click.echo(f"\n[queue.{name}]")
        for k, v in section.items():
            click.echo(f"{k} = {json.dumps(v)}")


@main_group.command()
@click.option("-q", "--queue", help="Only this queue.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def status(obj: Context, queue: str | None, as_json: bool) -> None:
    """Per queue: ready, delayed, claimed, dead, oldest ready age; and the live consumers."""
    from notifyq.ops import status as status_mod
    from notifyq.run import fanout

    cfg = obj.oneshot_config()
    if queue is not None:  # `-q ''` is a bad name, not "all queues"
        config_mod.validate_queue_name(queue)
    answers, down = fanout.on_shards(cfg, "status", lambda session: status_mod.collect(session, queue))
    data = status_mod.merge(answers, down) if cfg.shards else answers[""]
    click.echo(json.dumps(data, indent=2) if as_json else status_mod.render(data))
    fanout.fail_if_down(down)  # the shards that answered are shown; the exit code says not all did


@main_group.command()
@click.option("-q", "--queue", required=True)
@click.pass_obj
def pause(obj: Context, queue: str) -> None:
    """Stop consumers claiming from QUEUE (they go back to waiting, without polling)."""
    _set_paused(obj, queue, True)


@main_group.command()
@click.option("-q", "--queue", required=True)
@click.pass_obj
def resume(obj: Context, queue: str) -> None:
    """Let consumers claim from QUEUE again; the watcher wakes at once."""
    _set_paused(obj, queue, False)


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
    click.echo(f"{queue}: {state}")


# ------------------------------------------------------------------ produce

@main_group.command()
@click.option("-q", "--queue", help="Queue to put the jobs on.")
@click.option("--profile", help="Config section [queue.NAME]: its queue (the systemd instance name).")
@click.argument("payloads", nargs=-1, metavar="[JSON ...]")
@click.option("--priority", type=click.IntRange(-32768, 32767), default=0, help="Higher runs first.")
@click.option("--delay", type=float, default=0.0, callback=_seconds, help="Seconds before the jobs may run.")
@click.option("--at", "run_at", callback=_nonempty,
              help="Run at this ISO-8601 time (with offset; naive means UTC).")
@click.option("--max-attempts", type=click.IntRange(1, 65535), default=None)
@click.option("--dedup-key", callback=_nonempty,
              help="Skip if a pending job on the queue has this key (one JSON only).")
@click.option("--input", "input_path", callback=_readable,
              help="Read JSON lines from this file or FIFO instead of stdin.")
@click.option("--follow", is_flag=True,
              help="With --input: keep reading a FIFO whose writers come and go (a file: tail it).")
@click.option("--reject-file", callback=_writable, help="Append rejected lines here.")
@click.option("--print-ids/--count", default=None,
              help="Print each id (default with JSON arguments) or only a final count (default for streams).")
@click.option("--daemon", is_flag=True,
              help="Detach (classic daemon mode; not under systemd); needs --input, implies --follow.")
@click.option("--pidfile", callback=_writable, help="Refuse to start while another holds it.")
@click.option("--log-file", callback=_writable, help="Log to this file.")
@click.pass_obj
def produce(obj: Context, queue: str | None, profile: str | None, payloads: tuple[str, ...],
            priority: int, delay: float,
            run_at: str | None, max_attempts: int | None, dedup_key: str | None, input_path: str | None,
            follow: bool, reject_file: str | None, print_ids: bool | None, daemon: bool,
            pidfile: str | None, log_file: str | None) -> None:
    """Enqueue JSON payloads given as arguments, or JSON lines from stdin until EOF."""
    from notifyq.run import runner

    cfg = obj.config()
    if profile:
        config_mod.validate_queue_name(profile)
        if profile not in cfg.queues:
            raise errors.ConfigError(f"--profile {profile}: no [queue.{profile}] section in the config")
        if queue not in (None, profile):
            raise click.UsageError("give -q QUEUE or --profile NAME, not both")
        queue = profile
    if queue is None:
        raise click.UsageError("missing option -q QUEUE (or --profile NAME)")
    config_mod.validate_queue_name(queue)
    when = _parse_at(run_at)
    if dedup_key and len(payloads) != 1:
        raise click.UsageError("--dedup-key needs exactly one JSON argument")
    if payloads:
        cfg = obj.oneshot_config()
        runner.produce_args(cfg, queue, payloads, priority=priority, delay=delay, run_at=when,
                            max_attempts=max_attempts, dedup_key=dedup_key,
                            print_ids=print_ids is not False)
        return
    if _interactive_stream(obj, daemon or follow or bool(log_file)):
        cfg = obj.oneshot_config()
    runner.produce_stream(cfg, queue, priority=priority, delay=delay, run_at=when,
                          input_path=input_path, follow=follow, reject_file=reject_file,
                          print_ids=bool(print_ids), daemon=daemon, pidfile=pidfile, log_file=log_file,
                          reload=obj.reload)


def _interactive_stream(obj: Context, service: bool) -> bool:
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

@main_group.command()
@click.option("-q", "--queue", "queues", multiple=True, help="Queue to consume (repeatable).")
@click.option("--profile", help="Config section [queue.NAME] to run (the systemd instance name).")
@click.option("--handler", help="Python callable pkg.module:function, called with each Job.")
@click.option("--command", help="Command run per job with the payload JSON on stdin; exit 0 = done.")
@click.option("--per-batch/--per-job", default=None, help="Hand the handler whole batches.")
@click.option("--workers", type=click.IntRange(1, 256), default=None, help="Worker threads per queue.")
@click.option("--batch-size", type=click.IntRange(1, 10000), default=None)
@click.option("--exit-when-empty", is_flag=True, help="Exit once a claim finds no ready job.")
@click.option("--max-jobs", type=click.IntRange(1), default=None, help="Exit after this many jobs.")
@click.option("--daemon", is_flag=True, help="Detach (classic daemon mode; not under systemd).")
@click.option("--pidfile", callback=_writable, help="Refuse to start while another holds it.")
@click.option("--log-file", callback=_writable, help="Log to this file.")
@click.pass_obj
def consume(obj: Context, queues: tuple[str, ...], profile: str | None, handler: str | None,
            command: str | None, per_batch: bool | None, workers: int | None, batch_size: int | None,
            exit_when_empty: bool, max_jobs: int | None, daemon: bool, pidfile: str | None,
            log_file: str | None) -> None:
    """Claim and run jobs until stopped (SIGTERM/SIGINT drain gracefully; SIGHUP reloads)."""
    from notifyq.consume.service import ConsumeOptions
    from notifyq.run import runner

    cfg = obj.config()
    if profile:
        config_mod.validate_queue_name(profile)
        if profile not in cfg.queues:
            raise errors.ConfigError(f"--profile {profile}: no [queue.{profile}] section in the config")
        queues = (*queues, profile) if profile not in queues else queues
    if handler and command:
        raise click.UsageError("give --handler or --command, not both")
    if not queues:
        raise click.UsageError("missing option -q QUEUE (or --profile NAME)")
    options = ConsumeOptions(queues=tuple(dict.fromkeys(queues)), handler=handler, command=command,
                             per_batch=per_batch, workers=workers, batch_size=batch_size,
                             exit_when_empty=exit_when_empty, max_jobs=max_jobs)
    sys.exit(runner.consume(obj, options, daemon=daemon, pidfile=pidfile, log_file=log_file))


@main_group.command()
@click.option("--producers", type=click.IntRange(1, 32), default=2)
@click.option("--consumers", type=click.IntRange(1, 64), default=10)
@click.option("--rate", type=click.IntRange(1), default=2000, help="Jobs per second offered in all.")
@click.option("--duration", type=float, default=0, callback=_seconds, help="Seconds to run (0: until Ctrl-C).")
@click.option("--keep", is_flag=True, help="Keep the demo's database at the end (it is dropped otherwise).")
@click.pass_obj
def demo(obj: Context, producers: int, consumers: int, rate: int, duration: float, keep: bool) -> None:
    """Live demo: producers and consumers against a local (or private) MariaDB.

    It works in a new database of its own (notifyq_demo_<random>) on that server, never in the
    database of --dsn, and drops it at the end unless --keep."""
    from notifyq.run import demo as demo_mod

    from notifyq import logs

    logs.setup_logging(level=obj.flags.get("log", {}).get("level") or "warning")  # the progress is the output
    sys.exit(demo_mod.run(obj.flags.get("dsn"), producers=producers, consumers=consumers,
                          rate=rate, duration=duration, keep=keep))


main_group.add_command(cli_jobs.jobs)  # `notifyq jobs list|show|retry|cancel|purge`


def _add_global_options(group: click.Group) -> None:
    for command in group.commands.values():
        if isinstance(command, click.Group):
            command.params += _global_options(envvar=False)  # `notifyq jobs --dsn X list`
            _add_global_options(command)
        else:
            command.params += _global_options(envvar=False)


_add_global_options(main_group)


def _usage_line(e: click.UsageError) -> str:
    """click prints usage, a hint and the error over three lines; notifyq's errors are one."""
    where = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
    return f"notifyq: error: {e.format_message()}{where}"


def main(argv: list[str] | None = None) -> None:
    """Entry point: map errors to one line and an exit code."""
    try:
        main_group.main(args=argv, prog_name="notifyq", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("notifyq: aborted", err=True)
        sys.exit(errors.EXIT_KILLED)
    except click.UsageError as e:
        click.echo(_usage_line(e), err=True)
        sys.exit(errors.EXIT_USAGE)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except errors.NotifyqError as e:
        click.echo(f"notifyq: error: {e}", err=True)
        sys.exit(e.exit_code)
    except Exception as e:
        from notifyq.store import db  # only here: `notifyq --help` never loads the driver

        if not isinstance(e, db.DriverError):
            raise
        click.echo(f"notifyq: error: database: {db.describe(e)}", err=True)
        sys.exit(errors.EXIT_DB)
    except KeyboardInterrupt:
        sys.exit(errors.EXIT_KILLED)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(errors.EXIT_OK)
