"""One validation layer: DSNs, config files, NOTIFYQ_* variables and the Producer API refuse bad
values with one line that names the value and where it was set, and never echo a password."""

from __future__ import annotations

import datetime as dt
import os

import pytest

from notifyq import config, errors
from notifyq.config import DSN, values
from notifyq.produce.producer import Producer


def load(tmp_path, text="", env=None, overrides=None):
    path = tmp_path / "notifyq.toml"
    path.write_text(text)
    return config.load(env={"NOTIFYQ_CONFIG": str(path), **(env or {})}, overrides=overrides)


def config_error(tmp_path, text="", env=None, overrides=None) -> str:
    with pytest.raises(errors.ConfigError) as raised:
        load(tmp_path, text, env, overrides)
    message = str(raised.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------ 13.21 password fragments


@pytest.mark.parametrize("url", [
    "mysql://nq:Slash/Tail@db.example/jobs",
    "mysql://nq:Qmark?Tail@db.example/jobs",
    "mysql://nq:Hash#Tail@db.example/jobs",
    "mysql://nq:At@Slash/Tail@db.example/jobs",
    "mysql://nq:At@Qmark?Tail@db.example/jobs",
    "mysql://nq:12/34Tail@db.example/jobs",
])
def test_an_unencoded_character_in_the_password_is_refused_without_any_part_of_it(url):
    # Given a DSN whose password holds an unencoded / ? # (which ends the host part early)
    password = url.split("nq:", 1)[1].rsplit("@", 1)[0]
    # When it is parsed
    with pytest.raises(errors.ConfigError) as raised:
        DSN.parse(url)
    # Then the message says to percent-encode it, and holds no piece of the password
    message = str(raised.value)
    assert "percent-encoded" in message
    for piece in [password[i:i + 4] for i in range(len(password) - 3)]:
        assert piece not in message, piece


def test_a_percent_encoded_password_parses_to_the_real_one():
    dsn = DSN.parse("mysql://nq:S%2Fl%3Fa%23s%40h@db.example/jobs")
    assert dsn.password == "S/l?a#s@h" and "S/l" not in dsn.masked()


# ------------------------------------------------------------------ 13.23 queue names


@pytest.mark.parametrize("name", ["fz\n", "seeded\n", "a\r\n", "\nq", "x" * 10_000])
def test_a_queue_name_with_a_trailing_newline_or_too_long_is_refused_everywhere(tmp_path, name):
    with pytest.raises(errors.InputError) as raised:
        config.validate_queue_name(name)
    assert len(str(raised.value)) < 200  # a 10,000-character name is not echoed whole
    with pytest.raises(errors.InputError):
        Producer(name, load(tmp_path))
    text = f'[queue."{name.encode("unicode_escape").decode()}"]\nbatch_size = 1\n'
    with pytest.raises(errors.ConfigError):
        load(tmp_path, text)


# ------------------------------------------------------------------ 13.22 / 14.7 numbers


@pytest.mark.parametrize("section, key", [
    ("defaults", "lease_s"), ("defaults", "command_timeout_s"), ("defaults", "retry_base_s"),
    ("defaults", "retry_max_s"), ("queue.q", "lease_s"), ("wakeup", "poll_max_s"),
    ("wakeup", "idle_wait_s"), ("wakeup", "poll_initial_s"), ("consumer", "reap_interval_s"),
    ("consumer", "shutdown_grace_s"),
])
@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "-inf", "1e300", "9" * 400])
def test_zero_negative_and_non_finite_durations_are_refused_naming_the_key_and_file(tmp_path, section, key, bad):
    # Given a config file setting a duration to a bad value
    message = config_error(tmp_path, f"[{section}]\n{key} = {bad}\n")
    # Then the one line names the key and the file it came from
    assert f"{section}.{key}" in message and str(tmp_path / "notifyq.toml") in message


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "1e300"])
def test_a_batch_wait_may_be_zero_but_not_negative_or_non_finite(tmp_path, bad):
    assert load(tmp_path, "[producer]\nbatch_wait_s = 0\n").producer.batch_wait_s == 0
    assert "producer.batch_wait_s" in config_error(tmp_path, f"[producer]\nbatch_wait_s = {bad}\n")


@pytest.mark.parametrize("section, key", [
    ("defaults", "batch_size"), ("defaults", "workers"), ("defaults", "max_attempts"),
    ("producer", "chunk_size"), ("producer", "batch_lines"), ("producer", "max_payload_bytes"),
])
@pytest.mark.parametrize("bad", ["0", "-1", "1.5", "true"])
def test_zero_negative_and_fractional_counts_are_refused(tmp_path, section, key, bad):
    assert f"{section}.{key}" in config_error(tmp_path, f"[{section}]\n{key} = {bad}\n")


