"""`notifyq produce` as a long-running stream reader: FIFOs, slow writers, half lines, bad lines.

Synchronisation without sleeps: FIONREAD on the pipe tells when the producer has read what was
written, a fake $NOTIFY_SOCKET tells when it is READY, and nq_job shows what was committed.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from conftest import REPO, notifyq_cmd, wait_until
from notifyq import errors
from test_daemon_notify import NotifyListener, notify, procs  # noqa: F401 (shared fixtures)

UNIT = REPO / "systemd" / "notifyq-producer@.service"


def producer(procs, env, tmp_path: Path, *args: str, stdin=subprocess.DEVNULL):
    out, err = tmp_path / f"produce-{len(procs)}.out", tmp_path / f"produce-{len(procs)}.err"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(notifyq_cmd("produce", *args), env=env, stdin=stdin, stdout=o, stderr=e)
    procs.append(proc)
    return proc, out, err


def setup_env(db, tmp_path: Path, config: str, notify: NotifyListener | None = None) -> dict[str, str]:
    path = tmp_path / "nq.toml"
    path.write_text(config)
    env = {**db.env, "NOTIFYQ_CONFIG": str(path)}
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM"):
        env.pop(key, None)
    if notify is not None:
        env["NOTIFY_SOCKET"] = notify.address
    return env


def unread(fd: int) -> int:
    """Bytes in the pipe nobody has read yet (FIONREAD works on either end)."""
    n = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, n)
    return n[0]


def payloads(db) -> list:
    return [json.loads(p) for (p,) in db.query("SELECT payload FROM nq_job ORDER BY id")]


def wait_with_log(predicate, timeout: float, message: str, err: Path) -> None:
    """wait_until, and on its timeout the producer's log in the failure: its retries (a lock
    wait, a lost connection) and, at debug, its batches say where the lines stopped."""
    try:
        wait_until(predicate, timeout, message=message)
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- producer log ---\n{err.read_text()[-6000:]}") from None


class SystemdStream(NamedTuple):
    proc: subprocess.Popen
    out: Path
    err: Path
    fd: int  # the FIFO's end a test writes to (systemd's)
    config: Path
    ready: int  # the READY=1 message's index in notify.messages()


@contextlib.contextmanager
def systemd_stream(db, tmp_path: Path, notify: NotifyListener, procs, config: str) -> Iterator[SystemdStream]:
    """`notifyq produce -q s` with the config file `config`, its stdin a FIFO opened
    O_RDWR|O_NONBLOCK, as systemd passes ListenFIFO= with StandardInput=socket (never at EOF,
    and empty reads fail with EAGAIN); yielded once it said READY=1."""
    env = setup_env(db, tmp_path, config, notify)
    fifo = tmp_path / "systemd.fifo"
    os.mkfifo(fifo)
    systemd_end = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        proc, out, err = producer(procs, env, tmp_path, "-q", "s", stdin=systemd_end)
        ready = notify.wait_for("READY=1")
        yield SystemdStream(proc, out, err, systemd_end, Path(env["NOTIFYQ_CONFIG"]), ready)
    finally:
        os.close(systemd_end)


def test_a_followed_fifo_survives_writers_coming_and_going_and_commits_a_slow_line_in_time(db, tmp_path, notify, procs):
    # Given a producer following a FIFO, committing every 100 lines or 0.2 s
    env = setup_env(db, tmp_path, "[producer]\nbatch_lines = 100\nbatch_wait_s = 0.2\n", notify)
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    rejects = tmp_path / "rejects.txt"
    proc, out, err = producer(procs, env, tmp_path, "-q", "p", "--input", str(fifo), "--follow",
                              "--reject-file", str(rejects))
    notify.wait_for("READY=1")
    # When a first writer sends one line and stays connected
    writer = os.open(fifo, os.O_WRONLY)
    written = time.monotonic()
    os.write(writer, b'{"n": 1}\n')
    # Then that line is committed by the time limit while the writer and the producer go on
    wait_until(lambda: payloads(db) == [{"n": 1}], 10, message="the slow line committed")
    assert time.monotonic() - written < 5  # 0.2 s nominal; generous for a loaded machine
    assert proc.poll() is None
    # When it sends a bad line and a good one, and goes away
    os.write(writer, b'{"n": oops}\n{"n": 2}\n')
    os.close(writer)
    wait_until(lambda: len(payloads(db)) == 2, 10, message="the second good line")
    # And a second writer comes, writing one line in two halves
    writer = os.open(fifo, os.O_WRONLY)
    os.write(writer, b'{"n": ')
    wait_until(lambda: unread(writer) == 0, 10, message="the producer to read the half line")
    os.write(writer, b'3}\n')
    os.close(writer)
    # Then every good line is enqueued once, in order; the bad one is reported and kept
    wait_until(lambda: payloads(db) == [{"n": 1}, {"n": 2}, {"n": 3}], 10, message="all three lines")
    assert proc.poll() is None  # writers gone: a followed FIFO is not at EOF
    wait_until(lambda: "rejected line 2:" in err.read_text(), 10, message="the report")
    assert [ln for ln in err.read_text().splitlines() if ln.startswith("notifyq:")] == [
        "notifyq: rejected line 2: invalid JSON: Expecting value: line 1 column 7 (char 6)"]
    assert rejects.read_text() == '{"n": oops}\n'
    # When it is stopped, it exits 0 (a stop is no failure) with the counts
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, err.read_text()
    assert out.read_text() == "enqueued 3, rejected 1\n"
    assert "Traceback" not in err.read_text()


def test_stdin_as_systemd_passes_it_reads_whole_lines_and_reloads_on_sighup(db, tmp_path, notify, procs):
    # Given stdin is a FIFO opened O_RDWR|O_NONBLOCK, as systemd passes ListenFIFO= with
    # StandardInput=socket: never at EOF, and empty reads fail with EAGAIN
    config = "[producer]\nbatch_lines = 1\nbatch_wait_s = 30.0\n[log]\nlevel = \"info\"\n"
    with systemd_stream(db, tmp_path, notify, procs, config) as \
            (proc, out, err, systemd_end, path, ready):
        assert any(ln == "STATUS=queue=s enqueued=0 rejected=0 batches=0" for ln in notify.messages()[ready][1])
        # When a line arrives in two halves, with the pipe empty in between
        os.write(systemd_end, b'{"n": 1, "text": "')
        wait_until(lambda: unread(systemd_end) == 0, 10, message="the producer to read the half line")
        assert proc.poll() is None  # an empty non-blocking pipe is no EOF
        os.write(systemd_end, b'abc"}\n')
        # Then the whole line is enqueued (batch_lines = 1: at once), and STATUS= says so
        wait_until(lambda: payloads(db) == [{"n": 1, "text": "abc"}], 10, message="the joined line")
        notify.wait_for("STATUS=queue=s enqueued=1 rejected=0 batches=1")
        # When the config changes to batches of 3 within 0.1 s, debug logs, and SIGHUP comes
        path.write_text("[producer]\nbatch_lines = 3\nbatch_wait_s = 0.1\n[log]\nlevel = \"debug\"\n")
        mark = len(notify.messages())
        proc.send_signal(signal.SIGHUP)
        reloading = notify.wait_for("RELOADING=1", mark)
        assert any(ln.startswith("MONOTONIC_USEC=") for ln in notify.messages()[reloading][1])
        notify.wait_for("READY=1", reloading + 1)
        # Then three lines written at once are one batch, logged per job at debug
        os.write(systemd_end, b'{"n": 2}\n{"n": 3}\n{"n": 4}\n')
        wait_with_log(lambda: len(payloads(db)) == 4, 10, "three more jobs", err)
        wait_with_log(lambda: "batch enqueued queue=s n=3 " in err.read_text(), 10, "one batch of 3", err)
        # (the batch's line is logged before its jobs': wait for theirs, then no fourth)
        wait_with_log(lambda: err.read_text().count("job enqueued queue=s") >= 3, 10, "a line per job", err)
        text = err.read_text()
        assert text.count("job enqueued queue=s") == 3
        assert "reloaded config" in text and "batch_lines=3" in text
        # When it is stopped: STOPPING=1 and exit 0
        mark = len(notify.messages())
        proc.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1", mark)
        assert proc.wait(30) == 0, err.read_text()
        assert out.read_text() == "enqueued 4\n"


def test_sighup_after_the_queues_section_is_gone_is_refused_and_the_stream_runs_on(db, tmp_path, notify, procs):
    """Regression: the reload took the defaults for the queue, its jobs put with their
    max_attempts instead of the section's, in silence (a section deleted, or its name mistyped)."""
    # Given a producer of a queue whose section sets max_attempts, reading a FIFO as systemd passes it
    section = "[producer]\nbatch_lines = 1\n[queue.{name}]\nmax_attempts = 2\n"
    with systemd_stream(db, tmp_path, notify, procs, section.format(name="s")) as \
            (proc, out, err, systemd_end, path, ready):
        # When the section's name is mistyped and SIGHUP comes
        path.write_text(section.format(name="S"))
        mark = len(notify.messages())
        proc.send_signal(signal.SIGHUP)
        ready = notify.wait_for("READY=1", notify.wait_for("RELOADING=1", mark) + 1)
        # Then the reload is refused in one error line naming the section and the file, and
        # STATUS= says so
        text = err.read_text()
        refused = [ln for ln in text.splitlines() if "reload failed" in ln]
        assert len(refused) == 1 and "[queue.s]" in refused[0] and str(path) in refused[0], text
        assert "reloaded config" not in text and "Traceback" not in text
        assert any(ln.startswith("STATUS=") and "reload=failed" in ln for ln in notify.messages()[ready][1])
        # And the next job is put with the section's max_attempts still
        os.write(systemd_end, b'{"n": 1}\n')
        wait_with_log(lambda: payloads(db) == [{"n": 1}], 10, "the job", err)
        assert db.scalar("SELECT max_attempts FROM nq_job") == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, err.read_text()


