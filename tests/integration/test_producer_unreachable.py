"""A library Producer whose server does not answer fails fast: one DatabaseError within a few
seconds (producer.connect_retry_s, 5 s), well inside a web worker's request timeout."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from conftest import wait_until

from notifyq import config as config_mod
from notifyq import errors
from notifyq.produce.producer import Producer


@pytest.fixture
def closed_port():
    """A port bound but not listening: connections are refused, deterministically."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def unreachable_config(port: int, **env: str) -> config_mod.Config:
    return config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null", "NOTIFYQ_DSN": f"mysql://u@127.0.0.1:{port}/db", **env})


def timed_put(producer: Producer, deadline_s: float) -> tuple[BaseException | None, float]:
    """put() on a thread: (what it raised, seconds it took). A put still retrying at deadline_s
    fails the test there rather than after the old minute."""
    return timed_call(producer, lambda: producer.put({"n": 1}), deadline_s)


def timed_call(producer: Producer, call, deadline_s: float) -> tuple[BaseException | None, float]:
    """`call` on a thread: (what it raised, seconds it took), then the producer closed."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome.append(e)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(deadline_s)
    took = time.monotonic() - started
    assert outcome, f"still retrying after {deadline_s} s"
    producer.close()
    return outcome[0], took


def test_a_library_producer_gives_up_on_an_unreachable_server_in_a_few_seconds_with_one_error(closed_port):
    # Given a library Producer with nothing set, its server not listening
    producer = Producer("q", unreachable_config(closed_port))
    # When a put is made (as inside a web request)
    raised, took = timed_put(producer, 15.0)
    # Then it raises one DatabaseError after the library's 5 s, naming the setting (not after a minute)
    assert isinstance(raised, errors.DatabaseError), raised
    text = str(raised)
    assert "\n" not in text and f"cannot reach the database server at 127.0.0.1:{closed_port}" in text
    assert "retried for 5 s: producer.connect_retry_s" in text, text
    assert 4.5 <= took < 15.0, took


def test_producer_connect_retry_s_and_retry_s_set_how_long_a_put_retries(closed_port):
    # Given producer.connect_retry_s = 1 (here from its variable)
    cfg = unreachable_config(closed_port, NOTIFYQ_PRODUCER_CONNECT_RETRY_S="1")
    assert cfg.producer.connect_retry_s == 1.0
    # Then a put gives up after about a second
    raised, took = timed_put(Producer("q", cfg), 10.0)
    assert isinstance(raised, errors.DatabaseError) and "retried for 1 s" in str(raised), raised
    assert 1.0 <= took < 6.0, took
    # And the constructor's retry_s wins over it: 0 is one attempt
    raised, took = timed_put(Producer("q", cfg, retry_s=0), 10.0)
    assert isinstance(raised, errors.DatabaseError) and "retried" not in str(raised), raised
    assert took < 3.0, took


@pytest.mark.parametrize("retry_s", [-1, float("nan"), "5", True])
def test_a_bad_retry_s_is_one_input_error_before_any_connection(closed_port, retry_s):
    with pytest.raises(errors.InputError) as raised:
        Producer("q", unreachable_config(closed_port), retry_s=retry_s)
    assert "retry_s" in str(raised.value)


# A COMMIT as the driver sends it (mysql_commit): a COM_QUERY packet of its own, sequence 0
COMMIT_PACKET = b"\x07\x00\x00\x00\x03COMMIT"


class CommitCutter:
    """A TCP relay to the test server that, once armed, passes the next COMMIT on, lets the
    server answer it (so it lands), and drops the answer: the client's connection is cut and the
    relay stops listening, so the client cannot reconnect to ask what became of it."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.cut = threading.Event()
        self.answered = threading.Event()  # the server's reply to the cut COMMIT arrived
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.cut.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed: the cut
            server = socket.create_connection(self.target)
            threading.Thread(target=self._up, args=(client, server), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        try:
            while data := client.recv(65536):
                server.sendall(data)
                if self.armed.is_set() and COMMIT_PACKET in data and not self.cut.is_set():
                    self.cut.set()
                    self.listener.shutdown(socket.SHUT_RDWR)  # refused from now on (close alone
                    self.listener.close()                     # leaves it listening under accept())
                    client.shutdown(socket.SHUT_RDWR)
                    return
        except OSError:
            pass

    def _down(self, server: socket.socket, client: socket.socket) -> None:
        try:
            while data := server.recv(65536):
                if self.cut.is_set():
                    self.answered.set()  # the COMMIT's reply, never passed on
                    return
                client.sendall(data)
        except OSError:
            pass
        finally:
            server.close()


def test_a_put_whose_commit_reply_is_lost_and_whose_server_stays_away_raises_outcome_unknown(db):
    # Given a producer reaching its server through a relay, which cuts the connection right
    # after passing on the next COMMIT, and then lets nobody in
    admin = db.config().dsn
    relay = CommitCutter(admin.host, admin.port)
    cfg = db.config(dsn=f"mysql://nq_runtime@127.0.0.1:{relay.port}/{admin.database}",
                    wakeup={"instant_wake": False})
    producer = Producer("q", cfg, retry_s=1)
    producer.put({"n": 0})  # connected, the queue known: the next COMMIT is the put's
    relay.armed.set()
    # When a put's COMMIT lands but its reply is lost, and the server cannot be asked
    with pytest.raises(errors.NotifyqError) as raised:
        producer.put({"n": 1})
    producer.drop()
    # Then the put says its outcome is unknown, never that it stored nothing: the job is stored
    assert relay.cut.is_set()
    wait_until(lambda: relay.answered.is_set(), 10, message="the server answered the cut COMMIT")
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE payload = '{\"n\":1}'") == 1
    assert isinstance(raised.value, errors.OutcomeUnknown), raised.value


def test_a_result_wait_on_an_unreachable_server_fails_as_fast_as_a_put(closed_port):
    # Given a library Producer (connect retry 1 s) whose server is not listening
    producer = Producer("q", unreachable_config(closed_port, NOTIFYQ_PRODUCER_CONNECT_RETRY_S="1"))
    # When a result is awaited for up to 30 s
    raised, took = timed_call(producer, lambda: producer.result(1, wait=30), 20.0)
    # Then it raises the put's error after the producer's retry, not after the sessions' minute
    assert isinstance(raised, errors.DatabaseError), raised
    assert "retried for 1 s: producer.connect_retry_s" in str(raised), raised
    assert took < 10.0, took
