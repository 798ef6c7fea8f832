"""Handlers: a Python callable `pkg.module:function`, or an external command.

Per job, a handler gets one Job (a command gets the payload JSON on stdin). Per batch, it
gets the list (a command gets JSON lines) and may fail jobs one by one with `job.fail()`;
jobs it does not fail succeeded. Raising (or a non-zero exit) fails every job not yet decided;
so does SystemExit or KeyboardInterrupt: in a worker thread they could never stop the process,
only end the thread and strand its claimed jobs. A coroutine handler (`async def`, or any handler
that returns an awaitable) is run to completion on its worker thread's event loop: its job's
outcome is the coroutine's. A process the handler forked never comes back into the consumer's
code: it exits where the handler returned or raised (_exit_child).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ContextManager, NoReturn

from notifyq import config, errors
from notifyq.jobs import Job
from notifyq.jobs import cancelled as cancelled_jobs

if TYPE_CHECKING:
    import subprocess

log = logging.getLogger("notifyq.consumer")

STDERR_TAIL = 2000  # characters of a failed command's stderr kept in its error and its log line
EXTEND_EVERY_S = 1.0  # a running command's lease is extended this often (the worker paces the statements)
TERM_WAIT_S = 2.0  # at shutdown, how long a command gets between SIGTERM and SIGKILL
GRACE_EXPIRED = "shutdown grace expired while the command ran: its process group was killed"
CANCEL_GRACE_S = 2.0  # a cancelled command gets SIGTERM, then SIGKILL this much later
CANCELLED = f"cancelled: the command was stopped (SIGTERM, SIGKILL after {CANCEL_GRACE_S:g} s)"


class PythonHandler:
    """`around`: a context manager factory each call of the function runs inside (a framework's
    per-job hygiene: contrib.django closes stale connections before and after each job).
    `concurrency` N > 1: per job, the worker hands over up to N jobs at once, and a coroutine
    handler runs them as N coroutines on the thread's loop (a plain function still runs them
    one after another)."""

    def __init__(self, spec: str | Callable[..., Any], per_batch: bool,
                 around: Callable[[], ContextManager[Any]] | None = None, concurrency: int = 1):
        self.per_batch = per_batch
        self.func = spec if callable(spec) else load_callable(spec)
        self.around = around
        self.concurrency = concurrency
        self._warned = False  # a per-batch return value that cannot be kept: said once

    def __call__(self, jobs: list[Job], extend: Callable[[], None]) -> None:
        if self.per_batch:
            self._give_results(_run_batch(lambda: self._call(jobs), jobs), jobs)
            return
        if self.concurrency > 1 and len(jobs) > 1:
            self._call([j for j in jobs if j.error is None], self._together)
            return
        for job in jobs:
            if job.error is not None:
                continue
            try:
                job._result = self._call(job)  # kept with the completion if the queue keeps results
            except errors.Snooze as e:
                job.snooze(e.seconds)
            except HANDLER_FAILURES as e:  # the handler's failure is the job's, never the consumer's
                job.fail(describe(e))
                job.detail = traceback.format_exc()  # for the log line only: last_error stays short
                job.exception = e

    def _give_results(self, returned: Any, jobs: list[Job]) -> None:
        """A per-batch handler's results: a dict keyed by job (the Job, or its id) gives each
        job its value, kept as a per-job handler's return value is. A dict, not a list in the
        jobs' order: a handler that skips or reorders jobs cannot pair a value with the wrong
        job. Anything else but None is not kept (said once, with what was returned)."""
        if returned is None:
            return
        by_id = {job.id: job for job in jobs}
        unknown = [] if isinstance(returned, dict) else [type(returned).__name__]
        for key, value in returned.items() if isinstance(returned, dict) else ():
            job = by_id.get(key.id if isinstance(key, Job) else key)
            if job is None or (isinstance(key, Job) and key is not job):
                unknown.append(repr(key)[:40])
            else:
                job._result = value
        if unknown and not self._warned:
            self._warned = True
            log.warning("a per-batch handler's return value: only a dict {job or job.id: result} "
                        "for the jobs of its batch is kept; not kept: %s", ", ".join(unknown[:5]))

    def timeout_for(self, jobs: list[Job], queue_timeout_s: float) -> float:
        """How long a call on `jobs` may run (0: unbounded): the queue's timeout_s here; a
        TaskHandler's task may say otherwise."""
        return queue_timeout_s

    async def _together(self, jobs: list[Job]) -> None:
        """Each job's call as a coroutine of its own, all awaited at once; each job's outcome
        is its own coroutine's (its return value kept as its result)."""
        import asyncio

        async def one(job: Job) -> None:
            try:
                result = self.func(job)
                if inspect.isawaitable(result):
                    result = await result
                job._result = result
            except HANDLER_FAILURES as e:
                job.fail(describe(e))
                job.detail = "".join(traceback.format_exception(e))
                job.exception = e

        await asyncio.gather(*(one(job) for job in jobs))

    def _call(self, arg: Job | list[Job], func: Callable[[Any], Any] | None = None) -> Any:
        """The function (or `func`) on `arg`, awaited when it returns an awaitable: its return
        value. In a child the function forked, this never returns."""
        pid = os.getpid()
        try:
            with self.around() if self.around is not None else contextlib.nullcontext():
                result = (func or self.func)(arg)
                if inspect.isawaitable(result):
                    result = _await(result)
        except BaseException as e:
            if os.getpid() != pid:
                _exit_child(e)
            raise
        if os.getpid() != pid:
            _exit_child(None)
        return result


