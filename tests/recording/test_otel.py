"""proxy.recording.otel: what an OTLP receiver gets, decoded with the official protobuf messages, over HTTP and gRPC."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
grpc = pytest.importorskip("grpc")

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc  # noqa: E402
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc  # noqa: E402
from opentelemetry.proto.trace.v1 import trace_pb2  # noqa: E402

from proxy.errors import ErrorCode  # noqa: E402
from proxy.recording import otel  # noqa: E402
from proxy.recording.record import Action, LengthRecord  # noqa: E402


class Received:
    """What the receiver decoded: every ExportTraceServiceRequest and ExportMetricsServiceRequest."""

    def __init__(self) -> None:
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.lock = threading.Lock()

    def spans(self) -> list[Any]:
        return [s for req in self.traces for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]

    def metric(self, name: str) -> list[Any]:
        """Every exported instance of metric `name` (a cumulative histogram: the last is the total)."""
        return [m for req in self.metrics for rm in req.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics if m.name == name]


def http_receiver(received: Received) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            with received.lock:
                if self.path == "/v1/traces":
                    received.traces.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                    reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                else:
                    assert self.path == "/v1/metrics", self.path
                    received.metrics.append(metrics_service_pb2.ExportMetricsServiceRequest.FromString(body))
                    reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    return server


def grpc_receiver(received: Received) -> tuple[Any, int]:
    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            with received.lock:
                received.traces.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            with received.lock:
                received.metrics.append(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


@pytest.fixture(params=["http/protobuf", "grpc"])
def receiver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Received]:
    received = Received()
    if request.param == "grpc":
        server, port = grpc_receiver(received)
    else:
        http = http_receiver(received)
        port = http.server_address[1]
    for key in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_SDK_DISABLED",
                "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_HEADERS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", request.param)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "brimful-test")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci,service.instance.id=replica-7")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")   # exported by flush(), not by the clock
    yield received
    if request.param == "grpc":
        server.stop(None)
    else:
        http.shutdown()
        http.server_close()


SERVED = LengthRecord(ts=1_800_000_000.25, model="qwen3-8b", endpoint="chat", stream=True, request_id="req-1",
                      max_model_len=8192, prompt_tokens=1200, upstream_prompt_tokens=1201,
                      requested_max_tokens=9000, granted_max_tokens=6991, completion_tokens=300,
                      finish_reasons=["stop"], action=Action.CLAMPED, status=200, latency_ms=1500.0)
REFUSED = LengthRecord(ts=1_800_000_001.0, model="qwen3-8b", endpoint="completions", request_id="req-2",
                       max_model_len=8192, prompt_tokens=9000, requested_max_tokens=100, action=Action.REJECTED,
                       status=400, error_code=ErrorCode.CONTEXT_LENGTH_EXCEEDED, latency_ms=3.0)


def attrs(kvs: Any) -> dict[str, Any]:
    """OTLP KeyValues as Python values (string, int, double, bool, or a list of strings)."""
    out: dict[str, Any] = {}
    for kv in kvs:
        kind = kv.value.WhichOneof("value")
        value = getattr(kv.value, kind)
        out[kv.key] = [v.string_value for v in value.values] if kind == "array_value" else value
    return out


def test_a_span_per_request_with_the_genai_and_brimful_attributes(receiver: Received) -> None:
    telemetry = otel.Telemetry()
    try:
        telemetry.observe(SERVED, "local")
        telemetry.observe(REFUSED, "local")
        assert telemetry.flush()
    finally:
        telemetry.close()
    resource = attrs(receiver.traces[0].resource_spans[0].resource.attributes)
    assert (resource["service.name"], resource["deployment.environment"], resource["service.instance.id"]) == (
        "brimful-test", "ci", "replica-7")
    spans = {s.name: s for s in receiver.spans()}
    assert set(spans) == {"chat qwen3-8b", "text_completion qwen3-8b"}
    served = spans["chat qwen3-8b"]
    assert served.kind == trace_pb2.Span.SPAN_KIND_CLIENT
    assert served.start_time_unix_nano == 1_800_000_000_250_000_000
    assert served.end_time_unix_nano - served.start_time_unix_nano == 1_500_000_000
    assert served.status.code == trace_pb2.Status.STATUS_CODE_UNSET
    assert attrs(served.attributes) == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm", "gen_ai.request.model": "qwen3-8b",
        "gen_ai.request.max_tokens": 9000, "gen_ai.usage.input_tokens": 1201, "gen_ai.usage.output_tokens": 300,
        "gen_ai.response.finish_reasons": ["stop"], "brimful.action": "clamped", "brimful.prompt_tokens": 1200,
        "brimful.granted_max_tokens": 6991, "brimful.count_source": "local", "brimful.max_model_len": 8192,
        "brimful.request_id": "req-1", "brimful.endpoint": "chat", "brimful.status": 200, "brimful.stream": True,
    }
    refused = spans["text_completion qwen3-8b"]
    assert refused.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    got = attrs(refused.attributes)
    assert got["error.type"] == "context_length_exceeded" and got["gen_ai.usage.input_tokens"] == 9000
    assert "gen_ai.usage.output_tokens" not in got and got["brimful.action"] == "rejected"


def test_the_token_usage_and_duration_histograms_with_the_conventions_buckets(receiver: Received) -> None:
    telemetry = otel.Telemetry()
    try:
        for rec in (SERVED, SERVED, REFUSED):
            telemetry.observe(rec, "upstream")
        assert telemetry.flush()
    finally:
        telemetry.close()
    [usage] = receiver.metric("gen_ai.client.token.usage")[-1:]
    assert usage.unit == "{token}"
    points = {(attrs(p.attributes)["gen_ai.token.type"], attrs(p.attributes)["gen_ai.operation.name"]): p
              for p in usage.histogram.data_points}
    assert set(points) == {("input", "chat"), ("output", "chat"), ("input", "text_completion")}
    for p in points.values():
        assert list(p.explicit_bounds) == [float(b) for b in otel.TOKEN_BUCKETS]
    assert (points["input", "chat"].count, points["input", "chat"].sum) == (2, 2402)
    assert (points["output", "chat"].count, points["output", "chat"].sum) == (2, 600)
    # 1201 lies in (1024, 4096]: the 7th bucket
    assert list(points["input", "chat"].bucket_counts)[6] == 2
    point = attrs(points["input", "text_completion"].attributes)
    assert point == {"gen_ai.operation.name": "text_completion", "gen_ai.provider.name": "vllm",
                     "gen_ai.request.model": "qwen3-8b", "brimful.action": "rejected",
                     "error.type": "context_length_exceeded", "gen_ai.token.type": "input"}
    [duration] = receiver.metric("gen_ai.client.operation.duration")[-1:]
    assert duration.unit == "s"
    by_op = {attrs(p.attributes)["gen_ai.operation.name"]: p for p in duration.histogram.data_points}
    assert list(by_op["chat"].explicit_bounds) == list(otel.DURATION_BUCKETS)
    assert (by_op["chat"].count, by_op["chat"].sum) == (2, 3.0)
    assert by_op["text_completion"].sum == pytest.approx(0.003)


def test_otel_traces_exporter_none_sends_metrics_only(receiver: Received, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    telemetry = otel.Telemetry()
    try:
        telemetry.observe(SERVED)
        assert telemetry.flush()
    finally:
        telemetry.close()
    assert receiver.traces == [] and receiver.metric("gen_ai.client.token.usage")


def test_otel_sdk_disabled_makes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert otel.open_telemetry({"OTEL_SDK_DISABLED": "true"}) is None


def test_an_unknown_protocol_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="grpc or http/protobuf"):
        otel.Telemetry(env={"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_a_full_queue_drops_and_counts_without_blocking() -> None:
    telemetry = otel.Telemetry(queue_size=0, env={"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"})
    try:
        telemetry.observe(SERVED)
        assert telemetry.dropped == 1
    finally:
        telemetry.close()


@pytest.mark.slow
@pytest.mark.parametrize("receiver", ["http/protobuf"], indirect=True)
def test_brimful_serve_exports_each_request_it_answers(receiver: Received, qwen3_dir: Any, tmp_path: Any) -> None:
    """Through the real command and the openai SDK: a clamped chat and a refused one reach the receiver as spans
    with the count source the x-brimful-count header names, and in the token histogram; SIGTERM flushes them."""
    import openai

    from tests.support.fakevllm import FakeVLLM
    from tests.support.process import BrimfulProcess

    with FakeVLLM(max_model_len=4096) as fake:
        brimful = BrimfulProcess(fake.base_url, tmp_path, qwen3_dir, extra_toml="\n[otel]\nenabled = true\n")
        try:
            client = openai.OpenAI(base_url=brimful.base_url + "/v1", api_key="x", max_retries=0)
            raw = client.chat.completions.with_raw_response.create(
                model="tiny-qwen", messages=[{"role": "user", "content": "hi"}], max_tokens=65535)
            assert raw.headers["x-brimful-action"] == "clamped"
            source = raw.headers["x-brimful-count"]
            with pytest.raises(openai.BadRequestError):
                client.completions.create(model="tiny-qwen", prompt="hi " * 5000, max_tokens=5)
        finally:
            assert brimful.stop() == 0
    spans = {s.name: attrs(s.attributes) for s in receiver.spans()}
    assert set(spans) == {"chat tiny-qwen", "text_completion tiny-qwen"}
    chat = spans["chat tiny-qwen"]
    assert chat["brimful.action"] == "clamped" and chat["brimful.count_source"] == source
    assert chat["gen_ai.request.max_tokens"] == 65535 and chat["brimful.granted_max_tokens"] < 4096
    assert chat["gen_ai.usage.output_tokens"] >= 1 and chat["brimful.max_model_len"] == 4096
    refused = spans["text_completion tiny-qwen"]
    assert refused["brimful.action"] == "rejected" and refused["error.type"] == "context_length_exceeded"
    [usage] = receiver.metric("gen_ai.client.token.usage")[-1:]
    inputs = [p for p in usage.histogram.data_points if attrs(p.attributes)["gen_ai.token.type"] == "input"]
    assert sum(p.count for p in inputs) == 2
