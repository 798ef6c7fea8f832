"""The small ones of issue 28 (items 7-9): failure records that read fully under any stdlib
formatter, the on_failure hook, NOTIFYQ_INSTANT_WAKE=1, `produce --delay 5m`."""

from __future__ import annotations

import json
import logging
import threading

import pytest
from conftest import run_cli

import notifyq
from notifyq import config as config_mod
from notifyq import errors, testing


def _consume_once(db, queue, function, **options):
    service = notifyq.ConsumerService(db.config(defaults={"retry_base_s": 60.0}),
                                      notifyq.ConsumeOptions(queues=(queue,), function=function,
                                                             exit_when_empty=True, **options))
    assert service.run(threading.Event()) == 0


def test_a_failure_record_reads_fully_under_a_plain_stdlib_formatter(db, caplog):
    # Given an app that only called logging.basicConfig (caplog stands for its root handler)
    with notifyq.Producer("lg", db.config()) as producer:
        job_id = producer.put({"n": 1})

    def boom(job):
        raise ValueError("disk full")

    # When a job fails
    with caplog.at_level(logging.WARNING, logger="notifyq"):
        _consume_once(db, "lg", boom)
    record = next(r for r in caplog.records if "job failed" in r.getMessage())
    text = logging.Formatter("%(levelname)s:%(name)s:%(message)s").format(record)
    # Then the line names the queue, the job, the attempt, the error, and the traceback follows
    head, *tb = text.splitlines()
    assert head.startswith(f"WARNING:notifyq.consumer:job failed, retrying queue=lg job={job_id} attempt=1/5 "
                           "next=\"retry at ")
    assert head.endswith('error="ValueError: disk full"')
    assert tb[0] == "Traceback (most recent call last):" and tb[-1] == "ValueError: disk full"
    # And notifyq's own key=value format prints the bare message, the fields as keys
    from notifyq import logs
    kv = logs.KVFormatter(timestamps=False).format(record)
    assert kv.startswith('level=warning logger=notifyq.consumer msg="job failed, retrying" queue=lg ')
    assert "traceback=\"Traceback (most recent call last):\\n" in kv


def test_a_failure_record_carries_the_exception_and_the_jobs_fields_for_the_apps_handlers(db, caplog):
    # Given an app whose logging hands records to an error reporter (Sentry's logging integration
    # reads exc_info) or a JSON formatter (it reads the record's attributes); caplog stands for it
    registry = notifyq.TaskRegistry(db.config())

    @registry.task(queue="lgx", name="charge")
    def charge(order):
        raise ValueError(f"card declined for {order}")

    try:
        job_id = charge.enqueue(7)
        # When the job fails
        with caplog.at_level(logging.WARNING, logger="notifyq"):
            testing.drain(db.config(), "lgx", registry, raise_on_failure=False)
    finally:
        registry.close()
    record = next(r for r in caplog.records if "job failed" in r.getMessage())
    # Then the record carries what the handler raised, with its traceback
    assert record.exc_info is not None and isinstance(record.exc_info[1], ValueError)
    assert str(record.exc_info[1]) == "card declined for 7" and record.exc_info[2] is not None
    # And the job's fields are attributes of the record
    assert (record.queue, record.job, record.attempt, record.task) == ("lgx", job_id, "1/5", "charge")
    assert record.error == "ValueError: card declined for 7" and record.next.startswith("retry at ")
    # And a plain formatter prints the traceback once
    text = logging.Formatter("%(message)s").format(record)
    assert text.count("Traceback (most recent call last)") == 1 and text.endswith("ValueError: card declined for 7")
    # And notifyq's own formats are as before: the traceback a field of its own, no second copy
    from notifyq import logs
    doc = json.loads(logs.JSONFormatter().format(record))
    assert doc["traceback"].startswith("Traceback (most recent call last)") and "exc" not in doc


def test_on_failure_gets_the_job_and_what_the_handler_raised(db):
    with notifyq.Producer("hook", db.config()) as producer:
        failing, fine = producer.put({"fail": True}), producer.put({"fail": False})
    seen = []

    def handler(job):
        if job.payload["fail"]:
            raise KeyError("missing")

    def hook(job, exc):
        seen.append((job.id, job.queue, exc))
        raise RuntimeError("a broken reporter fails nothing")

    _consume_once(db, "hook", handler, on_failure=hook)
    assert [(i, q, type(e), e.args) for i, q, e in seen] == [(failing, "hook", KeyError, ("missing",))]
    assert seen[0][2].__traceback__ is not None  # an error reporter gets the stack
    assert db.query("SELECT id, attempts FROM nq_job WHERE queue = 'hook'") == [(failing, 1)]
    assert fine != failing