HANDLER_FAILURES = (Exception, SystemExit, KeyboardInterrupt)


_thread = threading.local()  # .runner: the thread's asyncio.Runner, made by its first coroutine


def _await(awaitable: Awaitable[Any]) -> Any:
    """Run a handler's awaitable to completion on the calling worker thread's own event loop:
    one per thread, kept across jobs (a loop per job would cost its setup on every job)."""
    import asyncio  # here: a consumer of plain handlers never loads it

    async def wait() -> Any:
        return await awaitable

    runner = getattr(_thread, "runner", None)
    if runner is None:
        runner = _thread.runner = asyncio.Runner()
    try:
        return runner.run(wait())
    except BaseException as e:
        if not isinstance(e, Exception):  # SystemExit and the like stop the loop mid-step:
            close_loop()  # the next coroutine gets a fresh one
        raise


def close_loop() -> None:
    """Close the calling thread's event loop, if a coroutine handler made one (its worker ends)."""
    runner = getattr(_thread, "runner", None)
    if runner is not None:
        _thread.runner = None
        runner.close()


def _exit_child(e: BaseException | None) -> NoReturn:
    """A process the handler forked came back from it. It shares the consumer's sessions,
    sockets and claimed jobs: going on into consumer code would ack, read replies meant for the
    parent and hang its drain. So it exits here, with the code Python gives at top level:
    SystemExit's code, 1 after any other exception (its traceback on stderr), 0 on a return."""
    code = 0
    try:
        if isinstance(e, SystemExit):
            if isinstance(e.code, int):
                code = e.code
            elif e.code is not None:
                code = 1
                print(e.code, file=sys.stderr)
        elif e is not None:
            code = 1
            traceback.print_exception(e)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        os._exit(code)


def describe(e: BaseException) -> str:
    """The job's error: 'SystemExit: 3', 'ValueError: bad input', or the bare name (sys.exit())."""
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _run_batch(call: Callable[[], Any], jobs: list[Job]) -> Any:
    """The batch's call: what it returned; None when it raised (every undecided job failed)."""
    try:
        return call()
    except HANDLER_FAILURES as e:
        detail = traceback.format_exc()
        for job in jobs:
            if job.error is None:
                job.fail(describe(e))
                job.detail = detail
                job.exception = e
        return None


