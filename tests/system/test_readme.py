"""The README's Python examples run as printed: the producer stores its jobs (the one on the
caller's connection with the caller's commit), and the consumer runs jobs and stops cleanly on
SIGTERM. The getting-started page shows the same two programs. And the README carries no drafting
leftovers and stays a front door (links into docs/ are tests/unit/test_docs.py's)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

from conftest import REPO, run_cli, wait_until


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def the_block(path, marker: str) -> str:
    blocks = [b for b in python_blocks(path.read_text()) if marker in b]
    assert len(blocks) == 1, f"{path.name}: one python block with {marker!r}"
    return blocks[0]


def test_the_readmes_producer_stores_every_job_it_puts(db, tmp_path):
    # Given the README's producer, exactly as printed there
    script = tmp_path / "producer.py"
    script.write_text(the_block(REPO / "README.md", "notifyq.Producer("))
    # When it runs against a fresh database
    done = subprocess.run([sys.executable, str(script)], env=db.env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    # Then it ends well, and every put stored its job: one, 10,000 in bulk, one with a key, and the
    # one on the caller's connection, which its commit stored
    assert done.returncode == 0, done.stderr
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE queue = 'emails'") == 10_003
    assert db.scalar("SELECT COUNT(*) FROM nq_job WHERE payload LIKE '%%\"order\":42%%'") == 1


def test_the_getting_started_page_shows_the_readmes_programs():
    for marker in ("notifyq.Producer(", "service.run(stop)"):
        assert the_block(REPO / "docs" / "getting-started.md", marker) == the_block(REPO / "README.md", marker)


def test_the_readmes_consumer_runs_jobs_and_stops_on_sigterm(db, tmp_path):
    # Given the README's consumer, exactly as printed there
    script = tmp_path / "consumer.py"
    script.write_text(the_block(REPO / "README.md", "service.run(stop)"))
    # And two jobs waiting on its queue
    assert run_cli(db.env, "produce", "-q", "emails", '{"to": "a@example.com"}', '{"to": "b@example.com"}'
                   ).returncode == 0
    out = tmp_path / "out"
    with out.open("w") as fo, (tmp_path / "err").open("w") as fe:
        proc = subprocess.Popen([sys.executable, str(script)], env=db.env, stdout=fo, stderr=fe, cwd=tmp_path)
    try:
        # When it runs, it runs both
        wait_until(lambda: out.read_text().count("sending to") == 2 or proc.poll() is not None, 30,
                   message="both jobs handled")
        assert proc.poll() is None, (tmp_path / "err").read_text()
        assert sorted(out.read_text().splitlines()) == ["sending to a@example.com", "sending to b@example.com"]
        # And SIGTERM stops it cleanly
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (tmp_path / "err").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert db.scalar("SELECT COUNT(*) FROM nq_job") == 0
    assert db.scalar("SELECT COUNT(*) FROM nq_consumer") == 0  # it unregistered on the way out


def test_the_readme_has_no_drafting_leftovers_and_stays_a_front_door():
    text = (REPO / "README.md").read_text()
    assert "Sections to merge" not in text
    assert "mysql://root@localhost/notifyq" in text  # the default DSN is stated
    assert "./scripts/demo.sh" in text and "./scripts/test.sh" in text  # the two commands
    assert len(text.splitlines()) <= 250  # the rest is in docs/
