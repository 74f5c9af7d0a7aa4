"""Record the request bodies real SDKs send (tests/corpus/clients_captured.jsonl).

    .venv/bin/python -m tests.clients.capture [--only NAME ...] [--out PATH]

Each scenario of tests/clients/drivers.py runs against the scripted recorder
(tests/clients/recorder.py); every chat, completions and Responses body it
sends is written as one line: `{"id", "client", "scenario", "endpoint",
"request"}`.  Scenarios run in their SDK's venv (tests/clients/envs.py).
tests/clients/ground_truth.py then asks a real vLLM for the counts.  Needs the
SDKs of the `[clients]` extra; no network beyond loopback.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from tests.clients.drivers import SCENARIOS, Scenario
from tests.clients.envs import run_scenario
from tests.clients.recorder import Recorder

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/responses": "responses"}
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "corpus" / "clients_captured.jsonl"


def capture(scenario: Scenario) -> list[dict]:
    """Run one scenario against a fresh recorder; one line per generation request."""
    with Recorder(scenario.script) as recorder:
        client = run_scenario(scenario, recorder.base_url)
        exchanges = list(recorder.exchanges)
    lines = []
    for turn, exchange in enumerate(e for e in exchanges if e.path in ENDPOINTS and e.body is not None):
        digest = hashlib.sha256(json.dumps(exchange.body, sort_keys=True).encode()).hexdigest()[:8]
        lines.append({
            "id": f"{scenario.name}:{turn}:{digest}",
            "client": client,
            "scenario": scenario.name,
            "endpoint": ENDPOINTS[exchange.path],
            "request": exchange.body,
        })
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="scenario names (default: all)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    chosen = [s for s in SCENARIOS if not args.only or s.name in args.only]
    lines = []
    for scenario in chosen:
        captured = capture(scenario)
        client = captured[0]["client"] if captured else "-"
        print(f"{scenario.name:32} {client:40} {len(captured)} bodies", file=sys.stderr)
        lines.extend(captured)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    print(f"{len(lines)} bodies -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
