"""OpenTelemetry spans for notifyq (pip install 'notifyq[otel]'; docs/observability.md).

The app sets up its tracer provider as usual, then calls `instrument()` once:

    from notifyq.contrib import otel
    otel.instrument()          # or instrument(tracer_provider=provider)

From then on, following OpenTelemetry's messaging conventions:

- every enqueue (put, put_many, conn=, transaction(), AsyncProducer, a task's enqueue(), Django's
  enqueue_on_commit) is a "send QUEUE" span (kind PRODUCER), and each job stores that span's
  context (the app's propagators inject it) in its payload's envelope (notifyq/jobs/envelope.py);
- every handler call is a "process QUEUE" span (kind CONSUMER). A job's first run continues its
  enqueue's trace (a child of the send span); a later run (a retry, or a run after its consumer
  died) starts a new trace linked to it; a call on several jobs (a per-batch handler, a
  coroutine handler with concurrency) starts a new trace linked to each. A failed job's error
  is on the span: its exception recorded, status ERROR.

A consumer (`notifyq consume --handler app.jobs:run`) calls instrument() where it sets up its
tracer provider: in the handler's module, say; the consumer reads the hook on each call.
Without this module imported nothing of OpenTelemetry is loaded, and the core's cost is one
attribute read per put and per handler call (jobs/tracing.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from notifyq.jobs import Job, envelope, run_of, tracing

__all__ = ["instrument", "uninstrument", "instrumented"]

SYSTEM = "notifyq"  # messaging.system: not one of the conventions' well-known values, as allowed


def instrument(tracer_provider: Any = None) -> None:
    """Trace every enqueue and every run of this process, with `tracer_provider` (None: the
    global one, trace.set_tracer_provider's). Calling it again replaces the provider."""
    tracing.install(OtelTracer(tracer_provider))


def uninstrument() -> None:
    """Stop tracing: notifyq goes back to its untraced path."""
    tracing.install(None)


def instrumented() -> bool:
    return isinstance(tracing.HOOK, OtelTracer)


class OtelTracer:
    """jobs/tracing.py's Tracer on OpenTelemetry's API."""

    def __init__(self, tracer_provider: Any = None):
        self.tracer = trace.get_tracer("notifyq", _version(), tracer_provider=tracer_provider)

    def send(self, queue: str, count: int, server: tuple[str, int | None],
             write: Callable[[str | None], list[int]]) -> list[int]:
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": queue,
            "server.address": server[0],
        }
        if server[1] is not None:
            attributes["server.port"] = server[1]
        if count != 1:
            attributes["messaging.batch.message_count"] = count
        with self.tracer.start_as_current_span(f"send {queue}", kind=SpanKind.PRODUCER,
                                               attributes=attributes) as span:
            carrier: dict[str, str] = {}
            if span.get_span_context().is_valid:  # a provider that records (or samples) it
                propagate.inject(carrier)
            ids = write(envelope.context_text(carrier) if carrier else None)
            if len(ids) == 1:
                span.set_attribute("messaging.message.id", str(ids[0]))
            return ids

    def process(self, queue: str, jobs: list[Job], call: Callable[[], None]) -> None:
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": queue,
        }
        parent = otel_context.Context()  # a new trace, unless a first run continues its enqueue's
        links: list[Link] = []
        if len(jobs) == 1:
            job = jobs[0]
            attributes["messaging.message.id"] = str(job.id)
            attributes["notifyq.job.attempt"] = job.attempts
            task = run_of(job).task  # as the consumer's handler names it ("" for a plain handler's job)
            if task:
                attributes["notifyq.task"] = task
            sent = _sent_context(job)
            if sent is not None:
                if job.attempts <= 1:
                    parent = sent
                else:  # a retry: its own trace, linked to the enqueue's
                    links.append(_link(sent, job))
        else:
            attributes["messaging.batch.message_count"] = len(jobs)
            links = [_link(sent, job) for job in jobs if (sent := _sent_context(job)) is not None]
        with self.tracer.start_as_current_span(f"process {queue}", context=parent, kind=SpanKind.CONSUMER,
                                               attributes=attributes, links=links) as span:
            call()
            failed = [job for job in jobs if job.error is not None]
            if failed:
                _record_failures(span, failed)


def _version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("notifyq")
    except metadata.PackageNotFoundError:  # run from a checkout
        return None


def _sent_context(job: Job) -> Any:
    """The enqueue's context stored with the job, as the app's propagators extract it."""
    carrier = run_of(job).trace
    if not carrier:
        return None
    ctx = propagate.extract(carrier)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def _link(ctx: Any, job: Job) -> Link:
    return Link(trace.get_current_span(ctx).get_span_context(), {"messaging.message.id": str(job.id)})


def _record_failures(span: Any, failed: list[Job]) -> None:
    """Each failure's exception once (a batch handler that raised fails all with the same one),
    the error's type, and the span's status ERROR."""
    seen: set[int] = set()
    for job in failed:
        exc = job.exception
        if exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            span.record_exception(exc, attributes={"messaging.message.id": str(job.id)})
    first = failed[0]
    span.set_attribute("error.type", type(first.exception).__qualname__ if first.exception is not None
                       else "notifyq.JobFailed")
    span.set_status(Status(StatusCode.ERROR, (first.error or "failed")[:500]))
