"""The pages' HTTP server, with bounds: how many requests are handled at once, how long a
connection may take to send its request, how many may be sending one, and how long a write to
a client may block.

The standard library's ThreadingHTTPServer starts a thread per connection and waits for its
request as long as the client likes: 300 sockets opened and left silent held 302 threads for
ever. Here a connection gets a thread only once its whole request is in: until then the
dispatcher reads it, without blocking and without a thread (a selector, a buffer a
connection), and a connection must send its request line, headers and form within REQUEST_S
of its accept or be closed, silent or trickling: 8 sockets trickling a header line a second no
longer hold the 8 handlers (every page was answered 503 meanwhile). At most WAITING_MAX
connections may be sending their request; one more accepted takes the place of the oldest,
which is answered 503 and closed: a flood of idle sockets is cycled out by clients that send,
and no client is closed without an answer (before, the new one was closed silently). A handler
reads the request from that buffer, and a socket write blocked IO_TIMEOUT_S ends its request
(a client that stops reading its page). At most HANDLERS requests are served at once.

A connection whose request is in and that no handler has taken within QUEUE_S of its accept is
answered 503 with Retry-After by the dispatcher, at once and without a thread (with the
database frozen, 8 handlers each held a page for 14 s). A handler's page counts its time from
the accept too (accepted_at), so every request sent in time is answered within the docs' bound.
"""

from __future__ import annotations

import collections
import io
import logging
import re
import selectors
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

log = logging.getLogger("notifyq.web")

HANDLERS = 8  # requests served at once; the pages' database sessions are fewer (data.SESSIONS)
WAITING_MAX = 512  # connections sending their request; one more answers the oldest 503
REQUEST_S = 5.0  # a connection sends its request line, headers and form within this of its accept
IO_TIMEOUT_S = 10.0  # a socket write (or read past the buffer) blocked this long ends the request
QUEUE_S = 5.0  # a request no handler has taken this long after its accept is answered 503
RETRY_AFTER_S = 5  # what that 503 tells the client to wait before it asks again
_DRAIN_BYTES = 64 * 1024  # what a refused connection's request is read of before the answer
HEAD_MAX = 64 * 1024  # a request line and headers read at most (http.server refuses longer ones)
BODY_MAX = 64 * 1024  # a form read at most before a handler takes it (server.MAX_FORM_BYTES is less)
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_LENGTH = re.compile(rb"^content-length:[ \t]*([0-9]{1,12})[ \t]*\r?$", re.I | re.M)
_TICK_S = 0.25  # how often the dispatcher looks for requests past their deadline


class _Sending:
    """A connection sending its request: what it sent so far, and by when it must have sent all."""

    __slots__ = ("client_address", "deadline", "got")

    def __init__(self, client_address: Any, deadline: float):
        self.client_address = client_address
        self.deadline = deadline
        self.got = bytearray()


def request_in(got: bytes | bytearray) -> bool:
    """Whether `got` holds a whole request: its head (request line and headers, up to the blank
    line) and as much form as its Content-Length says, or a head only if the form is more than
    BODY_MAX (the handler refuses it from its head). A head past HEAD_MAX is never whole."""
    end = _HEAD_END.search(got, 0, HEAD_MAX)
    if end is None:
        return False
    length = _LENGTH.search(got, 0, end.start())
    n = int(length.group(1)) if length else 0
    return n > BODY_MAX or len(got) >= end.end() + n


class _Then(io.RawIOBase):
    """`first`'s bytes, then what `rest` reads (the socket's, past a request a handler refuses)."""

    def __init__(self, first: bytes, rest: Any):
        self._first, self._at, self._rest = first, 0, rest

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._at < len(self._first):
            n = min(len(b), len(self._first) - self._at)
            b[:n] = self._first[self._at:self._at + n]
            self._at += n
            return n
        got = self._rest.read1(len(b))
        b[:len(got)] = got
        return len(got)

    def close(self) -> None:
        try:
            self._rest.close()
        finally:
            super().close()


