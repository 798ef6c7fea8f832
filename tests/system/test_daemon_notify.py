"""sd_notify from real `notifyq consume` processes; a datagram socket the test binds plays systemd.

READY=1 only once the database answers and the schema is checked; STATUS= with live counts;
WATCHDOG=1 paced by WATCHDOG_USEC and only while the main loop sees its workers turning;
RELOADING=1 (+MONOTONIC_USEC) then READY=1 around a SIGHUP that applies a new config;
STOPPING=1 then exit 0 on SIGTERM.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest

from conftest import admin_connect, notifyq_cmd, run_cli, wait_until
from notifyq import errors


class NotifyListener:
    """Stands in for $NOTIFY_SOCKET. A thread drains it at once: the kernel queues only a few
    datagrams per socket, and on a full queue notifyq drops its report (MSG_DONTWAIT)."""

    def __init__(self) -> None:
        name = f"nq-test-{uuid.uuid4().hex}"
        self.address = "@" + name  # abstract: no path-length limit, nothing to clean up
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + name)
        self.sock.settimeout(0.1)
        self._messages: list[tuple[float, list[str]]] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._closed.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._messages.append((time.monotonic(), data.decode().split("\n")))

    def messages(self) -> list[tuple[float, list[str]]]:
        with self._lock:
            return list(self._messages)

    def find(self, line: str, start: int = 0) -> int | None:
        """Index of the first message from `start` on that has `line` (or a line starting with it)."""
        for i, (_, lines) in enumerate(self.messages()[start:], start):
            if any(ln == line or (line.endswith("=") and ln.startswith(line)) for ln in lines):
                return i
        return None

    def wait_for(self, line: str, start: int = 0, timeout: float = 30) -> int:
        return wait_until(lambda: (i := self.find(line, start)) is not None and (i,),
                          timeout, message=f"{line} from notifyq (got {self.messages()[-5:]})")[0]

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self.sock.close()


def status_counts(lines: list[str]) -> dict[str, int]:
    for line in lines:
        if line.startswith("STATUS="):
            return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)\b", line[len("STATUS="):])}
    return {}


@pytest.fixture
def notify():
    listener = NotifyListener()
    yield listener
    listener.close()


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def consumer(procs, env, tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    err = tmp_path / f"consume-{len(procs)}.err"
    with err.open("w") as f:
        proc = subprocess.Popen(notifyq_cmd("consume", *args), env=env, stdout=subprocess.DEVNULL, stderr=f)
    procs.append(proc)
    return proc, err


def setup_env(db, tmp_path: Path, notify: NotifyListener, config: str = "", **extra: str) -> dict[str, str]:
    out = tmp_path / "runs"
    out.mkdir(exist_ok=True)
    path = tmp_path / "nq.toml"
    path.write_text(config or "[wakeup]\npoll_max_s = 0.2\nidle_wait_s = 1.0\n")
    env = {**db.env, "NOTIFYQ_CONFIG": str(path), "NOTIFY_SOCKET": notify.address, "NQ_TEST_OUT": str(out)}
    for key in ("WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM"):
        env.pop(key, None)
    return {**env, **extra}


def produce(db, queue: str, n: int, start: int = 0) -> None:
    result = run_cli(db.env, "produce", "-q", queue, "--count", *[f'{{"n": {i}}}' for i in range(start, start + n)])
    assert result.returncode == 0, result.stderr


def admin_url(db) -> str:
    a = db.admin
    auth = quote(a.user) + (":" + quote(a.password, safe="") if a.password else "")
    return f"mysql://{auth}@{a.host}:{a.port}/{a.database}"


# ------------------------------------------------------------------ READY


def test_ready_is_sent_only_once_the_database_answers(db, tmp_path, notify, procs):
    # Given a DSN naming a unix socket that does not exist yet (the server is "down")
    server_socket = db.scalar("SELECT @@socket")
    if not server_socket or not os.path.exists(server_socket):
        pytest.skip("the test server has no local unix socket")
    short = Path(tempfile.mkdtemp(prefix="nq", dir="/tmp"))  # sun_path holds 108 bytes
    link = short / "db.sock"
    d = db.dsn
    env = setup_env(db, tmp_path, notify, NOTIFYQ_DSN=f"mysql://{d.user}@localhost/{d.database}?unix_socket={link}",
                    NOTIFYQ_CONNECT_RETRY_S="60")
    try:
        proc, err = consumer(procs, env, tmp_path, "-q", "r", "--handler", "nqhandlers:record")
        # When the consumer has tried and failed to connect
        wait_until(lambda: "connect startup" in err.read_text(), 30, message="a failed connection attempt in the log")
        # Then it has said nothing to systemd yet, and is still trying
        assert notify.messages() == [] and proc.poll() is None
        # When the server comes up
        os.symlink(server_socket, link)
        # Then READY=1 follows, and it is the very first thing the consumer says
        assert notify.wait_for("READY=1") == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, err.read_text()
    finally:
        link.unlink(missing_ok=True)
        short.rmdir()


def test_no_ready_without_a_schema_and_ready_after_init(db, tmp_path, notify, procs):
    # Given the database lost every notifyq table
    conn = admin_connect(db.admin, db.admin.database)
    cur = conn.cursor()
    cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()")
    tables = [row[0] for row in cur.fetchall()]
    cur.execute("SET SESSION foreign_key_checks = 0")
    cur.execute("DROP TABLE " + ", ".join(f"`{t}`" for t in tables))
    conn.close()
    env = setup_env(db, tmp_path, notify)
    # When a consumer starts, it exits 6 with one line, and never said READY
    proc, err = consumer(procs, env, tmp_path, "-q", "s", "--handler", "nqhandlers:record")
    assert proc.wait(60) == errors.EXIT_SCHEMA
    assert [ln for ln in err.read_text().splitlines() if ln.startswith("notifyq: error:")] == [
        f"notifyq: error: database {db.dsn.database!r} has no notifyq schema: run `notifyq init`"]
    assert notify.find("READY=1") is None
    # When an admin runs `notifyq init`
    result = run_cli({**env, "NOTIFYQ_DSN": admin_url(db), "NOTIFYQ_PASSWORD": ""}, "init")
    assert result.returncode == 0, result.stderr
    # Then the next start reports READY=1 with its STATUS=
    proc, err = consumer(procs, env, tmp_path, "-q", "s", "--handler", "nqhandlers:record")
    first = notify.wait_for("READY=1")
    assert status_counts(notify.messages()[first][1]) == {"workers": 1, "busy": 0, "claimed": 0, "done": 0,
                                                         "failed": 0, "dead": 0}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, err.read_text()


# ------------------------------------------------------------------ STATUS, WATCHDOG, STOPPING


def test_status_counts_grow_watchdog_pings_are_paced_and_sigterm_says_stopping(db, tmp_path, notify, procs):
    # Given a consumer whose watchdog interval is 0.6 s (so pings are due every 0.3 s)
    env = setup_env(db, tmp_path, notify, WATCHDOG_USEC="600000")
    proc, err = consumer(procs, env, tmp_path, "-q", "s", "--handler", "nqhandlers:record")
    ready = notify.wait_for("READY=1")
    # When jobs arrive in two rounds
    produce(db, "s", 3)
    wait_until(lambda: any(status_counts(m).get("done") == 3 for _, m in notify.messages()), 30,
               message="STATUS= with done=3")
    produce(db, "s", 2, start=3)
    wait_until(lambda: any(status_counts(m).get("done") == 5 for _, m in notify.messages()), 30,
               message="STATUS= with done=5")
    # And pings keep coming
    wait_until(lambda: sum("WATCHDOG=1" in m for _, m in notify.messages()) >= 5, 30, message="5 pings")
    proc.send_signal(signal.SIGTERM)
    stopping = notify.wait_for("STOPPING=1", ready)
    assert proc.wait(30) == 0, err.read_text()
    messages = notify.messages()
    # Then STATUS= counts only ever grew, up to claimed=5 done=5
    done = [status_counts(m)["done"] for _, m in messages if status_counts(m)]
    assert done == sorted(done) and done[-1] == 5
    assert status_counts(messages[stopping - 1][1])["claimed"] == 5
    # And pings came only after READY, never closer together than the sender's 0.3 s allows
    # (arrival jitter of up to 0.15 s is tolerated), and none after STOPPING
    pings = [t for i, (t, m) in enumerate(messages) if "WATCHDOG=1" in m]
    assert all(ready < i < stopping for i, (_, m) in enumerate(messages) if "WATCHDOG=1" in m)
    gaps = [b - a for a, b in zip(pings, pings[1:])]
    assert min(gaps) >= 0.15, gaps
    assert len(pings) <= (pings[-1] - pings[0]) / 0.3 + 2, gaps
    # And STOPPING=1 was the last thing said
    assert all("READY=1" not in m and "WATCHDOG=1" not in m for _, m in messages[stopping:])


def test_watchdog_pings_stop_while_the_loop_hangs_on_the_database_and_resume_after(db, tmp_path, notify, procs):
    # Given a pinging consumer, idle (its watcher re-reads nq_signal every 0.2 s)
    env = setup_env(db, tmp_path, notify, WATCHDOG_USEC="1000000")
    proc, err = consumer(procs, env, tmp_path, "-q", "h", "--handler", "nqhandlers:record")
    notify.wait_for("READY=1")
    notify.wait_for("WATCHDOG=1")
    # When its database calls hang (write locks held on the tables it reads)
    conn = admin_connect(db.admin, db.admin.database)
    try:
        conn.cursor().execute("LOCK TABLES nq_signal WRITE, nq_job WRITE, nq_queue WRITE, nq_consumer WRITE")
        locked = len(notify.messages())
        # Then the pings stop while STATUS= keeps coming (the main loop runs, the worker does not)
        # The health limit is max(idle_wait_s, poll_max_s) + 15 s without a turn.
        def silent_for(seconds: float) -> bool:
            messages = notify.messages()
            last_ping = max((t for t, m in messages if "WATCHDOG=1" in m), default=0.0)
            return messages[-1][0] - last_ping >= seconds

        wait_until(lambda: silent_for(2.0), 40, message="2 s of STATUS= without a ping")
        assert proc.poll() is None
    finally:
        conn.close()  # releases the table locks
    # When the database answers again, the pings resume
    unlocked = len(notify.messages())
    notify.wait_for("WATCHDOG=1", unlocked)
    assert locked < unlocked
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, err.read_text()


# ------------------------------------------------------------------ reload


CONFIG = """
[log]
level = "{level}"
[defaults]
batch_size = {batch}
workers = {workers}
[wakeup]
poll_max_s = 0.2
idle_wait_s = 1.0
"""


def test_sighup_applies_batch_size_and_log_level_between_reloading_and_ready(db, tmp_path, notify, procs):
    # Given a consumer claiming one job at a time and logging at info
    env = setup_env(db, tmp_path, notify, CONFIG.format(level="info", batch=1, workers=1))
    proc, err = consumer(procs, env, tmp_path, "-q", "s", "--handler", "nqhandlers:record")
    notify.wait_for("READY=1")
    produce(db, "s", 3)
    wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0, 30, message="3 jobs done")
    assert "job ok" not in err.read_text() and "batch done" not in err.read_text()  # both debug
    # When the config asks for batches of 50, debug logs and two workers, and SIGHUP arrives
    Path(env["NOTIFYQ_CONFIG"]).write_text(CONFIG.format(level="debug", batch=50, workers=2))
    before_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    mark = len(notify.messages())
    proc.send_signal(signal.SIGHUP)
    # Then RELOADING=1 with the monotonic clock, then READY=1
    reloading = notify.wait_for("RELOADING=1", mark)
    notify.wait_for("READY=1", reloading + 1)
    after_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    (usec,) = [int(ln.split("=")[1]) for ln in notify.messages()[reloading][1] if ln.startswith("MONOTONIC_USEC=")]
    assert before_us <= usec <= after_us
    assert notify.find("READY=1", mark) > reloading
    # And the next five jobs come in one batch, with per-job debug lines
    produce(db, "s", 5, start=3)
    wait_until(lambda: "batch done queue=s n=5 " in err.read_text(), 30, message="one batch of five")
    log = err.read_text()
    assert log.count("job ok queue=s") == 5
    assert "reloaded config" in log
    # And what cannot change live says so
    assert "reload: queue.s.workers changed; restart the service to apply it" in log
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, log
    assert "Traceback" not in err.read_text()


LIMITED = """
[wakeup]
poll_max_s = 0.2
idle_wait_s = 1.0
[queue.{name}]
handler = "nqhandlers:record"
limit_per_key = {per_key}
limit = 5
rate = "100/1s"
"""


def recorded_flow(db, pid: int) -> dict:
    import json

    flow = db.scalar("SELECT flow FROM nq_consumer WHERE pid = %s", (pid,))
    return json.loads(flow) if flow else {}


def test_sighup_after_a_served_queues_section_is_gone_is_refused_and_the_process_runs_on(db, tmp_path, notify,
                                                                                           procs):
    """Regression: the reload kept the old handler and ran the queue on the defaults, its limits
    gone in silence (a section deleted, or its name mistyped)."""
    # Given a consumer of a queue whose section sets its handler, limits and rate
    env = setup_env(db, tmp_path, notify, LIMITED.format(name="s", per_key=2))
    path = Path(env["NOTIFYQ_CONFIG"])
    proc, err = consumer(procs, env, tmp_path, "-q", "s")
    notify.wait_for("READY=1")
    wait_until(lambda: recorded_flow(db, proc.pid).get("s", {}).get("limit_per_key") == 2, 30,
               message="the limits recorded")
    # When the section's name is mistyped and SIGHUP arrives
    path.write_text(LIMITED.format(name="S", per_key=2))
    mark = len(notify.messages())
    proc.send_signal(signal.SIGHUP)
    reloading = notify.wait_for("RELOADING=1", mark)
    ready = notify.wait_for("READY=1", reloading + 1)
    # Then the reload is refused in one error line naming the section and the file, and the
    # READY=1 that ends it says so in its STATUS=
    log = err.read_text()
    refused = [ln for ln in log.splitlines() if "reload failed" in ln]
    assert len(refused) == 1 and "[queue.s]" in refused[0] and str(path) in refused[0], log
    assert "reloaded config" not in log and "Traceback" not in log
    assert any(ln.startswith("STATUS=") and "reload=failed" in ln for ln in notify.messages()[ready][1])
    # And the process runs on with its old config: its limits, its handler
    assert recorded_flow(db, proc.pid)["s"]["limit_per_key"] == 2
    produce(db, "s", 2)
    wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0, 30, message="2 jobs done")
    # When the section is back, with another limit, and SIGHUP comes again
    path.write_text(LIMITED.format(name="s", per_key=3))
    mark = len(notify.messages())
    proc.send_signal(signal.SIGHUP)
    notify.wait_for("READY=1", notify.wait_for("RELOADING=1", mark) + 1)
    # Then it applies
    wait_until(lambda: recorded_flow(db, proc.pid)["s"]["limit_per_key"] == 3, 30, message="the new limit")
    assert "reloaded config" in err.read_text()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, err.read_text()
    assert "Traceback" not in err.read_text()


# ------------------------------------------------------------------ the guide


def test_the_systemd_guide_shows_the_consumer_unit_as_shipped():
    # The guide is docs/operations.md; a heading renamed fails here rather than skipping the check
    repo = Path(__file__).resolve().parents[2]
    guide = (repo / "docs" / "operations.md").read_text()
    assert "## Running under systemd" in guide and "### The consumer unit" in guide
    text = guide.split("## Running under systemd", 1)[1]
    shown = text.split("### The consumer unit", 1)[1].split("```ini\n", 1)[1].split("\n```", 1)[0]
    assert shown == (repo / "systemd" / "notifyq-consumer@.service").read_text().rstrip("\n")
