"""A handler's return value, kept on its job's attempt record when the queue keeps results
(keep_done or result_ttl_s): how it is rendered and bounded, and how it is written when the
job's completion committed already (job.transaction())."""

from __future__ import annotations

import logging
from typing import Any

from notifyq.store.db import Session
from notifyq.store.driver import Ids, cut_short
from notifyq.store.pipeline import PACKET_MARGIN_BYTES
from notifyq.store.queries import error_text
from notifyq.store.sql import QUERIES as Q

log = logging.getLogger("notifyq.consumer")

RESULT_MAX_BYTES = 65536  # a handler's return value kept (JSON, UTF-8); a larger one is not kept
# What encoding a handler's value may raise: anything its own code raises (a __iter__, items()
# or __float__ of its own), RecursionError, ValueError (NaN, Infinity), UnicodeEncodeError (a lone
# surrogate), and any BaseException its own code may raise, which on a worker thread could only
# end the thread (as handlers.HANDLER_FAILURES).
UNENCODABLE = (BaseException,)


def keep_results(session: Session, token: int, results: list[tuple[int, str]]) -> None:
    """Results of jobs whose completion committed already (job.transaction() in the handler,
    which then returned its value): onto their records, in one round trip."""
    if not results:
        return

    def body(cur) -> None:
        counts = session.pipeline.run_all(cur, [(Q["attempt_result"], {"id": job_id, "token": token, "result": text})
                                                for job_id, text in results])
        if any(n != 1 for n in counts):  # each record exists (its completion committed)
            cur.execute(Q["results_missing"], {"ids": Ids([job_id for job_id, _ in results]), "token": token})
            if cur.fetchall():  # a KILL QUERY's OK reply to an UPDATE it cut short
                raise cut_short(f"results of {len(results)} jobs: replies {counts}")

    session.run(body, what="keep results")


def result_text(value: Any, job_id: int, max_packet: int = 0) -> str | None:
    """A handler's return value as kept: JSON of at most RESULT_MAX_BYTES; None (and a warning)
    for one that is not JSON or too large: the job is done all the same. max_packet: the
    server's max_allowed_packet (0: unknown). A result whose statement could exceed it even
    alone is not kept either: it would fail its batch's ack however that is split
    (Pipeline.sized), and run the batch again."""
    if value is None:
        return None
    import json  # here: only a queue that keeps results pays for it

    try:
        # Strictly JSON: NaN and Infinity are no JSON (kept, they made JSON_VALID 0 and `jobs show
        # --json` print what no parser reads), nor is a lone surrogate UTF-8 (the server kept it
        # altered, as "?")
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        size = len(text.encode("utf-8"))
    except UNENCODABLE as e:
        # Whatever encoding the handler's value raises (not JSON, nested too deep for the
        # encoder's recursion, a dict subclass whose items() raises): the value's fault, never
        # the job's nor the worker's.
        log.warning("a handler's result cannot be encoded as JSON: not kept job=%d error=%s: %s",
                    job_id, type(e).__name__, e)
        return None
    if size > RESULT_MAX_BYTES:
        log.warning("a handler's result is over %d bytes: not kept job=%d", RESULT_MAX_BYTES, job_id)
        return None
    if max_packet > 0 and statement_bound(size) > max_packet - PACKET_MARGIN_BYTES:
        log.warning("a handler's result of %d bytes may not fit the server's max_allowed_packet of %d "
                    "bytes: not kept job=%d", size, max_packet, job_id)
        return None
    return error_text(text, RESULT_MAX_BYTES)


def statement_bound(size: int) -> int:
    """At least the bytes of the statement that keeps a result of `size` bytes (attempt_result,
    or a completion's record): escaping at most doubles it; the rest is the SQL and two
    integers, within 1 KB."""
    return 2 * size + len(Q["complete_record"]) + 1024
