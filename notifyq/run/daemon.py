"""sd_notify, stop/reload signals; pidfile and DaemonContext for hosts without systemd."""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal, Self

from notifyq import errors

if TYPE_CHECKING:
    import daemon

log = logging.getLogger("notifyq.daemon")

EXIT_KILLED = errors.EXIT_KILLED  # 130: a second stop signal skips the drain


def sd_notify(*lines: str) -> bool:
    """Send one datagram of KEY=VALUE lines to $NOTIFY_SOCKET; False if unset or failed."""
    return _send(os.environ.get("NOTIFY_SOCKET"), lines)


def _send(address: str | None, lines: tuple[str, ...]) -> bool:
    if not address:
        return False
    if address[0] == "@":
        address = "\0" + address[1:]  # abstract namespace; other schemes fail in sendto
    import socket  # here: a process outside systemd (and the tests, the benchmark) never needs it

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            # A congested manager must never stall the loop; a lost ping is simply resent.
            s.sendto("\n".join(lines).encode(), socket.MSG_DONTWAIT, address)
    except OSError as e:
        log.debug("sd_notify(%s) failed: %s", ", ".join(lines), e)
        return False
    return True


def _status(text: str | None) -> tuple[str, ...]:  # a newline would start a new KEY=VALUE
    return () if text is None else ("STATUS=" + " ".join(text.splitlines()),)