def reader(first: bytes, rest: Any) -> io.BufferedReader:
    """A handler's rfile: the request the dispatcher received, then the socket."""
    return io.BufferedReader(_Then(first, rest))


class BoundedHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer whose accepted connections send their request to the dispatcher,
    without a thread, within `request_s`, and are then served by at most `handlers` threads. The
    request handler reads the request from received(self.request)."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, addr: Any, handler_class: Any, handlers: int = HANDLERS, request_s: float = REQUEST_S,
                 queue_s: float = QUEUE_S):
        self.request_s = request_s
        self.queue_s = queue_s
        self._slots = threading.BoundedSemaphore(handlers)
        self._lock = threading.Lock()
        self._accepted_at: dict[Any, float] = {}  # every connection not closed yet: its accept (monotonic)
        self._accepted: list[tuple[Any, Any]] = []  # for the dispatcher to read from
        self._received: dict[Any, bytes] = {}  # whole requests, for their handlers
        self._sending: dict[Any, _Sending] = {}  # the dispatcher's alone, oldest first
        self._ready: collections.deque[tuple[Any, Any]] = collections.deque()  # sent, waiting for a handler
        self._closing = threading.Event()
        self._dispatcher = None
        self._waiting = selectors.DefaultSelector()  # the dispatcher's alone
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._waiting.register(self._wake_r, selectors.EVENT_READ)
        try:
            super().__init__(addr, handler_class)
        except BaseException:
            self._close_wake()
            raise
        self._dispatcher: threading.Thread | None = threading.Thread(
            target=self._dispatch, name="notifyq-web-dispatch", daemon=True)
        self._dispatcher.start()

    # ------------------------------------------------------------ the accept loop's side

    def process_request(self, request: Any, client_address: Any) -> None:
        """Accepted: hand the connection to the dispatcher, never wait here."""
        with self._lock:
            self._accepted_at[request] = time.monotonic()
            self._accepted.append((request, client_address))
        self._wake()

    # ------------------------------------------------------------ the handlers' side

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._accepted_at.pop(request, None)
                self._received.pop(request, None)
            self._slots.release()
            self._wake()  # a request waiting for a handler is started now, not at the next tick

    def accepted_at(self, request: Any) -> float | None:
        """When this connection was accepted (monotonic): a page's time counts from there."""
        with self._lock:
            return self._accepted_at.get(request)

    def received(self, request: Any) -> bytes:
        """What the dispatcher read of this connection: its whole request (request_in)."""
        with self._lock:
            return self._received.pop(request, b"")

    # ------------------------------------------------------------ the dispatcher

    def _dispatch(self) -> None:
        while not self._closing.is_set():
            try:
                self._dispatch_once()
            except Exception:  # a bug: said, and the pages keep being served (no silent stall)
                log.exception("web: the connection dispatcher failed a turn")
                time.sleep(_TICK_S)
        for request in list(self._sending):
            self._forget(request)
            self.shutdown_request(request)
        while self._ready:
            self.shutdown_request(self._ready.popleft()[0])

    def _dispatch_once(self) -> None:
        """Read what the connections sent, start a handler for each whole request, wait on the
        new connections (the oldest sending answered 503 past WAITING_MAX), close the late ones."""
        for key, _events in self._waiting.select(timeout=_TICK_S):
            if key.fileobj is self._wake_r:
                try:
                    self._wake_r.recv(4096)
                except OSError:
                    pass
                continue
            self._read(key.fileobj)
        with self._lock:
            accepted, self._accepted = self._accepted, []
        now = time.monotonic()
        for request, client_address in accepted:
            while len(self._sending) >= WAITING_MAX:
                oldest = next(iter(self._sending))
                self._forget(oldest)
                self.refuse(oldest, f"more than {WAITING_MAX} connections were sending their request")
            request.setblocking(False)
            self._sending[request] = _Sending(client_address, now + self.request_s)
            self._waiting.register(request, selectors.EVENT_READ)
        self._start_ready()
        self.expire()

    def _read(self, request: Any) -> None:
        """What the connection sent, without blocking; its whole request in: to a handler."""
        sending = self._sending[request]
        try:
            while not request_in(sending.got):
                chunk = request.recv(65536)
                if not chunk:  # closed before its request was in: nothing to answer
                    self._forget(request)
                    self.shutdown_request(request)
                    return
                sending.got += chunk
                if len(sending.got) >= HEAD_MAX and not _HEAD_END.search(sending.got, 0, HEAD_MAX):
                    self._forget(request)
                    self.refuse(request, f"request head past {HEAD_MAX // 1024} KiB",
                                "431 Request Header Fields Too Large")
                    return
        except (BlockingIOError, InterruptedError):
            return  # the rest later
        except OSError:
            self._forget(request)
            self.shutdown_request(request)
            return
        self._forget(request)
        with self._lock:
            self._received[request] = bytes(sending.got)
        self._ready.append((request, sending.client_address))

    def _forget(self, request: Any) -> None:
        """No longer sending: out of the selector and of the connections sending."""
        del self._sending[request]
        self._waiting.unregister(request)

    def _start_ready(self) -> None:
        """A thread for each whole request, first come first served, while a handler's slot is
        free; those left waiting past QUEUE_S from their accept are answered 503 (refuse)."""
        while self._ready and self._slots.acquire(blocking=False):
            request, client_address = self._ready.popleft()
            threading.Thread(target=self.process_request_thread, args=(request, client_address),
                             daemon=True).start()
        if not self._ready:
            return
        now, kept = time.monotonic(), collections.deque()
        with self._lock:
            accepted_at = {request: self._accepted_at.get(request, now) for request, _ in self._ready}
        for request, client_address in self._ready:
            if accepted_at[request] + self.queue_s <= now:
                self.refuse(request, f"no handler was free within {self.queue_s:.3g} s of this request")
            else:
                kept.append((request, client_address))
        self._ready = kept

    def refuse(self, request: Any, why: str, status: str = "503 Service Unavailable") -> None:
        """Answer 503 with Retry-After (or `status`) and close, without a thread: what the client
        sent is read first (up to _DRAIN_BYTES, without waiting), so that closing does not reset the
        connection over the answer."""
        try:
            request.setblocking(False)
            drained = 0
            try:
                while drained < _DRAIN_BYTES:
                    got = request.recv(8192)
                    if not got:
                        break
                    drained += len(got)
            except (BlockingIOError, InterruptedError):
                pass
            request.send(_answer(status, why))  # a few hundred bytes: the socket's buffer takes them
        except OSError:
            pass  # gone meanwhile
        finally:
            with self._lock:
                self._accepted_at.pop(request, None)
                self._received.pop(request, None)
            self.shutdown_request(request)

    def expire(self) -> None:
        """Close the connections that have not sent their whole request by their deadline."""
        now = time.monotonic()
        late = [request for request, sending in self._sending.items() if sending.deadline <= now]
        for request in late:
            self._forget(request)
            with self._lock:
                self._accepted_at.pop(request, None)
            self.shutdown_request(request)

    # ------------------------------------------------------------ closing

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # a wake-up is pending already (the pair's buffer is full), or we are closing

    def server_close(self) -> None:  # also TCPServer.__init__'s, when it cannot listen
        self._closing.set()
        self._wake()
        if self._dispatcher is not None:
            self._dispatcher.join(timeout=5)
        super().server_close()
        self._close_wake()

    def _close_wake(self) -> None:
        if self._wake_r.fileno() != -1:
            self._waiting.close()
            self._wake_r.close()
            self._wake_w.close()


def _answer(status: str, why: str) -> bytes:
    busy = status.startswith("503")
    body = (f"busy: {why}; try again in {RETRY_AFTER_S} s\n" if busy else f"refused: {why}\n").encode()
    head = (f"HTTP/1.0 {status}\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            + (f"Retry-After: {RETRY_AFTER_S}\r\n" if busy else "")
            + "Cache-Control: no-store\r\n"
            "X-Content-Type-Options: nosniff\r\n"
            "Connection: close\r\n\r\n")
    return head.encode() + body


class BoundedHTTPServer6(BoundedHTTPServer):
    address_family = socket.AF_INET6
