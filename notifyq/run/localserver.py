"""Start and control a private, throwaway MariaDB/MySQL server.

Used by the test suite (fault tests kill and restart it) and by the live demo,
so that neither depends on, nor disturbs, a system server. Only stdlib + the store's driver connection.
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from notifyq.store import driver

# /usr/sbin is often not on a normal user's PATH, yet that is where Debian puts mariadbd.
_EXTRA_DIRS = ("/usr/sbin", "/usr/bin", "/usr/local/mysql/bin")
_SYSTEM_SOCKETS = ("/run/mysqld/mysqld.sock", "/var/run/mysqld/mysqld.sock", "/tmp/mysql.sock")
# A unix socket path must fit in sun_path (108 bytes on Linux).
_MAX_SOCKET_PATH = 100
# Strong refs on purpose: a started server must be stopped at exit even if its object was dropped.
_LIVE: "set[LocalServer]" = set()


def _which(names: tuple[str, ...]) -> str | None:
    path = os.pathsep.join(os.environ.get("PATH", "").split(os.pathsep) + list(_EXTRA_DIRS))
    for name in names:
        found = shutil.which(name, path=path)
        if found:
            return found
    return None


def find_server_binaries() -> tuple[str, str] | None:
    """(server, install-db) or None. For MySQL >= 8 there is no install script:
    the server initialises its own datadir, so the server is returned twice."""
    server = _which(("mariadbd", "mysqld"))
    if server is None:
        return None
    installer = _which(("mariadb-install-db", "mysql_install_db"))
    return server, installer or server


def server_version(server: str) -> tuple[str, tuple[int, ...]]:
    """("mariadb" | "mysql", (major, minor, patch)) of a server binary, from its --version line,
    e.g. "mariadbd  Ver 10.11.6-MariaDB-0+deb12u1 for debian-linux-gnu" or
    "mysqld  Ver 8.0.36-0ubuntu0.22.04.1 for Linux on x86_64"."""
    line = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=30).stdout
    return parse_server_version(line)


def parse_server_version(line: str) -> tuple[str, tuple[int, ...]]:
    found = re.search(r"Ver (\d+)\.(\d+)\.(\d+)", line)
    version = tuple(int(x) for x in found.groups()) if found else (0, 0, 0)
    return ("mariadb" if "mariadb" in line.lower() else "mysql"), version


def storage_options(flavour: str, version: tuple[int, ...], redo_log_mb: int, filedir: Path) -> list[str]:
    """The options that differ between the servers. MySQL 8.0.30 sizes its redo log with
    innodb_redo_log_capacity (innodb_log_file_size is deprecated there, and ignored beside it);
    MariaDB has innodb_log_file_size only. secure_file_priv: MySQL's compiled-in default is a
    packaging directory (/var/lib/mysql-files) that a machine without the package lacks, and the
    server refuses to start without it: MySQL's private server gets a directory of its own
    (MariaDB's default, no restriction, stays)."""
    if flavour != "mysql":
        return [f"--innodb-log-file-size={redo_log_mb}M"]
    if version >= (8, 0, 30):
        return [f"--innodb-redo-log-capacity={redo_log_mb}M", f"--secure-file-priv={filedir}"]
    return [f"--innodb-log-file-size={redo_log_mb}M", f"--secure-file-priv={filedir}"]


def _parse_dsn(dsn: str) -> dict:
    """Tiny private parser: mysql://user[:pw]@host[:port]/[db][?unix_socket=/path]."""
    u = urlsplit(dsn)
    if u.scheme not in ("mysql", "mariadb"):
        raise ValueError(f"not a mysql:// DSN: {dsn!r}")
    kw: dict = {"host": u.hostname or "localhost", "user": unquote(u.username or "root"),
                "passwd": unquote(u.password or "")}
    if u.port:
        kw["port"] = u.port
    if u.path.strip("/"):
        kw["db"] = unquote(u.path.strip("/"))
    sock = parse_qs(u.query).get("unix_socket")
    if sock:
        kw["unix_socket"] = sock[0]
    return kw


def probe_dsn(dsn: str, timeout: float = 2) -> bool:
    """True if a connection with this DSN can be opened right now."""
    try:
        conn = driver.connect(connect_timeout=max(1, int(timeout)), **_parse_dsn(dsn))
    except (driver.DriverError, OSError, ValueError):
        return False
    conn.close()
    return True


def find_local_server() -> str | None:
    """DSN of an already running local server that root can use without a password."""
    for sock in _SYSTEM_SOCKETS:
        dsn = f"mysql://root@localhost/?unix_socket={sock}"
        if os.path.exists(sock) and probe_dsn(dsn):
            return dsn
    dsn = "mysql://root@127.0.0.1:3306/"
    return dsn if probe_dsn(dsn) else None


def _free_port() -> int:
    # Small race (another process may grab it before mariadbd binds), acceptable for tests.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# MySQL 8.0's defaults, where MariaDB has the setting: the test suite runs part of the
# integration tier a second time on a private server started with these (scripts/test.sh,
# NOTIFYQ_TEST_SERVER_PROFILE=mysql80), the nearest this machine comes to a MySQL server.
MYSQL80_DEFAULTS = (
    "--innodb-autoinc-lock-mode=2",  # interleaved: a multi-row INSERT's ids are not promised consecutive
    "--sql-mode=ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
    "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION",
    "--transaction-isolation=REPEATABLE-READ",  # a caller's own transactions (put(conn=...)) run in it
    "--log-bin=binlog", "--binlog-format=ROW", "--server-id=1",
    "--character-set-server=utf8mb4", "--collation-server=utf8mb4_unicode_ci",
)
PROFILES = {"": (), "mysql80": MYSQL80_DEFAULTS}


class LocalServer:
    """A private server whose datadir, socket, pid file and log live under basedir."""

    def __init__(self, basedir: str | Path, port: int | None = None, redo_log_mb: int = 16,
                 extra_args: tuple[str, ...] = ()):
        """extra_args: server options after ours (MYSQL80_DEFAULTS)."""
        self.basedir = Path(basedir).resolve()
        self.extra_args = tuple(extra_args)
        # 16 MB keeps throwaway test servers small and quick to start. Under sustained load it
        # is too small: the redo log wraps every few seconds and each checkpoint stalls every
        # commit for tens of ms. Benchmarks pass the server's own default (96 MB on MariaDB).
        self.redo_log_mb = redo_log_mb
        self.port = port or _free_port()
        self.datadir = self.basedir / "data"
        self.log_path = self.basedir / "server.log"
        self._sockdir: str | None = None
        sock = self.basedir / "mysqld.sock"
        if len(str(sock)) > _MAX_SOCKET_PATH:  # deep pytest tmp dirs: put the socket somewhere short
            self._sockdir = tempfile.mkdtemp(prefix="nq-")
            sock = Path(self._sockdir) / "mysqld.sock"
        self.socket_path = str(sock)
        self._proc: subprocess.Popen | None = None
        self._version: tuple[str, tuple[int, ...]] | None = None  # the server binary's, read at first start

    @property
    def dsn(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/"

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle -----------------------------------------------------------
    def _common_args(self, server: str) -> list[str]:
        if self._version is None:
            self._version = server_version(server)
        args = [f"--datadir={self.datadir}", f"--tmpdir={self.basedir}", "--innodb-buffer-pool-size=64M",
                *storage_options(*self._version, self.redo_log_mb, self.basedir)]
        if os.geteuid() == 0:  # mariadbd refuses to run as root unless told to
            args.append("--user=root")
        return args

    def _log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _initialise(self, server: str, installer: str, deadline: float) -> None:
        shutil.rmtree(self.datadir, ignore_errors=True)  # a half-done init cannot be resumed
        if installer != server:  # MariaDB (or old MySQL) install script
            cmd = [installer, "--no-defaults", "--auth-root-authentication-method=normal",
                   "--skip-test-db", "--skip-name-resolve"]
        else:  # MySQL >= 5.7 initialises itself; root@localhost gets an empty password
            cmd = [server, "--no-defaults", "--initialize-insecure"]
        with open(self.log_path, "ab") as log:
            rc = subprocess.run(cmd + self._common_args(server), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT,
                                timeout=max(1.0, deadline - time.monotonic())).returncode
        if rc != 0 or not (self.datadir / "mysql").is_dir():
            raise RuntimeError(f"initialising {self.datadir} failed (rc={rc}):\n{self._log_tail()}")

    def start(self, timeout: float = 60) -> None:
        if self.is_running():
            return
        binaries = find_server_binaries()
        if binaries is None:
            raise RuntimeError("no mariadbd/mysqld found (install mariadb-server)")
        server, installer = binaries
        deadline = time.monotonic() + timeout
        self.basedir.mkdir(parents=True, exist_ok=True)
        if not (self.datadir / "mysql").is_dir():
            self._initialise(server, installer, deadline)
        cmd = [server, "--no-defaults", *self._common_args(server),
               f"--socket={self.socket_path}", f"--pid-file={self.basedir / 'mysqld.pid'}",
               f"--port={self.port}", "--bind-address=127.0.0.1", f"--log-error={self.log_path}",
               *(() if any(a.startswith("--log-bin") for a in self.extra_args) else ("--skip-log-bin",)),
               "--max-connections=500",
               "--skip-name-resolve",  # no DNS lookups per connection; we grant root@127.0.0.1
               "--loose-mysqlx=OFF",  # MySQL 8's X plugin would fight over port 33060
               *self.extra_args]
        with open(self.log_path, "ab") as log:
            # Own session: a Ctrl-C in the parent's terminal must not kill the server mid-test.
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        _LIVE.add(self)
        try:
            self._wait_ready(deadline)
            self._grant_tcp_root()
        except BaseException:
            self.kill()
            raise

    def _connect_socket(self):
        return driver.connect(host="localhost", user="root", passwd="",
                               unix_socket=self.socket_path, connect_timeout=2)

    def _wait_ready(self, deadline: float) -> None:
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"server exited with {self._proc.returncode}:\n{self._log_tail()}")
            try:
                self._connect_socket().close()
                return
            except driver.DriverError as e:  # "can't connect" until the socket is up
                last = e
            if time.monotonic() >= deadline:
                raise RuntimeError(f"server not ready before deadline ({last!r}):\n{self._log_tail()}")
            time.sleep(0.05)  # poll interval inside a deadline loop, not a synchronisation sleep

    def _grant_tcp_root(self) -> None:
        # The install step only guarantees root@localhost (socket). The DSN is TCP and
        # --skip-name-resolve means 127.0.0.1 never matches 'localhost', so make sure
        # root@127.0.0.1 exists with an empty password. Idempotent, so run on every start.
        conn = self._connect_socket()
        try:
            cur = conn.cursor()
            cur.execute("CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'")
            cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION")
        finally:
            conn.close()

    def _signal_and_wait(self, sig: int, timeout: float) -> bool:
        if not self.is_running():
            return True
        self._proc.send_signal(sig)
        try:
            self._proc.wait(timeout=timeout)  # deadline-based wait for exit
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self, timeout: float = 60) -> None:
        """Clean shutdown (SIGTERM); the datadir is kept."""
        if not self._signal_and_wait(signal.SIGTERM, timeout):
            self.kill()
            raise RuntimeError(f"server did not stop within {timeout}s; killed it:\n{self._log_tail()}")

    def kill(self) -> None:
        """Simulated crash (SIGKILL); InnoDB recovers on the next start."""
        if not self._signal_and_wait(signal.SIGKILL, 30):
            raise RuntimeError(f"server pid {self._proc.pid} survived SIGKILL")

    def restart(self, timeout: float = 60) -> None:
        self.stop(timeout)
        self.start(timeout)

    def cleanup(self) -> None:
        try:
            self.stop()
        finally:
            _LIVE.discard(self)
            shutil.rmtree(self.basedir, ignore_errors=True)
            if self._sockdir:
                shutil.rmtree(self._sockdir, ignore_errors=True)

    def __enter__(self) -> "LocalServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()


@atexit.register
def _stop_leftovers() -> None:
    # Running in its own session, a server would outlive an interpreter that forgot
    # cleanup(); stop (not remove) it so no orphan keeps a port and 64M of RAM.
    for srv in list(_LIVE):
        try:
            srv.stop(timeout=20)
        except Exception:
            pass
