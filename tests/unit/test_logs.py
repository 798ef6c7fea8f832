"""notifyq.logs: kv and JSON lines, redaction, journald detection, live level changes."""

import io
import json
import logging
import os
import re
import sys

import pytest

from notifyq import logs


@pytest.fixture(autouse=True)
def restore_notifyq_logger():
    logger = logging.getLogger("notifyq")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    for handler in logger.handlers[:]:
        logger.removeHandler(handler)
        if handler not in saved[0]:
            handler.close()
    logger.handlers[:], logger.level, logger.propagate = saved


class Stderr(io.StringIO):
    def __init__(self, monkeypatch):
        super().__init__()
        self.monkeypatch = monkeypatch

    def setup(self, *args, **kwargs):
        # pytest re-installs its own sys.stderr between fixture setup and the test call,
        # so the swap happens here, inside the test.
        self.monkeypatch.setattr(sys, "stderr", self)
        return logs.setup_logging(*args, **kwargs)


@pytest.fixture
def stderr(monkeypatch):
    """A buffer that setup_logging() will see as sys.stderr (call stderr.setup(...))."""
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    return Stderr(monkeypatch)


def lines(buffer):
    return buffer.getvalue().splitlines()


KV_TS = re.compile(r"^ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")


def test_kv_line_has_timestamp_level_logger_message_and_fields(stderr):
    stderr.setup("info", "kv")
    logging.getLogger("notifyq.consumer").info("claimed batch", extra=logs.kv(queue="emails", n=100))
    (line,) = lines(stderr)
    assert KV_TS.match(line)
    assert line.split(" ", 1)[1] == (
        'level=info logger=notifyq.consumer msg="claimed batch" queue=emails n=100')


@pytest.mark.parametrize("value, rendered", [
    ("plain", "plain"),
    ("two words", '"two words"'),
    ('say "hi"', r'"say \"hi\""'),
    ("a=b", '"a=b"'),
    ("line1\nline2\r\n", r'"line1\nline2\r\n"'),
    ("tab\there", r'"tab\there"'),
    ("back\\slash", r'"back\\slash"'),
    ("bell\x07", r'"bell\x07"'),
    ("", '""'),
    (None, "null"),
    (True, "true"),
    (3.5, "3.5"),
    ("naïve", "naïve"),
])
def test_kv_values_are_quoted_and_escaped_only_when_needed(stderr, value, rendered):
    stderr.setup("info", "kv")
    logging.getLogger("notifyq").info("m", extra=logs.kv(v=value))
    (line,) = lines(stderr)  # never more than one line per event
    assert line.endswith(f" v={rendered}")


def test_kv_keys_are_sanitised_and_core_keys_are_not_overwritten(stderr):
    stderr.setup("info", "kv")
    logging.getLogger("notifyq").info("real", extra=logs.kv(**{"msg": "fake", "odd key=": 1}))
    (line,) = lines(stderr)
    assert " msg=real " in line and line.endswith(" _msg=fake odd_key_=1")


def test_an_exception_stays_on_one_kv_line(stderr):
    stderr.setup("info", "kv")
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        logging.getLogger("notifyq").exception("failed")
    (line,) = lines(stderr)
    assert 'msg=failed exc="Traceback (most recent call last):\\n' in line
    assert line.endswith('ValueError: bad\\nthing"')


def test_json_is_one_object_per_line(stderr):
    stderr.setup("info", "json")
    log = logging.getLogger("notifyq.producer")
    log.warning("two\nlines", extra=logs.kv(queue="emails", n=2, ok=False, obj=object))
    log.info("second")
    first, second = (json.loads(line) for line in lines(stderr))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first.pop("ts"))
    assert first == {"level": "warning", "logger": "notifyq.producer", "msg": "two\nlines",
                     "queue": "emails", "n": 2, "ok": False, "obj": str(object)}
    assert second["msg"] == "second"


@pytest.mark.parametrize("fmt", ["kv", "json"])
@pytest.mark.parametrize("message, leak", [
    ("connecting to mysql://app:s3cret@db:3306/notifyq", "s3cret"),
    ("dsn mysql+mysqldb://app:p@ss@db/q", "ss@db"),  # an @ inside the password too
    ("login password=hunter2 user=app", "hunter2"),
    ("login PASSWORD: 'two words'", "two words"),
    ("pw=abc123,next=1", "abc123"),
    ('{"db_password": "xyz"}', "xyz"),
])
def test_secrets_in_messages_are_redacted(stderr, fmt, message, leak):
    stderr.setup("info", fmt)
    logging.getLogger("notifyq.db").info(message)
    (line,) = lines(stderr)
    assert leak not in line
    assert "***" in line


def test_secrets_in_args_fields_and_tracebacks_are_redacted(stderr):
    stderr.setup("info", "kv")
    log = logging.getLogger("notifyq.db")
    log.info("dsn is %s", "mysql://u:Zq9s3cr3t@h/db",
             extra=logs.kv(password="hunter2", dsn="mysql://u:Zq9s3cr3t@h/db", password_file="/etc/x"))
    try:
        raise ConnectionError("mysql://u:Zq9s3cr3t@h/db refused")
    except ConnectionError:
        log.exception("connect failed password=hunter2")
    out = stderr.getvalue()
    assert "Zq9s3cr3t" not in out and "hunter2" not in out
    assert "password=*** dsn=mysql://u:***@h/db password_file=/etc/x" in out  # a path is no secret
    assert "mysql://u:***@h/db refused" in out


