"""LineSource: JSON lines from stdin or --input for `notifyq produce`, read with select() + os.read()."""

from __future__ import annotations

import collections
import logging
import os
import select
import stat
import threading
import time
from collections.abc import Callable, Iterator

from notifyq import errors

log = logging.getLogger("notifyq.lines")


class ReadError(errors.InputError):
    """The input failed while being read: what came before it was enqueued, the rest is lost."""

    def __init__(self, name: str, why: str, *, after_line: int = 0, enqueued: int = 0):
        where = f" after line {after_line}" if after_line else ""
        done = f" (enqueued {enqueued} lines before it)" if after_line else ""
        super().__init__(f"reading {name} failed{where}: {why}{done}")
        self.name, self.why = name, why

READ_CHUNK = 65536
POLL_S = 0.2  # how often an input that stays silent lets the reader see stop and reload requests
FINISH_LINE_S = 1.0  # on stop, how long to wait for the rest of a line already half read


class LineSource:
    """stdin or --input, read with select() + os.read(), never through a Python file object.

    Under the socket unit, stdin is systemd's FIFO opened O_RDWR|O_NONBLOCK: `for line in
    sys.stdin` there yields half-written lines and stops at the first empty read as if at EOF.
    Here an empty pipe is "no data yet" (BlockingIOError, or select() timing out), b"" is a
    real EOF (the last writer of `cat x | notifyq produce` went away), an unfinished line waits
    for its newline, and the stop event is looked at between reads.

    --input FIFO without --follow ends when its writers have come and gone; with --follow it is
    opened read-write, like systemd does, so it never reaches EOF and writers never block in
    open() or lose a line between two readers. A regular file with --follow is tailed."""

    def __init__(self, path: str | None, follow: bool, max_line_bytes: int):
        self.path = path
        self.follow = follow
        self.max_line_bytes = max_line_bytes
        self.cut: set[int] = set()  # numbers of lines longer than max_line_bytes (yielded cut)
        self.fd = 0
        self._owned = False
        self._tail = False  # a regular file: at EOF wait for more rather than end
        self._complete: collections.deque[str] = collections.deque()  # read, not yet yielded
        self._buf = bytearray()  # the line being read
        self._skipping = False  # inside a line already cut at max_line_bytes: drop up to its newline
        self._number = 0  # complete lines read
        self._failed: ReadError | None = None  # a read failed in ready(): raised by lines()

    def __enter__(self) -> "LineSource":
        if self.path is None:
            try:
                os.fstat(self.fd)
            except OSError:
                raise errors.InputError("stdin is closed: give --input PATH") from None
            return self
        try:
            is_fifo = stat.S_ISFIFO(os.stat(self.path).st_mode)
            if is_fifo:
                mode = os.O_RDWR if self.follow else os.O_RDONLY  # O_NONBLOCK: open() never waits
                self.fd = os.open(self.path, mode | os.O_NONBLOCK | os.O_CLOEXEC)
            else:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                self._tail = self.follow
        except OSError as e:
            raise errors.InputError(f"--input {self.path}: {e.strerror}") from None
        self._owned = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owned:
            os.close(self.fd)
            self._owned = False

    def lines(self, stop: threading.Event, between_reads: Callable[[], None] = lambda: None) -> Iterator[str]:
        """Every complete line, then an unterminated last one at EOF; ends soon after `stop`."""
        while True:
            while self._complete:
                yield self._complete.popleft()
            if stop.is_set():
                break
            if self._failed is not None:
                raise self._failed
            between_reads()
            chunk = self._read(POLL_S)
            if chunk is None:
                continue
            if not chunk:  # EOF
                if self._tail:
                    stop.wait(POLL_S)
                    continue
                break
            self._feed(chunk)
        if stop.is_set() and self._buf and not self._skipping:
            self._buf += self._finish_line()
        if self._buf:  # at EOF a last line needs no newline; on stop it may be incomplete
            yield self._decode(self._buf) + ("\0" if self._skipping else "")
            self._buf.clear()

    def ready(self, timeout: float = 0.0) -> bool:
        """Is a complete line waiting, or does one arrive within `timeout`? What `notifyq
        produce` asks before it commits: lines that came while the last commit was in flight
        join this one, and a lone line is committed at once. A failing read is raised by
        lines(), after the lines before it."""
        deadline = time.monotonic() + timeout
        while not self._complete and self._failed is None:
            try:
                chunk = self._read(max(0.0, deadline - time.monotonic()))
            except ReadError as e:
                self._failed = e
                break
            if chunk is None:
                if time.monotonic() >= deadline:
                    break
                continue
            if not chunk:  # EOF: lines() sees it again and ends the stream
                break
            self._feed(chunk)
        return bool(self._complete)

    def _feed(self, chunk: bytes) -> None:
        parts = chunk.split(b"\n")
        for i, part in enumerate(parts):
            if not self._skipping:
                self._buf += part
            if len(self._buf) > self.max_line_bytes and not self._skipping:
                del self._buf[self.max_line_bytes:]
                self._skipping = True
                self.cut.add(self._number + 1)
            if i == len(parts) - 1:
                break
            self._number += 1
            # A NUL can end no JSON text: a cut line is always rejected, never half enqueued.
            self._complete.append(self._decode(self._buf) + ("\0" if self._skipping else ""))
            self._buf.clear()
            self._skipping = False

    def _read(self, timeout: float) -> bytes | None:
        """Some bytes, b"" at EOF, or None when nothing came within `timeout`.

        A failing read (EIO from a terminal that went away, EISDIR, EBADF) is no EOF: taken for
        one, the lines still to come would be lost without a word and the exit status would be 0."""
        try:
            readable, _, _ = select.select([self.fd], [], [], timeout)
            if not readable:
                return None
            return os.read(self.fd, READ_CHUNK)
        except BlockingIOError:  # another reader of the same pipe was quicker
            return None
        except (OSError, ValueError) as e:  # ValueError: select() on a closed descriptor
            raise ReadError(self.path or "stdin", getattr(e, "strerror", None) or str(e)) from None

    def _finish_line(self) -> bytes:
        """Stopping mid-line: writers write whole lines, so the rest is in the pipe already.
        Read it byte by byte, to take nothing beyond the newline from the next instance."""
        rest = bytearray()
        deadline = time.monotonic() + FINISH_LINE_S
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([self.fd], [], [], left)
            if not readable:
                break
            try:
                byte = os.read(self.fd, 1)
            except BlockingIOError:
                continue
            except OSError:  # stopping anyway: keep what was read of the line
                break
            if byte in (b"", b"\n"):
                return bytes(rest)
            rest += byte
            if len(rest) > self.max_line_bytes:
                break
        log.warning("stopped inside an unfinished line: enqueueing what was read of it, if it parses")
        return bytes(rest)

    @staticmethod
    def _decode(raw: bytearray) -> str:
        # surrogateescape: invalid UTF-8 survives to the reject file byte for byte.
        return raw.decode("utf-8", "surrogateescape")
