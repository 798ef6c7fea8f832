"""Processes and the CLI: the argparse commands (cli.py, cli_jobs.py; their flags and help texts,
cli_options.py; argparse as they use it, args.py), the producer and consumer processes
(runner.py), daemon mode and sd_notify (daemon.py), the demo and the private server it and the
tests start (localserver.py). The top floor: may import every other part.
"""

import sys


def echo(text: str, *, err: bool = False) -> None:
    """One line of a command's output (err: on stderr), flushed: a pipe's reader sees each id
    as it is enqueued, not when a buffer fills."""
    stream = sys.stderr if err else sys.stdout
    stream.write(f"{text}\n")
    stream.flush()
