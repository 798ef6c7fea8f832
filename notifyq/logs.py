"""One line per event, key=value or JSON, secrets redacted; only the "notifyq" logger.

log.info("claimed batch", extra=logs.kv(queue="emails", n=1)) writes
ts=2026-01-02T03:04:05.678Z level=info logger=notifyq.consumer msg="claimed batch" queue=emails n=1"""

import datetime
import json
import logging
import os
import re
import sys
from typing import Any, TextIO

LOGGER = "notifyq"
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "warn": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL}
_OURS = "_notifyq_handler"  # marks our handlers, so a second setup replaces only them


def kv(**fields: Any) -> dict[str, dict[str, Any]]:
    """Structured fields for a log call: `log.info("msg", extra=kv(queue=q, n=3))`."""
    return {"kv": fields}


class Line:
    """A message that carries its fields, so that it reads fully under any formatter (an app's
    `logging.basicConfig`, where record.kv is never printed): str() is `msg key=value ...`, and a
    multi-line traceback field follows on the lines below, as stdlib prints exc_info.
    notifyq's own formatters print the bare msg and the fields as keys of their own (record.kv).

        log.warning(logs.Line("job failed, retrying", fields), extra=logs.kv(**fields))
    """

    __slots__ = ("msg", "fields")

    def __init__(self, msg: str, fields: dict[str, Any]):
        self.msg, self.fields = msg, fields

    def __str__(self) -> str:
        tb = self.fields.get("traceback")
        parts = [self.msg] + [f"{k}={_value(v)}" for k, v in self.fields.items()
                              if k != "traceback" or "\n" not in str(v)]
        text = " ".join(parts) + (f"\n{tb}" if tb is not None and "\n" in str(tb) else "")
        return redact(text)


def setup_logging(level: str = "info", fmt: str = "auto", log_file: str | None = None,
                  use_syslog: bool = False) -> logging.Logger:
    """Configure the "notifyq" logger; safe to call again (e.g. on reload)."""
    if fmt not in ("auto", "kv", "json"):
        raise ValueError(f"log format must be auto, kv or json, not {fmt!r}")
    logger = logging.getLogger(LOGGER)
    for old in [h for h in logger.handlers if getattr(h, _OURS, False)]:
        logger.removeHandler(old)
        old.close()
    journal = False
    # logging.handlers (and socket) cost ~5 ms of every start: imported only when used.
    if log_file:
        from logging.handlers import WatchedFileHandler

        # Watched: a file moved away by logrotate is reopened, not written into forever.
        main: logging.Handler = WatchedFileHandler(log_file, encoding="utf-8")
        stamped = True
    else:
        main = logging.StreamHandler(sys.stderr)
        journal = under_journald(sys.stderr)
        stamped = fmt != "auto" or not journal  # journald stamps its own
    handlers = [(main, stamped, journal)]
    if use_syslog:
        from logging.handlers import SysLogHandler

        syslog = SysLogHandler("/dev/log", SysLogHandler.LOG_DAEMON)
        syslog.ident = f"notifyq[{os.getpid()}]: "
        handlers.append((syslog, False, False))  # syslog stamps its own, and sends the level itself
    for handler, stamped, journal in handlers:
        formatter = JSONFormatter() if fmt == "json" else KVFormatter(timestamps=stamped)
        handler.setFormatter(PriorityPrefix(formatter) if journal else formatter)
        # On the handler, not the logger: logger filters skip records from child loggers.
        handler.addFilter(Redactor())
        setattr(handler, _OURS, True)
        logger.addHandler(handler)
    logger.propagate = False  # a root handler (basicConfig, a library) would print twice
    set_level(level)
    return logger


def set_level(level: str) -> None:
    """Change the level live (SIGHUP reload)."""
    try:
        logging.getLogger(LOGGER).setLevel(_LEVELS[level.lower()])
    except KeyError:
        raise ValueError(f"log level must be one of {', '.join(_LEVELS)}, not {level!r}") from None


def under_journald(stream: TextIO, env: dict[str, str] | None = None) -> bool:
    """stream is systemd's journal connection: $JOURNAL_STREAM=dev:inode matches it (the
    variable alone proves nothing: children inherit it with stderr redirected elsewhere)."""
    env = os.environ if env is None else env
    try:
        dev, ino = (int(part) for part in env.get("JOURNAL_STREAM", "").split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):  # io.UnsupportedOperation is both
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


