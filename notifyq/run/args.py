"""argparse, as notifyq's commands use it (cli.py, cli_jobs.py): an error is one line and exit
2 (cli.main prints it), a flag's value is checked by notifyq.config.values, and a value may start with
a dash.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from notifyq import errors
from notifyq.config import values


class UsageError(Exception):
    """A bad or missing flag or argument: exit 2, one line naming the command's --help."""

    def __init__(self, message: str, prog: str = "notifyq"):
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse prints usage and exits on an error; notifyq's errors are one line (main)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message, self.prog)


def checked(name: str, fn: Callable[[str, Any], Any]) -> Callable[[str], Any]:
    """An argparse type from a notifyq.config.values check of the flag `name`."""
    def convert(text: str) -> Any:
        try:
            return fn(name, text)
        except errors.NotifyqError as e:  # argparse names the flag itself
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"{name}: ").removeprefix(f"{name} ")) from None
    return convert


def int_range(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from lo to hi (no bound: None)."""
    def convert(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{values.shown(text)} is not a valid integer") from None
        if value < lo or (hi is not None and value > hi):
            bounds = f"{lo}<=x<={hi}" if hi is not None else f"x>={lo}"
            raise argparse.ArgumentTypeError(f"{value} is not in the range {bounds}")
        return value
    return convert


class Formatter(argparse.RawDescriptionHelpFormatter):
    """The terminal's width as shutil.get_terminal_size reads it, without importing shutil
    (which loads bz2 and lzma): argparse makes a formatter for every option it adds."""

    def __init__(self, prog: str) -> None:
        try:
            columns = int(os.environ["COLUMNS"])
        except (KeyError, ValueError):
            try:
                columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
            except (AttributeError, ValueError, OSError):
                columns = 80
        super().__init__(prog, width=max(columns, 40) - 2)


def make_parser(prog: str, description: str, epilog: str | None = None) -> Parser:
    """A command's parser: no abbreviated flags (a prefix that means one flag today would mean
    another once a flag is added), help laid out as written."""
    return Parser(prog=prog, description=description, epilog=epilog, allow_abbrev=False,
                  formatter_class=Formatter)


def _options_taking_a_value(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions if action.option_strings and action.nargs is None
            for o in action.option_strings}


def dash_values_attached(parser: argparse.ArgumentParser, argv: list[str],
                         until_command: bool = False) -> list[str]:
    """`--dedup-key -x` and `--older-than -1d` give the value -x and -1d, as a user means
    (argparse would take them for options): such a value is attached, `--dedup-key=-x`.
    until_command: what follows the command's name is the command's parser's to read."""
    takes_value, out, i = _options_taking_a_value(parser), [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or (until_command and not arg.startswith("-")):
            return [*out, *argv[i:]]
        if arg in takes_value and i + 1 < len(argv):
            value = argv[i + 1]
            if not value.startswith("-"):
                out += [arg, value]
            else:
                out.append(f"{arg}={value}" if arg.startswith("--") else arg + value)
            i += 2
            continue
        out.append(arg)
        i += 1
    return out
