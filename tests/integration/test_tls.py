"""TLS asked for means TLS or nothing: against a private server started with TLS (a certificate
made here with openssl, signed by a test CA) and the session's server, which has TLS off."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import run_cli

from notifyq import errors
from notifyq.config import DSN
from notifyq.run.localserver import LocalServer
from notifyq.store.db import Session

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """A test CA, a server certificate for 127.0.0.1 signed by it, and an unrelated CA."""
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=notifyq test CA",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
             "-out", "server.csr", cwd=d)
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", "ext.cnf", "-out", "server.pem", cwd=d)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=another CA",
             "-keyout", "other.key", "-out", "other.pem", cwd=d)
    return d


class TLSServer(LocalServer):
    """A LocalServer whose mariadbd serves TLS with the given certificate (not while initialising)."""

    def __init__(self, basedir: Path, certs: Path):
        super().__init__(basedir)
        self.certs = certs
        self._initialising = False

    def _initialise(self, *args) -> None:
        self._initialising = True
        try:
            super()._initialise(*args)
        finally:
            self._initialising = False

    def _common_args(self, server: str) -> list[str]:
        args = super()._common_args(server)
        if self._initialising:
            return args
        c = self.certs
        return [*args, f"--ssl-ca={c / 'ca.pem'}", f"--ssl-cert={c / 'server.pem'}", f"--ssl-key={c / 'server.key'}"]


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory, certs) -> str:
    server = TLSServer(tmp_path_factory.mktemp("tls-mariadb"), certs)
    server.start()
    try:
        yield server.dsn + "mysql"
    finally:
        server.cleanup()


def cipher(url: str) -> str:
    session = Session(DSN.parse(url), retry_s=2, name="tls-test")
    try:
        cur = session.conn.cursor()
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        return cur.fetchone()[1]
    finally:
        session.close()


def test_a_named_ca_gives_a_verified_tls_session(tls_server, certs):
    assert cipher(f"{tls_server}?ssl_ca={certs / 'ca.pem'}")
    assert cipher(f"{tls_server}?ssl_ca={certs / 'ca.pem'}&ssl_mode=VERIFY_IDENTITY")


def test_tls_required_without_a_ca_still_encrypts(tls_server):
    assert cipher(f"{tls_server}?ssl_mode=REQUIRED")


def test_a_server_certificate_from_another_ca_is_refused(tls_server, certs):
    with pytest.raises(errors.DatabaseError, match="TLS"):
        cipher(f"{tls_server}?ssl_ca={certs / 'other.pem'}")


@pytest.mark.parametrize("options", ["ssl_mode=REQUIRED", "ssl_ca={ca}", "ssl_cipher=AES256-SHA"])
def test_any_tls_option_against_a_server_without_tls_fails_in_one_clear_line(server_dsn, certs, options):
    # Given the session's server, which runs without TLS, and a DSN with one TLS option
    url = server_dsn + "mysql?" + options.format(ca=certs / "ca.pem")
    # When a session connects
    started = time.monotonic()
    with pytest.raises(errors.DatabaseError) as raised:
        cipher(url)
    # Then it fails at once, saying TLS was asked for, instead of talking plaintext
    assert "TLS" in str(raised.value) and "\n" not in str(raised.value)
    assert time.monotonic() - started < 10


def test_without_tls_options_the_plaintext_server_still_serves(server_dsn):
    assert cipher(server_dsn + "mysql") == ""


def test_the_cli_refuses_plaintext_and_a_missing_ca_file(db, certs):
    d = db.dsn
    base = f"mysql://{d.user}@{d.host}:{d.port}/{d.database}"
    result = run_cli({**db.env, "NOTIFYQ_DSN": f"{base}?ssl_ca={certs / 'ca.pem'}"}, "status")
    assert result.returncode == errors.EXIT_DB and "TLS" in result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    result = run_cli({**db.env, "NOTIFYQ_DSN": f"{base}?ssl_ca={certs / 'missing.pem'}"}, "status")
    assert result.returncode == errors.EXIT_CONFIG and "does not exist" in result.stderr
