"""`notifyq jobs ...`: look at and act on single jobs, or on many (a thin layer over admin.py).

Errors are raised as errors.InputError and friends; cli.main turns them into one line on
stderr and the exit code. Value checks happen here, not in click types, so that a bad
--status or --older-than is one line too, not a usage screen.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from notifyq import errors, values
from notifyq.jobs import Status

JOB_ID = click.IntRange(1, 2**63 - 1)  # ids are BIGINT: a larger number is no job, not a database error

# admin (with the store, the driver and tenacity, ~55 ms) is imported inside each command:
# `notifyq --help` and the commands that do not touch jobs never need it.


def _each_shard(obj: Any, work: Callable[[Any], Any], shard: str | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """`work(session)` on every shard, or on `--shard NAME` (one server: the one)."""
    from notifyq.run import fanout

    cfg = obj.oneshot_config()
    if shard is not None and shard not in cfg.shards:
        raise errors.InputError(f"--shard {values.shown(shard)}: " + (f"[shards] names {', '.join(sorted(cfg.shards))}"
                                                                   if cfg.shards else "no [shards] configured"))
    return fanout.on_shards(cfg, "admin", work, None if shard is None else [shard])


def _one_job(obj: Any, job_id: int, shard: str | None, work: Callable[[Any], Any]) -> Any:
    """`work(session)` on the shard that holds job `job_id` (ids are per shard: --shard picks one)."""
    from notifyq.ops import admin
    from notifyq.run import fanout

    if not obj.oneshot_config().shards:
        return _each_shard(obj, work)[0][""]

    def find(session: Any) -> Any:
        try:
            admin.get_job(session, job_id)
        except errors.InputError:
            return None  # not on this shard
        return work(session)

    answers, down = _each_shard(obj, find, shard)
    return fanout.only(answers, f"job {job_id}", down)[1]


SHARD_OPTION = click.option("--shard", help="With [shards]: the shard of the job (ids are per shard).")


def _age(text: str | None) -> float:
    """An age given is parsed in full: an empty or invalid one is refused, never read as 0
    (for a purge, 0 would mean every finished job). None means: no age filter."""
    from notifyq.ops import admin

    if text is None:
        return 0.0
    if not text.strip():
        raise errors.InputError("--older-than: an age is required, like 30m or 7d (a purge never defaults to all)")
    return values.seconds("--older-than age", admin.parse_age(text), positive=False)


@click.group()
def jobs() -> None:
    """Inspect, retry, cancel and purge jobs."""


@jobs.command("list")
@click.option("-q", "--queue", help="Only this queue.")
@click.option("--status", "status_name", metavar="STATUS", help="ready, scheduled, claimed, done or dead.")
@click.option("--older-than", metavar="AGE", help="Created more than AGE ago: 90s, 30m, 12h, 7d, 2w.")
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=100, help="At most this many jobs (oldest first).")
@click.option("--json", "as_json", is_flag=True, help="A JSON array instead of a table.")
@click.pass_obj
def list_(obj: Any, queue: str | None, status_name: str | None, older_than: str | None, limit: int,
          as_json: bool) -> None:
    """List jobs, oldest first."""
    from notifyq.ops import admin

    from notifyq.run import fanout

    status = admin.parse_status(status_name) if status_name else None
    age = _age(older_than)
    answers, down = _each_shard(obj, lambda session: admin.list_jobs(
        session, queue=queue, status=status, older_than_s=age, limit=limit))
    sharded = bool(obj.oneshot_config().shards)
    rows = [{**r, "shard": shard} if sharded else r for shard, found in answers.items() for r in found]
    if sharded:  # oldest first over every shard
        rows = sorted(rows, key=lambda r: (r["created_at"], r["shard"], r["id"]))[:limit]
    click.echo(json.dumps(rows, indent=2) if as_json else _table(rows, sharded))
    fanout.fail_if_down(down)


@jobs.command()
@click.argument("job_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True, help="JSON instead of text.")
@SHARD_OPTION
@click.pass_obj
def show(obj: Any, job_id: int, as_json: bool, shard: str | None) -> None:
    """Every field of one job, the payload pretty-printed."""
    from notifyq.ops import admin

    job = _one_job(obj, job_id, shard, lambda session: admin.get_job(session, job_id))
    if as_json:
        click.echo(json.dumps(job, indent=2))
        return
    width = max(len(k) for k in job)
    for key, value in job.items():
        if key != "payload":
            text = "-" if value is None else str(value).replace("\n", "\n" + " " * (width + 2))
            click.echo(f"{key.ljust(width)}  {text}")
    click.echo("payload:\n" + json.dumps(job["payload"], indent=2, ensure_ascii=False))


@jobs.command()
@click.argument("job_id", type=JOB_ID, required=False)
@click.option("--dead", "all_dead", is_flag=True, help="Every dead job (of -q QUEUE).")
@click.option("-q", "--queue", help="With --dead: only this queue.")
@SHARD_OPTION
@click.pass_obj
def retry(obj: Any, job_id: int | None, all_dead: bool, queue: str | None, shard: str | None) -> None:
    """Put a dead, done or scheduled job back to ready now, attempts reset."""
    from notifyq.ops import admin
    from notifyq.run import fanout

    if (job_id is None) == (not all_dead) or (queue and not all_dead):
        raise click.UsageError("give a JOB_ID, or --dead [-q QUEUE]")
    if not all_dead:
        click.echo(f"job {job_id}: {_one_job(obj, job_id, shard, lambda session: admin.retry(session, job_id))}")
        return
    answers, down = _each_shard(obj, lambda session: admin.retry_dead(session, queue), shard)
    retried, skipped = (sum(a[i] for a in answers.values()) for i in (0, 1))
    click.echo(f"retried {retried}" + (f", skipped {skipped} (their dedup key is taken by a pending job)"
                                       if skipped else ""))
    fanout.fail_if_down(down)


@jobs.command()
@click.argument("job_id", type=JOB_ID)
@SHARD_OPTION
@click.pass_obj
def cancel(obj: Any, job_id: int, shard: str | None) -> None:
    """Delete a pending job, or ask a running one to stop (Job.cancel_requested())."""
    from notifyq.ops import admin

    outcome = _one_job(obj, job_id, shard, lambda session: admin.cancel(session, job_id))
    click.echo(f"job {job_id}: " + ("deleted" if outcome == "deleted" else
                                    "cancel requested (its handler stops when it checks)"))


@jobs.command()
@click.option("--dead", is_flag=True, help="Purge dead jobs.")
@click.option("--done", is_flag=True, help="Purge done jobs (kept with keep_done).")
@click.option("--older-than", metavar="AGE", required=True, help="Finished more than AGE ago: 7d, 12h ...")
@click.option("-q", "--queue", help="Only this queue.")
@click.pass_obj
def purge(obj: Any, dead: bool, done: bool, older_than: str, queue: str | None) -> None:
    """Delete finished jobs, 1000 rows per transaction."""
    from notifyq.ops import admin

    if not (dead or done):
        raise click.UsageError("say what to purge: --dead, --done or both")
    from notifyq.run import fanout

    statuses = [s for s, wanted in ((Status.DEAD, dead), (Status.DONE, done)) if wanted]
    age = _age(older_than)
    answers, down = _each_shard(obj, lambda session: admin.purge(session, statuses, age, queue=queue))
    click.echo(f"purged {sum(deleted for deleted, _ in answers.values())}")
    fanout.fail_if_down(down)


def _table(rows: list[dict[str, Any]], sharded: bool = False) -> str:
    head = ("id", *(("shard",) if sharded else ()), "queue", "status", "prio", "attempts", "run_at",
            "created_at", "last_error")
    lines = [head]
    for r in rows:
        status = r["status"] + (" (cancel)" if r["cancel_requested"] else "")
        error = (r["last_error"] or "").replace("\n", " ")
        lines.append((str(r["id"]), *((r["shard"],) if sharded else ()), r["queue"], status, str(r["priority"]),
                      f"{r['attempts']}/{r['max_attempts']}", _short(r["run_at"]),
                      _short(r["created_at"]), error[:60]))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def _short(iso: str | None) -> str:
    return "-" if iso is None else iso[:19].replace("T", " ")
