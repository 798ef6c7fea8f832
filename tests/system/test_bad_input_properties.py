"""Property-based bad input (hypothesis): whatever a user types into a DSN, a config file, the
command line or the Python API, notifyq answers with no traceback, one line, an exit code from
errors.py, no secret, and nothing written when it refuses.

The CLI runs in this process (cli.main with captured stdio) against the test database, so a few
hundred examples take seconds. Bounded: max_examples per property, no deadline (a noisy machine).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import math

import pytest
from conftest import RUNTIME_PASSWORD
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notifyq import config, errors
from notifyq.config import DSN
from notifyq.produce.producer import Producer
from notifyq.run import cli

EXIT_CODES = {v for k, v in vars(errors).items() if k.startswith("EXIT_")} - {errors.EXIT_INTERNAL}
SECRET = "QZXJsecretPw"  # in every DSN password the properties build
TABLES = ("nq_job", "nq_queue", "nq_signal", "nq_consumer", "nq_periodic")
SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Pieces of text that bad input is made of: what broke notifyq before.
nasty_text = st.one_of(
    st.sampled_from(["", " ", "\n", "fz\n", "nan", "inf", "-inf", "-1", "0", "1e12", "1e309", "9" * 400,
                     "\udc80", "\ud800", "[" * 2000, "x" * 10_000, "é", "a;b", "'", "%", "%zz", "../x"]),
    st.text(max_size=30),
)
numbers_as_text = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "1e12", "-1", "0", "1e20", "9" * 400, "", "1.5", "abc", "1"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)
queue_names = st.one_of(st.sampled_from(["q", "ok.queue-1", "", "fz\n", "x" * 65, "a b", "\udc80"]), nasty_text)
password_chars = st.sampled_from(list("QZXJ/?#@:%[]") + ["%2F", "%zz"])


@st.composite
def dsns(draw) -> str:
    """mysql:// URLs around a password that holds SECRET and maybe unencoded / ? # @."""
    noise = "".join(draw(st.lists(password_chars, max_size=4)))
    password = SECRET[: draw(st.integers(4, len(SECRET)))] + noise + SECRET
    host = draw(st.sampled_from(["127.0.0.1", "[::1", "h", "", "[::1]"]))
    port = draw(st.sampled_from(["", ":0", ":70000", ":abc", ":3306", ":1"]))
    db = draw(st.sampled_from(["", "/", "/db", "/bad-name!", "/" + "d" * 70]))
    query = draw(st.sampled_from(["", "?ssl_bogus=1", "?ssl_mode=NOPE", "?colour=blue", "?unix_socket=/nope/x",
                                  "?ssl_ca=/nope.pem", "#frag"]))
    scheme = draw(st.sampled_from(["mysql", "mariadb", "postgres", ""]))
    return f"{scheme}://nq:{password}@{host}{port}{db}{query}"


def no_secret(text: str) -> None:
    """No 4-character piece of the password's secret part, and not the test user's password."""
    assert RUNTIME_PASSWORD not in text
    for i in range(len(SECRET) - 3):
        assert SECRET[i:i + 4] not in text, text


# ------------------------------------------------------------------ the DSN parser and the loader


@SETTINGS
@given(url=st.one_of(dsns(), st.text(max_size=60)))
def test_any_dsn_parses_or_is_one_config_error_without_the_password(url):
    try:
        dsn = DSN.parse(url)
    except errors.ConfigError as e:
        assert "\n" not in str(e)
        no_secret(str(e))
    else:
        no_secret(repr(dsn) + dsn.masked())


section_values = st.one_of(st.integers(), st.just(10**400), st.floats(), st.booleans(),
                           nasty_text, st.lists(st.integers(), max_size=2), st.dictionaries(nasty_text, st.integers(), max_size=2))
known_keys = st.sampled_from(["lease_s", "batch_size", "workers", "max_attempts", "retry_base_s", "command_timeout_s",
                              "poll_max_s", "poll_initial_s", "idle_wait_s", "reap_interval_s", "shutdown_grace_s",
                              "metrics_port", "chunk_size", "batch_lines", "level", "file", "handler", "ca", "mode"])
sections = st.sampled_from(["defaults", "wakeup", "consumer", "producer", "log", "tls", "queue", "queue.q", "dsn",
                            "connect_retry_s", "bogus"])


@SETTINGS
@given(data=st.dictionaries(sections, st.one_of(st.dictionaries(known_keys, section_values, max_size=3),
                                                section_values), max_size=3))
def test_any_settings_load_or_are_one_config_error(tmp_path_factory, data):
    overrides: dict = {}
    for section, value in data.items():
        if section == "queue.q":
            queues = overrides.setdefault("queue", {})
            if isinstance(queues, dict):  # (else `queue` itself is the bad value under test)
                queues["q"] = value
        else:
            overrides[section] = value
    try:
        cfg = config.load(env={"NOTIFYQ_CONFIG": "/dev/null"}, overrides=overrides)
    except errors.ConfigError as e:
        assert "\n" not in str(e)
    else:  # what loads is within range: finite numbers only
        for section in (cfg.defaults, cfg.wakeup, cfg.consumer, cfg.producer):
            for value in vars(section).values():
                if isinstance(value, float):
                    assert math.isfinite(value)


