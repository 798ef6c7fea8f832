"""The `--command` handler: an external command per job (the payload JSON on stdin) or per
batch (JSON lines), in its own process group, with a timeout, lease extension while it runs,
cancel (SIGTERM, then SIGKILL) and the shutdown grace. Loaded only for a queue with a command
(handlers.load).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable

from notifyq import config, errors
from notifyq.consume.handler import Handler
from notifyq.jobs import Job, run_of
from notifyq.jobs import cancelled as cancelled_jobs

STDERR_TAIL = 2000  # characters of a failed command's stderr kept in its error and its log line
EXTEND_EVERY_S = 1.0  # a running command's lease is extended this often (the worker paces the statements)
TERM_WAIT_S = 2.0  # at shutdown, how long a command gets between SIGTERM and SIGKILL
GRACE_EXPIRED = "interrupted: the shutdown grace expired while the command ran: its process group was killed"
EXITED_LOOK_S = 0.2  # a call cut short: how long it waits to learn whether its command had exited
# Once the command has exited, how long its stderr is still read: a child it left running may hold
# the pipe open for ever; the command's exit status is its outcome, whatever that child does.
STDERR_AFTER_EXIT_S = 0.5
CANCEL_GRACE_S = 2.0  # a cancelled command gets SIGTERM, then SIGKILL this much later
CANCELLED = f"cancelled: the command was stopped (SIGTERM, SIGKILL after {CANCEL_GRACE_S:g} s)"

# The process groups of every command of this process that may still run (added at the start,
# removed once the command is reaped), whatever handler started it: a consumer that exits at
# once (a second stop signal) kills them all first (kill_all_groups), from a signal handler.
_live_groups: set[int] = set()


class CommandHandler(Handler):
    """Runs `command` (split like a shell would, but without a shell) with a timeout.

    Exit 0 is success. The environment is notifyq's own without its secrets (child_env), plus
    NOTIFYQ_QUEUE and, per job, NOTIFYQ_JOB_ID and NOTIFYQ_ATTEMPT, or, per batch,
    NOTIFYQ_JOB_IDS (space-separated, in the order of the lines on stdin). The command runs in its
    own process group, so a timeout, or the end of the shutdown grace (stop_running), kills
    everything it started, not just the first process.

    The workers of a queue share one handler, so it tracks each thread's running command.
    """

    def __init__(self, command: str, per_batch: bool, timeout_s: float):
        try:
            self.argv = shlex.split(command)
        except ValueError as e:
            raise errors.HandlerError(f"command {command!r}: {e}") from None
        if not self.argv:
            raise errors.HandlerError("command is empty")
        if shutil.which(self.argv[0]) is None:
            raise errors.HandlerError(f"command not found: {self.argv[0]}")
        self.per_batch = per_batch
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._running: dict[int, Command] = {}  # worker thread id -> its command
        # worker thread id -> (its command's exit status, when it exited), ended before the stop
        self._ended_before_stop: dict[int, tuple[int, float]] = {}
        self._stopping = False

    def __call__(self, jobs: list[Job], extend: Callable[[], None]) -> None:
        if self.per_batch:
            self._run_batch(jobs, extend)
            return
        for job in jobs:
            env = {"NOTIFYQ_JOB_ID": str(job.id), "NOTIFYQ_ATTEMPT": str(job.attempts)}
            error, exited_at = self._run(json.dumps(job.payload), env, job.queue, extend, job.cancel_requested)
            if exited_at is not None:  # the attempt's end, however late its call returns
                run_of(job).end_at(exited_at)
            if error == GRACE_EXPIRED:  # the shutdown's doing, not the job's: not charged
                run_of(job).interrupt(error)
            elif error:
                job.fail(error, retry=error != CANCELLED)

    def _run_batch(self, jobs: list[Job], extend: Callable[[], None]) -> None:
        """A per-batch command learns which of its jobs were cancelled from the file named by
        NOTIFYQ_CANCELLED_FILE (their ids, one a line, appended as the cancels are seen, about
        once a second); once every job of its batch is cancelled, it is stopped."""
        lines = "".join(json.dumps(j.payload, separators=(",", ":")) + "\n" for j in jobs)
        fd, path = tempfile.mkstemp(prefix="notifyq-cancelled-")
        told: set[int] = set()

        def cancel() -> bool:
            gone = [j for j in cancelled_jobs(jobs) if j.id not in told]
            if gone:
                os.write(fd, "".join(f"{j.id}\n" for j in gone).encode())
                told.update(j.id for j in gone)
            return len(told) == len(jobs)

        try:
            env = {"NOTIFYQ_JOB_IDS": " ".join(str(j.id) for j in jobs), "NOTIFYQ_CANCELLED_FILE": path}
            error, exited_at = self._run(lines, env, jobs[0].queue, extend, cancel)
        finally:
            os.close(fd)
            os.unlink(path)
        if exited_at is not None:
            for job in jobs:
                run_of(job).end_at(exited_at)
        for job in jobs if error else ():
            if error == GRACE_EXPIRED:  # the shutdown's doing, not the jobs': not charged
                run_of(job).interrupt(error)
            else:
                job.fail(error, retry=error != CANCELLED)

    def _run(self, stdin: str, extra_env: dict[str, str], queue: str, extend: Callable[[], None],
             cancel: Callable[[], bool] | None = None) -> tuple[str | None, float | None]:
        """(None on success, else the job's error: the exit status and the tail of stderr; when
        the command exited, monotonic, None if it never ran). The exit's time is the attempt's
        end: the call may return much later (its lease extension waiting on the server)."""
        env = {**child_env(os.environ), **extra_env, "NOTIFYQ_QUEUE": queue}
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, env=env, text=True, start_new_session=True)
        except OSError as e:
            return f"cannot run {self.argv[0]}: {e.strerror}", None
        _live_groups.add(proc.pid)  # start_new_session: the group's id is the command's pid
        command = Command(proc)
        with self._lock:
            self._running[threading.get_ident()] = command
            stopping = self._stopping
        try:
            if stopping:  # started as the grace expired: it must not outlive the consumer
                _kill_group(proc)
                return GRACE_EXPIRED, command.exited_at()
            error = self._wait(command, stdin, extend, cancel)
            return error, command.exited_at()
        except BaseException as e:
            if isinstance(e, Exception) and _exited(proc):
                # The command ended by itself while the call waited on the server (an extension
                # or a cancel check retrying it, which the stop or a gone server then ended): its
                # exit is the job's outcome. Given back as interrupted, a command that had run
                # to its end ran again.
                return self._ended(command), command.exited_at()
            # The call ends early (a lease extension met a lost server, or the consumer's stop
            # ended its retry; an error of ours): the worker, then its process, may exit next.
            # The command's group is ours to end first, as at the end of the grace: it would
            # run on, a peer running its job again meanwhile.
            _end_groups([proc], TERM_WAIT_S)
            for pipe in (proc.stdin, proc.stderr):  # (nobody reads them any more)
                with contextlib.suppress(OSError):
                    pipe.close()
            raise
        finally:
            with self._lock:
                self._running.pop(threading.get_ident(), None)
            if proc.returncode is not None:  # reaped: its pid, so its group's id, may be reused
                _live_groups.discard(proc.pid)

    def _wait(self, command: Command, stdin: str, extend: Callable[[], None],
              cancel: Callable[[], bool] | None = None) -> str | None:
        proc = command.proc
        deadline = time.monotonic() + self.timeout_s
        stderr = ""
        pending: str | None = stdin
        while True:
            try:
                # In slices of a second, each followed by an extension: whatever the lease, it
                # never runs out under a running command (extend() is cheap when not yet due).
                wait_s = min(EXTEND_EVERY_S, max(0.01, deadline - time.monotonic()))
                _, stderr = proc.communicate(pending, timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                pending = None
                if command.status() is not None:
                    # Exited, its stderr still open: a child it left running holds the pipe.
                    # The timeout is the command's, not that child's: its exit is the outcome.
                    return self._outcome(command, _rest_of_stderr(proc))
                if time.monotonic() >= deadline:
                    _kill_group(proc)
                    return f"command timed out after {self.timeout_s:g}s"
                extend()  # still running and within its timeout: keep the lease
                if cancel is not None and cancel():  # `jobs cancel` (asked at most once a second)
                    _stop_group(proc, CANCEL_GRACE_S)
                    return CANCELLED
        return self._outcome(command, stderr)

    def _ended(self, command: Command) -> str | None:
        """The outcome of a command that has exited, its stderr's rest read (a call cut short
        left communicate() part way: it picks up where it stopped)."""
        return self._outcome(command, _rest_of_stderr(command.proc))

    def _outcome(self, command: Command, stderr: str) -> str | None:
        """The outcome of a command that has exited (and been reaped). One the stop signalled
        while it ran (stop_running) was interrupted, whatever its exit status: a command that
        obeys SIGTERM with exit 0 has not finished its job (which runs again), as the stop
        says of it. Read under the lock the stop marks it under: the stop either saw it exited
        (its exit is the outcome, ran_to_end agrees) or signalled it (interrupted)."""
        proc = command.proc
        with self._lock:
            interrupted = command.stopped or (self._stopping and proc.returncode != 0)
        if interrupted:
            return GRACE_EXPIRED
        if proc.returncode != 0:
            tail = (stderr or "").strip()[-STDERR_TAIL:]
            status = (f"exit status {proc.returncode}" if proc.returncode > 0
                      else f"killed by signal {-proc.returncode}")
            return status + (f": {tail}" if tail else "")
        return None

    def stop_running(self, wait_s: float = TERM_WAIT_S) -> bool:
        """The shutdown grace expired, or the consumer exits (ConsumerService.end_handlers): end
        every running command's process group (_end_groups), and return once the commands are
        reaped, so the caller fails their jobs only when nothing of them runs any more.
        Commands started from now on are killed at once."""
        with self._lock:
            self._stopping = True
            running = dict(self._running)
            # Those that had ended by themselves, their calls still waiting on the server (a
            # lease extension or a cancel check retrying it, or a frozen server's read): asked
            # of the kernel (Command.status), not of Popen.poll(), which says nothing while the
            # worker's thread is inside its own waitpid. The others are signalled now: marked
            # so (under the lock, which their outcome is read under: _outcome), they were
            # interrupted whatever their exit, as their job is given back. One an earlier call
            # signalled stays so (its exit on that SIGTERM is no end of its own).
            ended = {tid: e for tid, e in self._ended_before_stop.items() if tid not in running}
            for tid, command in running.items():
                if command.stopped:
                    continue
                status = command.status()
                if status is None:
                    command.stopped = True
                else:
                    ended[tid] = (status, command.exited_at())
            self._ended_before_stop = ended
        _end_groups([command.proc for command in running.values()], wait_s)
        return True

    def ran_to_end(self, thread_id: int) -> bool:
        ended = self._ended_before_stop.get(thread_id)
        return ended is not None and ended[0] == 0

    def ended_at(self, thread_id: int) -> float | None:
        ended = self._ended_before_stop.get(thread_id)
        return None if ended is None else ended[1]


class Command:
    """A running command's exit, as the kernel tells it, without reaping it (its Popen does):
    when it exited, for its attempt's record (ended_at), however late its call returns; and
    whether it has, to any thread at any time (status), also while another thread holds its
    Popen's wait lock (Popen.poll() says nothing then). Where the kernel has no pidfd (Linux
    before 5.3), the exit's time is when it was first seen."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self._exited_at: float | None = None
        # The stop signalled it while it ran (CommandHandler.stop_running, under its lock)
        self.stopped = False
        try:
            pidfd = os.pidfd_open(proc.pid)  # (before anything reaps it: its caller's thread alone does)
        except (AttributeError, OSError):
            return
        try:
            threading.Thread(target=self._watch, args=(pidfd,), name="notifyq-command-exit", daemon=True).start()
        except RuntimeError:  # no thread to spare: the time it is seen exited
            os.close(pidfd)

    def _watch(self, pidfd: int) -> None:
        """(Its own thread) wait for the exit, and take its time."""
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            poller.poll()  # readable once the process has exited (reaped or not)
            if self._exited_at is None:
                self._exited_at = time.monotonic()
        finally:
            os.close(pidfd)

    def exited_at(self) -> float:
        """When it exited (monotonic), asked once it has: the watch's time, or now if the
        watch's thread has not woken since (or there is none). The first answer stays."""
        if self._exited_at is None:
            self._exited_at = time.monotonic()
        return self._exited_at

    def status(self) -> int | None:
        """Its exit status once it has exited, None while it runs. Asked of the kernel without
        reaping it (waitid, WNOWAIT: its Popen reaps it); one reaped at this instant by another
        thread has its returncode set by that thread, waited for a moment (_exited)."""
        proc = self.proc
        if proc.returncode is not None:
            return proc.returncode
        if not hasattr(os, "waitid"):
            return proc.returncode if _exited(proc) else None
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped at this instant by another thread
            return proc.returncode if _exited(proc) else None
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def child_env(env: dict[str, str] | os._Environ) -> dict[str, str]:
    """notifyq's environment for a command, without the database password in any of its forms:
    NOTIFYQ_PASSWORD(_FILE), and NOTIFYQ_DSN or NOTIFYQ_SHARDS when it holds a password. A command that needs the
    database gets its own credentials."""
    out = {k: v for k, v in env.items() if k not in config.SECRET_ENV}
    userinfo, at, _ = out.get("NOTIFYQ_DSN", "").partition("//")[2].partition("@")
    if at and ":" in userinfo:  # parsed by hand: even a DSN too malformed to parse keeps its secret
        del out["NOTIFYQ_DSN"]
    # NOTIFYQ_SHARDS: any `//...:...@` (each DSN's user:password, or text spanning two DSNs: left
    # out too, on the safe side).
    shards = out.get("NOTIFYQ_SHARDS", "")
    if any(":" in part.partition("@")[0] for part in shards.split("//")[1:] if "@" in part):
        del out["NOTIFYQ_SHARDS"]
    return out


