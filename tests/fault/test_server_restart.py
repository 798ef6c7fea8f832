"""Restart the server (clean stop + start, then SIGKILL + start) under producers and consumers.

Every job whose put() returned, or whose id `produce --print-ids` printed, must be handled. A put
whose COMMIT was cut off raises OutcomeUnknown (exit 9 for `notifyq produce`): allowed, counted,
and then its payload must be in the table once or not at all. Done jobs are kept (keep_done) so
the payloads can be checked after the run.
"""

from __future__ import annotations

import collections
import json
import signal
import threading

from conftest import wait_until

from notifyq import errors
from notifyq.produce.producer import Producer

from .conftest import finished_counts, read_runs, recorder_env, write_config


class PutLoop(threading.Thread):
    """A Python producer calling put() in a loop, at a paced rate, until told to stop."""

    def __init__(self, config, queue: str):
        super().__init__(name="put-loop", daemon=True)
        self.config, self.queue = config, queue
        self.stop = threading.Event()
        self.ids: list[int] = []
        self.unknown: list[str] = []  # payloads whose put() ended in OutcomeUnknown
        self.failures: list[BaseException] = []

    def run(self) -> None:
        with Producer(self.queue, self.config) as producer:
            n = 0
            while not self.stop.wait(0.005):  # pacing: ~200 puts/s offered, not synchronisation
                payload = {"src": "put", "n": n}
                n += 1
                try:
                    self.ids.append(producer.put(payload))
                except errors.OutcomeUnknown:
                    self.unknown.append(json.dumps(payload, separators=(",", ":")))
                except BaseException as e:  # anything else fails the test
                    self.failures.append(e)
                    return


class PipeFeeder(threading.Thread):
    """Writes JSON lines into a `notifyq produce` pipe at a paced rate."""

    def __init__(self, proc):
        super().__init__(name="pipe-feeder", daemon=True)
        self.proc = proc
        self.stop = threading.Event()
        self.sent: list[str] = []

    def run(self) -> None:
        n = 0
        try:
            while not self.stop.wait(0.005):
                line = json.dumps({"src": "pipe", "n": n}, separators=(",", ":"))
                self.proc.stdin.write(line + "\n")
                self.proc.stdin.flush()
                self.sent.append(line)
                n += 1
        except (BrokenPipeError, ValueError):
            pass  # the producer exited (OutcomeUnknown): counted by the test
        finally:
            try:
                self.proc.stdin.close()
            except (BrokenPipeError, ValueError):
                pass


def test_producers_and_consumers_ride_out_a_server_restart_and_a_server_crash(server, fdb, procs, tmp_path):
    # Given two consumers, a `notifyq produce` fed through a pipe and a put() loop, all running
    out = tmp_path / "runs"
    cfg_path = write_config(tmp_path / "nq.toml", "[consumer]\nreap_interval_s = 0.5\n"
                            "[wakeup]\npoll_max_s = 0.2\nidle_wait_s = 5.0\n[defaults]\nkeep_done = true\n")
    env = {**recorder_env(fdb, out, sleep_s=0.005), "NOTIFYQ_CONFIG": str(cfg_path)}
    consumers = [procs.consumer(env, "r", "--batch-size", "20") for _ in range(2)]
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_consumer") == 2, 30, message="2 consumers")
    stream = procs.start(env, "produce", "-q", "r", "--print-ids", stdin=True)
    # The put() loop waits out the restart (a library producer gives up after 5 s by default)
    feeder, putter = PipeFeeder(stream), PutLoop(fdb.config(producer={"connect_retry_s": 60}), "r")
    feeder.start()
    putter.start()

    def done_jobs() -> int:
        return fdb.scalar("SELECT COUNT(*) FROM nq_job WHERE status = 3")

    def progress(n: int, what: str) -> None:
        target = done_jobs() + n
        wait_until(lambda: done_jobs() >= target and putter.failures == [], 60, 0.05, what)

    progress(200, "200 jobs done before the restart")
    per_pid_before = collections.Counter(r.pid for r in read_runs(out) if r.finished)

    # When the server is restarted cleanly, and later SIGKILLed and started again
    server.restart()
    progress(200, "200 more jobs done after the restart")
    server.kill()
    server.start()
    progress(200, "200 more jobs done after the crash")

    # Then every process carried on by itself
    per_pid_after = collections.Counter(r.pid for r in read_runs(out) if r.finished)
    assert all(per_pid_after[c.pid] > per_pid_before[c.pid] for c in consumers), "a consumer stalled"
    assert all(c.alive() for c in consumers)
    putter.stop.set()
    feeder.stop.set()
    putter.join(60)
    feeder.join(60)
    assert putter.failures == []
    stream_code = stream.wait(60)
    assert stream_code in (errors.EXIT_OK, errors.EXIT_UNKNOWN_OUTCOME), stream.stderr_text()
    if stream_code == errors.EXIT_UNKNOWN_OUTCOME:
        assert "outcome is unknown" in stream.stderr_text().strip().splitlines()[-1]

    # And every job whose id a producer was given is handled
    printed = [int(x) for x in stream.stdout_text().split() if x.isdigit()]
    acknowledged = set(putter.ids) | set(printed)
    wait_until(lambda: fdb.scalar("SELECT COUNT(*) FROM nq_job WHERE status <> 3") == 0, 60, 0.05,
               "every stored job done")
    handled = finished_counts(read_runs(out))
    assert acknowledged <= set(handled), f"lost: {sorted(acknowledged - set(handled))[:10]}"
    assert fdb.scalar("SELECT COUNT(*) FROM nq_job") == len(handled)

    # And a put whose outcome was unknown is stored once or not at all, never twice
    unknown = list(putter.unknown)
    if stream_code == errors.EXIT_UNKNOWN_OUTCOME:
        unknown += feeder.sent[len(printed):]
    copies = collections.Counter(
        fdb.scalar("SELECT COUNT(*) FROM nq_job WHERE payload = %s", (p,)) for p in unknown)
    assert set(copies) <= {0, 1}
    # And a job that ran twice did so under two claims: its killed claim counted as an attempt,
    # unless a reaper took it back together with others of its claim (not charged: README)
    finished = [(r.job, r.attempt) for r in read_runs(out) if r.finished]
    if len(finished) != len(set(finished)):
        logs = "".join(c.stderr_text() for c in consumers)
        assert "consumer died, jobs returned" in logs or "leases expired" in logs, "one claim ran twice"
    for c in consumers:
        c.signal(signal.SIGTERM)
    assert [c.wait(30) for c in consumers] == [0, 0]
    duplicates = sum(1 for n in handled.values() if n > 1)
    print(f"\nserver restart + crash: {len(handled)} jobs, {duplicates} ran twice, "
          f"{len(putter.unknown)} put() OutcomeUnknown, produce exit {stream_code}")
