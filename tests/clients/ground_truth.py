"""Ask a running real vLLM 0.32 for the prompt-token count of every captured body.

    .venv/bin/python -m tests.clients.ground_truth --url http://127.0.0.1:PORT \\
        --model-dir models/Qwen--Qwen3-8B [--captured PATH] [--out PATH] [--responses-out PATH]

Each body of tests/corpus/clients_captured.jsonl is sent as captured except
that the model is the served one, streaming is off and the completion limit is
1 (`max_tokens`, and `max_completion_tokens` when present; `max_output_tokens`
for Responses): none of these change the prompt.  A 200 gives
`expected_prompt_tokens` (`usage.prompt_tokens`; `usage.input_tokens` for
Responses), anything else `expected_error` (the server's message).  Chat and
completions lines go to tests/corpus/clients.jsonl, Responses lines to
tests/corpus/clients_responses.jsonl, in the corpus line format
(docs/vllm-behaviour.md) plus `client` and `scenario`.  Lines already in the
output for another `model_dir` are kept, so one run per tokenizer (one tiny
model served at a time) fills the file.

The server must serve the tokenizer files of `--model-dir` (a tiny model built
around them, see tests/realvllm/tiny_model.py) with `--max-model-len` large
enough for the bodies and the hermes tool parser (`--enable-auto-tool-choice`).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tests.clients.recorder import _counting_body

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses"}
REFERENCE = "real vLLM 0.32.0 (CPU build, tiny random model around the tokenizer files), usage.prompt_tokens"


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def served_model(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as response:
        return json.loads(response.read())["data"][0]["id"]


def ground_truth(url: str, model_dir: str, line: dict, model: str) -> dict:
    endpoint = line["endpoint"]
    body = {**_counting_body(PATHS[endpoint], line["request"]), "model": model}
    status, answer = post(url + PATHS[endpoint], body)
    expected_tokens, expected_error = None, None
    if status == 200:
        usage = answer["usage"]
        expected_tokens = usage["input_tokens"] if endpoint == "responses" else usage["prompt_tokens"]
    else:
        error = answer.get("error", answer)
        expected_error = error.get("message", json.dumps(error)) if isinstance(error, dict) else str(error)
    short = Path(model_dir).name.split("--")[-1].lower()
    return {
        "id": f"{short}:{line['id']}",
        "client": line["client"],
        "scenario": line["scenario"],
        "model_dir": model_dir,
        "endpoint": endpoint,
        "request": line["request"],
        "expected_prompt_tokens": expected_tokens,
        "expected_error": expected_error,
        "reference": REFERENCE,
    }


def merge(path: Path, model_dir: str, new: list[dict]) -> None:
    kept = []
    if path.exists():
        kept = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
        kept = [x for x in kept if x["model_dir"] != model_dir]
    lines = kept + new
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the vLLM base URL, without /v1")
    parser.add_argument("--model-dir", required=True, help="the tokenizer folder, relative to shared/")
    parser.add_argument("--captured", type=Path, default=CORPUS / "clients_captured.jsonl")
    parser.add_argument("--out", type=Path, default=CORPUS / "clients.jsonl")
    parser.add_argument("--responses-out", type=Path, default=CORPUS / "clients_responses.jsonl")
    parser.add_argument("--endpoints", nargs="*", default=list(PATHS))
    args = parser.parse_args(argv)
    model = served_model(args.url)
    captured = [json.loads(x) for x in args.captured.read_text(encoding="utf-8").splitlines() if x.strip()]
    results = [ground_truth(args.url, args.model_dir, line, model)
               for line in captured if line["endpoint"] in args.endpoints]
    for result in results:
        error = result["expected_error"]
        outcome = result["expected_prompt_tokens"] if error is None else f"400 {error[:80]!r}"
        print(f"{result['id']:60} {outcome}", file=sys.stderr)
    merge(args.out, args.model_dir, [r for r in results if r["endpoint"] != "responses"])
    if any(r["endpoint"] == "responses" for r in results):
        merge(args.responses_out, args.model_dir, [r for r in results if r["endpoint"] == "responses"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
