"""A payload's stored text (notifyq/jobs/envelope.py): a payload put without a trace context is
stored as its JSON, byte for byte; with one, in an envelope; and every stored text opens to the
payload as put, whatever the payload looks like."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from notifyq.jobs import envelope

CONTEXT = envelope.context_text({"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "tracestate": "k=v"})
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=10)
# Payloads that look like an envelope: a dict whose first key is the envelope's own
LOOKALIKE = st.builds(lambda ctx, rest: {"notifyq:trace": ctx, **rest},
                      st.dictionaries(st.text(), st.text()) | st.none(), st.dictionaries(st.text(), JSON))


def _text(payload) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


@given(JSON | LOOKALIKE)
def test_an_untraced_payload_opens_as_put_and_is_stored_as_its_json_unless_it_looks_like_an_envelope(payload):
    text = _text(payload)
    stored = envelope.escaped(text)
    assert envelope.opened(stored) == (payload, None)
    assert (stored == text) == (not text.startswith(envelope.MARKER))


@given(JSON | LOOKALIKE)
def test_a_traced_payload_opens_as_put_with_its_context(payload):
    stored = envelope.stamped(envelope.escaped(_text(payload)), CONTEXT)
    assert stored.startswith(envelope.MARKER)
    assert envelope.opened(stored) == (payload, json.loads(CONTEXT))


def test_a_text_that_is_not_json_raises_value_error():
    for text in ("{", envelope.MARKER + "{}", "NaN-ish"):
        try:
            envelope.opened(text)
        except ValueError:
            continue
        raise AssertionError(f"{text!r} opened")
