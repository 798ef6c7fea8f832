"""A handler for tests/apps/test_otel.py's consumer process: the app's own tracer provider (the
SDK), spans written as JSON lines to $NQ_OTEL_OUT as each ends, and notifyq instrumented."""
import json
import os

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from notifyq.contrib import otel


class FileExporter(SpanExporter):
    def export(self, spans):
        with open(os.environ["NQ_OTEL_OUT"], "a") as f:
            for s in spans:
                f.write(json.dumps(span_record(s)) + "\n")
        return SpanExportResult.SUCCESS


def span_record(s) -> dict:
    return {"name": s.name, "kind": s.kind.name, "trace_id": f"{s.context.trace_id:032x}",
            "span_id": f"{s.context.span_id:016x}", "parent": f"{s.parent.span_id:016x}" if s.parent else None,
            "status": s.status.status_code.name, "attributes": dict(s.attributes or {}),
            "links": [f"{link.context.trace_id:032x}:{link.context.span_id:016x}" for link in s.links],
            "events": [e.name for e in s.events]}


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
otel.instrument(provider)


def run(job):
    if isinstance(job.payload, dict) and job.payload.get("fail"):
        raise ValueError(f"boom {job.id}")
