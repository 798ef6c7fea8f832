"""Logs of real `notifyq consume` processes: one line per event, as journald and log shippers want.

Under journald (JOURNAL_STREAM names our stderr) the journal stamps each line, so ts= is left
out, and each line starts with its syslog priority (<6> for info) so the journal keeps the
level; log.format = "json" gives one JSON object per line. Info has one start line and a periodic
summary; batch and per-job lines are debug.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from conftest import notifyq_cmd, run_cli

KV_NO_TS = re.compile(r'^level=(debug|info|warning|error) logger=notifyq[\w.]* msg=("[^"\\]*(\\.[^"\\]*)*"|\S+)( |$)')


def consume_until_empty(db, tmp_path: Path, queue: str, journal: bool, *options: str) -> list[str]:
    """Produce 3 jobs, run a consumer over them with stderr in a file; its stderr lines."""
    out = tmp_path / "runs"
    out.mkdir()
    result = run_cli(db.env, "produce", "-q", queue, "--count", '{"n": 1}', '{"n": 2}', '{"n": 3}')
    assert result.returncode == 0, result.stderr
    env = {**db.env, "NQ_TEST_OUT": str(out)}
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM", "NOTIFYQ_LOG_FORMAT", "NOTIFYQ_LOG_LEVEL"):
        env.pop(key, None)
    err = tmp_path / "stderr"
    with err.open("w") as f:
        if journal:  # what systemd sets when stderr is its journal stream
            st = os.fstat(f.fileno())
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        proc = subprocess.run(notifyq_cmd(*options, "consume", "-q", queue, "--handler", "nqhandlers:record",
                                          "--exit-when-empty"), env=env, stdout=subprocess.DEVNULL, stderr=f,
                              timeout=60)
    text = err.read_text()
    assert proc.returncode == 0, text
    assert "Traceback" not in text
    return text.splitlines()


def test_under_journald_lines_carry_their_priority_and_no_timestamp_and_info_has_no_batches(db, tmp_path):
    lines = consume_until_empty(db, tmp_path, "j", True)
    # Every line starts with its syslog priority, which journald keeps as the entry's level
    priority = {"debug": "<7>", "info": "<6>", "warning": "<4>", "error": "<3>"}
    assert lines and all(priority[KV_NO_TS.match(ln[3:]).group(1)] == ln[:3] for ln in lines), lines
    assert not any("ts=" in ln for ln in lines)
    # One start line for the process; batches and jobs only at debug
    assert sum('msg="consumer started ' in ln for ln in lines) == 1
    assert not any("batch done" in ln or "job ok" in ln or "worker started" in ln for ln in lines)


def test_json_format_is_one_object_per_line_with_per_job_lines_at_debug(db, tmp_path):
    lines = consume_until_empty(db, tmp_path, "js", False, "--log-format", "json", "--log-level", "debug")
    docs = [json.loads(ln) for ln in lines]  # every line parses
    assert all({"ts", "level", "logger", "msg"} <= doc.keys() for doc in docs)
    assert sum(doc["msg"].startswith("job ok queue=js") for doc in docs) == 3
    batch = [doc for doc in docs if doc["msg"].startswith("batch done queue=js n=3 ")]
    assert len(batch) == 1 and batch[0]["level"] == "debug"
    assert {doc["level"] for doc in docs if doc["msg"].startswith("job ok")} == {"debug"}
