"""Shared fixtures: a real MariaDB for every test, a fresh database per test, a runtime user with
only the grants `notifyq init --print-grants` prints, and deadline-bound waiting helpers."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import MySQLdb
import pytest

from notifyq import config as config_mod
from notifyq.config import DSN
from notifyq.run.localserver import PROFILES, LocalServer
from notifyq.store import schema
from notifyq.store.signal import SIGNAL_SLOTS

REPO = Path(__file__).resolve().parent.parent
RUNTIME_USER = "nq_runtime"
RUNTIME_PASSWORD = "runtime-secret-pw"


def cron_run(cfg: config_mod.Config, queue: str, handler: Callable[[Any], Any], timeout: float = 30.0):
    """One worker run with --exit-when-empty (a cron run), in a thread bounded by `timeout`;
    the worker, for its error and stats."""
    import threading

    from notifyq.consume import handlers
    from notifyq.consume.stats import Budget
    from notifyq.consume.worker import Worker

    stop = threading.Event()
    worker = Worker(cfg, queue, handlers.PythonHandler(handler, False), stop=stop, budget=Budget(None),
                    exit_when_empty=True)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        thread.join(timeout)
    finally:
        stop.set()
        thread.join(10)
    return worker


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02,
               message: str = "condition") -> Any:
    """Poll a condition until it holds; fail the test with `message` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message} (last: {value!r})")
        time.sleep(interval)


def alive(pid: int) -> bool:
    """A process still running: not gone, not a zombie waiting to be reaped (by init, once its
    parent is gone, which may reap late)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


# ------------------------------------------------------------------ which connection is whose


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        fds = list(fd_dir.iterdir())
    except FileNotFoundError:
        return inodes  # the process exited meanwhile (a fault schedule's SIGKILL): no sockets
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def client_ports(pid: int) -> set[int]:
    """Local TCP ports of `pid`'s sockets (from /proc: no psutil needed)."""
    inodes = _socket_inodes(pid)
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[9]) in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


# Which of a process's sessions ran the latest statement: MariaDB numbers every statement
# server-wide (PROCESSLIST.QUERY_ID); MySQL has no such column, but performance_schema's timer of
# a thread's current or last statement is server-wide too (enabled by default on MySQL 8).
_SESSIONS_MARIADB = "SELECT ID, HOST, COMMAND, QUERY_ID FROM information_schema.PROCESSLIST WHERE USER = %s"
_SESSIONS_MYSQL = ("SELECT p.ID, p.HOST, p.COMMAND, MAX(e.TIMER_START) FROM information_schema.PROCESSLIST p"
                   " JOIN performance_schema.threads t ON t.PROCESSLIST_ID = p.ID"
                   " JOIN performance_schema.events_statements_current e ON e.THREAD_ID = t.THREAD_ID"
                   " WHERE p.USER = %s GROUP BY p.ID, p.HOST, p.COMMAND")


def sessions_of(query: Callable[..., list[tuple]], user: str, pid: int) -> dict[int, tuple[str, int]]:
    """{connection id: (COMMAND, order of its latest statement)} of the server sessions that
    process `pid` holds as `user`; `query(sql, params)` runs on the server (any session)."""
    mariadb = "mariadb" in query("SELECT VERSION()")[0][0].lower()
    rows = query(_SESSIONS_MARIADB if mariadb else _SESSIONS_MYSQL, (user,))
    ports = client_ports(pid)
    return {int(cid): (command, int(order or 0)) for cid, host, command, order in rows
            if ":" in host and int(host.rsplit(":", 1)[1]) in ports}


