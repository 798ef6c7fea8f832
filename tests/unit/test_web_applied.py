"""What the live consumers apply (notifyq/web/applied.py), alone: the settings a consumer records
read back, grouped, set against the page's config; anything unreadable is unknown, never guessed."""

from __future__ import annotations

import json

from notifyq.config import QueueConfig
from notifyq.config.settings import flow_settings_value
from notifyq.web import applied

OURS = QueueConfig(limit=10, limit_per_key=2, key_limits=(("vip*", 5), ("vip-1", 1)), rate_per_key="60/1m", fair=True)


def _row(name: str, flow: object, queues: str = "api") -> tuple:
    return (name.ljust(32, "0"), name, 1, queues, flow if flow is None or isinstance(flow, str) else json.dumps(flow))


def test_recorded_settings_read_back_as_the_config_that_wrote_them():
    recorded = json.loads(json.dumps(OURS.flow_settings))
    assert flow_settings_value(recorded) == OURS.flow_settings
    assert QueueConfig().with_flow(flow_settings_value(recorded)).flow_compared() == OURS.flow_compared()


def test_damaged_or_foreign_settings_are_not_read():
    for damaged in ("x", [], {**OURS.flow_settings, "limit": -1}, {**OURS.flow_settings, "rate": "fast"},
                    {**OURS.flow_settings, "key_limits": {"vip": 5}}, {**OURS.flow_settings, "fair": "yes"},
                    {**OURS.flow_settings, "key_limits": [["a", 1], ["a", 2]]}):
        assert flow_settings_value(damaged) is None, damaged


def test_consumers_are_grouped_by_what_they_apply_rates_compared_as_parsed():
    # Given consumers of api: two as this config (one writing its rate "60/60s"), one with another
    # limit, one of an older version (NULL), one whose record is damaged; and one of another queue
    rows = [_row("a", {"api": OURS.flow_settings}),
            _row("b", {"api": {**OURS.flow_settings, "rate_per_key": "60/60s"}}), _row("c", {"api": {**OURS.flow_settings, "limit": 20}}), _row("d", None), _row("e", "{not json"),
            _row("f", {"other": OURS.flow_settings}, queues="other")]
    consumers = [applied._consumer(r) for r in rows]
    # When they are set against this config
    found = applied.of_queue(consumers, "api", OURS)
    # Then this config's group comes first, the other is marked where it differs, two are unknown
    assert found["live"] == 5 and found["unknown"] == 2 and found["unknown_names"] == ["d:1", "e:1"]
    assert [(g["names"], g["as_config"], g["differs_in"]) for g in found["groups"]] == [
        (["a:1", "b:1"], True, []), (["c:1"], False, ["limit"])]
    assert found["disagree"] and found["differs"]
    assert applied.controlled(consumers) == {"api", "other"}
    # And with only the consumer of the other limit, they agree with each other, not with this config
    alone = applied.of_queue(consumers[2:3], "api", OURS)
    assert not alone["disagree"] and alone["differs"]


def test_a_recorded_queue_name_that_is_not_a_valid_one_is_not_read():
    consumer = applied._consumer(_row("a", {"<script>x</script>": OURS.flow_settings, "api": OURS.flow_settings},
                                      queues="api,<script>x</script>"))
    assert set(consumer.flow) == {"api"}
    assert applied.controlled([consumer]) == {"api"}


def test_many_groups_of_settings_are_grouped_in_one_pass_and_shown_to_a_bound():
    # Given 5,000 consumers of api with 2,500 distinct limits (two each), and one as this config
    consumers = [applied._consumer(_row(f"c{i}", {"api": {**OURS.flow_settings, "limit": 11 + i // 2}}))
                 for i in range(5_000)] + [applied._consumer(_row("ours", {"api": OURS.flow_settings}))]
    # When they are set against this config
    found = applied.of_queue(consumers, "api", OURS)
    # Then GROUPS_SHOWN groups are shown, this config's first, and the rest counted
    assert len(found["groups"]) == applied.GROUPS_SHOWN and found["groups"][0]["as_config"]
    assert found["more_groups"] == 2_501 - applied.GROUPS_SHOWN
    assert found["more_consumers"] == 5_001 - sum(g["count"] for g in found["groups"])
    assert found["live"] == 5_001 and found["disagree"] and found["differs"]
