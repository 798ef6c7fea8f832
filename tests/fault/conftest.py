"""Fault-injection fixtures: a private, throwaway server per test that asks for one (the test may
SIGKILL it or restart it) or else per module (the test KILLs connections or consumers), a fresh
notifyq database on it with the least-privilege runtime user,
and real `notifyq` processes that are always reaped at teardown.

tests/fault is a package (it has __init__.py) on purpose: pytest imports a package-less conftest.py
under the bare name `conftest`, and this file would then shadow tests/conftest.py for every
`from conftest import ...` in tests/system.
"""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
from conftest import TestDB, create_test_db, ensure_runtime_user, notifyq_cmd, run_cli, sessions_of, wait_until

from notifyq.config import DSN
from notifyq.run.localserver import LocalServer


@pytest.fixture(scope="session")
def server_template(tmp_path_factory) -> Path:
    """An initialised, cleanly stopped datadir: a copy of it starts in ~0.2 s instead of ~1.2 s."""
    srv = LocalServer(tmp_path_factory.mktemp("fault-template") / "srv")
    srv.start()
    srv.stop()
    return srv.datadir


def _started_server(basedir: Path, template: Path, extra_args: tuple[str, ...] = ()) -> LocalServer:
    """extra_args: server options (LocalServer's), for a test that needs a setting of its own."""
    srv = LocalServer(basedir, extra_args=extra_args)
    shutil.copytree(template, srv.datadir)
    srv.start()
    # Its Uptime counts whole seconds: a consumer that registers in the server's first second
    # reads to a reaper as maybe registered before the start (liveness.restarted_since_s) until
    # it touches its row again once that second is over (presence.RETOUCH_AFTER_S), and one
    # killed before that gets the restart grace (reaper.reap) that the tests' reaping deadlines
    # do not allow for.
    root = DSN.parse(srv.dsn)
    wait_until(lambda: _uptime(root) >= 3, 10, 0.05, "the server up 3 s")
    return srv


@pytest.fixture
def server(tmp_path, server_template) -> LocalServer:
    """A private mariadbd for this test alone (it may stop, restart or SIGKILL it); root over
    TCP is `server.dsn`."""
    srv = _started_server(tmp_path / "srv", server_template)
    yield srv
    srv.cleanup()


@pytest.fixture(scope="module")
def module_server(tmp_path_factory, server_template) -> LocalServer:
    """A private mariadbd for the tests of one module that leave the server itself alone (they
    kill consumers and connections, each in a database of its own): the ~3 s start is paid once."""
    srv = _started_server(tmp_path_factory.mktemp("fault-module") / "srv", server_template)
    yield srv
    srv.cleanup()


def _uptime(root: DSN) -> int:
    import MySQLdb

    conn = MySQLdb.connect(host=root.servers[0][0], port=root.servers[0][1], user=root.user)
    try:
        cur = conn.cursor()
        cur.execute("SHOW GLOBAL STATUS LIKE 'Uptime'")
        return int(cur.fetchone()[1])
    finally:
        conn.close()


@pytest.fixture
def fdb(request) -> TestDB:
    """The `db` fixture's database, on the test's own server when it asks for `server` (to stop
    or kill it), else on the module's server."""
    srv = request.getfixturevalue("server" if "server" in request.fixturenames else "module_server")
    ensure_runtime_user(DSN.parse(srv.dsn))
    return create_test_db(srv.dsn)


# ------------------------------------------------------------------ processes


@dataclass
class Proc:
    popen: subprocess.Popen
    out: Path  # stdout (ids printed by `produce --print-ids`)
    err: Path  # stderr: the notifyq log

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stdin(self) -> IO[str]:
        return self.popen.stdin

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def stdout_text(self) -> str:
        return self.out.read_text()

    def stderr_text(self) -> str:
        return self.err.read_text()


class Procs:
    """Starts `notifyq` commands with output in files (a full pipe would stall them)."""

    def __init__(self, base: Path):
        self.base = base
        self.started: list[Proc] = []

    def start(self, env: dict[str, str], *args: str, stdin: bool = False) -> Proc:
        n = len(self.started)
        out, err = self.base / f"proc{n}.out", self.base / f"proc{n}.err"
        with out.open("w") as fo, err.open("w") as fe:
            popen = subprocess.Popen(notifyq_cmd(*args), env=env, stdout=fo, stderr=fe, text=True,
                                     stdin=subprocess.PIPE if stdin else subprocess.DEVNULL)
        proc = Proc(popen, out, err)
        self.started.append(proc)
        return proc

    def consumer(self, env: dict[str, str], queue: str, *args: str,
                 handler: str = "nqhandlers:record_slow") -> Proc:
        return self.start(env, "consume", "-q", queue, "--handler", handler, *args)

    def reap_all(self) -> None:
        for proc in self.started:
            if proc.alive():
                proc.signal(signal.SIGKILL)
            proc.popen.wait(30)
            if proc.popen.stdin:
                proc.popen.stdin.close()


@pytest.fixture
def procs(tmp_path) -> Procs:
    base = tmp_path / "procs"
    base.mkdir()
    manager = Procs(base)
    yield manager
    manager.reap_all()


