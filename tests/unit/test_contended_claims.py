"""A limited claim left empty by peers' key locks (store/key_gate.py): its worker claims again at
once, CONTENDED_AGAIN times in a row at most, then waits for a wake as before."""

from __future__ import annotations

from types import SimpleNamespace

from notifyq.consume.worker import CONTENDED_AGAIN, Worker


def _worker(contended: bool) -> SimpleNamespace:
    return SimpleNamespace(flow=SimpleNamespace(last=SimpleNamespace(contended=contended)), _contended=0)


def test_an_empty_claim_that_peers_key_locks_left_empty_claims_again_a_bounded_number_of_times():
    # Given a worker whose empty claims each found their keys' rows held by peers' claims
    worker = _worker(contended=True)
    # When it asks after each of them whether to claim again at once
    answers = [Worker._contended_claim(worker) for _ in range(2 * CONTENDED_AGAIN + 2)]
    # Then it does CONTENDED_AGAIN times, then waits once, and then may again
    assert answers[:CONTENDED_AGAIN + 1] == [True] * CONTENDED_AGAIN + [False]
    assert answers[CONTENDED_AGAIN + 1:2 * CONTENDED_AGAIN + 2] == [True] * CONTENDED_AGAIN + [False]


def test_an_empty_claim_of_held_jobs_waits_for_a_wake():
    # Given an empty claim whose jobs a limit held (no peer held their keys), or no flow read
    assert Worker._contended_claim(_worker(contended=False)) is False
    assert Worker._contended_claim(SimpleNamespace(flow=None, _contended=1)) is False
