"""OpenTelemetry (issue 40, item 1): a "send QUEUE" span for every way to enqueue, its context
stored with the job, a "process QUEUE" span for the run that continues that trace on the first
run and links to it on a retry, handler errors on the span; nothing of it when not instrumented.
Spans read from the SDK's in-memory exporter, or from a consumer process's own exporter."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import MySQLdb
import pytest
from conftest import REPO, run_cli, wait_until

pytest.importorskip("opentelemetry.sdk", reason="the tracing tests need opentelemetry-sdk (the test extra)")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

import notifyq  # noqa: E402
from notifyq import testing  # noqa: E402
from notifyq.contrib import otel  # noqa: E402
from notifyq.jobs import envelope  # noqa: E402
from notifyq.ops import admin  # noqa: E402
from notifyq.store.db import Session  # noqa: E402


@pytest.fixture
def spans():
    """notifyq instrumented with a provider of the test's own; the finished spans' exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(provider)
    exporter.provider = provider
    try:
        yield exporter
    finally:
        otel.uninstrument()
        provider.shutdown()


def _named(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _stored(db, job_id):
    return db.query("SELECT payload FROM nq_job WHERE id = %s", (job_id,))[0][0]


def _trace_of(db, job_id):
    text = _stored(db, job_id)
    return envelope.opened(text.decode() if isinstance(text, bytes) else text)[1]


def test_every_way_to_enqueue_is_a_send_span_in_the_callers_trace_and_its_job_keeps_the_context(db, spans):
    config = db.config()
    tracer = spans.provider.get_tracer("app")
    producer = notifyq.Producer("otq", config)
    registry = notifyq.TaskRegistry(config)
    ping = registry.task(lambda n: None, queue="otq", name="ping")
    conn = MySQLdb.connect(**db.dsn.connect_args())
    ids: dict[str, list[int]] = {}
    try:
        with tracer.start_as_current_span("request") as request:
            ids["put"] = [producer.put({"n": 1})]
            ids["put_many"] = producer.put_many([{"n": 2}, {"n": 3}])
            ids["conn"] = [producer.put({"n": 4}, conn=conn)]
            conn.commit()
            with producer.transaction(conn) as tx:
                ids["transaction"] = [tx.put({"n": 5})]
            ids["task"] = [ping.enqueue(6)]

            async def aput():
                async with notifyq.AsyncProducer("otq", config) as aio:
                    return await aio.put({"n": 7})
            ids["async"] = [asyncio.run(aput())]
    finally:
        conn.close()
        registry.close()
        producer.close()
    sends = _named(spans, "send otq")
    assert len(sends) == len(ids)  # one per enqueue call
    want = request.get_span_context()
    for span in sends:
        assert span.kind == SpanKind.PRODUCER
        assert span.context.trace_id == want.trace_id and span.parent.span_id == want.span_id
        assert span.attributes["messaging.system"] == "notifyq"
        assert span.attributes["messaging.destination.name"] == "otq"
        assert span.attributes["messaging.operation.type"] == "send"
    by_id = {s.attributes.get("messaging.message.id"): s for s in sends}
    many = [s for s in sends if s.attributes.get("messaging.batch.message_count") == 2]
    assert len(many) == 1
    # Each job stores its send span's context; its handler sees the payload as put
    for how, job_ids in ids.items():
        send = many[0] if how == "put_many" else by_id[str(job_ids[0])]
        for job_id in job_ids:
            carried = _trace_of(db, job_id)
            assert carried["traceparent"].startswith(f"00-{want.trace_id:032x}-{send.context.span_id:016x}-"), how
    seen = []
    testing.drain(config, "otq", lambda job: seen.append(job.payload) if "n" in job.payload else None)
    assert sorted(p["n"] for p in seen) == [1, 2, 3, 4, 5, 7]


def test_a_first_run_continues_the_enqueues_trace_and_a_retry_starts_a_new_one_linked_to_it(db, spans):
    config = db.config(queue={"otr": {"retry_base_s": 0.001, "retry_max_s": 0.001}})
    tracer = spans.provider.get_tracer("app")
    with notifyq.Producer("otr", config) as producer, tracer.start_as_current_span("request"):
        job_id = producer.put({"x": 1})
    send = _named(spans, "send otr")[0]
    runs = []

    def handler(job):
        runs.append(job.attempts)
        if job.attempts == 1:
            raise ValueError("first run fails")

    testing.drain(config, "otr", handler, run_delayed=True, raise_on_failure=False)
    assert runs == [1, 2]
    first, second = _named(spans, "process otr")
    assert first.kind == second.kind == SpanKind.CONSUMER
    assert first.attributes["messaging.message.id"] == second.attributes["messaging.message.id"] == str(job_id)
    # The first run: a child of the send span, in its trace; its failure on it
    assert first.context.trace_id == send.context.trace_id and first.parent.span_id == send.context.span_id
    assert first.status.status_code == StatusCode.ERROR and "first run fails" in first.status.description
    assert [e.name for e in first.events] == ["exception"]
    assert first.events[0].attributes["exception.type"] == "ValueError"
    assert first.attributes["error.type"] == "ValueError"
    # The retry: a trace of its own, linked to the enqueue's
    assert second.parent is None and second.context.trace_id != send.context.trace_id
    assert [link.context.span_id for link in second.links] == [send.context.span_id]
    assert second.status.status_code == StatusCode.UNSET and second.attributes["notifyq.job.attempt"] == 2


def test_a_per_batch_call_is_one_span_linked_to_each_jobs_enqueue(db, spans):
    config = db.config(queue={"otb": {"per_batch": True}})
    tracer = spans.provider.get_tracer("app")
    with notifyq.Producer("otb", config) as producer:
        for n in range(3):
            with tracer.start_as_current_span(f"request {n}"):
                producer.put({"n": n})
    sends = _named(spans, "send otb")
    testing.drain(config, "otb", lambda jobs: jobs[1].fail("no"), batch_size=3, raise_on_failure=False)
    (run,) = _named(spans, "process otb")
    assert run.attributes["messaging.batch.message_count"] == 3 and run.parent is None
    assert {link.context.span_id for link in run.links} == {s.context.span_id for s in sends}
    assert run.status.status_code == StatusCode.ERROR and run.attributes["error.type"] == "notifyq.JobFailed"


def test_untraced_jobs_are_stored_as_put_and_a_payload_that_looks_like_an_envelope_comes_back_whole(db):
    config = db.config()
    assert not otel.instrumented()
    tricky = {"notifyq:trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}, "payload": 5}
    with notifyq.Producer("otu", config) as producer:
        plain = producer.put({"a": 1})
        odd = producer.put(tricky)
    assert _stored(db, plain) in ('{"a":1}', b'{"a":1}')  # byte for byte as before
    session = Session(config.dsn)
    try:
        shown = admin.get_job(session, odd)
    finally:
        session.close()
    assert shown["payload"] == tricky and "trace" not in shown
    assert [j.payload for j in testing.jobs(config, "otu")] == [{"a": 1}, tricky]
    seen = []
    testing.drain(config, "otu", lambda job: seen.append(job.payload))
    assert seen == [{"a": 1}, tricky]


def test_a_traced_payload_that_looks_like_an_envelope_comes_back_whole(db, spans):
    config = db.config()
    tricky = {"notifyq:trace": {}, "payload": [1]}
    with notifyq.Producer("otw", config) as producer:
        job_id = producer.put(tricky)
    assert _trace_of(db, job_id)["traceparent"].startswith("00-")
    session = Session(config.dsn)
    try:
        shown = admin.get_job(session, job_id)
    finally:
        session.close()
    assert shown["payload"] == tricky and shown["trace"]["traceparent"].startswith("00-")
    listed = run_cli(db.env, "jobs", "show", str(job_id))
    assert listed.returncode == 0, listed.stderr
    assert [line.split(None, 1)[1] for line in listed.stdout.splitlines() if line.startswith("trace ")] == [
        json.dumps(shown["trace"])]
    assert testing.jobs(config, "otw")[0].payload == tricky
    seen = []
    testing.drain(config, "otw", lambda job: seen.append(job.payload))
    assert seen == [tricky]


def test_a_consumer_process_continues_the_trace_of_a_job_enqueued_in_a_traced_request(db, spans, tmp_path):
    # Given a job put inside a traced request, and one whose handler fails
    out = tmp_path / "spans.jsonl"
    tracer = spans.provider.get_tracer("app")
    with notifyq.Producer("otp", db.config()) as producer, tracer.start_as_current_span("request") as request:
        ok_id = producer.put({"ok": True})
        bad_id = producer.put({"fail": True})
    # When a consumer process, with its own tracer provider, runs them
    env = {**db.env, "NQ_OTEL_OUT": str(out)}
    done = run_cli(env, "consume", "-q", "otp", "--handler", "nqotel:run", "--exit-when-empty", "--max-jobs", "2")
    assert done.returncode == 0, done.stderr
    wait_until(lambda: out.exists() and len(out.read_text().splitlines()) >= 2, timeout=10)
    runs = {r["attributes"]["messaging.message.id"]: r for r in map(json.loads, out.read_text().splitlines())
            if r["name"] == "process otp"}
    sends = {s.attributes["messaging.message.id"]: s for s in _named(spans, "send otp")}
    # Then each run's span is in the request's trace, a child of its job's send span
    for job_id in (ok_id, bad_id):
        run, send = runs[str(job_id)], sends[str(job_id)]
        assert run["kind"] == "CONSUMER"
        assert run["trace_id"] == f"{request.get_span_context().trace_id:032x}"
        assert run["parent"] == f"{send.context.span_id:016x}"
    assert runs[str(ok_id)]["status"] == "UNSET"
    assert runs[str(bad_id)]["status"] == "ERROR" and runs[str(bad_id)]["events"] == ["exception"]


def test_put_and_drain_load_nothing_of_opentelemetry_unless_instrumented(db):
    # The extra is installed here: nothing of it may be imported by notifyq's own path
    code = ("import sys, notifyq\n"
            "from notifyq import testing\n"
            "config = notifyq.load_config()\n"
            "with notifyq.Producer('otz', config) as p:\n"
            "    p.put({'a': 1}); p.put_many([1, 2])\n"
            "testing.drain(config, 'otz', lambda job: None)\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n")
    env = {**db.env, "PYTHONPATH": os.pathsep.join([str(REPO), db.env["PYTHONPATH"]])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_tasks_run_span_names_its_task(db, spans):
    registry = notifyq.TaskRegistry(db.config())
    ran = []
    ping = registry.task(lambda n: ran.append(n), queue="ott", name="ping")
    try:
        ping.enqueue(1)
        testing.drain(db.config(), "ott", registry)
    finally:
        registry.close()
    (run,) = _named(spans, "process ott")
    assert ran == [1] and run.attributes["notifyq.task"] == "ping"


def test_a_workflow_put_is_a_send_span_and_its_waiting_jobs_carry_its_context_to_their_runs(db, spans):
    # Given a parent, then a child put with after= and a chain put as a workflow on the caller's
    # connection, each in a traced request
    config = db.config()
    tracer = spans.provider.get_tracer("app")
    conn = MySQLdb.connect(**db.dsn.connect_args())
    try:
        with notifyq.Producer("otw", config) as producer, tracer.start_as_current_span("request"):
            parent = producer.put({"n": 1})
            child = producer.put({"n": 2}, after=[parent], key="tenant-a")
            wf = notifyq.Workflow()
            wf.chain("otw", [{"n": 3}, {"n": 4}], after=[child])
            chain = producer.put_workflow(wf, conn=conn)
            conn.commit()
    finally:
        conn.close()
    # Then each put is one send span, and each job stores its own put's span context
    sends = _named(spans, "send otw")
    assert len(sends) == 3
    for send, job_ids in zip(sends, ([parent], [child], chain)):
        for job_id in job_ids:
            assert _trace_of(db, job_id)["traceparent"].split("-")[2] == f"{send.context.span_id:016x}"
    # And once released, the waiting jobs run with their payloads as put, each run a child of its put's span
    seen = []
    testing.drain(config, "otw", lambda job: seen.append((job.payload["n"], job.key)))
    assert seen == [(1, None), (2, "tenant-a"), (3, None), (4, None)]
    runs = {s.attributes["messaging.message.id"]: s for s in _named(spans, "process otw")}
    for send, job_ids in zip(sends, ([parent], [child], chain)):
        for job_id in job_ids:
            assert runs[str(job_id)].parent.span_id == send.context.span_id
