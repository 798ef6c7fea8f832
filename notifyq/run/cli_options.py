"""The `notifyq` command line's flags, their checks and its help texts (cli.py runs them).

Only the parser of the command given is built: argparse spends about a millisecond per parser
and per option (gettext, the terminal width), which every consumer process would pay.
"""

from __future__ import annotations

import argparse
from typing import Any

from notifyq import config as config_mod
from notifyq import errors
from notifyq.config import values
from notifyq.run import args, echo

# ------------------------------------------------------------------ value checks
# Flags go through the same checks as the config (notifyq.config.values): a bad value is a usage
# error (exit 2) in one line, named by its flag (argparse puts "argument --flag: " before it).

def seconds(name: str, text: str) -> float:
    """Seconds, or a duration with a unit as --older-than takes: 90s, 5m, 2h, 7d, 2w."""
    try:
        number = float(text)
    except ValueError:
        number = values.duration_text(text)
        if number is None:
            raise errors.InputError(f"{values.shown(text)} is not a valid number of seconds "
                                    "(or a duration like 90s, 5m, 2h, 7d)") from None
    return values.seconds(name, number, positive=False)


def not_empty(name: str, value: str) -> str:
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


# ------------------------------------------------------------------ help texts

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
  3  configuration, grants    10  another instance holds the pidfile
  4  bad input (data)        130  killed by a second signal
  5  database unreachable
"""


# ------------------------------------------------------------------ each command's options

def init_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--print-grants", dest="grant_user", metavar="USER",
                   help="Print the GRANTs a runtime user needs (DML on notifyq tables only) and exit.")


def config_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", dest="as_json", action="store_true", help="Print JSON instead of TOML-ish text.")


def status_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--queue", help="Only this queue.")
    p.add_argument("--json", dest="as_json", action="store_true", help="Machine-readable output.")
    p.add_argument("--locks", action="store_true",
                   help="Also who holds and who waits on each queue's advisory locks, where the server's "
                        "performance_schema.metadata_locks shows them (else one line says why).")


def queue_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--queue", required=True)


def process_options(p: argparse.ArgumentParser, daemon_help: str) -> None:
    p.add_argument("--daemon", action="store_true", help=daemon_help)
    p.add_argument("--pidfile", metavar="FILE", type=args.checked("--pidfile", values.writable_file),
                   help="Refuse to start while another holds it.")
    p.add_argument("--log-file", metavar="FILE", type=args.checked("--log-file", values.writable_file), help="Log to this file.")


def produce_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("payloads", nargs="*", metavar="JSON", help="One job each; none: JSON lines from stdin.")
    p.add_argument("-q", "--queue", help="Queue to put the jobs on.")
    p.add_argument("--profile", metavar="NAME", help="Config section [queue.NAME]: its queue (the systemd instance name).")
    p.add_argument("--priority", metavar="N", type=args.int_range(-32768, 32767), default=0, help="Higher runs first (default 0).")
    p.add_argument("--delay", metavar="SECONDS", type=args.checked("--delay", seconds), default=0.0,
                   help="Seconds before the jobs may run, or a duration: 90s, 5m, 2h, 7d.")
    p.add_argument("--at", dest="run_at", metavar="TIME", type=args.checked("--at", not_empty),
                   help="Run at this ISO-8601 time (with offset; naive means UTC).")
    p.add_argument("--max-attempts", metavar="N", type=args.int_range(1, 65535), help="Runs before the job is dead.")
    p.add_argument("--dedup-key", metavar="KEY", type=args.checked("--dedup-key", not_empty),
                   help="Skip if a pending job on the queue has this key (one JSON only).")
    p.add_argument("--dedup", choices=("keep", "replace"), default="keep",
                   help="With --dedup-key, while a job of the key is pending: keep it (default), or replace it "
                        "unless it is running (debounce).")
    p.add_argument("--key", metavar="KEY", type=args.checked("--key", not_empty),
                   help="The jobs' flow-control key (limit_per_key, rate_per_key, fair count them under it).")
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
    process_options(p, "Detach (classic daemon mode; not under systemd); needs --input, implies --follow.")


def consume_options(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--version", dest="code_version", metavar="N", type=args.int_range(0, values.MAX_VERSION),
                   help="The code version this consumer runs (consumer.version): it never claims a job "
                        "put with a higher min_version (default 0).")
    process_options(p, "Detach (classic daemon mode; not under systemd).")


def demo_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--producers", metavar="N", type=args.int_range(1, 32), default=2, help="(default 2)")
    p.add_argument("--consumers", metavar="N", type=args.int_range(1, 64), default=10, help="(default 10)")
    p.add_argument("--rate", metavar="N", type=args.int_range(1), default=2000, help="Jobs per second offered in all (default 2000).")
    p.add_argument("--duration", metavar="SECONDS", type=args.checked("--duration", seconds), default=0.0,
                   help="Seconds to run (0: until Ctrl-C; the default).")
    p.add_argument("--keep", action="store_true", help="Keep the demo's database at the end (it is dropped otherwise).")


def web_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", metavar="N", type=args.int_range(0, 65535), default=8089,
                   help="Port to listen on (default 8089; 0: any free one, printed at start).")
    p.add_argument("--bind", metavar="ADDR", default="127.0.0.1",
                   help="Address to listen on (default 127.0.0.1; 0.0.0.0 or :: for every interface).")
    p.add_argument("--actions-token-file", dest="token_file", metavar="FILE",
                   type=args.checked("--actions-token-file", values.readable_file),
                   help="Enable retry/cancel/purge/pause/resume for whoever signs in with the token in FILE "
                        "(or set NOTIFYQ_WEB_TOKEN). Without one the pages are read-only.")


# ------------------------------------------------------------------ `notifyq` and `notifyq jobs`

class Version(argparse.Action):
    """--version: the installed package's, read only when asked (importlib.metadata is slow)."""

    def __init__(self, **kw: Any):
        super().__init__(nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values_, option_string=None):  # noqa: ANN001
        from importlib.metadata import version

        echo(f"notifyq, version {version('notifyq')}")
        parser.exit()


def group_parser(prog: str, description: str, names: dict[str, str], top: bool) -> args.Parser:
    """`notifyq` or `notifyq jobs`: global options, then COMMAND and what follows it, unparsed."""
    width = max(map(len, names)) + 2
    listing = "\n".join(f"  {name.ljust(width)}{summary.splitlines()[0]}" for name, summary in names.items())
    parser = args.make_parser(prog, f"{description}\ncommands:\n{listing}\n", EXIT_CODES if top else None)
    parser.usage = f"%(prog)s [-h]{' [--version] [global options]' if top else ''} COMMAND ..."
    if top:
        parser.add_argument("--version", action=Version, help="Print the version and exit.")
    add_global_options(parser, top=top)
    parser.add_argument("command_name", metavar="COMMAND", choices=list(names), help=argparse.SUPPRESS)
    rest = parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    rest.required = False  # a missing COMMAND is the error to report, not this
    return parser
