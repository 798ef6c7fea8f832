"""The fault schedule's handler (tests/fault/harness.py): it records every start and end.

Each record is one line written with a single os.write() on an O_APPEND descriptor, with no
buffer in between: whatever a SIGKILL or os._exit() interrupts, every line written before it
is complete in the file and none is half-written (an O_APPEND write of a short line to a
local file lands whole). A process killed mid-handler leaves its start line and no end line:
that missing end is how the checker knows the run was cut short.

    S <deploy> <job> <attempt> <pid> <token> <t_mono_ns> <t_wall_ns> <priority> <run_at_us> [f=<flags>] [u=<tag>] [k=<key>] [m=<spent_us>]
    E <deploy> <job> <attempt> <pid> <token> <t_mono_ns> <ok|fail>
    C <deploy> <job> <attempt> <pid> <token> <t_mono_ns>   (fx: its block's COMMIT is next)

Monotonic time is CLOCK_MONOTONIC, one clock for every process of the machine, so the
harness's fault times and these lines compare directly. <token> is the claim token, read
from the job's run state (notifyq.jobs.run_of: the claim's Completion carries it; the handler
API does not expose it). Payload: {"k": kind, "s": seconds}; kind "poison" kills the process with
os._exit before the job can end, "unwind" (poison too) raises a BaseException that is no
Exception on every attempt (its job ends dead; it once ended its worker's thread, and the
consumer exited 0 by itself), "fail1" fails the first attempt (a normal retry).

Kinds of the issue-26 classes (tests/fault/schedule.py):
  long   runs "s" seconds and calls job.extend_lease() every "x" seconds: a handler that keeps its
         lease, so a second run of it is never its own doing (flag L on its start line)
  fork   forks a child that calls sys.exit(0) at once; the parent waits for it (flag F). A child
         that runs consumer code instead starts jobs under its own pid: the checker sees it
  kanji  the first attempt fails with a 90 KB non-ASCII error (30,000 x U+6F22)
Payload "u" is echoed as u=<tag> on the start line: which put() stored this job.

The rate class (tests/fault/rated.py): with NQF_RATE_DSN and NQF_RATE_DB set (the server's
admin DSN, a user whose sessions the schedule's KILLs do not pick, and the deployment's database), the start line carries m=<epoch us>:
when the job's claim spent its starts, as the rate log (nq_rate) holds it under the claim's
token. The checker's rate rule then measures the claims' own times, not start lines that a
loaded machine may delay by a few hundred ms after the spend.

Issue 29's kind:
  fx     sleeps "s", then writes one row (job, attempt, pid, token) into the effects table
         (EFFECTS_TABLE, made by the harness) through job.transaction(), which commits it with
         the job's completion. Its end line says ok only once that COMMIT returned; a
         transaction that raised (ClaimLost, a COMMIT that did not land) ends it fail and raises.
         With "c" (half of them), what a long handler does inside its block: after the row,
         job.extend_lease(), job.cancel_requested() and notifyq.cancelled() (none may commit
         the block), then "c" seconds more inside it, a window for the faults to land in.
         With "r" (a few), it gives job.transaction() a result that cannot be encoded.
  unenc  (the effects class, a few) returns a result that cannot be encoded (nested too deep,
         NaN, a lone surrogate: by job id); the queues keep results there: it is dropped with a
         warning, and the job is done once (NaN was once kept as invalid JSON).
`handle_async` is the same handler as a coroutine (`async def` handlers, item 2).
"""

import datetime as dt
import os
import signal
import sys
import threading
import time

from notifyq.jobs import run_of

_EPOCH = dt.datetime(1970, 1, 1)
_fd_by_pid = {}


def _fd() -> int:
    pid = os.getpid()
    fd = _fd_by_pid.get(pid)
    if fd is None:
        path = os.path.join(os.environ["NQF_OUT"], f"{pid}.log")
        fd = _fd_by_pid[pid] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    return fd


def _token(job) -> int:
    """The claim token: the job's Completion (its run state's, notifyq.jobs.run_of) carries it.
    The checker's past-lease excuses need it: every job a worker hands its handler has one, and
    a job without it raises here rather than write 0 (those excuses then fail silently)."""
    return int(run_of(job).completion.token)


_rate_conn: list = []  # the process's connection for _spent_us (none yet: [])
_rate_lock = threading.Lock()  # a consumer's workers share it


def _spent_us(token: int) -> int | None:
    """When the claim `token` spent its rate starts (epoch microseconds, the server's clock), or
    None: no NQF_RATE_DSN, the read failed (its connection killed: the next call opens another),
    or the slots were spent again since (a period later: the start line stands in)."""
    url = os.environ.get("NQF_RATE_DSN")
    if not url:
        return None
    import MySQLdb

    from notifyq.config.dsn import DSN

    with _rate_lock:
        try:
            if not _rate_conn:
                args = {**DSN.parse(url).connect_args(), "database": os.environ["NQF_RATE_DB"]}
                _rate_conn.append(MySQLdb.connect(**args, autocommit=True))
            cur = _rate_conn[0].cursor()
            cur.execute("SELECT UNIX_TIMESTAMP(MAX(started_at)) FROM nq_rate WHERE claim_token = %s", (token,))
            row = cur.fetchone()
        except MySQLdb.Error:
            _rate_conn.clear()
            return None
    return None if row is None or row[0] is None else round(row[0] * 1_000_000)


