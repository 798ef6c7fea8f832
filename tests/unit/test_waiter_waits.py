"""The watcher's waits in one idle turn (wakeup/waiter.py), from the watch statements it sends;
no server here: bells.watch answers as the server would."""

from __future__ import annotations

import threading

from notifyq.config.settings import WakeupConfig
from notifyq.store import bells
from notifyq.store.bells import WatchState
from notifyq.store.locks import QueueLocks
from notifyq.wakeup import FIRST_WAIT_S, QUIET_LOOK_S, Waiter


class _Session:
    generation = 1
    read_timeout_s = 3600.0


def _waits(monkeypatch, cfg: WakeupConfig, answers: list[WatchState]) -> list[float]:
    sent: list[float] = []

    def watch(session, queue, locks, wait_on, wait_s, use_bell=True, on_generation=None, nap=None):
        sent.append(wait_s)
        return answers.pop(0)

    monkeypatch.setattr(bells, "watch", watch)
    waiter = Waiter(_Session(), "q", QueueLocks("db", "q"), cfg, threading.Event(),
                    on_turn=lambda: None, on_reap=lambda: None)
    assert waiter.wait_for_work() is True
    return sent


def test_a_turns_first_wait_on_the_bell_ends_soon_whatever_the_backoff(monkeypatch):
    # Given a watcher whose backoff starts at 5 s, and a ringer holding bell 0
    cfg = WakeupConfig(poll_initial_s=5.0, poll_max_s=8.0)
    nothing_new = dict(total=7, watched=7, paused=False, reap=0, due_in_s=None, held=0)
    answers = [WatchState(**nothing_new, waited=None),  # a turn's first statement only reads
               *[WatchState(**nothing_new, waited=0) for _ in range(3)],  # bell waits that time out
               WatchState(**{**nothing_new, "total": 8}, waited=None)]
    # When its turn goes by with no ring
    sent = _waits(monkeypatch, cfg, answers)
    # Then the first wait ends within FIRST_WAIT_S and the count is read again (the turn may have
    # begun inside a producer's quiet window, whose puts do not ring), then the backoff goes on
    assert sent[1:] == [FIRST_WAIT_S, 5.0, 8.0, 8.0]
    assert QUIET_LOOK_S < FIRST_WAIT_S < 5.0


def test_a_turns_first_sleep_without_a_ringer_ends_soon_too(monkeypatch):
    # Given a watcher whose backoff starts at 5 s, and no ringer: it sleeps from its first statement
    cfg = WakeupConfig(poll_initial_s=5.0, poll_max_s=5.0)
    asleep = dict(total=7, watched=7, paused=False, reap=0, due_in_s=None, held=None, waited=-1)
    answers = [WatchState(**asleep), WatchState(**asleep), WatchState(**{**asleep, "total": 8})]
    # When its turn goes by without a put
    sent = _waits(monkeypatch, cfg, answers)
    # Then its first sleep is cut to FIRST_WAIT_S (an instant wake skipped in a quiet window is
    # the same miss), and the backoff starts after it
    assert sent == [FIRST_WAIT_S, 5.0, 5.0]


def test_a_short_backoff_is_left_as_it_is(monkeypatch):
    # Given the default backoff, which starts below FIRST_WAIT_S
    cfg = WakeupConfig()
    asleep = dict(total=7, watched=7, paused=False, reap=0, due_in_s=None, held=None, waited=-1)
    answers = [WatchState(**asleep), WatchState(**asleep), WatchState(**{**asleep, "total": 8})]
    sent = _waits(monkeypatch, cfg, answers)
    # Then it doubles from poll_initial_s as before
    assert sent == [cfg.poll_initial_s, 2 * cfg.poll_initial_s, 4 * cfg.poll_initial_s]


def test_a_watch_lock_whose_connection_is_gone_is_not_released_over_a_new_one(monkeypatch):
    # Given a watcher holding the watch lock whose session lost its connection (the stall watch
    # cut it: a frozen server), where a release would connect first (10 s on a frozen server)
    from notifyq.store import advisory

    released: list[str] = []
    monkeypatch.setattr(advisory, "release_lock", lambda session, name: released.append(name))
    session = _Session()
    session.current_conn = None
    waiter = Waiter(session, "q", QueueLocks("db", "q"), WakeupConfig(), threading.Event(),
                    on_turn=lambda: None, on_reap=lambda: None)
    waiter.watching = True
    # When it hands the watch back
    waiter.release_watch()
    # Then nothing is sent: the lock died with its connection
    assert released == [] and not waiter.watching
