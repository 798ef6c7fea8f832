"""Checks of user-given values, in one place: config files, NOTIFYQ_* variables, flags and the
Python API all go through these, so a value refused in one is refused in all, in the same words.

Each check returns the clean value or raises `error` (an errors.NotifyqError subclass chosen by
the caller: ConfigError for settings, InputError for data) with one line that names the value.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from notifyq import errors

QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
DATABASE_NAME_RE = re.compile(r"[A-Za-z0-9_]{1,64}")
MAX_SECONDS = 10 * 365 * 86400.0  # any duration: beyond this the database's datetimes overflow
MAX_VERSION = 4294967295  # a code version (consumer.version, put(min_version=)): nq_job.min_version is INT UNSIGNED
_SHOWN = 80  # a value echoed in an error is cut here: a 10,000-character name is no message


def shown(value: Any) -> str:
    """repr(value), cut short for an error line."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "...(cut)"


def queue_name(name: Any, error: type[errors.NotifyqError] = errors.InputError) -> str:
    """Queue names end up in lock names and log lines, never in SQL text; still, keep them tame.
    fullmatch, not match with `$`: `$` also matches before a trailing newline."""
    if not isinstance(name, str) or not QUEUE_NAME_RE.fullmatch(name):
        raise error(f"invalid queue name {shown(name)}: use 1-64 characters from A-Z a-z 0-9 _ . -")
    return name


# nq_job.job_key and nq_dedup.dedup_key are VARCHAR(191): utf8mb4's longest indexable prefix
KEY_MAX_CHARS = 191
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1 (U+0085, a line break to some readers)


def job_key(name: str, key: Any, error: type[errors.NotifyqError] = errors.InputError) -> str:
    """A job's key (`key=`, flow control's) or dedup key, as the columns take it: a str of 1 to
    KEY_MAX_CHARS characters that encodes as UTF-8 (a lone surrogate does not)."""
    if not isinstance(key, str):
        raise error(f"{name}: expected a string, got {shown(key)}")
    if not 0 < len(key) <= KEY_MAX_CHARS:
        raise error(f"{name} must be 1 to {KEY_MAX_CHARS} characters, got {len(key)}")
    try:
        key.encode()
    except UnicodeEncodeError:
        raise error(f"{name} is not valid UTF-8") from None
    if name != "dedup_key":
        # The server compares keys with trailing spaces ignored ("x" and "x " are one key to
        # it, and " " is the queue's own empty key), and a control character never names a
        # tenant: refused, where a key that the limits and rates count under was silently
        # another's (a limited key that never ran, a rated consumer that failed).
        if key.endswith(" ") or key.isspace():
            raise error(f"{name} must not end with a space, got {shown(key)}")
        if _CONTROL.search(key):
            raise error(f"{name} must not contain control characters, got {shown(key)}")
    return key


def number(name: str, value: Any, *, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False, integer: bool = False,
           error: type[errors.NotifyqError] = errors.InputError) -> Any:
    """A finite int or float within [lo, hi] ((lo, hi] with lo_open); bools and nan/inf refused.

    `integer` demands an int (a float like 2.0 is refused: a count is never fractional)."""
    kind = "an integer" if integer else "a number"
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type:
        raise error(f"{name}: expected {kind}, got {shown(value)}")
    if not integer:
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an int too large for a float (TOML ints have no size limit)
            finite = False
        if not finite:
            raise error(f"{name}: expected a finite number, got {shown(value)}")
    too_low = lo is not None and (value <= lo if lo_open else value < lo)
    too_high = hi is not None and value > hi
    if too_low or too_high:
        low = "" if lo is None else (f"> {lo:g}" if lo_open else f">= {lo:g}")
        high = "" if hi is None else f"<= {hi:g}"
        raise error(f"{name}: must be {' and '.join(p for p in (low, high) if p)}, got {shown(value)}")
    return value


