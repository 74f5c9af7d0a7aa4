"""`brimful` command line: serve, count, report, plan, check-config.

Sub-commands other than `serve` live beside the code they drive
(`proxy.commands.count`, `proxy.commands.report`, `proxy.commands.plan`), each exposing
`register(subparsers)`; this module only assembles them.
"""

from __future__ import annotations

import argparse
import gc
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from proxy import __version__
from proxy.commands import count, plan, report
from proxy.config import Config, ConfigError, load_config
from proxy.logs import configure_logging
from proxy.workers.siblings import WorkerSlot

# each exposes register(subparsers); imported plainly, so a broken command fails loudly instead of vanishing
SUBCOMMANDS = (count, report, plan)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="brimful",
        description=(
            "An OpenAI-compatible proxy in front of vLLM that counts prompt tokens exactly and "
            "rewrites the completion limit instead of letting a context-length rejection reach the app."
        ),
    )
    parser.add_argument("--version", action="version", version=f"brimful {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser(
        "serve",
        help="run the proxy",
        description="Run the proxy. Point the openai client's base_url at http://HOST:PORT/v1.",
    )
    serve.add_argument("--config", metavar="FILE", help="TOML configuration (see config/brimful.toml)")
    serve.add_argument("--upstream", metavar="URL", action="append", default=None,
                       help="the vLLM server, e.g. http://127.0.0.1:8000; given again, one more upstream "
                            "(named upstream-2, upstream-3, ...): the same model with another max_model_len "
                            "makes pools routed by length")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8100)")
    serve.add_argument("--workers", type=int, metavar="N",
                       help="serving processes on the one port (default 1; docs/deployment.md, Workers)")
    serve.add_argument("--length-log", metavar="FILE",
                       help="append one JSON line of length figures per request to FILE ('-': standard output)")
    serve.add_argument(
        "--upstream-timeout",
        type=float,
        metavar="SECONDS",
        help="first-byte and idle-between-chunks timeout for the upstream (default 900)",
    )
    serve.add_argument("--margin-tokens", type=int, metavar="N", help="safety margin kept free when clamping")
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        metavar="SECONDS",
        help="after SIGTERM, how long in-flight requests and streams may run before they are cut (default 30)",
    )
    serve.add_argument("--upstream-metrics", action="store_true", default=None,
                       help="scrape each upstream's /metrics: its real KV pool and the time-to-add-capacity signals")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--log-json", action="store_true", default=None, help="one JSON object per log line")
    serve.set_defaults(func=run_serve)

    check = sub.add_parser(
        "check-config", help="validate a configuration file and print the effective settings"
    )
    check.add_argument("file", metavar="FILE")
    check.set_defaults(func=run_check_config)

    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def serve_overrides(args: argparse.Namespace) -> dict[str, object]:
    return {
        "upstream.url": args.upstream[0] if args.upstream else None,
        "upstreams": args.upstream[1:] if args.upstream else None,
        "server.host": args.host,
        "server.port": args.port,
        "server.workers": args.workers,
        "length_log.path": args.length_log,
        "upstream.timeout": args.upstream_timeout,
        "upstream.idle_timeout": args.upstream_timeout,
        "server.shutdown_timeout": args.shutdown_timeout,
        "policy.margin_tokens": args.margin_tokens,
        "upstream_metrics.enabled": args.upstream_metrics,
        "logging.level": args.log_level,
        "logging.json": args.log_json,
    }


def summary(config: Config) -> str:
    lines = [
        f"brimful {__version__}",
        f"  listen     http://{config.server.host}:{config.server.port}/v1"
        + (f" ({config.server.workers} workers)" if config.server.workers > 1 else ""),
        f"  upstream   {config.upstream.url} (connect {config.upstream.connect_timeout:g} s, "
        f"first byte/idle {config.upstream.timeout:g} s)",
    ]
    for entry in config.upstreams:
        lines.append(f"  upstream   {entry.url} ({entry.name}; models from its /v1/models)")
    lines += [
        f"  policy     {config.policy.on_overflow}, margin {config.policy.margin_tokens} tokens"
        + (f" + {config.policy.margin_fraction:.1%} of the prompt" if config.policy.margin_fraction else "")
        + f", min completion {config.policy.min_completion_tokens}",
        f"  length log {_length_log_target(config.length_log.path, config.length_log.format)}",
        f"  api keys   {len(config.server.api_keys) or 'none (open)'}",
        f"  pages      /metrics /stats /dashboard: {_pages_target(config)}",
        f"  back-pressure {config.upstream.max_concurrent_requests or 'off'}"
        + (f" in flight per upstream, wait {config.upstream.queue_timeout:g} s"
           if config.upstream.max_concurrent_requests else ""),
        f"  upstream metrics {_upstream_metrics(config)}",
        "  (served models, their max_model_len and tokenizer sources are logged once the upstream answers)",
    ]
    for name, model in config.models.items():
        parts = [f"{k}={v}" for k, v in vars(model).items() if v is not None]
        lines.append(f"  model      {name}: {', '.join(parts) or 'no overrides'}")
    return "\n".join(lines)


def _pages_target(config: Config) -> str:
    server = config.server
    where = f"http://{server.metrics_host or server.host}:{server.metrics_port}" if server.metrics_port else "here"
    if server.metrics_api_keys:
        return f"{where}, {len(server.metrics_api_keys)} metrics key(s)"
    if server.api_keys and not server.metrics_port:
        return f"{where}, API keys"
    return f"{where}, open"


