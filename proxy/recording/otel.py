"""OpenTelemetry, opt-in (`[otel] enabled`): a span and the GenAI metrics per request, over OTLP.

What goes out, under the GenAI semantic conventions' names (docs/gen-ai/gen-ai-spans.md and
gen-ai-metrics.md of open-telemetry/semantic-conventions):

* a CLIENT span per admitted request, named "{gen_ai.operation.name} {gen_ai.request.model}", from the
  request's arrival to its last byte, with gen_ai.operation.name, gen_ai.provider.name,
  gen_ai.request.model, gen_ai.request.max_tokens (what the client asked), gen_ai.usage.input_tokens /
  output_tokens (the upstream's usage, else brimful's own count for the input), gen_ai.response.
  finish_reasons and error.type; status ERROR from HTTP status 400 on;
* `gen_ai.client.token.usage` ({token}, the conventions' bucket edges 1, 4, ... 67108864), one value per
  gen_ai.token.type ("input", "output") when known, and `gen_ai.client.operation.duration` (s, their edges
  0.01 ... 81.92);
* brimful's own figures under `brimful.`: prompt_tokens (its count), granted_max_tokens, action,
  count_source (local | upstream | margin), max_model_len, endpoint, status, request_id — numbers and
  labels only, never text.

Off the request path: `observe` only appends the finished record to a bounded deque (full: dropped and
counted); a thread of its own makes the spans and measurements every `interval_s`, and the SDK's
BatchSpanProcessor and PeriodicExportingMetricReader export them on their threads.  The SDK reads the
standard variables itself: OTEL_EXPORTER_OTLP_ENDPOINT (and the _TRACES_/_METRICS_ ones), _HEADERS,
_TIMEOUT, _COMPRESSION, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*, OTEL_METRIC_EXPORT_INTERVAL;
here OTEL_EXPORTER_OTLP_PROTOCOL (grpc | http/protobuf, the default) picks the exporter,
OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER = none turn a signal off and OTEL_SDK_DISABLED=true both.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from proxy.recording.record import LengthRecord

log = logging.getLogger("brimful.otel")

TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
PROVIDER = "vllm"          # not one of the conventions' well-known values: a custom one, as they allow
# gen_ai.operation.name per surface (proxy.admitted.surfaces); others go out under the surface's own name
OPERATIONS = {"chat": "chat", "responses": "chat", "messages": "chat", "completions": "text_completion",
              "embeddings": "embeddings"}
OTEL_MISSING = "[otel] enabled needs the OpenTelemetry SDK: pip install 'brimful[otel]'"


def available() -> bool:
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def _input_tokens(rec: LengthRecord) -> int | None:
    return rec.upstream_prompt_tokens if rec.upstream_prompt_tokens is not None else rec.prompt_tokens


def _error_type(rec: LengthRecord) -> str | None:
    if rec.error_code is not None:
        return str(rec.error_code)
    return str(rec.status) if rec.status >= 400 else None


def metric_attributes(rec: LengthRecord) -> dict[str, Any]:
    """The attributes every measurement of `rec` carries (low cardinality: no ids, no counts)."""
    attrs: dict[str, Any] = {"gen_ai.operation.name": OPERATIONS.get(rec.endpoint, rec.endpoint),
                             "gen_ai.provider.name": PROVIDER, "brimful.action": str(rec.action)}
    if rec.model is not None:
        attrs["gen_ai.request.model"] = rec.model
    error = _error_type(rec)
    if error is not None:
        attrs["error.type"] = error
    return attrs


def span_attributes(rec: LengthRecord, count_source: str | None) -> dict[str, Any]:
    """A request's span attributes: the conventions' where they have a name, brimful.* for the rest."""
    attrs = metric_attributes(rec)
    optional: Mapping[str, Any] = {
        "gen_ai.request.max_tokens": rec.requested_max_tokens,
        "gen_ai.usage.input_tokens": _input_tokens(rec),
        "gen_ai.usage.output_tokens": rec.completion_tokens,
        "gen_ai.response.finish_reasons": list(rec.finish_reasons) or None,
        "brimful.prompt_tokens": rec.prompt_tokens,
        "brimful.granted_max_tokens": rec.granted_max_tokens,
        "brimful.count_source": count_source,
        "brimful.max_model_len": rec.max_model_len,
        "brimful.request_id": rec.request_id,
    }
    attrs.update({k: v for k, v in optional.items() if v is not None})
    attrs["brimful.endpoint"] = rec.endpoint
    attrs["brimful.status"] = rec.status
    attrs["brimful.stream"] = rec.stream
    return attrs


def _exporters(env: Mapping[str, str]) -> tuple[Any, Any]:
    """(span exporter, metric exporter) for OTEL_EXPORTER_OTLP_PROTOCOL; None where OTEL_*_EXPORTER is none."""
    protocol = env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf").strip().lower()
    traces = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() != "none"
    metrics = env.get("OTEL_METRICS_EXPORTER", "otlp").strip().lower() != "none"
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    elif protocol in ("http/protobuf", "http"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[assignment]
            OTLPMetricExporter,
        )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
            OTLPSpanExporter,
        )
    else:
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: brimful exports grpc or http/protobuf")
    return (OTLPSpanExporter() if traces else None), (OTLPMetricExporter() if metrics else None)


class Telemetry:
    """The SDK's providers, fed from a deque by a thread of their own (see the module docstring)."""

    def __init__(self, *, queue_size: int = 10_000, interval_s: float = 0.2,
                 env: Mapping[str, str] | None = None) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        env = os.environ if env is None else env
        span_exporter, metric_exporter = _exporters(env)
        resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or "brimful"})
        self.tracer_provider = TracerProvider(resource=resource)
        if span_exporter is not None:
            self.tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        readers = [PeriodicExportingMetricReader(metric_exporter)] if metric_exporter is not None else []
        self.meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        self.tracer = self.tracer_provider.get_tracer("brimful")
        meter = self.meter_provider.get_meter("brimful")
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.dropped = 0
        self._pending: collections.deque[tuple[LengthRecord, str | None] | threading.Event | None] = \
            collections.deque()
        self._queue_size = queue_size
        self._interval_s = interval_s
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="brimful-otel", daemon=True)
        self._thread.start()

    def observe(self, rec: LengthRecord, count_source: str | None = None) -> None:
        """Queue a finished request (the event loop's whole share of the cost: one append)."""
        if self._closed or len(self._pending) >= self._queue_size:
            self.dropped += 1
            return
        self._pending.append((rec, count_source))

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            while self._pending:
                item = self._pending.popleft()
                if item is None:
                    return
                if isinstance(item, threading.Event):
                    item.set()
                    continue
                try:
                    self.emit(*item)
                except Exception:   # telemetry must never take the proxy down
                    log.exception("could not export a request's telemetry")

    def emit(self, rec: LengthRecord, count_source: str | None) -> None:
        """The span and the measurements of one request, with the request's own times."""
        from opentelemetry.trace import SpanKind, Status, StatusCode

        start = round(rec.ts * 1e6) * 1000          # microseconds: a float second has no more
        end = start + round((rec.latency_ms or 0.0) * 1000) * 1000
        attrs = metric_attributes(rec)
        name = f"{attrs['gen_ai.operation.name']} {rec.model}" if rec.model else attrs["gen_ai.operation.name"]
        span = self.tracer.start_span(name, kind=SpanKind.CLIENT, start_time=start,
                                      attributes=span_attributes(rec, count_source))
        if rec.status >= 400:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=end)
        tokens = _input_tokens(rec)
        if tokens is not None:
            self.token_usage.record(tokens, {**attrs, "gen_ai.token.type": "input"})
        if rec.completion_tokens is not None:
            self.token_usage.record(rec.completion_tokens, {**attrs, "gen_ai.token.type": "output"})
        if rec.latency_ms is not None:
            self.duration.record(rec.latency_ms / 1000, attrs)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Emit what is queued and export it now (tests, shutdown); blocks the calling thread."""
        done = threading.Event()
        self._pending.append(done)
        self._wake.set()
        ok = done.wait(timeout_s)
        millis = int(timeout_s * 1000)
        return ok and bool(self.tracer_provider.force_flush(millis)) and bool(
            self.meter_provider.force_flush(millis))

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._pending.append(None)
        self._wake.set()
        self._thread.join(10)
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def open_telemetry(env: Mapping[str, str] | None = None) -> Telemetry | None:
    """A `Telemetry`, or None under OTEL_SDK_DISABLED=true; RuntimeError without the SDK."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        log.info("OpenTelemetry is enabled in the configuration but OTEL_SDK_DISABLED=true: nothing is exported")
        return None
    if not available():
        raise RuntimeError(OTEL_MISSING)
    return Telemetry(env=env)
