"""One measurement of benchmarks/otel_cost.py, in a process of its own on the notifyq of its
PYTHONPATH (this checkout, or a clean export of another commit): CPU µs per job of the
producer's put() and put_many(), and of an in-process drain (testing.drain: the consumer's
Worker on this thread, a no-op handler), untraced, or traced (notifyq.contrib.otel with the
SDK, spans to an exporter that drops them). Prints one JSON object."""
import json
import sys
import time

import notifyq
from notifyq import testing


def main() -> None:
    n, mode, queue = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if mode == "traced":
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

        class Drop(SpanExporter):
            def export(self, spans):
                return SpanExportResult.SUCCESS

        from notifyq.contrib import otel

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(Drop()))
        otel.instrument(provider)
    config = notifyq.load_config()
    out = {"mode": mode, "opentelemetry_loaded": False}
    with notifyq.Producer(queue, config) as producer:
        producer.put({"warm": 0})
        testing.drain(config, queue, lambda job: None)
        c0, w0 = time.process_time(), time.perf_counter()
        for i in range(n):
            producer.put({"i": i})
        out["put_cpu_us"] = (time.process_time() - c0) / n * 1e6
        out["put_wall_us"] = (time.perf_counter() - w0) / n * 1e6
        c0 = time.process_time()
        for i in range(0, n, 100):
            producer.put_many([{"i": j} for j in range(i, min(n, i + 100))])
        out["put_many_cpu_us"] = (time.process_time() - c0) / n * 1e6
    c0, w0 = time.process_time(), time.perf_counter()
    done = testing.drain(config, queue, lambda job: None, batch_size=100, timeout_s=600).done
    out["drain_cpu_us"] = (time.process_time() - c0) / done * 1e6
    out["drain_wall_us"] = (time.perf_counter() - w0) / done * 1e6
    out["drained"] = done
    out["opentelemetry_loaded"] = any(m.startswith("opentelemetry") for m in sys.modules)
    print(json.dumps(out))


main()