@pytest.mark.parametrize("var, bad, key", [
    ("NOTIFYQ_CONNECT_RETRY_S", "nan", "connect_retry_s"), ("NOTIFYQ_CONNECT_RETRY_S", "-1", "connect_retry_s"),
    ("NOTIFYQ_CONNECT_RETRY_S", "inf", "connect_retry_s"), ("NOTIFYQ_POLL_MAX_S", "nan", "wakeup.poll_max_s"),
    ("NOTIFYQ_METRICS_PORT", "70000", "consumer.metrics_port"), ("NOTIFYQ_METRICS_PORT", "-1", "consumer.metrics_port"),
])
def test_bad_numbers_from_the_environment_are_refused_naming_the_variable(tmp_path, var, bad, key):
    message = config_error(tmp_path, env={var: bad})
    assert key in message and var in message


def test_bad_numbers_from_flags_name_the_command_line(tmp_path):
    message = config_error(tmp_path, overrides={"defaults": {"batch_size": 0}})
    assert "defaults.batch_size" in message and "the command line" in message


def test_a_retention_of_zero_keeps_its_meaning_forever_and_connect_retry_zero_means_once(tmp_path):
    cfg = load(tmp_path, "connect_retry_s = 0\n[defaults]\nretention_s = 0\n")
    assert cfg.defaults.retention_s == 0 and cfg.connect_retry_s == 0


@pytest.mark.parametrize("text, mentions", [
    ("queue = 1\n", "queue: expected a table"),
    ("defaults = 1\n", "defaults: expected a table"),
    ("tls = 'yes'\n", "tls: expected a table"),
    ("[queue]\nx = 1\n", "queue.x: expected a table"),
    ("[queue.x]\nperiodic = 1\n", "queue.x.periodic"),
    ("[[queue.x.periodic]]\ncron = '* * * * *'\npayload = {v = nan}\n", "not JSON"),
    ("dsn = 5\n", "dsn: expected a string"),
    ("[log]\nfile = '/no/such/dir/notifyq.log'\n", "does not exist"),
    ("[wakeup]\npoll_initial_s = 2.0\npoll_max_s = 1.0\n", "poll_max_s"),
])
def test_malformed_sections_are_one_line_not_a_traceback(tmp_path, text, mentions):
    assert mentions in config_error(tmp_path, text)


def test_a_toml_file_that_is_not_utf8_or_nested_too_deeply_is_one_line(tmp_path):
    (tmp_path / "notifyq.toml").write_bytes(b"dsn = '\xff'\n")
    with pytest.raises(errors.ConfigError, match="not UTF-8"):
        config.load(env={"NOTIFYQ_CONFIG": str(tmp_path / "notifyq.toml")})
    assert "invalid TOML" in config_error(tmp_path, "x = " + "[" * 5000 + "]" * 5000 + "\n")


def test_a_config_path_too_long_is_one_line(tmp_path):
    with pytest.raises(errors.ConfigError):
        config.load(env={"NOTIFYQ_CONFIG": "/" + "x" * 5000})


# ------------------------------------------------------------------ DSN


def test_a_dsn_without_a_database_means_the_documented_default():
    assert DSN.parse("mysql://root@127.0.0.1/").database == config.DEFAULT_DATABASE == "notifyq"
    assert DSN.parse("mysql://root@127.0.0.1").database == "notifyq"


@pytest.mark.parametrize("url, mentions", [
    ("mysql://u@h:0/db", "port"), ("mysql://u@h:70000/db", "port"), ("mysql://u@[::1/db", "IPv6"),
    ("mysql://u@h/db?ssl_bogus=1", "unknown TLS option"), ("mysql://u@h/db?ssl_mode=BOGUS", "ssl_mode"),
    ("mysql://u@h/db?ssl_mode=DISABLED", "ssl_mode"), ("mysql://u@h/db?ssl_mode=PREFERRED", "ssl_mode"),
    ("mysql://u@h/db?colour=blue", "unknown option"),
])
def test_bad_dsns_are_config_errors(url, mentions):
    with pytest.raises(errors.ConfigError, match=mentions):
        DSN.parse(url)