_URL_SECRET = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)\S*@", re.I)  # to the last @
_KEY_SECRET = re.compile(
    r"""(\b[\w.-]*(?:password|passwd|pwd|pw)["']?\s*[=:]\s*)("[^"]*"|'[^']*'|[^\s,;&'"}]+)""", re.I)
_SECRET_FIELD = re.compile(r"(?:passw(?:or)?d|pwd|(?:^|[_.-])pw)$", re.I)


def redact(text: str) -> str:
    return _KEY_SECRET.sub(r"\1***", _URL_SECRET.sub(r"\1***@", text))


class Redactor(logging.Filter):
    """Last line of defence: masks password=..., pw=..., scheme://user:SECRET@ in messages,
    string fields and tracebacks. Code should never log secrets in the first place."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = getattr(record, "kv", None)
        if isinstance(fields, dict):
            record.kv = {k: "***" if _SECRET_FIELD.search(str(k))
                         else redact(v) if isinstance(v, str) else v for k, v in fields.items()}
        if isinstance(record.msg, Line):  # the bare message; its fields are record.kv's, redacted
            own = record.msg.fields  # (a failed job's Line leaves its traceback to exc_info)
            record.msg = Line(redact(record.msg.msg), {k: record.kv.get(k, v) for k, v in own.items()}
                              if isinstance(fields, dict) else own)
        else:
            try:
                record.msg, record.args = redact(record.getMessage()), None
            except Exception:
                return True  # bad format args: let the handler report it as usual
        if record.exc_info or record.exc_text:  # formatters reuse a cached exc_text
            exc = record.exc_text or logging.Formatter().formatException(record.exc_info)
            record.exc_text = redact(exc)
        return True


def _core(record: logging.LogRecord, formatter: logging.Formatter, ts: bool) -> dict[str, Any]:
    when = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
    doc: dict[str, Any] = {"ts": when.isoformat(timespec="milliseconds")[:-6] + "Z"} if ts else {}
    msg = record.msg.msg if isinstance(record.msg, Line) else record.getMessage()
    doc.update(level=record.levelname.lower(), logger=record.name, msg=msg)
    fields = getattr(record, "kv", None)
    for key, value in (fields.items() if isinstance(fields, dict) else ()):
        doc["_" + key if key in doc else key] = value  # never overwrite the core keys
    if "traceback" not in doc:  # a failed job's record carries its traceback as a field and exc_info both
        if record.exc_info and not record.exc_text:
            record.exc_text = formatter.formatException(record.exc_info)
        if record.exc_text:
            doc["exc"] = record.exc_text
    if record.stack_info:
        doc["stack"] = record.stack_info
    return doc


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_core(record, self, ts=True), default=str, ensure_ascii=False)


# syslog(3) priorities: journald reads a leading "<N>" on a stream line as the line's level
# (SyslogLevelPrefix=, on by default), so `journalctl -p warning` works and errors show red.
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


class PriorityPrefix(logging.Formatter):
    """Wraps a formatter for a stderr that is the journal: "<6>msg=..." (one line per record:
    both formatters escape newlines, so the prefix covers the whole record)."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        level = max((n for n in _PRIORITY if n <= record.levelno), default=logging.DEBUG)
        return f"<{_PRIORITY[level]}>{self.inner.format(record)}"


_NEEDS_QUOTES = re.compile(r'[\s"=\\\x00-\x1f\x7f]')
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPE = re.compile(r'[\\"\x00-\x1f\x7f]')
_BAD_KEY = re.compile(r"[^\w.-]")


class KVFormatter(logging.Formatter):
    """logfmt-style key=value; values are quoted only when they must be, newlines escaped."""

    def __init__(self, timestamps: bool = True) -> None:
        super().__init__()
        self.timestamps = timestamps

    def format(self, record: logging.LogRecord) -> str:
        doc = _core(record, self, ts=self.timestamps)
        return " ".join(f"{_BAD_KEY.sub('_', str(k)) or '_'}={_value(v)}" for k, v in doc.items())


def _value(value: object) -> str:
    text = json.dumps(value) if value is None or isinstance(value, bool) else str(value)
    if text and not _NEEDS_QUOTES.search(text):
        return text
    return '"' + _ESCAPE.sub(lambda m: _ESCAPES.get(m[0], f"\\x{ord(m[0]):02x}"), text) + '"'
