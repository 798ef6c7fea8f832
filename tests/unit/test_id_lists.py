"""Ids and IntList render as the driver's bound values did: integers only, whatever comes in."""

import pytest

from notifyq.store.driver import CONVERSIONS, Ids, IntList


def render(values):
    return CONVERSIONS[type(values)](values, CONVERSIONS)


def test_ids_and_int_lists_render_as_int_then_str_did():
    values = [3, 10_000_000_001, 0, True, 2.9, "7"]
    assert render(Ids(values)) == "(" + ",".join(str(int(v)) for v in values) + ")"
    assert render(IntList(values)) == ",".join(str(int(v)) for v in values)
    assert render(IntList([])) == ""
    assert render(Ids([5])) == "(5)"


@pytest.mark.parametrize("bad", ["1) OR (1", None, "0x10", float("nan")])
def test_anything_but_an_integer_is_refused(bad):
    with pytest.raises((TypeError, ValueError)):
        render(Ids([1, bad]))
    with pytest.raises((TypeError, ValueError)):
        render(IntList([bad]))


def test_an_ids_text_is_made_once_and_kept():
    ids = Ids([1, 2])
    assert render(ids) == "(1,2)" and ids.__dict__["sql"] == "(1,2)"
    ids.__dict__["sql"] = "(9)"  # (the kept text is what a second statement gets)
    assert render(ids) == "(9)"
