"""The stored text of a job's payload: the payload's JSON as put, or, for a job that carries a
trace context (notifyq.contrib.otel), an envelope around it.

    {"notifyq:trace":{"traceparent":"00-...","tracestate":"..."},"payload":<the payload's JSON>}

Why in the payload's text and not a column of its own: no schema change, and every statement
that writes or reads a job stays as it is; only the consumer's decode (and the admin's and
testing's reads) open it, and Job.payload is always the payload as put. A job without a trace
context is stored as before, byte for byte: untraced enqueues pay one `startswith` per payload.

Unambiguous: a payload whose own JSON happens to begin as an envelope does (a dict whose first
key is "notifyq:trace") is stored in an envelope with an empty context, so that every stored
text that begins with MARKER is an envelope.
"""

from __future__ import annotations

import json
import operator
from typing import Any

MARKER = '{"notifyq:trace":'
_EMPTY = MARKER + '{},"payload":'  # a user payload that looks like an envelope, wrapped
_EMPTY_LEN = len(_EMPTY)
_BEGINS_AS_ENVELOPE = operator.methodcaller("startswith", MARKER)


def escaped(text: str) -> str:
    """A payload's JSON as stored when no trace context goes with it (Producer._payload_text):
    itself, unless it begins as an envelope does."""
    return _EMPTY + text + "}" if text.startswith(MARKER) else text


def escaped_all(texts: list[str]) -> list[str]:
    """escaped() of every text: the list itself when none begins as an envelope does (a bulk
    put's usual case, told by one pass of startswith in C)."""
    if any(map(_BEGINS_AS_ENVELOPE, texts)):
        return list(map(escaped, texts))
    return texts


def stamped(text: str, context: str) -> str:
    """escaped()'s text with `context` (a JSON object's text, from context_text) around it."""
    if text.startswith(_EMPTY):  # escaped already: the context takes the empty one's place
        text = text[_EMPTY_LEN:-1]
    return MARKER + context + ',"payload":' + text + "}"


def context_text(carrier: dict[str, str]) -> str:
    """A propagator's carrier (traceparent, tracestate) as the envelope's JSON."""
    return json.dumps({str(k): str(v) for k, v in carrier.items()}, separators=(",", ":"), ensure_ascii=True)


# json.loads' own scanner (its default decoder's): loads() calls it through decode() and
# raw_decode(), with a regex match for whitespace on either side, four calls more per job
_scan = json.decoder.JSONDecoder().scan_once


def _loads(text: str) -> Any:
    """json.loads(text): the scanner alone for a text that is one JSON value from end to end
    (what a producer stores), json.loads itself for the rest (whitespace around the value, and
    every error, raised as loads raises it)."""
    try:
        value, end = _scan(text, 0)
    except StopIteration:  # no value at 0 (whitespace first, or an empty text)
        return json.loads(text)
    if end != len(text):  # whitespace after the value, or more than one value
        return json.loads(text)
    return value


def opened(text: str) -> tuple[Any, dict[str, str] | None]:
    """(the payload, decoded; its trace context, or None) from a stored text; ValueError for a
    text that is not JSON."""
    if not text.startswith(MARKER):
        return _loads(text), None
    stored = json.loads(text)
    context = stored.get("notifyq:trace")
    return stored.get("payload"), (context or None) if isinstance(context, dict) else None
