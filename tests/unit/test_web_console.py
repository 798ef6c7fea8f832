"""The console's pure parts: percentiles, the bulk ids' bound, the history and search filters,
the history chart (no database)."""

import pytest

from notifyq import errors
from notifyq.web import console, views


def test_percentiles_are_nearest_rank():
    assert console.percentiles([]) == {"p50": None, "p90": None, "p99": None, "max": None}
    assert console.percentiles([3.0]) == {"p50": 3.0, "p90": 3.0, "p99": 3.0, "max": 3.0}
    values = [float(v) for v in range(1, 101)]  # 1..100, shuffled order does not matter
    assert console.percentiles(list(reversed(values))) == {"p50": 50.0, "p90": 90.0, "p99": 99.0, "max": 100.0}


def test_bulk_ids_are_bounded_checked_and_deduplicated():
    assert console.parse_ids(["3", "1", "3"]) == [1, 3]
    assert console.parse_ids([str(i) for i in range(1, console.MAX_BULK + 1)])[-1] == console.MAX_BULK
    with pytest.raises(errors.InputError, match=f"{console.MAX_BULK + 1} jobs selected: a bulk action takes at most"):
        console.parse_ids(["1"] * (console.MAX_BULK + 1))
    for bad in ([], ["x"], ["0"], ["-1"], [str(2**63)], ["\u0663"], ["1\u0663"]):  # Arabic-Indic 3: not ASCII
        with pytest.raises(errors.InputError):
            console.parse_ids(bad)


def test_history_and_search_filters_refuse_what_is_out_of_bounds():
    assert console.parse_history({}) == {"queue": None, "hours": 1, "task": None}
    assert console.parse_history({"queue": "mail", "hours": "6", "task": "a.b"})["hours"] == 6
    for bad in ({"hours": "0"}, {"hours": "7"}, {"hours": "x"}, {"queue": "bad name!"}, {"task": "t" * 192}):
        with pytest.raises(errors.InputError):
            console.parse_history(bad)
    assert console.parse_search({})["since_hours"] == console.SEARCH_SINCE_HOURS
    for bad in ({"q": "x" * 201}, {"since_hours": "0"}, {"since_hours": "99999"}):
        with pytest.raises(errors.InputError):
            console.parse_search(bad)


def test_the_history_chart_stacks_each_minutes_outcomes_within_its_height():
    per_minute = {"done": [4, 0, 2], "failed": [1, 0, 0], "dead": [0, 0, 2], "cancelled": [0, 0, 0]}
    c = views.history_chart(per_minute)
    assert c["label"] == "last 3 minutes: 6 done, 1 failed, 2 dead, 0 cancelled"
    now = [b for b in c["bars"] if b["ago"] == 0]
    assert [b["outcome"] for b in now] == ["done", "failed"]
    assert all(0 <= b["y"] and b["y"] + b["h"] <= c["h"] + 0.1 for b in c["bars"])
    assert not [b for b in c["bars"] if b["ago"] == 1]  # an empty minute draws nothing
