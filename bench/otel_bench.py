"""OpenTelemetry's CPU cost per request: `brimful serve` with `[otel] enabled` against the same with it off.

In one run, alternating, `--rounds` times: brimful in front of FakeVLLM on loopback, N sequential small
chats on one keep-alive connection, brimful's CPU (utime + stime from /proc) per request.  With the
exporter on, OTLP goes to a receiver in this process that decodes every request with the official
protobuf messages (so the figures include a real export, batched as the SDK does).

    python bench/otel_bench.py                       # http/protobuf, 2000 requests, 2 rounds
    python bench/otel_bench.py --protocol grpc --requests 4000

A benchmark, not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2  # noqa: E402
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: E402

from bench.lengthlog_bench import BODY, CHAT, QWEN3, cpu_seconds  # noqa: E402
from tests.support.fakevllm import FakeVLLM  # noqa: E402
from tests.support.process import BrimfulProcess  # noqa: E402


class Receiver:
    """An OTLP/HTTP receiver on loopback: counts the spans and metric exports it decodes."""

    def __init__(self) -> None:
        self.spans = 0
        self.metric_exports = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                if self.path == "/v1/traces":
                    req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                    outer.spans += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
                else:
                    metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                    outer.metric_exports += 1
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def cost(fake: FakeVLLM, otel_on: bool, requests: int) -> float:
    """brimful's CPU milliseconds per request."""
    tmp = Path(tempfile.mkdtemp())
    brimful = BrimfulProcess(fake.base_url, tmp, QWEN3, extra_toml="\n[otel]\nenabled = true\n" if otel_on else "")
    try:
        # a long timeout: the first chat waits for the tokenizer to load, slow on a busy machine
        with httpx.Client(base_url=brimful.base_url, timeout=300) as http:
            for _ in range(50):
                http.post(CHAT, json=BODY)
            before = cpu_seconds(brimful.pid)
            for _ in range(requests):
                assert http.post(CHAT, json=BODY).status_code == 200
            return (cpu_seconds(brimful.pid) - before) * 1000 / requests
    finally:
        brimful.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--protocol", choices=["http/protobuf", "grpc"], default="http/protobuf")
    args = ap.parse_args()
    receiver = Receiver()
    if args.protocol == "grpc":
        import grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: object, context: object) -> object:
                receiver.spans += sum(len(ss.spans) for rs in request.resource_spans  # type: ignore[attr-defined]
                                      for ss in rs.scope_spans)
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: object, context: object) -> object:
                receiver.metric_exports += 1
                return metrics_service_pb2.ExportMetricsServiceResponse()

        from concurrent import futures
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        endpoint = f"http://127.0.0.1:{port}"
    else:
        endpoint = receiver.url
    os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": args.protocol,
                       "OTEL_METRIC_EXPORT_INTERVAL": "5000"})
    off: list[float] = []
    on: list[float] = []
    with FakeVLLM(record=False) as fake:
        for _ in range(args.rounds):
            off.append(cost(fake, False, args.requests))
            on.append(cost(fake, True, args.requests))
    print(f"{args.requests} sequential chats per run, {args.rounds} rounds, OTLP {args.protocol}")
    print("otel off: " + ", ".join(f"{x:.3f}" for x in off) + " ms CPU/request")
    print("otel on:  " + ", ".join(f"{x:.3f}" for x in on) + " ms CPU/request")
    diffs = [b - a for a, b in zip(off, on, strict=True)]
    print("cost:     " + ", ".join(f"+{d:.3f} ms ({100 * d / a:+.0f} %)" for d, a in zip(diffs, off, strict=True))
          + f"; the receiver decoded {receiver.spans} spans and {receiver.metric_exports} metric exports")
    return 0


if __name__ == "__main__":
    sys.exit(main())
