"""A `--command` job's attempt record (nq_attempt) ends when its command exited, as a Python
handler's ends when it returned: not when its call learnt of the exit, which may be much later
(a lease extension under it waiting on a slow or restarting server, or the stop's settle)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from conftest import alive, wait_until

from notifyq.consume import commands
from notifyq.consume.stats import Budget
from notifyq.consume.worker import Worker
from notifyq.produce.producer import Producer
from notifyq.store import queries

HELD_S = 1.5  # how long the lease extension under the command waits on the "server" after its exit

# Writes its pid and its own start and end times (seconds, the epoch); runs until released.
COMMAND = """#!/bin/sh
echo "$$" > "$1/pid"
date +%s.%N > "$1/start"
while [ ! -e "$1/release" ]; do sleep 0.01; done
date +%s.%N > "$1/end"
"""


def test_a_commands_attempt_ends_when_the_command_exited_not_when_its_call_learnt_of_it(db, tmp_path, monkeypatch):
    """Regression: the record's ended_at was when the handler's call returned, and a command
    that exited while a lease extension under it waited on the server was recorded as running
    until that wait ended."""
    # Given a command run per job under a 1.5 s lease (extended after 0.5 s), whose first lease
    # extension releases it, waits for it to exit, and then waits HELD_S more (a server that
    # answers late) before it is sent
    script = tmp_path / "job.sh"
    script.write_text(COMMAND)
    script.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    cfg = db.config(defaults={"lease_s": 1.5})
    with Producer("q", cfg) as p:
        [job] = p.put_many([{"n": 1}])
    real_extend = queries.extend_lease
    held = threading.Event()

    def extend_lease(session, ids, token, lease_s):
        if not held.is_set() and threading.current_thread().name == "worker-thread":
            held.set()
            (out / "release").touch()
            pid = int(wait_until(lambda: (out / "pid").read_text().strip(), 10, message="the command's pid"))
            wait_until(lambda: not alive(pid), 10, message="the command exited")
            threading.Event().wait(HELD_S)  # (the server's late answer: a span to measure, no hand-off)
        return real_extend(session, ids, token, lease_s)

    monkeypatch.setattr(queries, "extend_lease", extend_lease)
    stop = threading.Event()
    worker = Worker(cfg, "q", commands.CommandHandler(f"{script} {out}", False, 60.0), stop=stop,
                    budget=Budget(None), batch_size=1, exit_when_empty=True)

    # When the worker runs it to its end
    runner = threading.Thread(target=worker.run, name="worker-thread", daemon=True)
    runner.start()
    runner.join(60)
    assert not runner.is_alive() and worker.error is None and held.is_set()

    # Then its record is done, and lasts as long as the command ran (its start and exit), not
    # HELD_S more
    [(outcome, run_s)] = db.query("SELECT outcome, TIMESTAMPDIFF(MICROSECOND, started_at, ended_at) / 1e6 "
                                  "FROM nq_attempt WHERE job_id = %s", (job,))
    ran_s = float((out / "end").read_text()) - float((out / "start").read_text())
    assert outcome == "done"
    assert ran_s <= float(run_s) < ran_s + HELD_S / 2, (float(run_s), ran_s)
