"""Config: precedence, DSN parsing, masking, and the errors a typo deserves."""

import os
import stat

import pytest

from notifyq import config, errors
from notifyq.config import DSN


def load(tmp_path, text="", env=None, overrides=None, warnings=None):
    path = tmp_path / "notifyq.toml"
    path.write_text(text)
    return config.load(env={"NOTIFYQ_CONFIG": str(path), **(env or {})}, overrides=overrides,
                       warn=(warnings.append if warnings is not None else None))


def test_dsn_url_with_password_port_and_database():
    dsn = DSN.parse("mysql://app:s%40cret@db.example:3307/jobs")
    assert (dsn.user, dsn.password, dsn.host, dsn.port, dsn.database) == ("app", "s@cret", "db.example", 3307, "jobs")
    assert "s@cret" not in repr(dsn) and "s@cret" not in dsn.masked()
    assert dsn.masked() == "mysql://app:***@db.example:3307/jobs"


def test_dsn_unix_socket_and_tls_options_reach_the_driver():
    dsn = DSN.parse("mysql://app@localhost/q?unix_socket=/run/mysqld/mysqld.sock&ssl_ca=/ca.pem")
    args = dsn.connect_args()
    assert args["unix_socket"] == "/run/mysqld/mysqld.sock" and "host" not in args
    assert args["ssl"] == {"ca": "/ca.pem"}


def test_multi_host_dsn_lists_every_node_in_order_and_masks_the_password():
    # Given the nodes of a Galera cluster in one DSN (a ',' in a password needs no encoding)
    dsn = DSN.parse("mysql://app:pw,1@h1:3307,h2,[::1]:3309/jobs")
    # Then every node is kept in order (default port 3306), the first one is the host
    assert dsn.servers == (("h1", 3307), ("h2", 3306), ("::1", 3309))
    assert (dsn.host, dsn.port, dsn.password, dsn.database) == ("h1", 3307, "pw,1", "jobs")
    assert dsn.masked() == "mysql://app:***@h1:3307,h2:3306,[::1]:3309/jobs"
    # And each node's driver arguments name that node
    assert (dsn.connect_args(2)["host"], dsn.connect_args(2)["port"]) == ("::1", 3309)
    # And a one-host DSN is one server, as before
    assert DSN.parse("mysql://app@h1:3307/jobs").servers == (("h1", 3307),)


def test_multi_host_dsn_from_env_and_config_file(tmp_path):
    cfg = load(tmp_path, 'dsn = "mysql://a@h1:1,h2:2/one"\n')
    assert cfg.dsn.servers == (("h1", 1), ("h2", 2))
    cfg = load(tmp_path, "", env={"NOTIFYQ_DSN": "mysql://a@h3:3,h4:4/two"})
    assert cfg.dsn.servers == (("h3", 3), ("h4", 4))


@pytest.mark.parametrize("url", ["mysql://u@h1:1,,h2:2/db", "mysql://u@h1:1,h2:x/db", "mysql://u@h1:1,h1:1/db",
                                 "mysql://u@h1,h2/db?unix_socket=/tmp/s", "mysql://u@h1:1,h2:0/db"])
def test_bad_multi_host_dsn_is_one_clear_error(url):
    with pytest.raises(errors.ConfigError, match="bad DSN"):
        DSN.parse(url)


@pytest.mark.parametrize("url", ["postgres://x@y/z", "mysql://u@h:notaport/db", "mysql://u@h/bad-name!",
                                 "mysql://u@h/db?colour=blue"])
def test_bad_dsn_is_a_config_error(url):
    with pytest.raises(errors.ConfigError):
        DSN.parse(url)


def test_precedence_defaults_file_confd_env_flags(tmp_path):
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "10-batch.toml").write_text("[defaults]\nbatch_size = 20\n")
    cfg = load(tmp_path, 'dsn = "mysql://a@h/one"\n[defaults]\nbatch_size = 10\nmax_attempts = 3\n',
               env={"NOTIFYQ_DSN": "mysql://b@h/two"}, overrides={"log": {"level": "debug"}})
    assert cfg.defaults.batch_size == 20  # conf.d beats the main file
    assert cfg.defaults.max_attempts == 3
    assert cfg.dsn.database == "two"  # env beats files
    assert cfg.log.level == "debug"  # flags beat everything