def load_callable(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise errors.HandlerError(f"handler {spec!r}: expected pkg.module:function")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: handlers next to the caller import
    try:
        module = importlib.import_module(module_name)
    except SystemExit as e:  # a module that exits at import would end the consumer without a word
        raise errors.HandlerError(f"handler {spec!r}: importing {module_name} called sys.exit({e.code!r})") from None
    except Exception as e:
        raise errors.HandlerError(f"handler {spec!r}: cannot import {module_name}: {e}") from None
    func = module
    for part in attr.split("."):
        func = getattr(func, part, None)
        if func is None:
            raise errors.HandlerError(f"handler {spec!r}: {module_name} has no attribute {attr}")
    if not callable(func):
        raise errors.HandlerError(f"handler {spec!r} is not callable")
    return func


class CommandHandler:
    """Runs `command` (split like a shell would, but without a shell) with a timeout.

    Exit 0 is success. The environment is notifyq's own without its secrets (child_env), plus
    NOTIFYQ_QUEUE and, per job, NOTIFYQ_JOB_ID and NOTIFYQ_ATTEMPT, or, per batch,
    NOTIFYQ_JOB_IDS (space-separated, in the order of the lines on stdin). The command runs in its
    own process group, so a timeout, or the end of the shutdown grace (stop_running), kills
    everything it started, not just the first process.

    The workers of a queue share one handler, so it tracks each thread's running command.
    """

    def __init__(self, command: str, per_batch: bool, timeout_s: float):
        import shlex  # here, as subprocess below: a consumer of Python handlers never loads them
        import shutil

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
        self._running: dict[int, subprocess.Popen] = {}  # worker thread id -> its command
        self._stopping = False

    def __call__(self, jobs: list[Job], extend: Callable[[], None]) -> None:
        if self.per_batch:
            self._run_batch(jobs, extend)
            return
        for job in jobs:
            env = {"NOTIFYQ_JOB_ID": str(job.id), "NOTIFYQ_ATTEMPT": str(job.attempts)}
            error = self._run(json.dumps(job.payload), env, job.queue, extend, job.cancel_requested)
            if error:
                job.fail(error, retry=error != CANCELLED)

    def _run_batch(self, jobs: list[Job], extend: Callable[[], None]) -> None:
        """A per-batch command learns which of its jobs were cancelled from the file named by
        NOTIFYQ_CANCELLED_FILE (their ids, one a line, appended as the cancels are seen, about
        once a second); once every job of its batch is cancelled, it is stopped."""
        import tempfile

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
            error = self._run(lines, env, jobs[0].queue, extend, cancel)
        finally:
            os.close(fd)
            os.unlink(path)
        if error:
            for job in jobs:
                job.fail(error, retry=error != CANCELLED)

    def _run(self, stdin: str, extra_env: dict[str, str], queue: str, extend: Callable[[], None],
             cancel: Callable[[], bool] | None = None) -> str | None:
        """None on success, else the job's error: the exit status and the tail of stderr."""
        import subprocess

        env = {**child_env(os.environ), **extra_env, "NOTIFYQ_QUEUE": queue}
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, env=env, text=True, start_new_session=True)
        except OSError as e:
            return f"cannot run {self.argv[0]}: {e.strerror}"
        with self._lock:
            self._running[threading.get_ident()] = proc
            stopping = self._stopping
        try:
            if stopping:  # started as the grace expired: it must not outlive the consumer
                _kill_group(proc)
                return GRACE_EXPIRED
            return self._wait(proc, stdin, extend, cancel)
        finally:
            with self._lock:
                self._running.pop(threading.get_ident(), None)

    def _wait(self, proc: subprocess.Popen, stdin: str, extend: Callable[[], None],
              cancel: Callable[[], bool] | None = None) -> str | None:
        import subprocess

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
                if time.monotonic() >= deadline:
                    _kill_group(proc)
                    return f"command timed out after {self.timeout_s:g}s"
                extend()  # still running and within its timeout: keep the lease
                if cancel is not None and cancel():  # `jobs cancel` (asked at most once a second)
                    _stop_group(proc, CANCEL_GRACE_S)
                    return CANCELLED
        if self._stopping and proc.returncode != 0:
            return GRACE_EXPIRED
        if proc.returncode != 0:
            tail = (stderr or "").strip()[-STDERR_TAIL:]
            status = (f"exit status {proc.returncode}" if proc.returncode > 0
                      else f"killed by signal {-proc.returncode}")
            return status + (f": {tail}" if tail else "")
        return None

    def stop_running(self, wait_s: float = TERM_WAIT_S) -> None:
        """The shutdown grace expired: SIGTERM every running command's process group, SIGKILL
        what is left of the groups after wait_s, and return once the commands are reaped, so
        the caller fails their jobs only when nothing of them runs any more. Commands started
        from now on are killed at once."""
        import signal
        import subprocess

        with self._lock:
            self._stopping = True
            procs = list(self._running.values())
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


def _stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the command's process group, SIGKILL what is left of it grace_s later; returns
    once the command is reaped."""
    import signal
    import subprocess

    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc, signal.SIGKILL)  # also what a leader that obeyed SIGTERM left behind
    proc.communicate()


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    _signal_group(proc, signal.SIGKILL)
    proc.communicate()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # start_new_session: the group's id is the command's pid
    except ProcessLookupError:
        pass


def load(handler: str, command: str, per_batch: bool, timeout_s: float):
    if handler and command:
        raise errors.HandlerError("give a handler or a command, not both")
    if handler:
        return PythonHandler(handler, per_batch)
    if command:
        return CommandHandler(command, per_batch, timeout_s)
    raise errors.HandlerError("no handler: pass --handler pkg.module:function or --command CMD "
                              "(or set handler/command for the queue in the config)")