def seconds(name: str, value: Any, *, positive: bool = True,
            error: type[errors.NotifyqError] = errors.InputError) -> float:
    """A duration: finite, > 0 (or >= 0 when not `positive`), at most MAX_SECONDS."""
    return float(number(name, value, lo=0, lo_open=positive, hi=MAX_SECONDS, error=error))


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration_text(text: str) -> float | None:
    """'90s', '30m', '12h', '7d', '2w' or plain seconds -> seconds; None if it is none of them."""
    m = _DURATION.match(str(text).strip().lower())
    return float(m.group(1)) * _UNIT_S[m.group(2)] if m else None


# A rate limit, "N/PERIOD": at most N starts in any window of PERIOD (config `rate`,
# `rate_per_key`; store/rates.py keeps the last N start times of each budget, one row each, so N
# is bounded). PERIOD is a number with a unit (ms, s, m, h, d), the number 1 if left out ("10/s").
# ASCII digits and spaces only, the unit in lower case: "\d" took Arabic and fullwidth digits,
# "\s" any Unicode space, and the load lower-cased "10/1S"; only what the docs name loads.
_RATE = re.compile(r" *([0-9]+) */ *([0-9]+(?:\.[0-9]+)?)? *(ms|s|m|h|d) *")
_RATE_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
RATE_MAX_COUNT = 10000
RATE_PERIOD_S = (0.001, 86400.0)
RATE_FORMS = '"N/PERIOD" with N 1-10000 and PERIOD 1ms-1d (units ms, s, m, h, d), e.g. "100/60s"'


class Rate(tuple):
    """A parsed rate limit: (count, period_s)."""

    @property
    def count(self) -> int:
        return self[0]

    @property
    def period_s(self) -> float:
        return self[1]


def rate(name: str, value: Any, error: type[errors.NotifyqError] = errors.InputError) -> Rate | None:
    """A rate limit's text -> Rate; "" -> None (no limit). One line naming `name` otherwise."""
    if value == "":
        return None
    m = _RATE.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise error(f"{name}: expected {RATE_FORMS}, got {shown(value)}")
    count = int(m.group(1))
    period_s = float(m.group(2) or 1) * _RATE_UNIT_S[m.group(3)]
    if not 1 <= count <= RATE_MAX_COUNT:
        raise error(f"{name}: N must be 1-{RATE_MAX_COUNT} (starts per period), got {shown(value)}")
    if not RATE_PERIOD_S[0] <= period_s <= RATE_PERIOD_S[1]:
        raise error(f"{name}: the period must be 1ms-1d, got {shown(value)}")
    return Rate((count, period_s))


def writable_file(name: str, path: str, error: type[errors.NotifyqError] = errors.ConfigError) -> str:
    """A file notifyq will create or append to: its directory exists and it can be written.
    Checked before anything starts, so a typo is one line, not a traceback from deep inside."""
    try:
        p = Path(path)
        parent = p.parent if str(p.parent) else Path(".")
        if p.is_dir():
            raise error(f"{name} {shown(path)} is a directory")
        if not parent.is_dir():
            raise error(f"{name} {shown(path)}: directory {shown(str(parent))} does not exist")
        target = p if p.exists() else parent
        if not os.access(target, os.W_OK):
            raise error(f"{name} {shown(path)}: permission denied")
    except OSError as e:  # name too long, a loop of links ...
        raise error(f"{name} {shown(path)}: {e.strerror}") from None
    except ValueError:  # an embedded NUL byte
        raise error(f"{name} {shown(path)}: not a valid path") from None
    return path


def readable_file(name: str, path: str, error: type[errors.NotifyqError] = errors.ConfigError) -> str:
    """A file notifyq will read (a FIFO counts): it exists and can be read."""
    try:
        if not os.path.exists(path):
            raise error(f"{name} {shown(path)} does not exist")
        if os.path.isdir(path):
            raise error(f"{name} {shown(path)} is a directory")
        if not os.access(path, os.R_OK):
            raise error(f"{name} {shown(path)}: permission denied")
    except OSError as e:
        raise error(f"{name} {shown(path)}: {e.strerror}") from None
    except ValueError:
        raise error(f"{name} {shown(path)}: not a valid path") from None
    return path