def test_an_unknown_top_level_key_is_named_with_the_file_or_conf_d_file_it_was_set_in(tmp_path):
    """Issue #25: the error named the key but not where it was set (a section's key did)."""
    with pytest.raises(errors.ConfigError) as e:
        load(tmp_path, "[defaultz]\nx = 1\n")
    assert str(e.value) == f"unknown config key(s) defaultz (in {tmp_path / 'notifyq.toml'})"
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "20-typo.toml").write_text("bogus_top = 1\n")
    with pytest.raises(errors.ConfigError) as e:
        load(tmp_path, "", overrides={"queues": {}})
    assert str(e.value) == (f"unknown config key(s) bogus_top (in {tmp_path / 'conf.d' / '20-typo.toml'}), "
                            "queues (in the command line)")


def test_queue_sections_inherit_defaults(tmp_path):
    cfg = load(tmp_path, '[defaults]\nmax_attempts = 7\n[queue.emails]\nbatch_size = 5\nhandler = "m:f"\n')
    assert cfg.queue("emails").batch_size == 5 and cfg.queue("emails").max_attempts == 7
    assert cfg.queue("other").batch_size == 100


@pytest.mark.parametrize("text,needle", [
    ("colour = 1\n", "colour"),
    ("[defaults]\nbatch_sise = 1\n", "batch_sise"),
    ("[defaults]\nbatch_size = \"ten\"\n", "batch_size"),
    ("[queue.emails]\nhandler = \"a:b\"\ncommand = \"c\"\n", "not both"),
    ("[log]\nlevel = \"loud\"\n", "log.level"),
    ("this is = = not toml", "invalid TOML"),
])
def test_config_mistakes_are_one_clear_error(tmp_path, text, needle):
    with pytest.raises(errors.ConfigError) as e:
        load(tmp_path, text)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_password_sources_and_readable_file_warning(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    os.chmod(secret, 0o644)
    warnings = []
    cfg = load(tmp_path, f'dsn = "mysql://a:in-url@h/db"\npassword_file = "{secret}"\n', warnings=warnings)
    assert cfg.dsn.password == "from-file"
    assert any("readable by other users" in w for w in warnings)
    assert "from-file" not in str(cfg.masked_dict()) and "in-url" not in str(cfg.masked_dict())
    os.chmod(secret, stat.S_IRUSR | stat.S_IWUSR)
    warnings.clear()
    load(tmp_path, f'password_file = "{secret}"\n', warnings=warnings)
    assert warnings == []


def test_systemd_credential_is_read(tmp_path):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "db_password").write_text("cred-pw")
    cfg = load(tmp_path, "", env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert cfg.dsn.password == "cred-pw"


@pytest.mark.parametrize("name", ["", "a" * 65, "has space", "semi;colon", "quote'", "ünï"])
def test_invalid_queue_names_are_refused(name):
    with pytest.raises(errors.InputError):
        config.validate_queue_name(name)


def test_missing_config_named_by_env_is_an_error(tmp_path):
    with pytest.raises(errors.ConfigError):
        config.load(env={"NOTIFYQ_CONFIG": str(tmp_path / "nope.toml")})


def test_a_password_on_the_command_line_draws_a_warning_and_is_never_printed(tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "NOTIFYQ_CONFIG": "/dev/null"}
    env.pop("NOTIFYQ_DSN", None)
    out = subprocess.run([sys.executable, "-m", "notifyq", "--dsn", "mysql://u:hunter2@h/db", "config"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert "process list" in out.stderr
    assert "hunter2" not in out.stdout + out.stderr


@pytest.mark.parametrize("value,needle", [
    ('"0/1s"', "N must be 1-10000"), ('"-1/1s"', "expected \"N/PERIOD\""), ('"10001/1s"', "N must be 1-10000"),
    ('"99999999999999999999/1s"', "N must be"), ('"ten/1s"', "expected"), ('"10/1y"', "expected"),
    ('"10/0s"', "period must be 1ms-1d"), ('"10/2d"', "period must be"), ("10", "expected"), ('"10"', "expected"),
    ('"10/1.5.2s"', "expected"), ('"10/1S"', "expected"), ('"\u0661\u0660/1s"', "expected"),
    ('"10/\uff11s"', "expected"), ('"10/1\u00a0s"', "expected"), ('"10/1s\\n"', "expected"),
])
@pytest.mark.parametrize("key", ["rate", "rate_per_key"])
def test_a_bad_rate_is_one_line_naming_the_key_and_the_file(tmp_path, key, value, needle):
    with pytest.raises(errors.ConfigError) as e:
        load(tmp_path, f"[queue.api]\n{key} = {value}\n")
    text = str(e.value)
    assert f"queue.api.{key}:" in text and needle in text and str(tmp_path / "notifyq.toml") in text
    assert "\n" not in text


def test_rates_are_parsed_with_their_units_and_default_to_none(tmp_path):
    cfg = load(tmp_path, '[defaults]\nrate_per_key = "10/s"\n[queue.api]\nrate = " 100 / 60s "\n'
                         '[queue.fast]\nrate = "5/250ms"\n[queue.slow]\nrate = "2/1h"\n')
    assert cfg.queue("api").rates == ((100, 60.0), (10, 1.0))
    assert cfg.queue("fast").rates[0] == (5, 0.25) and cfg.queue("slow").rates[0] == (2, 3600.0)
    assert cfg.queue("other").rates == (None, (10, 1.0)) and config.QueueConfig().rates == (None, None)


def test_flow_limits_load_with_overrides_in_order(tmp_path):
    cfg = load(tmp_path, '[queue.r]\nlimit_per_key = 2\nlimit = 50\nfair = true\n'
                         '[queue.r.key_limits]\n"premium-*" = 5\n"customer-42" = 10\n')
    qc = cfg.queue("r")
    assert (qc.limit_per_key, qc.limit, qc.fair) == (2, 50, True)
    assert qc.key_limits == (("premium-*", 5), ("customer-42", 10))
    assert qc.limited and qc.flow_controlled and not cfg.queue("other").flow_controlled


@pytest.mark.parametrize("text, where", [
    ("limit_per_key = -1", "queue.r.limit_per_key"),
    ("limit_per_key = 2.5", "queue.r.limit_per_key"),
    ("limit = \"50\"", "queue.r.limit"),
    ("limit = 10000000", "queue.r.limit"),
    ("fair = 1", "queue.r.fair"),
    ("key_limits = 3", "queue.r.key_limits"),
    ("[queue.r.key_limits]\n\"a\" = 0", "queue.r.key_limits.a"),
    ("[queue.r.key_limits]\n\"a\" = \"ten\"", "queue.r.key_limits.a"),
    ("[queue.r.key_limits]\n\"\" = 3", "queue.r.key_limits"),
    # an entry no key can match (a key never ends with a space, nor holds a control character)
    ("[queue.r.key_limits]\n\"x \" = 3", "queue.r.key_limits"),
    ("[queue.r.key_limits]\n\"a\\tb\" = 3", "queue.r.key_limits"),
])
def test_a_bad_flow_limit_is_one_error_naming_the_file_and_key(tmp_path, text, where):
    with pytest.raises(errors.ConfigError) as e:
        load(tmp_path, f"[queue.r]\n{text}\n")
    message = str(e.value)
    assert where in message and str(tmp_path / "notifyq.toml") in message and "\n" not in message


def test_a_reload_that_drops_the_defaults_section_is_refused_for_a_producer_too(tmp_path):
    """The rule a producer stream's reload and a consumer's share (check_sections_kept): the
    [defaults] section gone, deleted or in a conf.d file removed, is refused; emptied, applied."""
    old = load(tmp_path, "[defaults]\nmax_attempts = 2\n")
    # When the section is deleted: refused, naming it and the file
    with pytest.raises(errors.ConfigError, match=r"^\[defaults\]: .* gone from .*notifyq\.toml; restore it"):
        config.check_sections_kept(old, load(tmp_path, "[producer]\nbatch_lines = 3\n"), ["q"])
    # When it is kept with no keys (the built-in defaults, on purpose), or was never there: applied
    config.check_sections_kept(old, load(tmp_path, "[defaults]\n"), ["q"])
    config.check_sections_kept(load(tmp_path, ""), load(tmp_path, ""), ["q"])
    # And a conf.d file that held it, removed, is the section gone too
    confd = tmp_path / "conf.d"
    confd.mkdir()
    (confd / "10-defaults.toml").write_text("[defaults]\nmax_attempts = 2\n")
    old = load(tmp_path, "")
    (confd / "10-defaults.toml").unlink()
    with pytest.raises(errors.ConfigError, match=r"^\[defaults\]: "):
        config.check_sections_kept(old, load(tmp_path, ""), ["q"])
