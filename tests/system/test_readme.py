"""The README's Python consumer is complete: copied out of README.md as it stands, it runs jobs
and stops cleanly on SIGTERM. And the README carries no drafting leftovers."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

from conftest import REPO, run_cli, wait_until


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_the_readmes_consumer_runs_jobs_and_stops_on_sigterm(db, tmp_path):
    # Given the README's consumer, exactly as printed there
    blocks = [b for b in python_blocks((REPO / "README.md").read_text()) if "service.run(stop)" in b]
    assert len(blocks) == 1, "README.md: one python block with the complete consumer"
    script = tmp_path / "consumer.py"
    script.write_text(blocks[0])
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


def test_the_readme_has_no_drafting_leftovers():
    text = (REPO / "README.md").read_text()
    assert "Sections to merge" not in text
    assert "mysql://root@localhost/notifyq" in text  # the default DSN is stated