@pytest.fixture(scope="session")
def server_dsn(tmp_path_factory) -> str:
    """A server for the whole run: $NOTIFYQ_TEST_DSN, else a private throwaway mariadbd, started
    with $NOTIFYQ_TEST_SERVER_PROFILE's settings (mysql80: MySQL 8.0's defaults, localserver.py)."""
    if os.environ.get("NOTIFYQ_TEST_DSN"):
        yield os.environ["NOTIFYQ_TEST_DSN"]
        return
    profile = os.environ.get("NOTIFYQ_TEST_SERVER_PROFILE", "")
    if profile not in PROFILES:
        pytest.exit(f"NOTIFYQ_TEST_SERVER_PROFILE={profile!r}: expected one of {sorted(PROFILES)}", 2)
    server = LocalServer(tmp_path_factory.mktemp("mariadb"), extra_args=PROFILES[profile])
    server.start()
    try:
        yield server.dsn
    finally:
        server.cleanup()


def admin_connect(dsn: DSN, database: str | None = None):
    args = dsn.connect_args()
    args.pop("database", None)
    if database:
        args["database"] = database
    return MySQLdb.connect(**args, autocommit=True)


@dataclasses.dataclass
class TestDB:
    admin: DSN  # root: init, inspection, faults
    dsn: DSN  # the runtime user: what producers and consumers use
    env: dict[str, str]  # for CLI subprocesses

    def config(self, **overrides: Any) -> config_mod.Config:
        raw = {"dsn": _url(self.dsn), "wakeup": {"poll_max_s": 0.2, "idle_wait_s": 5.0},
               "consumer": {"reap_interval_s": 0.5, "shutdown_grace_s": 10.0}}
        for key, value in overrides.items():
            if isinstance(value, dict):
                raw[key] = {**raw.get(key, {}), **value}
            else:
                raw[key] = value
        return config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null", "NOTIFYQ_PASSWORD": RUNTIME_PASSWORD},
                               overrides=raw)

    def query(self, sql: str, params: Any = None) -> list[tuple]:
        conn = admin_connect(self.admin, self.admin.database)
        try:
            cur = conn.cursor()
            cur.execute(sql, params)
            return list(cur.fetchall())
        finally:
            conn.close()

    def scalar(self, sql: str, params: Any = None) -> Any:
        rows = self.query(sql, params)
        return rows[0][0] if rows else None

    def job_row_locked(self, job_id: int):
        """Another session's open transaction holding the job's row, as a mysql client's
        BEGIN; SELECT ... FOR UPDATE does (or a peer stopped in the middle of its statement):
        claims skip it. The caller closes the connection to let go."""
        conn = admin_connect(self.admin, self.admin.database)
        conn.autocommit(False)
        cur = conn.cursor()
        cur.execute("SELECT id FROM nq_job WHERE id = %s FOR UPDATE", (job_id,))
        assert cur.fetchall()
        return conn

    def signal_rows_locked(self, queue: str, free: int | None = None):
        """Another session's open transaction holding every slot row of the queue's signal
        counter, as a producer stopped inside its put's transaction does (each made first if
        missing, with nothing counted): a claim's promotion of due jobs, which bumps the counter,
        waits on it (a due job's own row held is passed over: the due_ids statement). With
        `free`, every slot row but that one (each locked by its key alone: a range read under
        REPEATABLE READ would lock the free row too). The caller closes the connection to let go."""
        conn = admin_connect(self.admin, self.admin.database)
        conn.autocommit(True)
        cur = conn.cursor()
        for slot in range(SIGNAL_SLOTS):
            cur.execute("INSERT IGNORE INTO nq_signal (queue, slot, seq) VALUES (%s, %s, 0)", (queue, slot))
        conn.autocommit(False)
        if free is None:
            cur.execute("SELECT slot FROM nq_signal WHERE queue = %s FOR UPDATE", (queue,))
            assert len(cur.fetchall()) == SIGNAL_SLOTS
            return conn
        for slot in range(SIGNAL_SLOTS):
            if slot != free:
                cur.execute("SELECT slot FROM nq_signal WHERE queue = %s AND slot = %s FOR UPDATE", (queue, slot))
                assert cur.fetchall()
        return conn


def _url(dsn: DSN) -> str:
    hosts = ",".join(f"{h}:{p}" for h, p in dsn.servers)  # every node of a multi-host DSN
    base = f"mysql://{dsn.user}@{hosts}/{dsn.database}"
    return base + (f"?unix_socket={dsn.unix_socket}" if dsn.unix_socket else "")


