"""Decisions that differ between MariaDB and MySQL, where no MySQL server runs here to test them
live (the docs' compatibility page lists them): each is taken from what the session knows of
its server, and checked here against a stand-in for the driver's answer."""

from __future__ import annotations

import MySQLdb

from notifyq.store import advisory


class _Server:
    """A session whose server says `version`, and whose statement fails with `error`, if any."""

    def __init__(self, version: str, error: BaseException | None = None, row=(1,)):
        self.server_version = version
        self.error = error
        self.row = row
        self.sent: list[tuple[str, dict]] = []

    def run(self, body, what: str, wait_s: float = 0.0):
        return body(self)

    def execute(self, sql, params):
        self.sent.append((sql, params))
        if self.error is not None:
            raise self.error

    def fetchone(self):
        return self.row


def test_mariadb_keeps_a_fractional_lock_wait_and_mysql_waits_whole_seconds_rounded_up():
    mariadb, mysql = _Server("10.11.19-MariaDB-0+deb12u1"), _Server("8.0.40")
    assert advisory.lock_wait_s(mariadb, 0.005) == 0.005
    assert advisory.lock_wait_s(mysql, 0.005) == 1.0  # never 0: MySQL would return at once, a spin
    assert advisory.lock_wait_s(mysql, 1.2) == 2.0
    assert advisory.lock_wait_s(mysql, 0) == 0.0  # a try-lock stays one
    assert advisory.lock_wait_s(mariadb, -3) == advisory.lock_wait_s(mysql, -3) == 0.0  # never "forever"


def test_get_lock_sends_the_wait_its_server_keeps():
    mysql = _Server("8.4.3")
    assert advisory.get_lock(mysql, "nq:w", 0.3) == 1
    assert mysql.sent[0][1]["wait_s"] == 1.0


def test_a_kill_query_in_get_lock_is_an_interruption_on_mysql_too_not_an_error_to_run_again():
    # MySQL answers KILL QUERY in GET_LOCK with NULL and error 1317 (MariaDB: NULL only); 1317
    # is in the rerun set, so without this the stop's KILL would be undone by a second GET_LOCK
    killed = _Server("8.0.40", MySQLdb.OperationalError(1317, "Query execution was interrupted"))
    assert advisory.get_lock(killed, "nq:w", 25) is None
    assert len(killed.sent) == 1


def test_a_dsn_can_name_the_servers_public_key_for_caching_sha2_password_without_tls(tmp_path):
    from notifyq.config.dsn import DSN

    key = tmp_path / "server-public.pem"
    key.write_text("-----BEGIN PUBLIC KEY-----\n")
    dsn = DSN.parse(f"mysql://app:secret@db.example:3306/jobs?server_public_key={key}")
    dsn.check_files()
    assert dsn.connect_args()["server_public_key_path"] == str(key)
    assert "secret" not in dsn.masked() and "server_public_key=" in dsn.masked()
    assert "server_public_key_path" not in DSN.parse("mysql://app@db.example/jobs").connect_args()


def test_a_server_public_key_that_cannot_be_read_is_one_clear_error(tmp_path):
    import pytest

    from notifyq import errors
    from notifyq.config.dsn import DSN

    with pytest.raises(errors.ConfigError, match="server_public_key file"):
        DSN.parse(f"mysql://app@db.example/jobs?server_public_key={tmp_path / 'missing.pem'}").check_files()


def test_a_private_server_is_started_with_the_options_its_own_kind_and_version_knows(tmp_path):
    from notifyq.run import localserver

    maria = localserver.parse_server_version("mariadbd  Ver 10.11.6-MariaDB-0+deb12u1 for debian-linux-gnu on x86_64")
    mysql = localserver.parse_server_version("/usr/sbin/mysqld  Ver 8.0.36-0ubuntu0.22.04.1 for Linux on x86_64")
    old_mysql = localserver.parse_server_version("mysqld  Ver 8.0.28 for Linux on x86_64 (MySQL Community Server - GPL)")
    assert maria == ("mariadb", (10, 11, 6)) and mysql == ("mysql", (8, 0, 36))
    # MySQL 8.0.30+: the redo log's size is innodb_redo_log_capacity (innodb_log_file_size is
    # deprecated there); MariaDB and older MySQL know only innodb_log_file_size.
    assert localserver.storage_options(*mysql, 16, tmp_path)[0] == "--innodb-redo-log-capacity=16M"
    assert localserver.storage_options(*old_mysql, 16, tmp_path)[0] == "--innodb-log-file-size=16M"
    assert localserver.storage_options(*maria, 16, tmp_path)[0] == "--innodb-log-file-size=16M"
    # MySQL's compiled-in secure_file_priv is a packaging directory a bare machine lacks (the
    # server would refuse to start): a MySQL private server gets a directory of its own
    for kind in (mysql, old_mysql):
        assert f"--secure-file-priv={tmp_path}" in localserver.storage_options(*kind, 16, tmp_path)
    assert not any(o.startswith("--secure-file-priv") for o in localserver.storage_options(*maria, 16, tmp_path))