def _upstream_metrics(config: Config) -> str:
    um = config.upstream_metrics
    if not um.enabled:
        return "off (--upstream-metrics reads each upstream's KV pool from its /metrics)"
    return f"{um.path} every {um.interval_s:g} s (timeout {um.timeout_s:g} s)"


def _length_log_target(path: str | None, fmt: str = "jsonl") -> str:
    if path and fmt == "parquet":
        return f"{path}/ (Parquet, rolled per replica and window)"
    if path == "-":
        return "standard output (JSON lines; brimful's own log goes to standard error)"
    return path or "off"


# The cyclic collector's first threshold for a serving process (CPython's default is 700).  Requests
# in flight hold thousands of young objects, nearly none of them in cycles; at 700 the collector ran
# about once per 26 requests and found them all still alive (docs/performance.md).
GC_YOUNG_THRESHOLD = 10_000


def collect_garbage_less_often() -> None:
    """Raise the young generation's threshold; the older generations keep theirs."""
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def run_serve(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, overrides=serve_overrides(args))
    except ConfigError as exc:
        print(f"brimful: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.logging.level, config.logging.json)
    print(summary(config), file=sys.stderr, flush=True)
    collect_garbage_less_often()    # before the workers fork: they inherit it

    import uvicorn

    from proxy import signals
    from proxy.app import BrimfulApp

    if config.server.workers > 1:
        from proxy.workers import supervisor as workers
        pages = None
        if config.server.metrics_port:
            host = config.server.metrics_host or config.server.host
            try:
                pages = _listen(host, config.server.metrics_port)
                pages.listen(workers.BACKLOG)
            except OSError as exc:
                print(f"brimful: cannot listen on {host}:{config.server.metrics_port}: {exc}", file=sys.stderr)
                return 1
        try:
            return workers.serve(config.server.host, config.server.port, config.server.workers,
                                 worker_runner(config, pages), shared=[] if pages is None else [pages])
        except OSError as exc:
            print(f"brimful: cannot listen on {config.server.host}:{config.server.port}: {exc}", file=sys.stderr)
            return 1

    signals.hold()                  # until the server handles them: a stop sent while starting is kept
    app = BrimfulApp(config)
    # uvicorn drains on SIGTERM, then re-raises the signal with the handler that
    # was installed before it started.
    signal.signal(signal.SIGTERM, signals.exit_cleanly)
    server = signals.Server(uvicorn.Config(app, host=config.server.host, port=config.server.port,
                                           **uvicorn_options(config)))
    if config.server.metrics_port:
        # brimful's pages on a listener of their own: the app tells them apart by the local port.
        sockets = [_listen(config.server.host, config.server.port),
                   _listen(config.server.metrics_host or config.server.host, config.server.metrics_port)]
        server.run(sockets=sockets)
    else:
        server.run()
    return 0 if server.started else 1


def worker_runner(config: Config, pages: socket.socket | None = None) -> Callable[[WorkerSlot, socket.socket], int]:
    """What each of `--workers N` runs: a BrimfulApp that knows its slot, under uvicorn, on its socket.

    `pages`: the server.metrics_port listener, one socket every worker inherits from the supervisor
    and accepts from (any worker answers the pages for all: proxy.workers.pages).  The supervisor
    holds it open throughout, so a worker that dies or drains leaves its connections to the others,
    and while none serves they wait in its queue."""
    import uvicorn

    from proxy.app import BrimfulApp
    from proxy.workers.handover import WorkerServer

    def run_worker(slot: WorkerSlot, sock: socket.socket) -> int:
        app = BrimfulApp(config, worker=slot)
        server = WorkerServer(uvicorn.Config(app, **uvicorn_options(config)), slot.channel)
        app.stop_requested = lambda: server.should_exit    # a replacement's wait to be ready ends on SIGTERM
        server.run(sockets=[sock] if pages is None else [sock, pages])
        return 0 if server.started else 1

    return run_worker


def uvicorn_options(config: Config) -> dict[str, Any]:
    """uvicorn's settings for one serving process (the only one, or each worker)."""
    from proxy.serving.server import uvicorn_settings

    return dict(
        log_level=config.logging.level,
        log_config=None,           # keep configure_logging's handlers (JSON stays JSON)
        access_log=False,          # access lines would carry paths only, but keep logs quiet by default
        server_header=False,       # relay the upstream's own Server and Date headers
        date_header=False,
        timeout_graceful_shutdown=config.server.shutdown_timeout,
        # brimful never reads the client address, so uvicorn's X-Forwarded-For
        # rewriting middleware would be pure per-request cost (~2 % of CPU, profiled).
        proxy_headers=False,
        # The limits uvicorn lacks (head size, head/body/idle timeouts, connections): proxy.serving.server.
        **uvicorn_settings(config),
    )


def _listen(host: str, port: int) -> socket.socket:
    """A bound TCP socket, as uvicorn binds its own (the server listens on it)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def run_check_config(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file, env={})
    except ConfigError as exc:
        print(f"{args.file}: {exc}", file=sys.stderr)
        return 1
    print(f"{args.file}: OK")
    print(summary(config))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
