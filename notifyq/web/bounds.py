"""The pages' HTTP server, with bounds: how many requests are handled at once, how long a
connection may take to send its request, and how long a write to a client may block.

The standard library's ThreadingHTTPServer starts a thread per connection and waits for its
request as long as the client likes: 300 sockets opened and left silent held 302 threads for
ever. Here a connection gets a thread only once it has sent something: until then it waits in
a selector (a file descriptor, no thread), at most WAITING_MAX of them. At most HANDLERS
requests are served at once. A connection must send its whole request within REQUEST_S of
being accepted, or it is closed, silent or trickling, waiting or in a handler; and a socket
read or write blocked IO_TIMEOUT_S ends its request (a client that stops reading its page).

A connection that has sent its request and that no handler has taken within QUEUE_S of its
accept is answered 503 with Retry-After by the dispatcher, at once and without a thread:
before, it waited for a handler until REQUEST_S and was then closed unanswered (with the
database frozen, 8 handlers each held a page for 14 s). A handler's page counts its time from
the accept too (accepted_at), so every request sent in time is answered within the docs' bound.
"""

from __future__ import annotations

import collections
import logging
import selectors
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

log = logging.getLogger("notifyq.web")

HANDLERS = 8  # requests served at once; the pages' database sessions are fewer (data.SESSIONS)
WAITING_MAX = 512  # connections accepted whose request is not read yet; beyond, new ones are closed
REQUEST_S = 10.0  # a connection sends its request line, headers and form within this
IO_TIMEOUT_S = 10.0  # a socket read or write blocked this long ends the request (Handler.timeout)
QUEUE_S = 5.0  # a request no handler has taken this long after its accept is answered 503
RETRY_AFTER_S = 5  # what that 503 tells the client to wait before it asks again
_DRAIN_BYTES = 64 * 1024  # what a refused connection's request is read of before the answer
_TICK_S = 0.25  # how often the dispatcher looks for requests past their deadline


class BoundedHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer whose accepted connections wait without a thread until they send,
    served by at most `handlers` threads, each request read within `request_s`. The request
    handler calls request_read(self.request) once it has read its request."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, addr: Any, handler_class: Any, handlers: int = HANDLERS, request_s: float = REQUEST_S,
                 queue_s: float = QUEUE_S):
        self.request_s = request_s
        self.queue_s = queue_s
        self._slots = threading.BoundedSemaphore(handlers)
        self._lock = threading.Lock()
        self._deadlines: dict[Any, float] = {}  # connections whose request is not read yet
        self._accepted_at: dict[Any, float] = {}  # every connection not closed yet: its accept (monotonic)
        self._accepted: list[tuple[Any, Any]] = []  # for the dispatcher to wait on
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
            if len(self._deadlines) >= WAITING_MAX:
                full = True
            else:
                full = False
                now = time.monotonic()
                self._deadlines[request] = now + self.request_s
                self._accepted_at[request] = now
                self._accepted.append((request, client_address))
        if full:
            self.shutdown_request(request)
            return
        self._wake()

    # ------------------------------------------------------------ the handlers' side

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.request_read(request)
            with self._lock:
                self._accepted_at.pop(request, None)
            self._slots.release()
            self._wake()  # a request waiting for a handler is started now, not at the next tick

    def accepted_at(self, request: Any) -> float | None:
        """When this connection was accepted (monotonic): a page's time counts from there."""
        with self._lock:
            return self._accepted_at.get(request)

    def request_read(self, request: Any) -> None:
        """The request is read: its connection's deadline is lifted (the page may take its time,
        bounded by the database sessions' own timeouts)."""
        with self._lock:
            self._deadlines.pop(request, None)

    # ------------------------------------------------------------ the dispatcher

    def _dispatch(self) -> None:
        while not self._closing.is_set():
            try:
                self._dispatch_once()
            except Exception:  # a bug: said, and the pages keep being served (no silent stall)
                log.exception("web: the connection dispatcher failed a turn")
                time.sleep(_TICK_S)
        for key in list(self._waiting.get_map().values()):
            if key.fileobj is not self._wake_r:
                self.shutdown_request(key.fileobj)
        while self._ready:
            self.shutdown_request(self._ready.popleft()[0])

    def _dispatch_once(self) -> None:
        """Start a handler for each connection that sent something, wait on the new ones, and
        close the late ones."""
        for key, _events in self._waiting.select(timeout=_TICK_S):
            if key.fileobj is self._wake_r:
                try:
                    self._wake_r.recv(4096)
                except OSError:
                    pass
                continue
            self._waiting.unregister(key.fileobj)
            self._ready.append((key.fileobj, key.data))
        with self._lock:
            accepted, self._accepted = self._accepted, []
        for request, client_address in accepted:
            self._waiting.register(request, selectors.EVENT_READ, client_address)
        self._start_ready()
        self.expire()

    def _start_ready(self) -> None:
        """A thread for each connection that sent something, first come first served, while a
        handler's slot is free; those left waiting past QUEUE_S from their accept are answered
        503 (refuse)."""
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
                self.refuse(request)
            else:
                kept.append((request, client_address))
        self._ready = kept

    def refuse(self, request: Any) -> None:
        """Answer 503 with Retry-After and close, without a thread: what the client sent is read
        first (up to _DRAIN_BYTES, without waiting), so that closing does not reset the
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
            request.send(_busy_answer(self.queue_s))  # a few hundred bytes: the socket's buffer takes them
        except OSError:
            pass  # gone meanwhile
        finally:
            with self._lock:
                self._deadlines.pop(request, None)
                self._accepted_at.pop(request, None)
            self.shutdown_request(request)

    def expire(self) -> None:
        """Close the connections whose request is not read by its deadline: a waiting one here;
        one in a handler is shut, so that its read returns end-of-file and it answers nothing."""
        now = time.monotonic()
        queued = {request for request, _ in self._ready}  # answered by _start_ready, sent or not
        with self._lock:
            late = [request for request, deadline in self._deadlines.items()
                    if deadline <= now and request not in queued]
            for request in late:
                del self._deadlines[request]
        waiting = self._waiting.get_map()
        for request in late:
            if request in waiting:
                self._waiting.unregister(request)
                with self._lock:
                    self._accepted_at.pop(request, None)
                self.shutdown_request(request)
            else:
                try:
                    request.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # closed meanwhile

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


def _busy_answer(queue_s: float) -> bytes:
    body = (f"busy: no handler was free within {queue_s:.3g} s of this request; "
            f"try again in {RETRY_AFTER_S} s\n").encode()
    head = ("HTTP/1.0 503 Service Unavailable\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"Retry-After: {RETRY_AFTER_S}\r\n"
            "Cache-Control: no-store\r\n"
            "X-Content-Type-Options: nosniff\r\n"
            "Connection: close\r\n\r\n")
    return head.encode() + body


class BoundedHTTPServer6(BoundedHTTPServer):
    address_family = socket.AF_INET6
