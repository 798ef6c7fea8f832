"""put_many's rows without a server: its payloads checked all at once (Producer._payload_texts)
exactly as put() checks one, and which rows take the bulk insert's one-template way."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from notifyq import config, errors
from notifyq.produce.producer import Producer
from notifyq.store import inserts


def producer(tmp_path, max_payload_bytes: int = 100) -> Producer:
    path = tmp_path / "notifyq.toml"
    path.write_text(f"[producer]\nmax_payload_bytes = {max_payload_bytes}\n")
    return Producer("q", config.load(env={"NOTIFYQ_CONFIG": str(path)}))


def one_by_one(p: Producer, payloads: list) -> list[str] | str:
    """What put() makes of each payload in turn: its text, or the first error's message."""
    try:
        return [p._payload_text(payload) for payload in payloads]
    except errors.InputError as e:
        return str(e)


def all_at_once(p: Producer, payloads) -> list[str] | str:
    try:
        return [row[5] for row in p.rows(payloads)]
    except errors.InputError as e:
        return str(e)


LOOKALIKE = {"notifyq:trace": {"traceparent": "x"}, "payload": 1}  # stored in an envelope
BATCHES = {
    "plain": [{"n": 1}, [1, 2], "s", 3, None, True],
    "awkward text": ["it's", 'say "hi"', "back\\slash", "nul \0", "é 日本 🎉"],
    "an envelope lookalike": [{"n": 1}, LOOKALIKE, {"n": 2}],
    "not JSON": [{"n": 1}, {1, 2}, {"n": 3}],
    "NaN": [1, math.nan],
    "a datetime": [dt.datetime(2026, 1, 1)],
    "too big, ASCII": [{"n": 1}, "x" * 99, "y" * 200],
    "too big in bytes, not characters": ["é" * 49, "é" * 60],  # 60 characters, 122 bytes
    "fits in bytes": ["é" * 49],
    "a lone surrogate": ["ok", "\ud800"],
    "nested too deeply": [{"n": 1}, "NESTED"],
    "empty": [],
}


@pytest.mark.parametrize("name", list(BATCHES))
def test_put_many_checks_and_stores_each_payload_as_put_does_one(tmp_path, name):
    # Checked by the list's own loops first, and one by one only when one is refused: the texts
    # and the error (the first bad payload's) must be put()'s
    p = producer(tmp_path)
    payloads = [nested(5000) if payload == "NESTED" else payload for payload in BATCHES[name]]
    expected = one_by_one(p, payloads)
    assert all_at_once(p, payloads) == expected
    assert all_at_once(p, iter(payloads)) == expected  # any iterable, read once
    if name == "an envelope lookalike":
        assert expected[1].startswith('{"notifyq:trace":{},"payload":') and expected[0] == '{"n":1}'


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


ROW = ("q", 0, 0, 0, 5, '{"n":1}', None, None)


def test_rows_that_differ_only_in_their_payloads_take_the_one_template_way():
    rows = [(*ROW[:5], f'{{"n":{i}}}', None, None) for i in range(3)]
    assert inserts._uniform_payloads(rows) == ['{"n":0}', '{"n":1}', '{"n":2}']
    at = dt.datetime(2030, 1, 1)
    keyed_at = [("q", at, 0, at, 5, "1", "d", "k"), ("q", at, 0, at, 5, "2", "d", "k")]
    assert inserts._uniform_payloads(keyed_at) == ["1", "2"]
    # Any other value that differs, in any place, sends the rows the general way (_render)
    for place, other in ((0, "r"), (1, 1), (2, 7), (3, 10), (4, 2), (6, "d"), (7, "k")):
        changed = list(ROW)
        changed[place] = other
        assert inserts._uniform_payloads([ROW, tuple(changed)]) is None, place
    assert inserts._uniform_payloads([ROW, (*ROW[:5], b"bytes", None, None)]) is None
