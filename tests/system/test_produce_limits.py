"""`notifyq produce` at the edges of its input: lines bigger than the server takes in one
statement, and an input that fails while being read."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import tty

from conftest import notifyq_cmd, wait_until

from notifyq import errors



def env_with(db, tmp_path, config: str) -> dict[str, str]:
    path = tmp_path / "nq.toml"
    path.write_text(config)
    return {**db.env, "NOTIFYQ_CONFIG": str(path)}


def test_big_lines_are_all_enqueued_and_a_line_too_big_for_the_server_is_rejected_alone(db, tmp_path, small_packet):
    # Given 600 lines of 60 KB (a default batch of 500 is 30 times the server's 1 MB packet),
    # and at line 301 one payload of 1.5 MB, within max_payload_bytes but too big for the server
    env = env_with(db, tmp_path, "[producer]\nmax_payload_bytes = 2000000\n")
    lines = [json.dumps({"n": n, "s": "x" * 60_000}) for n in range(600)]
    lines.insert(300, json.dumps({"n": "huge", "s": "z" * 1_500_000}))
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    # When they are produced
    result = subprocess.run(notifyq_cmd("produce", "-q", "big", "--input", str(source)), env=env,
                            capture_output=True, text=True, timeout=120)
    # Then every good line is enqueued, in order, and the big one is reported by its number
    assert result.returncode == errors.EXIT_INPUT, result.stderr
    assert result.stdout == "enqueued 600, rejected 1\n"
    reports = [ln for ln in result.stderr.splitlines() if ln.startswith("notifyq:")]
    assert len(reports) == 1 and reports[0].startswith("notifyq: rejected line 301: payload is too big")
    assert "max_allowed_packet" in reports[0] and "Traceback" not in result.stderr
    rows = db.query("SELECT JSON_VALUE(payload, '$.n') FROM nq_job ORDER BY id")
    assert [int(r[0]) for r in rows] == list(range(600))


def test_an_input_that_fails_while_being_read_is_reported_and_exits_non_zero(db, tmp_path):
    # Given a producer reading a terminal (a pty), which has passed it two lines
    master, slave = pty.openpty()
    proc = None
    tty.setraw(slave)  # no echo, no \r\n: the lines arrive as written
    err = tmp_path / "err"
    try:
        with err.open("w") as e:
            proc = subprocess.Popen(notifyq_cmd("produce", "-q", "tty"), env=db.env, stdin=master,
                                    stdout=subprocess.PIPE, stderr=e, text=True)
        os.close(master)
        os.write(slave, b'{"n": 1}\n{"n": 2}\n')
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 2, message="the two lines enqueued")
        # When the terminal goes away (reads now fail with EIO)
        os.close(slave)
        slave = None
        out, _ = proc.communicate(timeout=60)
    finally:
        if slave is not None:
            os.close(slave)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
    # Then it says so in one line and exits non-zero, what it read before enqueued
    stderr = err.read_text()
    assert proc.returncode == errors.EXIT_INPUT, stderr
    assert "Traceback" not in stderr
    reports = [ln for ln in stderr.splitlines() if ln.startswith("notifyq:")]
    assert reports == ["notifyq: error: reading stdin failed after line 2: Input/output error (enqueued 2 lines before it)"]
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 2


def test_an_input_that_fails_at_its_first_read_is_reported_and_exits_non_zero(db):
    # Given stdin a terminal whose other side is already gone
    master, slave = pty.openpty()
    os.close(slave)
    try:
        result = subprocess.run(notifyq_cmd("produce", "-q", "tty"), env=db.env, stdin=master,
                                capture_output=True, text=True, timeout=60)
    finally:
        os.close(master)
    # Then one line, a non-zero exit and nothing enqueued
    assert result.returncode == errors.EXIT_INPUT, result.stderr
    reports = [ln for ln in result.stderr.splitlines() if ln.startswith("notifyq:")]
    assert reports == ["notifyq: error: reading stdin failed: Input/output error"]
    assert "Traceback" not in result.stderr and "enqueued 0" not in result.stdout
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
