"""notifyq.run.daemon: sd_notify, SystemdNotifier, StopSignals, PidFile, daemon_context.

Every wait has a deadline; child processes are driven over pipes, never by sleeping.
"""

import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import wait_until

from notifyq import errors
from notifyq.run import daemon

REPO = Path(__file__).resolve().parents[2]
CHILD_ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def readline(proc, timeout=10.0):
    """One line from an unbuffered child stdout, or fail at the deadline."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        pytest.fail(f"child wrote nothing within {timeout}s")
    return proc.stdout.readline().decode().strip()


def spawn(code, *args):
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            bufsize=0, env=CHILD_ENV, cwd=REPO)


def reap(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        stream.close()


@pytest.fixture
def listener(tmp_path):
    """A fake $NOTIFY_SOCKET: (address for the env, bound datagram socket)."""
    path = str(tmp_path / "n.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        s.settimeout(5)
        yield path, s


def nothing_pending(s):
    # AF_UNIX datagrams are queued by the time sendto() returns: no race in checking.
    readable, _, _ = select.select([s], [], [], 0)
    return not readable


# --- sd_notify -------------------------------------------------------------------------


def test_sd_notify_sends_one_datagram_to_a_path(listener, monkeypatch):
    path, s = listener
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert daemon.sd_notify("READY=1", "STATUS=consuming emails") is True
    assert s.recv(4096) == b"READY=1\nSTATUS=consuming emails"
    assert nothing_pending(s)


def test_sd_notify_reaches_an_abstract_socket(monkeypatch):
    name = f"notifyq-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        s.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert daemon.sd_notify("WATCHDOG=1") is True
        assert s.recv(4096) == b"WATCHDOG=1"


def test_sd_notify_without_socket_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert daemon.sd_notify("READY=1") is False


@pytest.mark.parametrize("address", ["/nonexistent/dir/notify.sock", "@notifyq-nobody-listens",
                                     "vsock:2:1234", "relative.sock"])
def test_sd_notify_send_errors_return_false_and_never_raise(address, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    assert daemon.sd_notify("READY=1") is False


# --- SystemdNotifier ----------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_watchdog_pings_at_most_every_half_interval(listener):
    path, s = listener
    clock = FakeClock()
    notifier = daemon.SystemdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"}, clock)
    assert notifier.watchdog_interval_s == 2.0

    assert notifier.watchdog() is True  # the first call always pings
    assert s.recv(4096) == b"WATCHDOG=1"
    clock.now += 0.5
    assert notifier.watchdog() is False
    clock.now += 0.49
    assert notifier.watchdog() is False
    assert nothing_pending(s)
    clock.now += 0.01  # a full half interval since the last ping
    assert notifier.watchdog() is True
    assert s.recv(4096) == b"WATCHDOG=1"


def test_watchdog_retries_at_once_when_a_ping_could_not_be_sent(tmp_path):
    clock = FakeClock()
    path = str(tmp_path / "late.sock")
    notifier = daemon.SystemdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"}, clock)
    assert notifier.watchdog() is False  # nobody listening yet
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        s.settimeout(5)
        assert notifier.watchdog() is True  # same instant: the failure was not counted
        assert s.recv(4096) == b"WATCHDOG=1"


@pytest.mark.parametrize("env, expected", [
    ({"WATCHDOG_USEC": "60000000"}, 60.0),
    ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": str(os.getpid())}, 60.0),
    ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}, None),  # watching another process
    ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "junk"}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
    ({}, None),
])
def test_watchdog_interval_honours_usec_and_pid(env, expected, listener):
    path, s = listener
    notifier = daemon.SystemdNotifier({"NOTIFY_SOCKET": path, **env})
    assert notifier.watchdog_interval_s == expected
    if expected is None:
        assert notifier.watchdog() is False
        assert nothing_pending(s)


def test_watchdog_is_disabled_without_a_notify_socket():
    notifier = daemon.SystemdNotifier({"WATCHDOG_USEC": "60000000"})
    assert notifier.watchdog_interval_s is None
    assert notifier.watchdog() is False
    assert notifier.ready() is False


def test_reloading_carries_the_monotonic_clock_in_microseconds(listener):
    path, s = listener
    notifier = daemon.SystemdNotifier({"NOTIFY_SOCKET": path})
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert notifier.reloading() is True
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    first, second = s.recv(4096).decode().split("\n")
    assert first == "RELOADING=1"
    key, value = second.split("=")
    assert key == "MONOTONIC_USEC"
    assert before <= int(value) <= after


def test_ready_status_and_stopping_messages(listener):
    path, s = listener
    notifier = daemon.SystemdNotifier({"NOTIFY_SOCKET": path})
    assert notifier.ready("consuming\nemails")
    assert s.recv(4096) == b"READY=1\nSTATUS=consuming emails"  # a newline cannot split it
    assert notifier.status("3 in flight")
    assert s.recv(4096) == b"STATUS=3 in flight"
    assert notifier.stopping("draining")
    assert s.recv(4096) == b"STOPPING=1\nSTATUS=draining"


# --- StopSignals ----------------------------------------------------------------------------


def test_sigterm_sets_stop_requested_and_the_previous_handler_comes_back():
    # Given a handler that was there before
    def previous(signum, frame):
        pass

    original = signal.signal(signal.SIGTERM, previous)
    try:
        # When SIGTERM arrives inside the context
        with daemon.StopSignals() as signals:
            os.kill(os.getpid(), signal.SIGTERM)
            # Then the stop is reported, and nothing else
            assert signals.stop_requested.wait(10)
            assert signals.wait(10) == "stop"
            assert not signals.reload_requested.is_set()
        # And the earlier handler is back
        assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        signal.signal(signal.SIGTERM, original)


def test_sigint_is_a_stop_and_sighup_a_reload():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGHUP)}
    with daemon.StopSignals() as signals:
        os.kill(os.getpid(), signal.SIGHUP)
        assert signals.wait(10) == "reload"
        signals.reload_requested.clear()  # safe on the main thread: handlers take no lock
        assert signals.wait(0.01) is None
        os.kill(os.getpid(), signal.SIGINT)
        assert signals.wait(10) == "stop"
    assert {s: signal.getsignal(s) for s in before} == before


def test_wait_times_out_with_none():
    with daemon.StopSignals() as signals:
        started = time.monotonic()
        assert signals.wait(0.05) is None
        assert time.monotonic() - started >= 0.05


def test_wait_wakes_for_a_signal_delivered_while_blocked():
    with daemon.StopSignals() as signals:
        timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        try:
            assert signals.wait(10) == "stop"
        finally:
            timer.cancel()


def test_a_second_stop_signal_exits_at_once_with_130():
    # Given a child that has seen its first SIGTERM and is "draining"
    child = spawn("""
        import time
        from notifyq.run.daemon import StopSignals
        with StopSignals() as signals:
            print("ready", flush=True)
            assert signals.wait(30) == "stop"
            print("draining", flush=True)
            # A drain that would take far too long, in short waits as the service's loop waits:
            # CPython runs a Python signal handler between bytecodes of the main thread, so a
            # signal noted just as the main thread blocked in one 30 s wait would wait for it
            for _ in range(300):
                time.sleep(0.1)
    """)
    try:
        assert readline(child) == "ready"
        child.send_signal(signal.SIGTERM)
        assert readline(child) == "draining"
        # When a second one arrives
        child.send_signal(signal.SIGINT)
        # Then it exits 130 at once, saying why on stderr
        assert child.wait(timeout=10) == daemon.EXIT_KILLED == errors.EXIT_KILLED == 130
        assert b"second stop signal" in child.stderr.read()
    finally:
        reap(child)


# --- PidFile --------------------------------------------------------------------------------


def read(path):
    return Path(path).read_text().strip()


def dead_pid():
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=30)
    return int(proc.stdout)


HOLDER = """
    import sys
    from notifyq.run.daemon import PidFile
    pidfile = PidFile(sys.argv[1])
    pidfile.acquire()
    print("held", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    pidfile.release()
"""


def test_acquire_writes_our_pid_and_release_removes_it(tmp_path):
    path = tmp_path / "notifyq.pid"
    with daemon.PidFile(path) as pidfile:
        assert read(path) == str(os.getpid())
        assert pidfile.path == str(path)
    assert not path.exists()


def test_acquiring_twice_in_one_process_is_harmless(tmp_path):
    # DaemonContext acquires in open(); a caller that enters the pidfile too must not fail.
    path = tmp_path / "notifyq.pid"
    pidfile = daemon.PidFile(path)
    with pidfile, pidfile:
        assert read(path) == str(os.getpid())
    assert not path.exists()


def test_a_relative_path_is_made_absolute_before_daemonising_changes_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert daemon.PidFile("run/q.pid").path == str(tmp_path / "run" / "q.pid")


@pytest.mark.parametrize("content", ["{dead}\n", "", "garbage\n", "0\n", "-1\n", "{me}\n"])
def test_a_stale_pidfile_is_replaced(tmp_path, content):
    # Our own pid counts as stale: nobody holds the lock, and containers reuse pids.
    path = tmp_path / "notifyq.pid"
    path.write_text(content.format(dead=dead_pid(), me=os.getpid()))
    an_hour_ago = time.time() - 3600
    os.utime(path, (an_hour_ago, an_hour_ago))
    with daemon.PidFile(path):
        assert read(path) == str(os.getpid())
    assert not path.exists()


def test_a_fresh_pidless_file_is_a_starter_not_a_corpse(tmp_path):
    # Given an unlocked, empty file created just now (a starter between open and flock)
    path = tmp_path / "notifyq.pid"
    path.touch()
    # Then others back off rather than delete it under the starter
    with pytest.raises(daemon.PidfileHeld, match="an unknown pid"):
        daemon.PidFile(path).acquire()
    assert path.exists()


def test_a_live_python_pid_without_lock_means_already_running(tmp_path):
    # Given a pidfile naming a live python process (an instance that does not flock)
    child = spawn("import sys; print('up', flush=True); sys.stdin.read()")
    try:
        assert readline(child) == "up", child.stderr.read()
        path = tmp_path / "notifyq.pid"
        path.write_text(f"{child.pid}\n")
        # Then acquiring refuses, naming the pid and the file
        with pytest.raises(daemon.PidfileHeld) as caught:
            daemon.PidFile(path).acquire()
        assert caught.value.pid == child.pid
        assert str(caught.value) == (f"another notifyq is running with pid {child.pid} "
                                     f"(pidfile {path})")
        assert isinstance(caught.value, RuntimeError)
        assert caught.value.exit_code == errors.EXIT_RUNNING
        assert read(path) == str(child.pid)  # and leaves the file alone
    finally:
        reap(child)


def test_a_reused_pid_of_an_unrelated_program_is_stale(tmp_path):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        path = tmp_path / "notifyq.pid"
        path.write_text(f"{sleeper.pid}\n")
        with daemon.PidFile(path):
            assert read(path) == str(os.getpid())
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)


def test_a_holder_process_blocks_others_until_it_dies(tmp_path):
    path = tmp_path / "notifyq.pid"
    holder = spawn(HOLDER, path)
    try:
        assert readline(holder) == "held"
        # While it lives, nobody else gets in, and check() says so too
        with pytest.raises(daemon.PidfileHeld) as caught:
            daemon.PidFile(path).acquire()
        assert caught.value.pid == holder.pid
        with pytest.raises(daemon.PidfileHeld):
            daemon.PidFile(path).check()
        # When it is SIGKILLed, its file stays behind but its lock dies with it
        holder.kill()
        holder.wait(timeout=10)
        assert read(path) == str(holder.pid)
        daemon.PidFile(path).check()
        with daemon.PidFile(path):
            assert read(path) == str(os.getpid())
    finally:
        reap(holder)


def test_a_clean_holder_exit_removes_its_file(tmp_path):
    path = tmp_path / "notifyq.pid"
    holder = spawn(HOLDER, path)
    try:
        assert readline(holder) == "held"
        holder.stdin.close()
        assert holder.wait(timeout=10) == 0
        assert not path.exists()
    finally:
        reap(holder)


def test_release_leaves_someone_elses_pid_alone(tmp_path):
    path = tmp_path / "notifyq.pid"
    pidfile = daemon.PidFile(path)
    pidfile.acquire()
    path.write_text("4242\n")  # rewritten in place by someone else
    pidfile.release()
    assert read(path) == "4242"


def test_release_leaves_a_replacement_file_alone(tmp_path):
    path = tmp_path / "notifyq.pid"
    pidfile = daemon.PidFile(path)
    pidfile.acquire()
    path.unlink()
    path.write_text(f"{os.getpid()}\n")  # a new file, even with our pid, is not ours
    pidfile.release()
    assert path.exists()


def test_racing_starters_have_exactly_one_winner(tmp_path):
    # Given a stale file and eight starters released at once (flock locks are per open
    # file, so threads of one process contend like separate processes)
    path = tmp_path / "notifyq.pid"
    path.write_text(f"{dead_pid()}\n")
    barrier = threading.Barrier(8)
    outcomes, winners = [], []

    def start():
        pidfile = daemon.PidFile(path)
        barrier.wait(timeout=10)
        try:
            pidfile.acquire()
            winners.append(pidfile)
            outcomes.append("won")
        except daemon.PidfileHeld:
            outcomes.append("refused")

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    # Then exactly one wins and the rest are told another instance runs
    assert sorted(outcomes) == ["refused"] * 7 + ["won"]
    assert read(path) == str(os.getpid())
    winners[0].release()
    assert not path.exists()


# --- daemon_context ---------------------------------------------------------------------------


def test_daemon_context_is_configured_for_classic_mode(tmp_path):
    pidfile = daemon.PidFile(tmp_path / "q.pid")
    ctx = daemon.daemon_context(pidfile, str(tmp_path / "q.log"))
    try:
        assert ctx.umask == 0o027
        assert ctx.detach_process is True
        assert ctx.working_directory == "/"
        assert ctx.pidfile is pidfile
        assert ctx.stdout is ctx.stderr and ctx.stdout.name == str(tmp_path / "q.log")
        assert ctx.stdout in ctx.files_preserve
        assert ctx.signal_map[signal.SIGTERM] == signal.SIG_DFL  # never 'terminate'
        assert ctx.signal_map[signal.SIGINT] == signal.SIG_DFL
        assert ctx.signal_map[signal.SIGHUP] is None
        assert not (tmp_path / "q.pid").exists()  # taken only after the fork
    finally:
        ctx.stdout.close()


def test_daemon_context_refuses_in_the_parent_when_already_running(tmp_path):
    with daemon.PidFile(tmp_path / "q.pid"):
        with pytest.raises(daemon.PidfileHeld):
            daemon.daemon_context(daemon.PidFile(tmp_path / "q.pid"), None)


DAEMON = """
    import os, sys
    from notifyq.run import daemon
    pidfile = daemon.PidFile(sys.argv[1])
    # Entering the pidfile again, as notifyq.run.runner does, is harmless.
    with daemon.daemon_context(pidfile, sys.argv[2], working_directory=sys.argv[3]), pidfile:
        with daemon.StopSignals() as signals:
            open("made-by-daemon", "w").close()
            print(f"daemon pid={os.getpid()}", flush=True)
            signals.wait(60)
            print("stopping", flush=True)
"""


def test_a_daemon_writes_its_own_pid_and_cleans_up_on_sigterm(tmp_path):
    pid_path, log_path = tmp_path / "q.pid", tmp_path / "q.log"
    launcher = subprocess.run([sys.executable, "-c", textwrap.dedent(DAEMON), str(pid_path),
                               str(log_path), str(tmp_path)],
                              env=CHILD_ENV, cwd=REPO, capture_output=True, timeout=30)
    assert launcher.returncode == 0, launcher.stderr
    log_text = lambda: log_path.read_text() if log_path.exists() else ""  # noqa: E731
    wait_until(lambda: "daemon pid=" in log_text(), 10, message="the daemon to start")
    pid = int(log_text().split("daemon pid=")[1].split()[0])
    try:
        assert pid != launcher.args and read(pid_path) == str(pid)
        assert (tmp_path / "made-by-daemon").stat().st_mode & 0o777 == 0o640  # umask 027
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: "stopping" in log_text() and not pid_path.exists(), 10,
                   message="the daemon to stop and remove its pidfile")
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