def kill_all_groups() -> None:
    """SIGKILL the process group of every command of this process that may still run: called
    right before the process exits without a drain (a second stop signal, daemon.StopSignals),
    from the signal handler: no lock, one system call per group, over a copy of the set."""
    for pgid in tuple(_live_groups):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:  # gone already (or no longer ours to signal)
            pass


def _exited(proc: subprocess.Popen) -> bool:
    """Whether the command has exited (reaped now if so). Waited for a moment rather than
    polled: the stop's thread may be reaping the commands at this instant (_end_groups), and
    Popen.poll() then says nothing of one that has exited."""
    try:
        proc.wait(EXITED_LOOK_S)
    except subprocess.TimeoutExpired:
        return False
    return True


def _rest_of_stderr(proc: subprocess.Popen) -> str:
    """What an exited command's stderr still has, read for STDERR_AFTER_EXIT_S at most (after
    what communicate() read before: it picks up where it stopped); then our ends of its pipes
    are closed and it is reaped. A child it left running may hold the pipe open: it is neither
    waited for nor stopped (the grace's end and a timeout stop what runs in the group)."""
    try:
        _, stderr = proc.communicate(timeout=STDERR_AFTER_EXIT_S)
        return stderr or ""
    except subprocess.TimeoutExpired as e:
        partial = e.stderr or b""
    except (OSError, ValueError):  # (its pipes closed already)
        partial = b""
    for pipe in (proc.stdin, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(1.0)  # (exited: reaped at once)
    if isinstance(partial, str):
        return partial
    return partial.decode(errors="replace")


def _end_groups(procs: list[subprocess.Popen], wait_s: float) -> None:
    """SIGTERM each command's process group, SIGKILL what is left of the groups after wait_s;
    returns once the commands are reaped (or a second later, one in uninterruptible sleep)."""
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:  # also what a leader that obeyed SIGTERM left behind in its group
        _signal_group(proc, signal.SIGKILL)
    for proc in procs:
        try:
            proc.wait(1.0)
        except subprocess.TimeoutExpired:  # in uninterruptible sleep: nothing more to do
            pass


def _stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the command's process group, SIGKILL what is left of it grace_s later; returns
    once the command is reaped."""
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc, signal.SIGKILL)  # also what a leader that obeyed SIGTERM left behind
    proc.communicate()


def _kill_group(proc: subprocess.Popen) -> None:
    _signal_group(proc, signal.SIGKILL)
    proc.communicate()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    if proc.returncode is not None:  # reaped: its group's id may be another's by now
        return
    try:
        os.killpg(proc.pid, sig)  # start_new_session: the group's id is the command's pid
    except ProcessLookupError:
        pass
