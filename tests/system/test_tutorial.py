"""The tutorial works as printed: its config file, its producer (enqueue.py) and its handler
(welcome.py), run with the commands it shows against the test's private server, end as the page
says: ada's job done at its first attempt, flaky's done at its second after one failure, broken's
dead after its three attempts, and `notifyq status` and `notifyq jobs show` tell it. Only the DSN
differs from the page: NOTIFYQ_DSN (the test's database) wins over the config file's."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

from conftest import REPO, run_cli, wait_until

PAGE = REPO / "docs" / "tutorial.md"


def tutorial_files() -> dict[str, str]:
    """The files the tutorial has the reader write: its config (a heredoc) and two Python files."""
    text = PAGE.read_text()
    config = re.search(r"cat > notifyq.toml <<'EOF'\n(.*?)^EOF$", text, flags=re.MULTILINE | re.DOTALL).group(1)
    python = re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    enqueue = [b for b in python if "notifyq.Producer(" in b]
    welcome = [b for b in python if "def send_welcome" in b]
    assert len(enqueue) == 1 and len(welcome) == 1
    return {"notifyq.toml": config, "enqueue.py": enqueue[0], "welcome.py": welcome[0]}


def test_the_tutorial_runs_as_printed_one_job_done_one_retried_one_dead(db, tmp_path):
    # Given the tutorial's three files, written where the reader writes them
    for name, text in tutorial_files().items():
        (tmp_path / name).write_text(text)
    env = {**db.env, "NOTIFYQ_CONFIG": str(tmp_path / "notifyq.toml")}
    # When enqueue.py runs, then the consumer the page starts
    put = subprocess.run([sys.executable, "enqueue.py"], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert put.returncode == 0, put.stderr
    ids = [int(n) for n in re.findall(r"^put job (\d+)$", put.stdout, flags=re.MULTILINE)]
    assert len(ids) == 3
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as fo, err.open("w") as fe:
        proc = subprocess.Popen([sys.executable, "-m", "notifyq", "consume", "-q", "welcome", "--handler",
                                 "welcome:send_welcome"], env=env, cwd=tmp_path, stdout=fo, stderr=fe)
    try:
        # Then two jobs end done and one dead, as the page says (retries after ~2 s, then ~4 s)
        finished = "SELECT COUNT(*) FROM nq_job WHERE status IN (3, 4)"
        wait_until(lambda: db.scalar(finished) == 3 or proc.poll() is not None, 90,
                   message="the tutorial's three jobs finished")
        assert proc.poll() is None, err.read_text()
        proc.send_signal(signal.SIGINT)  # the page's Ctrl-C
        assert proc.wait(60) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    ada, flaky, broken = ids
    assert db.query("SELECT id, status, attempts FROM nq_job ORDER BY id") == [(ada, 3, 1), (flaky, 3, 2), (broken, 4, 3)]
    assert out.read_text().splitlines() == [f"welcome email sent to ada@example.com (job {ada}, attempt 1)",
                                            f"welcome email sent to flaky@example.com (job {flaky}, attempt 2)"]
    logged = err.read_text()
    assert logged.count('msg="job failed, retrying"') == 3 and logged.count('msg="job dead"') == 1
    assert "consumer stopped claimed=6 done=2 failed=4 dead=1" in logged
    # And the commands of step 5 show it
    status = run_cli(env, "status")
    assert status.returncode == 0
    assert re.search(r"^welcome\s+0\s+0\s+0\s+0\s+1\s+2\s+0\s", status.stdout, flags=re.MULTILINE), status.stdout
    show = run_cli(env, "jobs", "show", str(flaky))
    assert show.returncode == 0 and re.search(r"attempt 1\s+failed", show.stdout) and re.search(r"attempt 2\s+done", show.stdout)
