"""`notifyq jobs ...`: look at and act on single jobs, or on many (a thin layer over admin.py).

Errors are raised as errors.InputError and friends; cli.main turns them into one line on
stderr and the exit code. Value checks happen here, not in argparse types, so that a bad
--status or --older-than is an input error (exit 4) naming what is wrong with it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from notifyq import errors
from notifyq.config import values
from notifyq.jobs import Status
from notifyq.run import args, echo

MAX_JOB_ID = 2**63 - 1  # ids are BIGINT: a larger number is no job, not a database error

# admin (with the store, the driver and tenacity, ~55 ms) is imported inside each command:
# `notifyq --help` and the commands that do not touch jobs never need it.


def _on_every(obj: Any, work: Callable[[Any], Any], shard: str | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """`work(session)` on every server, or on `--shard NAME`: (answers, down) by shard name."""
    from notifyq.sharding import servers

    with servers.Servers.oneshot(obj.oneshot_config(), "admin") as every:
        return every.each(work, every.pick(shard))


def _one_job(obj: Any, job_id: int, shard: str | None, work: Callable[[Any], Any]) -> Any:
    """`work(session)` on the server that holds job `job_id` (ids are per shard: --shard picks one)."""
    from notifyq.sharding import servers

    with servers.Servers.oneshot(obj.oneshot_config(), "admin") as every:
        return servers.holding(every, job_id, work, shard)


def _age(text: str | None) -> float:
    """An age given is parsed in full: an empty or invalid one is refused, never read as 0
    (for a purge, 0 would mean every finished job). None means: no age filter."""
    from notifyq.ops import admin

    if text is None:
        return 0.0
    if not text.strip():
        raise errors.InputError("--older-than: an age is required, like 30m or 7d (a purge never defaults to all)")
    return values.seconds("--older-than age", admin.parse_age(text), positive=False)


def list_(obj: Any, a: argparse.Namespace) -> None:
    from notifyq.ops import admin
    from notifyq.sharding import servers

    queue, limit = a.queue, a.limit
    status = admin.parse_status(a.status_name) if a.status_name else None
    age = _age(a.older_than)
    key = None if a.key is None else values.job_key("--key", a.key)  # before any server is asked
    answers, down = _on_every(obj, lambda session: admin.list_jobs(
        session, queue=queue, status=status, older_than_s=age, limit=limit, key=key))
    rows, column = servers.jobs_in_one(obj.oneshot_config(), answers, limit)
    echo(json.dumps(rows, indent=2) if a.as_json else _table(rows, column))
    servers.fail_if_down(down)


def show(obj: Any, a: argparse.Namespace) -> None:
    from notifyq.ops import admin

    job_id = a.job_id
    job = _one_job(obj, job_id, a.shard, lambda session: admin.show_job(session, job_id))
    if a.as_json:
        echo(json.dumps(job, indent=2))
        return
    width = max(len(k) for k in job)
    for key, value in job.items():
        if key not in ("payload", "history"):
            if isinstance(value, dict):  # a traced job's context (trace): as JSON, not a repr
                value = json.dumps(value, ensure_ascii=False)
            text = "-" if value is None else str(value).replace("\n", "\n" + " " * (width + 2))
            echo(f"{key.ljust(width)}  {text}")
    if "payload" in job:  # gone with its row: the records keep no payload
        echo("payload:\n" + json.dumps(job["payload"], indent=2, ensure_ascii=False))
    _show_history(job["history"])


def _show_history(history: list[dict[str, Any]]) -> None:
    """One line per attempt (its error under it, its traceback indented below that)."""
    if not history:
        return
    echo("history:")
    for h in history:
        line = (f"  attempt {h['attempt']}  {h['outcome']:<9} {h['started_at'] or '-'} .. {h['ended_at']}"
                f"  on {h['host'] or '-'} consumer {h['consumer'] or '-'}")
        echo(line)
        if h["error"]:
            echo(f"    error: {h['error']}")
        if h["traceback"]:
            echo("    " + h["traceback"].rstrip("\n").replace("\n", "\n    "))
        if h["result"] is not None:
            echo(f"    result: {json.dumps(h['result'], ensure_ascii=False)}")


def retry(obj: Any, a: argparse.Namespace) -> None:
    from notifyq.ops import admin
    from notifyq.sharding import servers

    job_id, queue = a.job_id, a.queue
    if (job_id is None) == (not a.all_dead) or (queue and not a.all_dead):
        raise args.UsageError("give a JOB_ID, or --dead [-q QUEUE]", "notifyq jobs retry")
    if not a.all_dead:
        echo(f"job {job_id}: {_one_job(obj, job_id, a.shard, lambda session: admin.retry(session, job_id))}")
        return
    answers, down = _on_every(obj, lambda session: admin.retry_dead(session, queue), a.shard)
    retried, skipped = (sum(answer[i] for answer in answers.values()) for i in (0, 1))
    echo(f"retried {retried}" + (f", skipped {skipped} (their dedup key is taken by a pending job)"
                                 if skipped else ""))
    servers.fail_if_down(down)


CANCEL_OUTCOMES = {
    "deleted": "deleted",
    "cancelled": "cancelled (a workflow's job: kept, with what it cancelled; `jobs retry` brings them back)",
    "requested": "cancel requested (a command is stopped at once, a Python handler when it checks; "
                 "the job ends cancelled)"}


def cancel(obj: Any, a: argparse.Namespace) -> None:
    from notifyq.ops import admin

    job_id = a.job_id
    outcome = _one_job(obj, job_id, a.shard, lambda session: admin.cancel(session, job_id))
    echo(f"job {job_id}: " + CANCEL_OUTCOMES.get(outcome, outcome))


def purge(obj: Any, a: argparse.Namespace) -> None:
    from notifyq.ops import admin
    from notifyq.sharding import servers

    if not (a.dead or a.done or a.cancelled):
        raise args.UsageError("say what to purge: --dead, --done, --cancelled or several", "notifyq jobs purge")
    statuses = [s for s, wanted in ((Status.DEAD, a.dead), (Status.DONE, a.done), (Status.CANCELLED, a.cancelled))
                if wanted]
    age, queue = _age(a.older_than), a.queue
    answers, down = _on_every(obj, lambda session: admin.purge(session, statuses, age, queue=queue))
    echo(f"purged {sum(deleted for deleted, _ in answers.values())}")
    servers.fail_if_down(down)


def _list_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--queue", help="Only this queue.")
    p.add_argument("--status", dest="status_name", metavar="STATUS", help="ready, scheduled, claimed, done, dead or cancelled.")
    p.add_argument("--older-than", metavar="AGE", help="Created more than AGE ago: 90s, 30m, 12h, 7d, 2w.")
    p.add_argument("--key", metavar="KEY", help="Only jobs of this flow-control key (put(..., key=)).")
    p.add_argument("--limit", metavar="N", type=args.int_range(1, 1_000_000), default=100,
                   help="At most this many jobs, oldest first (default 100).")
    p.add_argument("--json", dest="as_json", action="store_true", help="A JSON array instead of a table.")


def _job_id(p: argparse.ArgumentParser, optional: bool = False) -> None:
    p.add_argument("job_id", type=args.int_range(1, MAX_JOB_ID), metavar="JOB_ID", **({"nargs": "?"} if optional else {}))
    p.add_argument("--shard", metavar="NAME", help="With [shards]: the shard of the job (ids are per shard).")


def _show_options(p: argparse.ArgumentParser) -> None:
    _job_id(p)
    p.add_argument("--json", dest="as_json", action="store_true", help="JSON instead of text.")


def _retry_options(p: argparse.ArgumentParser) -> None:
    _job_id(p, optional=True)
    p.add_argument("--dead", dest="all_dead", action="store_true", help="Every dead job (of -q QUEUE).")
    p.add_argument("-q", "--queue", help="With --dead: only this queue.")


def _purge_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dead", action="store_true", help="Purge dead jobs.")
    p.add_argument("--done", action="store_true", help="Purge done jobs (kept with keep_done).")
    p.add_argument("--cancelled", action="store_true", help="Purge jobs cancelled while they ran.")
    p.add_argument("--older-than", metavar="AGE", required=True, help="Finished more than AGE ago: 7d, 12h ...")
    p.add_argument("-q", "--queue", help="Only this queue.")


# `notifyq jobs NAME`: (what runs it, its help, what adds its options), as cli.COMMANDS
COMMANDS: dict[str, tuple[Callable[[Any, argparse.Namespace], None], str, Callable[[argparse.ArgumentParser], None]]] = {
    "list": (list_, "List jobs, oldest first.", _list_options),
    "show": (show, "Every field of one job, the payload pretty-printed.", _show_options),
    "retry": (retry, "Put a dead, done, cancelled or scheduled job back to ready now, attempts reset "
                     "(a workflow's job waits for its parents still pending).", _retry_options),
    "cancel": (cancel, "Delete a pending job (a workflow's ends cancelled, kept for a retry), or ask a "
                       "running one to stop (Job.cancel_requested()).", _job_id),
    "purge": (purge, "Delete finished jobs, 1000 rows per transaction.", _purge_options),
}


def _table(rows: list[dict[str, Any]], column: str | None = None) -> str:
    """`column`: one more after the id (with [shards], the shard), each row's value under that key.
    A `key` column (the jobs' flow-control keys, cut at 40) only when one of them has a key."""
    keys = any(r.get("key") is not None for r in rows)
    head = ("id", *((column,) if column else ()), "queue", *(("key",) if keys else ()), "status", "prio",
            "attempts", "run_at", "created_at", "last_error")
    lines = [head]
    for r in rows:
        status = r["status"] + (" (cancel)" if r["cancel_requested"] else "")
        error = (r["last_error"] or "").replace("\n", " ")
        key = (("-" if r["key"] is None else r["key"].replace("\n", " ")[:40]),) if keys else ()
        lines.append((str(r["id"]), *((r[column],) if column else ()), r["queue"], *key, status,
                      str(r["priority"]), f"{r['attempts']}/{r['max_attempts']}", _short(r["run_at"]),
                      _short(r["created_at"]), error[:60]))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def _short(iso: str | None) -> str:
    return "-" if iso is None else iso[:19].replace("T", " ")
