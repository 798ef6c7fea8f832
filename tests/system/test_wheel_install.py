"""`pip install .` as a user does it: build the wheel, install it (not editable) into a fresh venv,
and run the quick start's commands from that venv's `notifyq` against a real server.

An editable install reads the SQL files from the source tree, so only a real wheel shows a file
missing from the package data (the migrations once were: every database command failed).
Dependencies are not downloaded again: the fresh venv sees the test venv's site-packages through
a .pth line, after its own, so notifyq itself can only come from the wheel (asserted below).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

import pytest
from conftest import REPO, admin_connect

from notifyq.config import DSN
from notifyq.store import schema


def run(*cmd: str | Path, **kw) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)
    assert result.returncode == 0, f"{cmd}: {result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin/ of a fresh venv holding notifyq from its wheel; its dependencies are the test venv's."""
    base = tmp_path_factory.mktemp("wheel")
    # Build from a copy of the sources: no build/ or egg-info of an earlier build leaks in, and
    # the checkout is left as it was.
    src = base / "src"
    shutil.copytree(REPO / "notifyq", src / "notifyq", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", base / "dist", src)
    wheel = next((base / "dist").glob("notifyq-*.whl"))
    venv = base / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    # A plain path line: the test venv's own .pth files (its editable notifyq) are not run.
    Path(site, "deps-from-test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index", wheel)
    return venv / "bin"


def test_the_wheel_installed_in_a_fresh_venv_runs_init_produce_consume_and_status(installed, server_dsn, tmp_path):
    # Given a fresh database name on the test server, and an environment that knows nothing of
    # the source tree (no PYTHONPATH to it; run from elsewhere)
    root = DSN.parse(server_dsn)
    name = f"nq_t_{uuid.uuid4().hex[:12]}"
    out = tmp_path / "ran"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFYQ_")}
    env.update(NOTIFYQ_DSN=f"mysql://root@{root.host}:{root.port}/{name}", NOTIFYQ_CONFIG="/dev/null",
               PYTHONPATH=str(REPO / "tests" / "helpers"), NQ_TEST_OUT=str(out))
    notifyq = installed / "notifyq"
    try:
        # Then notifyq is the wheel's, not the checkout's
        where = run(installed / "python", "-c", "import notifyq; print(notifyq.__file__)", env=env, cwd=tmp_path)
        assert where.stdout.startswith(str(installed.parent)), where.stdout
        # And the quick start works: init applies the shipped migrations ...
        assert f"version none -> {schema.code_version()}" in run(notifyq, "init", env=env, cwd=tmp_path).stdout
        # ... produce enqueues ...
        ids = run(notifyq, "produce", "-q", "emails", '{"to": "a@example.com"}', '{"to": "b@example.com"}',
                  env=env, cwd=tmp_path).stdout.split()
        assert len(ids) == 2
        status = json.loads(run(notifyq, "status", "--json", env=env, cwd=tmp_path).stdout)
        assert status["queues"]["emails"]["ready"] == 2
        # ... consume runs them and exits when the queue is empty ...
        run(notifyq, "consume", "-q", "emails", "--handler", "nqhandlers:record", "--exit-when-empty",
            env=env, cwd=tmp_path)
        ran = sorted(line.split()[0] for f in out.glob("*.log") for line in f.read_text().splitlines())
        assert ran == sorted(ids)
        # ... and status shows the queue empty
        status = json.loads(run(notifyq, "status", "--json", env=env, cwd=tmp_path).stdout)
        assert status["queues"]["emails"]["ready"] == status["queues"]["emails"]["claimed"] == 0
        assert "emails" in run(notifyq, "status", env=env, cwd=tmp_path).stdout
    finally:
        conn = admin_connect(root)
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()