@SETTINGS
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1"))),
       raw=st.binary(max_size=64))
def test_any_config_file_loads_or_is_one_config_error(tmp_path_factory, text, raw):
    path = tmp_path_factory.mktemp("cfg") / "notifyq.toml"
    for content in (text.encode("utf-8", "surrogateescape"), raw):
        path.write_bytes(content)
        try:
            config.load(env={"NOTIFYQ_CONFIG": str(path)})
        except errors.ConfigError as e:
            assert "\n" not in str(e)


# ------------------------------------------------------------------ the command line


@st.composite
def command_lines(draw) -> list[str]:
    command = draw(st.sampled_from(["produce", "status", "pause", "resume", "config", "jobs list", "jobs purge",
                                    "jobs show", "jobs retry", "jobs cancel"]))
    argv = command.split()
    flags = {
        "produce": ["-q", "--priority", "--delay", "--at", "--max-attempts", "--dedup-key", "--reject-file"],
        "status": ["-q"], "pause": ["-q"], "resume": ["-q"], "config": [],
        "jobs list": ["-q", "--status", "--older-than", "--limit"],
        "jobs purge": ["-q", "--older-than"], "jobs show": [], "jobs retry": ["-q"], "jobs cancel": [],
    }[command]
    for flag in draw(st.lists(st.sampled_from(flags), max_size=3, unique=True)) if flags else []:
        value = draw(queue_names if flag == "-q" else
                     numbers_as_text if flag in ("--priority", "--delay", "--max-attempts", "--limit") else
                     st.sampled_from(["/no/such/dir/rej", "/dev/null"]) if flag == "--reject-file" else nasty_text)
        argv += [flag, value]
    if command == "jobs purge":
        argv += draw(st.sampled_from([["--dead"], ["--done"], []]))
    if command in ("jobs show", "jobs retry", "jobs cancel"):
        argv.append(draw(numbers_as_text))
    if command == "produce":
        argv += draw(st.lists(st.one_of(st.sampled_from(['{"n": 1}', "[]", "{nope", "[" * 3000, '"\udc80"']),
                                        nasty_text), min_size=1, max_size=2))
    globals_ = draw(st.sampled_from([[], ["--dsn", draw(dsns())], ["--log-level", "loud"], ["--config", "/nope"]]))
    return [*globals_, *argv] if draw(st.booleans()) else [*argv, *globals_]


def run_in_process(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(argv)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def counts(db) -> tuple[int, ...]:
    return tuple(db.scalar(f"SELECT COUNT(*) FROM {t}") for t in TABLES)


def test_any_command_line_ends_with_a_documented_code_one_line_and_no_secret(db, monkeypatch):
    for key, value in {**db.env, "NOTIFYQ_CONNECT_RETRY_S": "0"}.items():
        monkeypatch.setenv(key, value)

    @settings(SETTINGS, max_examples=80)
    @given(argv=command_lines())
    def check(argv):
        before = counts(db)
        code, out, err = run_in_process(argv)
        assert code in EXIT_CODES, (argv, code, err)
        assert "Traceback" not in err + out
        no_secret(out + err)
        if code != 0:
            lines = [ln for ln in err.splitlines() if not ln.startswith("notifyq: warning:")]
            assert len(lines) == 1 and lines[0].startswith("notifyq: error: "), (argv, err)
            if code != errors.EXIT_INPUT or "rejected" not in err:  # a stream keeps its good lines
                assert counts(db) == before, argv

    check()


# ------------------------------------------------------------------ the Python API

anything = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(),
                     nasty_text, st.just(dt.datetime(2030, 1, 1)), st.just(dt.datetime.max),
                     st.just(dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)), st.just(object()))


def test_any_put_arguments_enqueue_or_raise_input_error_and_write_nothing(db):
    cfg = db.config()
    producer = Producer("api", cfg)

    @SETTINGS
    @given(payload=st.one_of(anything, st.dictionaries(nasty_text, anything, max_size=2)),
           kwargs=st.fixed_dictionaries({}, optional={"priority": anything, "delay": anything, "run_at": anything,
                                                      "max_attempts": anything, "dedup_key": anything}))
    def check(payload, kwargs):
        before = db.scalar("SELECT COUNT(*) FROM nq_job")
        try:
            job_id = producer.put(payload, **kwargs)
        except errors.InputError as e:
            assert "\n" not in str(e)
            assert db.scalar("SELECT COUNT(*) FROM nq_job") == before
        else:
            assert isinstance(job_id, int)

    try:
        check()
    finally:
        producer.close()


@pytest.fixture(autouse=True)
def _no_journal(monkeypatch):
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)  # log lines as on a terminal