def test_any_tls_option_means_tls_required_and_a_named_ca_is_verified(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked here")
    assert DSN.parse("mysql://u@h/db?ssl_cipher=AES256-SHA").tls_mode == "REQUIRED"
    assert DSN.parse(f"mysql://u@h/db?ssl_ca={ca}").tls_mode == "VERIFY_CA"
    assert DSN.parse("mysql://u@h/db?ssl_mode=verify_identity").tls_mode == "VERIFY_IDENTITY"
    assert DSN.parse("mysql://u@h/db").tls_mode is None
    cfg = load(tmp_path, f"[tls]\nca = '{ca}'\n")
    assert cfg.dsn.tls_mode == "VERIFY_CA" and cfg.dsn.connect_args()["ssl"] == {"ca": str(ca)}


@pytest.mark.parametrize("where", ["dsn", "tls"])
def test_a_missing_ca_file_is_an_error_not_plaintext(tmp_path, where):
    missing = tmp_path / "nope.pem"
    text = (f"dsn = 'mysql://u@h/db?ssl_ca={missing}'\n" if where == "dsn" else f"[tls]\nca = '{missing}'\n")
    assert "does not exist" in config_error(tmp_path, text)


def test_a_unix_socket_that_can_never_be_one_is_refused(tmp_path):
    assert "is not a socket" in config_error(tmp_path, f"dsn = 'mysql://u@localhost/db?unix_socket={tmp_path}'\n")
    assert "directory does not exist" in config_error(
        tmp_path, f"dsn = 'mysql://u@localhost/db?unix_socket={tmp_path}/no/such.sock'\n")
    load(tmp_path, f"dsn = 'mysql://u@localhost/db?unix_socket={tmp_path}/not-yet.sock'\n")  # server starting


def test_the_readable_file_warning_ignores_a_dsn_with_a_port_but_no_password(tmp_path):
    path = tmp_path / "notifyq.toml"
    path.write_text("dsn = 'mysql://db.example:3307/jobs'\n")  # no user, no password: only a port
    path.chmod(0o644)
    warnings: list[str] = []
    config.load(env={"NOTIFYQ_CONFIG": str(path)}, warn=warnings.append)
    assert warnings == []


# ------------------------------------------------------------------ --command environment


def test_a_command_child_gets_the_environment_without_notifyqs_secrets():
    from notifyq.consume.commands import child_env

    env = {"PATH": "/bin", "NOTIFYQ_PASSWORD": "pw1", "NOTIFYQ_PASSWORD_FILE": "/run/pw",
           "NOTIFYQ_DSN": "mysql://u:pw2@h/db", "NOTIFYQ_LOG_LEVEL": "info"}
    assert child_env(env) == {"PATH": "/bin", "NOTIFYQ_LOG_LEVEL": "info"}
    assert child_env({"NOTIFYQ_DSN": "mysql://u@h:3306/db"}) == {"NOTIFYQ_DSN": "mysql://u@h:3306/db"}
    assert child_env({"NOTIFYQ_DSN": "mysql://u:p/w@h/db"}) == {}  # malformed, still secret


# ------------------------------------------------------------------ the Python API


@pytest.mark.parametrize("kwargs, mentions", [
    ({"priority": "abc"}, "priority"), ({"priority": None}, "priority"), ({"priority": 40000}, "priority"),
    ({"delay": None}, "delay"), ({"delay": float("nan")}, "delay"), ({"delay": float("inf")}, "delay"),
    ({"delay": 1e12}, "delay"), ({"delay": "5"}, "delay"), ({"delay": -1}, "delay"),
    ({"run_at": "2030-01-01"}, "run_at"), ({"run_at": dt.datetime(2030, 1, 1)}, "timezone"),
    ({"run_at": dt.datetime(9999, 1, 1, tzinfo=dt.timezone.utc)}, "run_at"),
    ({"dedup_key": 5}, "dedup_key"), ({"dedup_key": ""}, "dedup_key"), ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": "3"}, "max_attempts"), ({"conn": object()}, "conn"),
])
def test_wrong_api_arguments_raise_notifyqs_input_error_before_any_connection(tmp_path, kwargs, mentions):
    # Given a producer whose database does not exist (nothing may be reached)
    producer = Producer("q", load(tmp_path, "dsn = 'mysql://u@127.0.0.1:1/db'\nconnect_retry_s = 0\n"))
    # When put() gets a wrong argument
    with pytest.raises(errors.InputError) as raised:
        producer.put({"n": 1}, **kwargs)
    # Then it is notifyq's own error, one line, naming the argument
    assert mentions in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("payload", [float("nan"), {"x": float("inf")}, "\udc80", {1j: 2}, object()])
def test_payloads_that_are_not_json_raise_input_error(tmp_path, payload):
    with pytest.raises(errors.InputError):
        Producer("q", load(tmp_path)).put(payload)


def test_values_number_is_the_one_finite_and_range_check():
    from notifyq.config import values

    assert values.number("n", 3, lo=1, hi=5, integer=True) == 3
    for bad in (True, None, "3", float("nan"), float("inf"), 0, 6):
        with pytest.raises(errors.InputError):
            values.number("n", bad, lo=1, hi=5)
    with pytest.raises(errors.ConfigError):
        values.seconds("t", 0, error=errors.ConfigError)
    assert os.path.basename(values.writable_file("f", "x.log")) == "x.log"


def test_tables_nested_thousands_deep_in_two_files_are_one_line(tmp_path):
    deep = "[" + ".".join(["a"] * 3000) + "]\nx = 1\n"
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "10.toml").write_text(deep)
    assert "nested too deeply" in config_error(tmp_path, deep)


