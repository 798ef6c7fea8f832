"""Handlers: a Python callable `pkg.module:function`, or an external command.

Per job, a handler gets one Job (a command gets the payload JSON on stdin). Per batch, it
gets the list (a command gets JSON lines) and may fail jobs one by one with `job.fail()`;
jobs it does not fail succeeded. Raising (or a non-zero exit) fails every job not yet decided;
so does any BaseException (SystemExit, KeyboardInterrupt, asyncio.CancelledError, GeneratorExit,
one of the handler's own): in a worker thread it could never stop the process, only end the
thread and strand its claimed jobs. A coroutine handler (`async def`, or any handler
that returns an awaitable) is run to completion on its worker thread's event loop: its job's
outcome is the coroutine's. A process the handler forked never comes back into the consumer's
code: it exits where the handler returned or raised (_exit_child).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, ContextManager, NoReturn

from notifyq import errors
from notifyq.consume.handler import Handler
from notifyq.jobs import Job, run_of

log = logging.getLogger("notifyq.consumer")


class PythonHandler(Handler):
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
            run = run_of(job)
            if run.error is not None:
                continue
            try:
                # kept with the completion if the queue keeps results
                run.keep_result(self._call(job))
            except errors.Snooze as e:
                job.snooze(e.seconds)
            except HANDLER_FAILURES as e:  # the handler's failure is the job's, never the consumer's
                # The traceback for the log line only: last_error stays short
                run_of(job).fail(describe(e), retried(e), traceback.format_exc(), e)

    def _give_results(self, returned: Any, jobs: list[Job]) -> None:
        """A per-batch handler's results: a dict keyed by job (the Job, or its id) gives each
        job its value, kept as a per-job handler's return value is. A dict, not a list in the
        jobs' order: a handler that skips or reorders jobs cannot pair a value with the wrong
        job. Anything else but None is not kept (said once, with what was returned)."""
        if returned is None:
            return
        by_id = {job.id: job for job in jobs}
        try:
            unknown = [] if isinstance(returned, dict) else [type(returned).__name__]
            for key, value in returned.items() if isinstance(returned, dict) else ():
                job = by_id.get(key.id if isinstance(key, Job) else key)
                if job is None or (isinstance(key, Job) and key is not job):
                    unknown.append(_shown(key))
                else:
                    run_of(job).keep_result(value)
        except HANDLER_FAILURES as e:
            # The value's own code raised (a dict subclass whose items() does): no result of the
            # batch is kept, its jobs are done all the same; neither they nor the worker fail.
            for job in jobs:
                run_of(job).drop_result()
            log.warning("a per-batch handler's return value could not be read: no result kept, the jobs "
                        "are done all the same jobs=%s error=%s", ",".join(str(j.id) for j in jobs[:20]),
                        _shown(e, 200))
            return
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
        import asyncio  # here, as in _await: a consumer of plain handlers never needs its weight

        async def one(job: Job) -> None:
            try:
                result = self.func(job)
                if inspect.isawaitable(result):
                    result = await result
                run_of(job).keep_result(result)
            except HANDLER_FAILURES as e:
                run_of(job).fail(describe(e), retried(e), "".join(traceback.format_exception(e)), e)

        await asyncio.gather(*(one(job) for job in jobs))

    def _call(self, arg: Job | list[Job], func: Callable[[Any], Any] | None = None) -> Any:
        """The function (or `func`) on `arg`, awaited when it returns an awaitable: its return
        value. In a child the function forked, this never returns."""
        pid = _pid  # this process's (one getpid per job, after the call, finds a child)
        try:
            if self.around is None:  # the common case: no context to enter per job
                result = (func or self.func)(arg)
                if result is not None and inspect.isawaitable(result):  # (_awaited, inline)
                    result = _await(result)
            else:
                with self.around():
                    result = _awaited((func or self.func)(arg))
        except BaseException as e:
            if os.getpid() != pid:
                _exit_child(e)
            raise
        if os.getpid() != pid:
            _exit_child(None)
        return result


def _forked() -> None:
    global _pid
    _pid = os.getpid()


# The consumer's own pid, read before each call without a system call (the check after the
# call asks the system: a handler's child forked from C, past register_at_fork, is found too).
_pid = os.getpid()
os.register_at_fork(after_in_child=_forked)

# Everything a handler can raise: a BaseException that is no Exception (asyncio.CancelledError
# out of a task cancelled in the handler's own asyncio.run(), GeneratorExit, a class of its own)
# ended the worker thread, and once every worker had, the consumer exited 0 by itself.
HANDLER_FAILURES = (BaseException,)


def _awaited(result: Any) -> Any:
    """A call's return value, awaited when it is awaitable. None first: most handlers return
    nothing, and isawaitable's type tests would run per job."""
    return _await(result) if result is not None and inspect.isawaitable(result) else result


def _shown(value: Any, limit: int = 40) -> str:
    """A handler's value (or exception) for a log line, cut at `limit`: its own repr() may raise."""
    try:
        text = describe(value) if isinstance(value, BaseException) else repr(value)
    except HANDLER_FAILURES:
        text = f"<{type(value).__name__}>"
    return text[:limit]


_thread = threading.local()  # .runner: the thread's asyncio.Runner, made by its first coroutine


def _await(awaitable: Awaitable[Any]) -> Any:
    """Run a handler's awaitable to completion on the calling worker thread's own event loop:
    one per thread, kept across jobs (a loop per job would cost its setup on every job)."""
    import asyncio  # here: a consumer of plain handlers never needs its weight

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


def retried(e: BaseException) -> bool:
    """Whether a job whose handler raised `e` runs again: not when its job.transaction() block
    lost its transaction (what it stored would be stored again). A per-batch handler's other
    jobs are retried as ever: that job alone was failed so by its completion."""
    return not isinstance(e, errors.TransactionEnded)


def _run_batch(call: Callable[[], Any], jobs: list[Job]) -> Any:
    """The batch's call: what it returned; None when it raised (every undecided job failed)."""
    try:
        return call()
    except HANDLER_FAILURES as e:
        detail = traceback.format_exc()
        for job in jobs:
            if job.error is None:
                run_of(job).fail(describe(e), True, detail, e)
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



def load(handler: str, command: str, per_batch: bool, timeout_s: float) -> Handler:
    if handler and command:
        raise errors.HandlerError("give a handler or a command, not both")
    if handler:
        return PythonHandler(handler, per_batch)
    if command:
        # Here, not at the top: its subprocess, tempfile and shutil are a tenth of a consumer's
        # imports, which a consumer of Python handlers never needs.
        from notifyq.consume.commands import CommandHandler

        return CommandHandler(command, per_batch, timeout_s)
    raise errors.HandlerError("no handler: pass --handler pkg.module:function or --command CMD "
                              "(or set handler/command for the queue in the config)")