def test_bad_lines_are_reported_counted_and_kept_while_every_good_line_is_enqueued(db, tmp_path):
    # Given a file of good lines with every kind of bad line between them
    env = setup_env(db, tmp_path, "[producer]\nmax_payload_bytes = 100\nbatch_lines = 2\n")
    long_line = b'"' + b"x" * 70000 + b'"'  # beyond the reader's line cap (64 KiB here)
    lines = [b'{"n": 1}', b"{nope", b'{"n": 2}', b'{"s": "caf\xe9"}', b"[" * 20000,
             b'"' + b"y" * 200 + b'"', long_line, b"", b'{"n": 3}']
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\n".join(lines))  # the last line has no newline
    rejects = tmp_path / "rejects.txt"
    # When it is produced
    result = subprocess.run(notifyq_cmd("produce", "-q", "b", "--input", str(source), "--reject-file", str(rejects)),
                            env=env, capture_output=True, timeout=60)
    # Then the good lines are enqueued in order, the bad ones reported by number and reason
    assert payloads(db) == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert result.returncode == errors.EXIT_INPUT, result.stderr
    assert result.stdout == b"enqueued 3, rejected 5\n"
    reports = [ln for ln in result.stderr.decode().splitlines() if ln.startswith("notifyq:")]
    assert [ln.split(":")[1] for ln in reports] == [f" rejected line {n}" for n in (2, 4, 5, 6, 7)]
    assert "invalid JSON" in reports[0]
    assert reports[1].endswith("not valid UTF-8")
    assert "invalid JSON" in reports[2]  # nesting too deep: rejected, not a crash
    assert "over the 100-byte limit" in reports[3]
    assert reports[4].endswith("line longer than 65536 bytes (cut there)")
    assert "Traceback" not in result.stderr.decode()
    # And the reject file has each bad line byte for byte (the over-long one cut at the cap)
    kept = rejects.read_bytes().split(b"\n")
    assert kept == [b"{nope", b'{"s": "caf\xe9"}', b"[" * 20000, b'"' + b"y" * 200 + b'"', long_line[:65536], b""]