# ------------------------------------------------------------------ what the handlers recorded


@dataclass(frozen=True)
class Run:
    job: int
    attempt: int
    pid: int
    finished: bool  # record_slow writes a " start" line first, then the plain line when done


def wait_claimed(fdb: TestDB, ids: tuple[int, ...], timeout: float = 10) -> None:
    """Until every job of `ids` shows claimed (status 2): a claim's first job starts while its
    COMMIT is still on the wire, so a read as it starts can come before the rows land."""
    marks = ", ".join(["%s"] * len(ids))
    wait_until(lambda: fdb.scalar(f"SELECT COUNT(*) FROM nq_job WHERE id IN ({marks}) AND status = 2", ids)
               == len(ids), timeout, message=f"jobs {list(ids)} claimed")


def read_runs(out: Path) -> list[Run]:
    runs = []
    for path in out.glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) in (3, 4):
                runs.append(Run(int(parts[0]), int(parts[1]), int(parts[2]), len(parts) == 3))
    return runs


def finished_counts(runs: list[Run]) -> collections.Counter:
    return collections.Counter(r.job for r in runs if r.finished)


def started_by(runs: list[Run], pid: int) -> set[int]:
    return {r.job for r in runs if r.pid == pid and not r.finished}


def recorder_env(testdb: TestDB, out: Path, sleep_s: float = 0.05, **extra: str) -> dict[str, str]:
    out.mkdir(exist_ok=True)
    return {**testdb.env, "NQ_TEST_OUT": str(out), "NQ_TEST_SLEEP": str(sleep_s), **extra}


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def command_setup(testdb: TestDB, tmp_path: Path, script_text: str, config_text: str,
                  script_name: str = "cmd.sh") -> tuple[Path, Path, dict[str, str]]:
    """A `--command` consumer's files: (its output directory, its executable script, the env
    naming both the config written from config_text and that directory)."""
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / script_name
    script.write_text(script_text)
    script.chmod(0o755)
    cfg = write_config(tmp_path / "nq.toml", config_text)
    return out, script, {**testdb.env, "NOTIFYQ_CONFIG": str(cfg), "NQ_TEST_OUT": str(out)}


# ------------------------------------------------------------------ which connection is whose


def connections_of(testdb: TestDB, pid: int) -> dict[int, str]:
    """{connection id: COMMAND} of the server sessions process `pid` holds right now."""
    return {cid: command for cid, (command, _) in sessions_of(testdb.query, testdb.dsn.user, pid).items()}


def consumer_sessions(testdb: TestDB, pid: int) -> tuple[int, int, str]:
    """(work connection id, lock connection id, consumer id) of a busy one-worker consumer.

    The lock session is its queue's watcher session, which holds the liveness lock. Besides it
    such a process has its work session, and in polling mode a heartbeat session that beats
    every few seconds: the work session is the one that ran the latest statement (the server
    numbers statements in order)."""
    rows = testdb.query("SELECT id, IS_USED_LOCK(lock_name) FROM nq_consumer WHERE pid = %s", (pid,))
    assert len(rows) == 1, f"expected one registration of pid {pid}, got {rows}"
    consumer_id, lock_conn = rows[0]
    conns = sessions_of(testdb.query, testdb.dsn.user, pid)
    assert lock_conn in conns, f"lock session {lock_conn} is not among {conns} of pid {pid}"
    others = {c: query_id for c, (_, query_id) in conns.items() if c != lock_conn}
    assert 1 <= len(others) <= 2, f"expected a work session besides {lock_conn}, got {conns}"
    return max(others, key=others.get), int(lock_conn), consumer_id


# ------------------------------------------------------------------ driving consumers


def produce(testdb: TestDB, queue: str, n: int) -> None:
    """n jobs {"n": i} in one `notifyq produce` (one transaction)."""
    result = run_cli(testdb.env, "produce", "-q", queue, "--count", *[f'{{"n": {i}}}' for i in range(n)])
    assert result.returncode == 0, result.stderr


def consumer_id_of(testdb: TestDB, pid: int) -> str:
    return wait_until(lambda: testdb.scalar("SELECT id FROM nq_consumer WHERE pid = %s", (pid,)),
                      30, message=f"consumer pid {pid} registered")


def freeze_mid_batch(testdb: TestDB, proc: Proc, consumer_id: str) -> set[int]:
    """SIGSTOP the consumer at a moment it holds claimed jobs; returns their ids.

    Frozen, its sessions (and liveness lock) stay open, so what it holds cannot change, but for
    a claim's COMMIT already on the wire (a claim does not wait for it: Pipeline.send_commit),
    which may land after the read: the set may miss that claim's jobs."""
    def frozen_holding_jobs():
        proc.signal(signal.SIGSTOP)
        held = {r[0] for r in testdb.query(
            "SELECT id FROM nq_job WHERE owner = %s AND status = 2", (consumer_id,))}
        if not held:
            proc.signal(signal.SIGCONT)  # between two batches: let it claim the next one
        return held

    return wait_until(frozen_holding_jobs, 30, 0.05, "the consumer frozen in the middle of a batch")
