"""`notifyq produce`'s grouping of lines into commits, over a real pipe (no database)."""

import os
import threading

import pytest

from notifyq.produce.lines import LineSource
from notifyq.produce.stream import _batches


@pytest.fixture
def pipe():
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def stream(r: int, limits=(500, 0.0)):
    source = LineSource(None, follow=False, max_line_bytes=1 << 16)
    source.fd = r
    return _batches(source.lines(threading.Event()), lambda: limits, source.ready)


def test_a_lone_line_is_its_own_batch_at_once_without_waiting_for_more(pipe):
    # Given a producer reading a pipe whose writer stays open, with the default limits
    r, w = pipe
    batches = stream(r)
    # When one line is written and nothing follows
    os.write(w, b'{"n": 1}\n')
    # Then the next batch is that line alone, handed over without waiting for the writer
    # (the old 50 ms batch wait, or any wait for the pipe to close, would block here: the
    # writer is never closed before the batch comes)
    assert next(batches) == [(1, '{"n": 1}')]
    # And so is each further lone line
    os.write(w, b'{"n": 2}\n')
    assert next(batches) == [(2, '{"n": 2}')]


def test_lines_that_came_while_a_commit_was_in_flight_go_together_in_the_next_batch(pipe):
    # Given a producer that took one line for its commit
    r, w = pipe
    batches = stream(r, limits=(3, 0.0))
    os.write(w, b"1\n")
    assert next(batches) == [(1, "1")]
    # When five lines arrive while that commit is in flight (before the next batch is asked)
    os.write(w, b"2\n3\n")
    os.write(w, b"4\n5\n6\n")
    # Then they make the next batches, up to batch_lines each, in order
    assert next(batches) == [(2, "2"), (3, "3"), (4, "4")]
    assert next(batches) == [(5, "5"), (6, "6")]
    # And at EOF an unterminated last line is its own batch, then the stream ends
    os.write(w, b"7")
    os.close(w)
    assert list(batches) == [[(7, "7")]]


def test_a_batch_wait_holds_the_batch_open_for_a_line_that_comes_within_it(pipe):
    # Given batch_wait_s = 30 and a line already taken
    r, w = pipe
    batches = stream(r, limits=(500, 30.0))
    os.write(w, b"a\n")
    # When a second line comes from another thread a little later
    timer = threading.Timer(0.05, lambda: os.write(w, b"b\n"))
    timer.start()
    try:
        # Then both are one batch, once batch_lines is not reached: ended by EOF here
        threading.Timer(0.5, lambda: os.close(w)).start()
        assert next(batches) == [(1, "a"), (2, "b")]
    finally:
        timer.cancel()
