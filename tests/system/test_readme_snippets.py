"""The README's Python snippets run one after the other, as a newcomer pastes them: the producer
puts its jobs, then the consumer runs every one of them with no failed attempt (the consumer's
handler reads what the producer puts). Only the DSN differs from the page: it comes from the
test's private server through NOTIFYQ_DSN, as the README's load_config() reads it."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

from conftest import REPO, wait_until


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


JOBS_PUT = 1 + 10_000 + 1 + 1  # put, put_many, the put with a dedup key, the put on the caller's connection


def test_the_readmes_snippets_run_in_order_and_every_job_they_put_ends_done(db, tmp_path):
    # Given the README's Python snippets, in the order the page shows them: a producer, a consumer
    snippets = python_blocks((REPO / "README.md").read_text())
    assert [("notifyq.Producer(" in s, "service.run(stop)" in s) for s in snippets] == [(True, False), (False, True)]
    producer, consumer = (tmp_path / "producer.py", tmp_path / "consumer.py")
    producer.write_text(snippets[0])
    consumer.write_text(snippets[1])
    # When the producer runs and then the consumer, with nothing else on the queue
    put = subprocess.run([sys.executable, str(producer)], env=db.env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert put.returncode == 0, put.stderr
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = 'emails'") == JOBS_PUT
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as fo, err.open("w") as fe:
        proc = subprocess.Popen([sys.executable, str(consumer)], env=db.env, stdout=fo, stderr=fe, cwd=tmp_path)
    try:
        # Then every job leaves the queue (the delayed one too), each after one attempt that ended done
        failed = "SELECT COUNT(*) FROM nq_attempt WHERE outcome <> 'done'"
        wait_until(lambda: db.scalar("SELECT COUNT(*) FROM nq_job") == 0 or db.scalar(failed) > 0
                   or proc.poll() is not None, 180, message="every job the README's producer put handled")
        assert proc.poll() is None, err.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert db.query("SELECT outcome, COUNT(*) FROM nq_attempt GROUP BY outcome") == [("done", JOBS_PUT)]
    assert db.scalar("SELECT COUNT(*) FROM nq_attempt WHERE attempt <> 1") == 0
    # And the handler saw the address of every one of them
    lines = out.read_text().splitlines()
    assert len(lines) == JOBS_PUT and all(line.startswith("sending to ") and line.endswith("@example.com")
                                          for line in lines), lines[:5]