def ensure_runtime_user(root: DSN) -> str:
    """The least-privilege account producers and consumers use (grants come per database)."""
    conn = admin_connect(root)
    cur = conn.cursor()
    for host in ("%%", "localhost"):
        cur.execute(f"CREATE USER IF NOT EXISTS '{RUNTIME_USER}'@'{host}' IDENTIFIED BY %s", (RUNTIME_PASSWORD,))
    conn.close()
    return RUNTIME_USER


def create_test_db(server_dsn: str, runtime_user: str = RUNTIME_USER) -> TestDB:
    """A fresh database with the current schema, and grants for the runtime user only on it.

    Shared by the `db` fixture (the session's server) and the fault tests (a private server)."""
    root = DSN.parse(server_dsn)
    name = f"nq_t_{uuid.uuid4().hex[:12]}"
    admin = dataclasses.replace(root, database=name)
    schema.init(admin)
    conn = admin_connect(root)
    cur = conn.cursor()
    for host in ("%", "localhost"):
        for grant in schema.grants(name, f"'{runtime_user}'@'{host}'"):
            cur.execute(grant)
    conn.close()
    runtime = dataclasses.replace(admin, user=runtime_user, password=RUNTIME_PASSWORD)
    env = {**os.environ, "NOTIFYQ_DSN": _url(runtime), "NOTIFYQ_PASSWORD": RUNTIME_PASSWORD,
           "NOTIFYQ_CONFIG": "/dev/null", "PYTHONPATH": str(REPO / "tests" / "helpers")}
    return TestDB(admin, runtime, env)


def drop_test_db(testdb: TestDB) -> None:
    conn = admin_connect(testdb.admin)
    conn.cursor().execute(f"DROP DATABASE IF EXISTS `{testdb.admin.database}`")
    conn.close()


@pytest.fixture(scope="session")
def runtime_user(server_dsn) -> str:
    return ensure_runtime_user(DSN.parse(server_dsn))


@pytest.fixture
def db(server_dsn, runtime_user) -> TestDB:
    """A fresh database with the current schema, and grants for the runtime user only on it."""
    testdb = create_test_db(server_dsn, runtime_user)
    yield testdb
    drop_test_db(testdb)


def notifyq_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "notifyq", *args]


def run_cli(env: dict[str, str], *args: str, input: str | None = None, timeout: float = 60):
    return subprocess.run(notifyq_cmd(*args), env=env, input=input, capture_output=True, text=True,
                          timeout=timeout)


SMALL_PACKET = 1024 * 1024  # max_allowed_packet for the size tests (the server's minimum is 1 KB)


@pytest.fixture
def small_packet(db):
    """The server's max_allowed_packet lowered for new sessions, and put back afterwards."""
    root = admin_connect(db.admin)
    cur = root.cursor()
    cur.execute("SELECT @@global.max_allowed_packet")
    old = cur.fetchone()[0]
    cur.execute("SET GLOBAL max_allowed_packet = %s", (SMALL_PACKET,))
    try:
        yield SMALL_PACKET
    finally:
        cur.execute("SET GLOBAL max_allowed_packet = %s", (old,))
        root.close()


class Relay:
    """A TCP relay to a test server, for a test to stand between a client and it: each client
    connection gets one of its own to the server, and every chunk either way goes through
    forward(), which passes it on by default; a subclass holds, drops or cuts there. pair():
    state shared by a connection's two directions."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def pair(self) -> Any:
        return None

    def forward(self, data: bytes, dst: socket.socket, pair: Any, from_client: bool) -> bool:
        """Pass `data` on to `dst` (or not); False: this connection ends here."""
        dst.sendall(data)
        return True

    def close(self) -> None:
        self._closing = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            pair = self.pair()
            threading.Thread(target=self._pump, args=(client, server, pair, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, pair, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, pair: Any, from_client: bool) -> None:
        try:
            while data := src.recv(65536):
                if not self.forward(data, dst, pair, from_client):
                    break
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
