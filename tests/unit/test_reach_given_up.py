"""Reach.given_up: what ends a consumer even while a Python handler runs on (consume/service.py,
ConsumerService.gone): a give-up on its own budget, in an outage that lasted as long."""

from __future__ import annotations

from notifyq.store.reach import Reach


def test_a_give_up_counts_for_a_budget_no_longer_than_the_session_s_and_the_outage_s():
    reach = Reach()
    reach.failed(100.0)
    # A library producer's 5 s budget says nothing of a daemon's 30 s
    reach.gave_up(5.0, now=105.0)
    assert reach.given_up(5.0) and not reach.given_up(30.0)
    # A call whose budget counted from its own start, before the outage's first failure, gave up
    # with the outage younger than its budget: not given up on yet
    reach.gave_up(30.0, now=120.0)
    assert not reach.given_up(30.0)
    reach.gave_up(30.0, now=130.0)
    assert reach.given_up(30.0)


def test_an_answer_ends_the_give_up_with_the_outage():
    reach = Reach()
    reach.failed(100.0)
    reach.gave_up(30.0, now=140.0)
    reach.answered()
    assert not reach.given_up(0.0)
    reach.gave_up(30.0, now=200.0)  # (a give-up reported after the answer: no outage now)
    assert not reach.given_up(0.0)