def test_a_url_without_password_is_left_alone(stderr):
    stderr.setup("info", "kv")
    logging.getLogger("notifyq").info("see https://example.com:8443/docs and mysql://db:3306/q")
    assert "https://example.com:8443/docs and mysql://db:3306/q" in stderr.getvalue()


def test_under_journald_timestamps_are_left_to_the_journal(tmp_path, monkeypatch):
    # Given stderr is the stream systemd named in JOURNAL_STREAM
    with open(tmp_path / "journal", "w+") as fake_journal:
        st = os.fstat(fake_journal.fileno())
        monkeypatch.setattr(sys, "stderr", fake_journal)
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        logs.setup_logging("debug", "auto")
        log = logging.getLogger("notifyq")
        log.debug("d")
        log.info("hello")
        log.warning("w")
        log.error("e")
        log.critical("c")
        fake_journal.flush()
        # Then the auto format is kv without ts=, each line prefixed with its syslog priority,
        # which journald turns into the entry's level
        assert (tmp_path / "journal").read_text().splitlines() == [
            "<7>level=debug logger=notifyq msg=d", "<6>level=info logger=notifyq msg=hello",
            "<4>level=warning logger=notifyq msg=w", "<3>level=error logger=notifyq msg=e",
            "<2>level=critical logger=notifyq msg=c"]


def test_under_journald_a_traceback_stays_on_its_prefixed_line(tmp_path, monkeypatch):
    with open(tmp_path / "journal", "w+") as fake_journal:
        st = os.fstat(fake_journal.fileno())
        monkeypatch.setattr(sys, "stderr", fake_journal)
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        for fmt in ("auto", "json"):
            logs.setup_logging("info", fmt)
            try:
                raise ValueError("bad\nthing")
            except ValueError:
                logging.getLogger("notifyq").exception("failed")
        fake_journal.flush()
        lines = (tmp_path / "journal").read_text().splitlines()
        assert len(lines) == 2 and all(line.startswith("<3>") for line in lines)
        assert "Traceback" in lines[0] and json.loads(lines[1][3:])["msg"] == "failed"


def test_a_journal_stream_that_is_not_our_stderr_keeps_timestamps(tmp_path, monkeypatch):
    # An inherited JOURNAL_STREAM with stderr redirected elsewhere (a child, a pipe).
    with open(tmp_path / "elsewhere", "w+") as other, open(tmp_path / "journal", "w") as journal:
        st = os.fstat(journal.fileno())
        monkeypatch.setattr(sys, "stderr", other)
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        logs.setup_logging("info", "auto")
        logging.getLogger("notifyq").info("hello")
        other.flush()
        assert KV_TS.match((tmp_path / "elsewhere").read_text())


@pytest.mark.parametrize("env", [{}, {"JOURNAL_STREAM": "junk"}, {"JOURNAL_STREAM": "1:2:3"}])
def test_under_journald_is_false_without_a_matching_stream(env):
    assert logs.under_journald(io.StringIO(), env) is False
    assert logs.under_journald(sys.__stderr__, env) is False


def test_set_level_changes_what_gets_through_live(stderr):
    stderr.setup("info", "kv")
    log = logging.getLogger("notifyq.consumer")
    log.debug("hidden")
    logs.set_level("DEBUG")
    log.debug("shown")
    logs.set_level("warning")
    log.info("hidden too")
    assert [line.split("msg=")[1] for line in lines(stderr)] == ["shown"]
    with pytest.raises(ValueError, match="log level"):
        logs.set_level("loud")


def test_setup_twice_replaces_its_handlers_and_leaves_others_and_root_alone(stderr):
    logger = logging.getLogger("notifyq")
    foreign = logging.NullHandler()
    logger.addHandler(foreign)
    root_handlers = logging.getLogger().handlers[:]
    stderr.setup("info", "kv")
    stderr.setup("info", "json")
    logger.info("once")
    assert len(lines(stderr)) == 1 and json.loads(lines(stderr)[0])["msg"] == "once"
    assert foreign in logger.handlers and logger.propagate is False
    assert logging.getLogger().handlers == root_handlers


def test_log_file_gets_timestamped_lines(tmp_path, stderr):
    stderr.setup("info", "auto", log_file=str(tmp_path / "notifyq.log"))
    logging.getLogger("notifyq").info("to the file", extra=logs.kv(password="x"))
    (line,) = (tmp_path / "notifyq.log").read_text().splitlines()
    assert KV_TS.match(line) and line.endswith('msg="to the file" password=***')
    assert stderr.getvalue() == ""


def test_bad_format_is_refused():
    with pytest.raises(ValueError, match="auto, kv or json"):
        logs.setup_logging("info", "xml")