def test_a_producer_refuses_a_config_that_is_none_and_put_many_a_single_payload(tmp_path):
    with pytest.raises(errors.InputError, match="config"):
        Producer("q", None)
    for payloads in ("abc", {"n": 1}, 5):
        with pytest.raises(errors.InputError, match="payloads"):
            Producer("q", load(tmp_path)).put_many(payloads)


# ------------------------------------------------------------------ periodic entries

PERIODIC_ENTRIES = [  # (entries of queue q, the error both refuse them with; None: both accept them)
    ([{"cron": "* * * * *"}], None),
    ([{"cron": "*/5 * * * *", "name": "report", "payload": {"kind": "report"}, "priority": -32768}], None),
    ([{"cron": "* * * * *", "name": "a"}, {"cron": "* * * * *", "name": "b"}], None),
    ([{"name": "x"}], 'queue.q.periodic: each entry needs a cron = "..." expression'),
    ([{"cron": 5}], 'queue.q.periodic: each entry needs a cron = "..." expression'),
    ([{"cron": "* * * * *", "every": 1}], "queue.q.periodic: unknown key(s) every"),
    ([{"cron": "not a cron"}], "queue.q.periodic: invalid cron expression 'not a cron'"),
    ([{"cron": "* * * * *", "name": ""}], "queue.q.periodic '': names must be unique per queue, 1-191 characters"),
    ([{"cron": "* * * * *", "name": 5}], "queue.q.periodic 5: names must be unique per queue, 1-191 characters"),
    ([{"cron": "* * * * *", "name": "n" * 192}], "names must be unique per queue, 1-191 characters"),
    ([{"cron": "* * * * *"}, {"cron": "* * * * *"}],
     "queue.q.periodic '* * * * *': names must be unique per queue, 1-191 characters"),
    ([{"cron": "* * * * *", "priority": 40000}], "queue.q.periodic.priority: must be >= -32768 and <= 32767, got 40000"),
    ([{"cron": "* * * * *", "priority": True}], "queue.q.periodic.priority: expected an integer, got True"),
    ([{"cron": "* * * * *", "priority": 1.0}], "queue.q.periodic.priority: expected an integer"),
    ([{"cron": "* * * * *", "payload": [1]}], "queue.q.periodic.payload: must be a table without the keys 'tick'"),
    ([{"cron": "* * * * *", "payload": {"periodic": 1}}], "queue.q.periodic.payload: must be a table without"),
    ([{"cron": "* * * * *", "payload": {"v": float("nan")}}], "queue.q.periodic.payload: not JSON"),
    ([{"cron": "* * * * *", "payload": {"v": "x" * 2000}}], "queue.q.periodic.payload: over producer.max_payload_bytes"),
]


@pytest.mark.parametrize("entries, refused", PERIODIC_ENTRIES)
def test_the_config_load_and_the_periodic_scheduler_accept_and_refuse_the_same_entries(tmp_path, entries, refused):
    import dataclasses

    from notifyq.consume import periodic

    # Given the entries in the config's file (through its overrides), and in a Config built in code
    overrides = {"queue": {"q": {"periodic": entries}}, "producer": {"max_payload_bytes": 2048}}
    built = dataclasses.replace(load(tmp_path, overrides={"producer": {"max_payload_bytes": 2048}}),
                                periodic={"q": tuple(entries)})
    if refused is None:
        # Then both take them, as the same entries
        loaded = load(tmp_path, overrides=overrides)
        assert periodic._entries(loaded, ("q",)) == periodic._entries(built, ("q",))
        return
    # Then the load and the scheduler refuse them with the same one line
    message = config_error(tmp_path, overrides=overrides)
    with pytest.raises(errors.ConfigError) as raised:
        periodic.Scheduler(built, ("q",))
    assert refused in message and str(raised.value) == message


@pytest.mark.parametrize("key, needle", [("x ", "must not end with a space"), (" ", "must not end with a space"),
                                         ("\x00", "control characters"), ("a\tb", "control characters"),
                                         ("a\x7fb", "control characters"),
                                         ("a\x85b", "control characters")])
def test_a_job_key_the_server_would_confuse_with_another_is_one_clear_error(key, needle):
    # "x" and "x " are one key to the server (trailing spaces ignored); " " is the queue's own
    with pytest.raises(errors.InputError) as e:
        values.job_key("key", key)
    assert needle in str(e.value) and "\n" not in str(e.value)
    # while a dedup key keeps what it accepted before, and a leading space is a key of its own
    assert values.job_key("dedup_key", key) == key
    assert values.job_key("key", "  x") == "  x"