def _run_at_us(job) -> int:
    run_at = job.run_at
    if run_at.tzinfo is not None:  # the server's session time zone is UTC in the harness
        run_at = run_at.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return (run_at - _EPOCH) // dt.timedelta(microseconds=1)


FORK_WAIT_S = 3.0  # a child that has not exited by then runs on as a stray: it is killed
KANJI_ERROR = "\u6f22" * 30000


def _spent(token: int) -> str:
    spent = _spent_us(token)
    return "" if spent is None else f" m={spent}"


def _extras(payload: dict) -> str:
    flags = {"long": "L", "fork": "F"}.get(payload.get("k", ""), "")
    out = f" f={flags}" if flags else ""
    return out + (f" u={payload['u']}" if payload.get("u") else "")


def handle(job) -> None:
    deploy = os.environ.get("NQF_DEPLOY", "main")
    pid = os.getpid()
    token = _token(job)
    payload = job.payload if isinstance(job.payload, dict) else {}
    os.write(_fd(), (f"S {deploy} {job.id} {job.attempts} {pid} {token} {time.monotonic_ns()} "
                     f"{time.time_ns()} {job.priority} {_run_at_us(job)}{_extras(payload)}"
                     f"{f' k={job.key}' if getattr(job, 'key', None) else ''}{_spent(token)}\n").encode())
    kind = payload.get("k", "")
    if kind == "poison":
        os._exit(70)  # a crash the job itself causes (segfault, OOM kill): no cleanup, no ack
    if kind == "unwind":
        os.write(_fd(), f"E {deploy} {job.id} {job.attempts} {pid} {token} {time.monotonic_ns()} fail\n".encode())
        raise Unwound("a handler's own BaseException")
    if kind == "long":
        _run_long(job, float(payload.get("s", 0)), float(payload.get("x", 1.0)))
    elif kind == "fork":
        _fork_and_wait()
    else:
        time.sleep(float(payload.get("s", 0)))
    if kind == "fx":
        _effect(job, deploy, pid, token, payload.get("c"), _unencodable(job.id) if payload.get("r") else None)
    failed = kind in ("fail1", "kanji") and job.attempts == 1
    # Made before the end is written: the end is the handler's return (the checker's
    # past_lease reads it). Made after, 100,000 lists (and the collections they set off) took
    # seconds on a starved host after an end that said 16 ms.
    result = _unencodable(job.id) if kind == "unenc" else None
    os.write(_fd(), f"E {deploy} {job.id} {job.attempts} {pid} {token} {time.monotonic_ns()} "
                    f"{'fail' if failed else 'ok'}\n".encode())
    if failed:
        raise RuntimeError(KANJI_ERROR if kind == "kanji" else "planned failure of the first attempt")
    return result


class Unwound(BaseException):
    """A handler's own BaseException subclass (no Exception)."""


def _unencodable(job_id: int):
    """A result that is no JSON, by job id: nested deeper than the JSON encoder's recursion goes
    (RecursionError), NaN (no JSON number), or a lone surrogate (no UTF-8)."""
    if job_id % 3 == 1:
        return {"x": float("nan")}
    if job_id % 3 == 2:
        return "\ud800abc"
    value: list = []
    for _ in range(100_000):
        value = [value]
    return value


EFFECTS_TABLE = "nqf_effect"


def _effect(job, deploy: str, pid: int, token: int, calls_s: float | None, result=None) -> None:
    try:
        with job.transaction(result=result) as cur:
            cur.execute(f"INSERT INTO {EFFECTS_TABLE} (job_id, attempt, pid, token) VALUES (%s, %s, %s, %s)",
                        (job.id, job.attempts, pid, token))
            if calls_s is not None:
                import notifyq

                job.extend_lease()
                job.cancel_requested(max_age_s=0)
                notifyq.cancelled([job])
                time.sleep(calls_s)
            # The block's COMMIT, which completes the job (and frees its key's slot), comes
            # next: before the end line, which the checker's key_limit would otherwise take for
            # the slot's end
            os.write(_fd(), f"C {deploy} {job.id} {job.attempts} {pid} {token} {time.monotonic_ns()}\n".encode())
    except BaseException:
        os.write(_fd(), f"E {deploy} {job.id} {job.attempts} {pid} {token} {time.monotonic_ns()} fail\n".encode())
        raise


async def handle_async(job):
    return handle(job)


def _run_long(job, seconds: float, every_s: float) -> None:
    """Sleep `seconds`, extending the lease every `every_s` as a well-behaved long handler does.
    A refused extension (the claim is gone) does not stop it: what follows is the checker's."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(every_s, left))
        try:
            job.extend_lease()
        except Exception:  # noqa: BLE001 - the claim was taken back: keep running, as a user's handler would
            pass


def _fork_and_wait() -> None:
    child = os.fork()
    if child == 0:
        sys.exit(0)  # a user's child process ending the usual way (item 11)
    deadline = time.monotonic() + FORK_WAIT_S
    while time.monotonic() < deadline:
        done, _ = os.waitpid(child, os.WNOHANG)
        if done:
            return
        time.sleep(0.02)  # poll interval inside a deadline
    os.kill(child, signal.SIGKILL)  # it ran consumer code: its starts are already on record
    os.waitpid(child, 0)