def test_the_producer_unit_waits_for_ready_and_reloads_with_sighup():
    text = UNIT.read_text()
    assert "\nType=notify\n" in text and "\nNotifyAccess=main\n" in text
    assert "\nExecReload=/bin/kill -HUP $MAINPID\n" in text


def reload_and_wait(proc, notify, path: Path, config: str) -> list[str]:
    """Write `config`, SIGHUP, and wait for the READY=1 that ends the reload: its message's lines."""
    path.write_text(config)
    mark = len(notify.messages())
    proc.send_signal(signal.SIGHUP)
    ready = notify.wait_for("READY=1", notify.wait_for("RELOADING=1", mark) + 1)
    return notify.messages()[ready][1]


def test_a_refused_reload_stays_in_status_until_a_reload_applies(db, tmp_path, notify, procs):
    """Regression: the next batch's STATUS= dropped `reload=failed`, as if the reload had applied."""
    # Given a producer reading a FIFO as systemd passes it, whose reload was refused (a bad value)
    config = "[producer]\nbatch_lines = 1\n"
    with systemd_stream(db, tmp_path, notify, procs, config) as \
            (proc, out, err, systemd_end, path, ready):
        lines = reload_and_wait(proc, notify, path, "[producer]\nbatch_lines = 0\n")
        assert "STATUS=queue=s enqueued=0 rejected=0 batches=0 reload=failed" in lines
        # When a line is enqueued, and another is rejected
        mark = len(notify.messages())
        os.write(systemd_end, b'{"n": 1}\n')
        notify.wait_for("STATUS=queue=s enqueued=1 rejected=0 batches=1 reload=failed", mark)
        os.write(systemd_end, b'{"n": oops}\n')
        # Then every STATUS= since still says the reload failed
        notify.wait_for("STATUS=queue=s enqueued=1 rejected=1 batches=1 reload=failed", mark)
        statuses = [ln for _, msg in notify.messages()[mark:] for ln in msg if ln.startswith("STATUS=")]
        assert statuses and all(ln.endswith(" reload=failed") for ln in statuses), statuses
        # When a reload applies, the next STATUS= and those after it no longer say so
        lines = reload_and_wait(proc, notify, path, config)
        assert "STATUS=queue=s enqueued=1 rejected=1 batches=1" in lines
        mark = len(notify.messages())
        os.write(systemd_end, b'{"n": 2}\n')
        notify.wait_for("STATUS=queue=s enqueued=2 rejected=1 batches=2", mark)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, err.read_text()