def test_consumer_on_failure_in_the_config_reports_a_commands_failure(db, tmp_path):
    out = tmp_path / "failures.jsonl"
    conf = tmp_path / "notifyq.toml"
    conf.write_text('[consumer]\non_failure = "nqtasks:report_failure"\n')
    env = {**db.env, "NQ_TASKS_OUT": str(out), "NOTIFYQ_CONFIG": str(conf)}
    job_id = int(run_cli(env, "produce", "-q", "cmd", '{"n": 1}').stdout)
    done = run_cli(env, "consume", "-q", "cmd", "--command", "false", "--exit-when-empty")
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"failed": job_id, "type": "JobFailed", "error": "exit status 1"}]


def test_an_on_failure_path_that_does_not_load_is_one_line(db, tmp_path):
    conf = tmp_path / "notifyq.toml"
    conf.write_text('[consumer]\non_failure = "nqtasks:nothing_here"\n')
    done = run_cli({**db.env, "NOTIFYQ_CONFIG": str(conf)}, "consume", "-q", "cmd", "--command", "true",
                   "--exit-when-empty")
    assert done.returncode == 8
    assert done.stderr.strip() == ("notifyq: error: consumer.on_failure: handler 'nqtasks:nothing_here': "
                                   "nqtasks has no attribute nothing_here")


@pytest.mark.parametrize("text, value", [("1", True), ("0", False), ("true", True), ("False", False),
                                         ("yes", True), ("no", False), ("on", True), ("off", False)])
def test_notifyq_instant_wake_takes_the_usual_forms_of_a_boolean(text, value):
    cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null", "NOTIFYQ_INSTANT_WAKE": text})
    assert cfg.wakeup.instant_wake is value


def test_notifyq_instant_wake_refuses_other_words_in_one_line():
    with pytest.raises(errors.ConfigError) as e:
        notifyq.load_config(env={"NOTIFYQ_CONFIG": "/dev/null", "NOTIFYQ_INSTANT_WAKE": "2"})
    assert str(e.value) == "NOTIFYQ_INSTANT_WAKE: expected 1 or 0 (or true/false, yes/no, on/off) or auto, got '2'"


@pytest.mark.parametrize("text", ["auto", "AUTO", " Auto "])
def test_notifyq_instant_wake_takes_auto_the_default(text):
    # Given no setting at all, then NOTIFYQ_INSTANT_WAKE=auto in any case
    assert config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null"}).wakeup.instant_wake == "auto"
    cfg = config_mod.load(env={"NOTIFYQ_CONFIG": "/dev/null", "NOTIFYQ_INSTANT_WAKE": text})
    # Then both read as "auto"
    assert cfg.wakeup.instant_wake == "auto"


@pytest.mark.parametrize("toml, value", [("true", True), ("false", False), ('"auto"', "auto"), ('"Auto"', "auto")])
def test_wakeup_instant_wake_in_a_file_takes_true_false_or_auto(tmp_path, toml, value):
    conf = tmp_path / "notifyq.toml"
    conf.write_text(f"[wakeup]\ninstant_wake = {toml}\n")
    assert config_mod.load(env={"NOTIFYQ_CONFIG": str(conf)}).wakeup.instant_wake == value


@pytest.mark.parametrize("toml", ["1", '"yes"', '"sometimes"'])
def test_wakeup_instant_wake_in_a_file_refuses_anything_else_in_one_line(tmp_path, toml):
    conf = tmp_path / "notifyq.toml"
    conf.write_text(f"[wakeup]\ninstant_wake = {toml}\n")
    with pytest.raises(errors.ConfigError) as e:
        config_mod.load(env={"NOTIFYQ_CONFIG": str(conf)})
    assert str(e.value).startswith('wakeup.instant_wake: expected true, false or "auto", got ')


def test_produce_delay_takes_units_like_older_than(db):
    done = run_cli(db.env, "produce", "-q", "later", "--delay", "5m", '{"n": 1}')
    assert done.returncode == 0, done.stderr
    ahead = db.scalar("SELECT TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(6), run_at) FROM nq_job WHERE queue = 'later'")
    assert 290 <= ahead <= 300
    bad = run_cli(db.env, "produce", "-q", "later", "--delay", "5x", '{"n": 1}')
    assert (bad.returncode, bad.stderr.strip()) == (2, (
        "notifyq: error: argument --delay: '5x' is not a valid number of seconds (or a duration like 90s, 5m, "
        "2h, 7d) (see 'notifyq produce --help')"))
