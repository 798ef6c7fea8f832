"""One-shot commands over every shard: a session per shard in turn, a down one reported, not raised.

With one server (no [shards]) a command runs as it always did: its errors end it. With
[shards], each shard is asked in turn; one that cannot be reached (or has no schema) is
recorded with its error line, the others still answer, and the command says which were down.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from notifyq import errors
from notifyq.config import Config
from notifyq.store import schema
from notifyq.store.db import Session, oneshot_session

T = TypeVar("T")


def on_shards(cfg: Config, name: str, work: Callable[[Session], T],
              shards: Iterable[str] | None = None) -> tuple[dict[str, T], dict[str, str]]:
    """`work(session)` on each shard (all of them, or `shards`): (answers, errors) by shard name."""
    answers: dict[str, T] = {}
    down: dict[str, str] = {}
    for shard in (cfg.shard_names() if shards is None else shards):
        session = oneshot_session(cfg.on_shard(shard).dsn, cfg.connect_retry(oneshot=True), name)
        try:
            schema.require_current(session)
            answers[shard] = work(session)
        except (errors.DatabaseError, errors.SchemaError) as e:
            if not cfg.shards:
                raise  # one server: the error is the command's
            down[shard] = str(e)
        finally:
            session.close()
    return answers, down


def fail_if_down(down: dict[str, str]) -> None:
    """After the answers are printed: exit 5 naming the shards that did not answer."""
    if down:
        raise errors.DatabaseError("shard(s) down: " + "; ".join(f"{s}: {e}" for s, e in sorted(down.items())))


def only(answers: dict[str, Any], what: str, down: dict[str, str]) -> tuple[str, Any]:
    """The one shard that answered something (a job id is per shard), or one clear error."""
    found = {s: a for s, a in answers.items() if a is not None}
    if len(found) > 1:
        raise errors.InputError(f"{what} exists on shards {', '.join(sorted(found))}: "
                                "ids are per shard, give --shard NAME")
    if not found:
        fail_if_down(down)
        raise errors.InputError(f"no {what}")
    return next(iter(found.items()))