class SystemdNotifier:
    """The main loop calls watchdog() when it makes progress: a timer thread would keep
    pinging while the loop hangs in a dead database call, the very thing to catch."""

    def __init__(self, env: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        env = os.environ if env is None else env
        self._address = env.get("NOTIFY_SOCKET") or None
        self._interval_s = _watchdog_interval_s(env) if self._address else None
        self._clock = clock
        self._last_ping = float("-inf")

    @property
    def watchdog_interval_s(self) -> float | None:  # None: nobody watches this process
        return self._interval_s

    def ready(self, status: str | None = None) -> bool:
        return _send(self._address, ("READY=1", *_status(status)))

    def status(self, text: str) -> bool:
        return _send(self._address, _status(text))

    def stopping(self, status: str | None = None) -> bool:
        return _send(self._address, ("STOPPING=1", *_status(status)))

    def reloading(self, status: str | None = None) -> bool:
        """Announce a reload; call ready() when done (sd_notify(3), Type=notify-reload)."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return _send(self._address, ("RELOADING=1", f"MONOTONIC_USEC={usec}", *_status(status)))

    def watchdog(self) -> bool:
        """Ping at most once per half interval; True when a ping was sent."""
        now = self._clock()
        if self._interval_s is None or now - self._last_ping < self._interval_s / 2:
            return False
        if not _send(self._address, ("WATCHDOG=1",)):
            return False  # not recorded, so the next call retries at once
        self._last_ping = now
        return True


def _watchdog_interval_s(env: Mapping[str, str]) -> float | None:
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
        # A child that inherited our environment must not feed our watchdog.
        if env.get("WATCHDOG_PID") and int(env["WATCHDOG_PID"]) != os.getpid():
            return None
    except ValueError:
        return None
    return usec / 1_000_000 if usec > 0 else None


class StopSignals:
    """SIGTERM/SIGINT: stop_requested, a second one os._exit(130). SIGHUP: reload_requested.

    Event.set() in a handler deadlocks if the main thread was inside that Event's lock
    (wait(), clear()). So handlers only count and put() on a SimpleQueue, which is
    documented reentrant, and a thread sets the Events. Enter from the main thread."""

    def __init__(self, before_exit_now: Callable[[], None] | None = None) -> None:
        # Run in the signal handler right before os._exit on a second stop: what must not
        # outlive the process (a consumer's commands, commands.kill_all_groups).
        self.before_exit_now = before_exit_now
        self.stop_requested = threading.Event()
        self.reload_requested = threading.Event()
        self._wake = threading.Event()  # set along with either, so wait() watches both
        self._stops = 0
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Self:
        if self._thread is not None:
            raise RuntimeError("StopSignals is already installed")
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # raises off the main thread
            self._previous[signum] = signal.signal(signum, self._handle)
        self._thread = threading.Thread(target=self._dispatch, name="notifyq-signals", daemon=True)
        self._thread.start()  # a signal that came first is waiting in the queue
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._queue.put(None)
        self._thread.join(timeout=5)
        self._thread = None

    def _handle(self, signum: int, frame: object) -> None:
        if signum != signal.SIGHUP:
            self._stops += 1
            if self._stops > 1:
                os.write(2, b"notifyq: second stop signal, exiting now without draining\n")
                try:
                    if self.before_exit_now is not None:
                        self.before_exit_now()
                finally:
                    os._exit(EXIT_KILLED)
        self._queue.put(signum)

    def _dispatch(self) -> None:
        while (signum := self._queue.get()) is not None:
            (self.reload_requested if signum == signal.SIGHUP else self.stop_requested).set()
            self._wake.set()

    def wait(self, timeout: float | None) -> Literal["stop", "reload"] | None:
        """Stop wins over reload; None on timeout. Clear reload_requested after reloading."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (self.stop_requested.is_set() or self.reload_requested.is_set()):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            if self._wake.wait(remaining):
                self._wake.clear()  # the Events are re-read after clearing: nothing is lost
        return "stop" if self.stop_requested.is_set() else "reload"


class PidfileHeld(errors.AlreadyRunning, RuntimeError):
    """A live process holds the pidfile (the CLI maps it to errors.EXIT_RUNNING)."""

    def __init__(self, pid: int | None, path: str) -> None:
        self.pid, self.path = pid, path
        who = f"pid {pid}" if pid else "an unknown pid"
        super().__init__(f"another notifyq is running with {who} (pidfile {path})")


class PidFile:
    """O_CREAT|O_EXCL on the file itself, flock()ed for our lifetime (the kernel drops the
    lock however we die). Staleness is judged under the lock, on the inode the path still
    names; a fresh pid-less file is a starter before its flock(), never stale (no livelock)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        # Absolute now: DaemonContext changes directory before it acquires the pidfile.
        self.path = os.path.abspath(os.fspath(path))
        self._fd: int | None = None
        self._pid = 0

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def check(self) -> None:
        """Raise PidfileHeld if a live instance holds the file; takes nothing."""
        self._inspect(remove_stale=False)

    def acquire(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            return  # ours already: DaemonContext.open() acquires it, callers may again
        for _ in range(5):  # each lost race costs one retry; this bounds a pathological loop
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                self._inspect(remove_stale=True)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # contended only by a checker, briefly
                if _same_file(fd, self.path):  # else a checker removed it, still empty
                    os.write(fd, f"{os.getpid()}\n".encode())  # no fsync: after a crash it is stale
                    self._fd, self._pid = fd, os.getpid()
                    return
            finally:
                if self._fd != fd:
                    os.close(fd)
        raise RuntimeError(f"pidfile {self.path} keeps reappearing; giving up")

    def release(self) -> None:
        """Remove the file if it still holds our pid, then drop the lock."""
        if self._fd is None:
            return
        try:
            # Not from a forked child (it shares our lock), nor if the pid is someone else's.
            if (self._pid == os.getpid() and _same_file(self._fd, self.path)
                    and _read_pid(self._fd) == self._pid):
                os.unlink(self.path)  # before unlocking, so nobody sees it unlocked
        finally:
            os.close(self._fd)
            self._fd = None

    def _inspect(self, remove_stale: bool) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise PidfileHeld(_read_pid(fd), self.path) from None
            if not _same_file(fd, self.path):
                return  # replaced meanwhile: the caller looks again
            pid = _read_pid(fd)
            if pid is None and time.time() - os.fstat(fd).st_mtime < 2:
                raise PidfileHeld(None, self.path)  # a starter between open() and flock()
            # Unlocked, yet catch an instance that does not lock (NFS). Our own pid is stale
            # by definition: containers reuse small pids every boot.
            if pid is not None and pid != os.getpid() and _is_notifyq(pid):
                raise PidfileHeld(pid, self.path)
            if remove_stale:
                log.warning("removing stale pidfile %s (pid %s)", self.path, pid)
                os.unlink(self.path)
        finally:
            os.close(fd)


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _read_pid(fd: int) -> int | None:
    try:
        pid = int(os.pread(fd, 32, 0).strip() or b"0")
    except (OSError, ValueError):
        return None
    return pid if pid > 0 else None  # kill(0 or -1, 0) would probe process groups


def _is_notifyq(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return True  # cannot tell (no /proc, hidepid): refusing beats running twice
    return b"notifyq" in cmdline or b"python" in cmdline  # else a reused pid: stale


# python-daemon maps SIGTERM to `terminate` (SystemExit mid-transaction). Until StopSignals
# is in, SIGTERM/SIGINT keep the default action: nothing is open, so dying is clean, while
# SIG_IGN (python-daemon's None) loses an early stop and is inherited by commands we exec.
_SIGNAL_MAP = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.SIG_DFL, signal.SIGHUP: None,
               signal.SIGTSTP: None, signal.SIGTTIN: None, signal.SIGTTOU: None}


def daemon_context(pidfile: PidFile | None, log_file: str | None,
                   working_directory: str = "/") -> daemon.DaemonContext:
    """Classic mode: open connections, sockets, threads and StopSignals only inside the
    `with` block (open() closes every fd not in files_preserve). DaemonContext acquires the
    pidfile in open(), after the double fork and fd cleanup, so the pid is the daemon's;
    close() (also at exit) releases it. check() runs here in the parent first, so "already
    running" reaches the operator's terminal. stdout/stderr go to log_file or /dev/null;
    files of handlers on the "notifyq" logger (streams, syslog sockets) are kept."""
    import daemon  # python-daemon: only classic daemon mode needs it

    if pidfile is not None:
        pidfile.check()
    stream = open(log_file, "a", buffering=1, encoding="utf-8") if log_file else None
    handlers = logging.getLogger("notifyq").handlers
    preserve = [o for h in handlers for o in (getattr(h, "stream", 0), getattr(h, "socket", 0))
                if hasattr(o, "fileno")]
    return daemon.DaemonContext(
        working_directory=working_directory, umask=0o027, detach_process=True,
        pidfile=pidfile, stdout=stream, stderr=stream,
        files_preserve=preserve + ([stream] if stream else []), signal_map=dict(_SIGNAL_MAP))
