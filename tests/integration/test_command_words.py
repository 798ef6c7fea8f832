"""A `--command` is split into words as a shell would (shlex) and run without a shell, as the
docs say: `$VARS`, pipes and redirections reach the program as text; `sh -c '…'` runs a shell,
the payload on its stdin."""

from __future__ import annotations

import json
import shlex
import sys
import threading

from notifyq.consume import commands
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer


def run_command(db, command: str) -> None:
    cfg = db.config()
    with Producer("q", cfg) as p:
        p.put({"n": 7})
    worker = Worker(cfg, "q", commands.CommandHandler(command, False, 30.0), stop=threading.Event(),
                    budget=Budget(None), batch_size=10, exit_when_empty=True)
    worker.run()
    assert worker.error is None, worker.error
    assert (worker.stats.succeeded, worker.stats.failed) == (1, 0)


def test_a_command_gets_its_words_without_a_shell(db, tmp_path):
    # Given a command whose words hold a variable, a pipe and a redirection
    out = tmp_path / "argv.json"
    script = "import json, sys; open(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))"
    run_command(db, f"{shlex.quote(sys.executable)} -c {shlex.quote(script)} {out} '$HOME' a|b '>x' \"two words\"")
    # Then the program got them as text, quotes grouping words: no shell expanded anything
    assert json.loads(out.read_text()) == ["$HOME", "a|b", ">x", "two words"]


def test_sh_c_runs_a_shell_with_the_payload_on_its_stdin(db, tmp_path):
    # Given the documented form for shell syntax: sh -c with a pipe and a redirection
    out = tmp_path / "payload"
    run_command(db, f"sh -c 'cat | tr 7 8 > {out}'")
    # Then the shell ran the pipeline on the job's payload
    assert json.loads(out.read_text()) == {"n": 8}