def write_all(fd: int, data: bytes, chunk: int = 16384) -> None:
    """Write to a non-blocking pipe end in pieces, each once the producer read the one before."""
    for start in range(0, len(data), chunk):
        os.write(fd, data[start:start + chunk])
        wait_until(lambda: unread(fd) == 0, 10, message="the producer to read a piece of the line")


def test_a_reload_applies_the_payload_limit_and_max_attempts_to_the_next_line(db, tmp_path, notify, procs):
    """Regression: a reload logged "reloaded config" but a put still used the payload limit and
    the queue's max_attempts the producer started with."""
    # Given a producer of a queue with max_attempts 2 and a 100-byte payload limit
    config = "[producer]\nbatch_lines = 1\nmax_payload_bytes = {limit}\n[queue.s]\nmax_attempts = {attempts}\n"
    big = json.dumps({"text": "x" * 296}).encode()  # 308 bytes
    huge = json.dumps({"text": "y" * 70000}).encode()  # longer than a line may be at a 100-byte limit
    with systemd_stream(db, tmp_path, notify, procs, config.format(limit=100, attempts=2)) as \
            (proc, out, err, systemd_end, path, ready):
        os.write(systemd_end, big + b"\n")
        wait_with_log(lambda: "over the 100-byte limit" in err.read_text(), 10, "the first reject", err)
        # When the limit is raised to 100000, max_attempts to 7, and SIGHUP comes
        reload_and_wait(proc, notify, path, config.format(limit=100000, attempts=7))
        # Then the 308-byte line, and a 70 kB one, are enqueued with the new max_attempts
        os.write(systemd_end, big + b"\n")
        write_all(systemd_end, huge + b"\n")
        wait_with_log(lambda: len(payloads(db)) == 2, 10, "both lines enqueued", err)
        assert payloads(db) == [json.loads(big), json.loads(huge)]
        assert db.query("SELECT max_attempts FROM nq_job") == [(7,), (7,)]
        assert "max_payload_bytes=100000" in err.read_text()  # the reload's line says so
        # And a lowered limit applies too: the 308-byte line is rejected again
        reload_and_wait(proc, notify, path, config.format(limit=100, attempts=7))
        mark = len(notify.messages())
        os.write(systemd_end, big + b"\n")
        notify.wait_for("STATUS=queue=s enqueued=2 rejected=2 batches=2", mark)
        assert err.read_text().count("over the 100-byte limit") == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, err.read_text()


def test_a_reload_says_which_changed_settings_the_stream_keeps_until_a_restart(db, tmp_path, notify, procs):
    """Regression: a reload that changed connect_retry_s or wakeup.instant_wake logged
    "reloaded config" and nothing else, while the producer went on with the old values."""
    # Given a producer stream started with a config file
    config = "connect_retry_s = {retry}\n[wakeup]\ninstant_wake = {wake}\npoll_max_s = {poll}\n"
    with systemd_stream(db, tmp_path, notify, procs, config.format(retry=30, wake='"auto"', poll=0.5)) as \
            (proc, out, err, systemd_end, path, ready):
        # When the file changes connect_retry_s, wakeup.instant_wake and the consumers'
        # poll_max_s, and SIGHUP comes
        reload_and_wait(proc, notify, path, config.format(retry=5, wake="false", poll=2))
        # Then the reload applies, with one warning line for each key the stream keeps until a
        # restart, and none for the key only consumers read
        text = err.read_text()
        warned = [ln for ln in text.splitlines() if "restart the service" in ln]
        assert len(warned) == 2, text
        assert "reload: connect_retry_s changed; restart the service to apply it" in warned[0]
        assert "reload: wakeup.instant_wake changed; restart the service to apply it" in warned[1]
        assert "reloaded config" in text and "reload failed" not in text
        # When a reload leaves them as they run (connect_retry_s unset is a stream's 30 s)
        reload_and_wait(proc, notify, path, "[wakeup]\ninstant_wake = \"auto\"\n")
        # Then it warns of nothing more
        assert err.read_text().count("restart the service") == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, err.read_text()
