"""Tokenizer loaders side by side: tokenizer.json as it is against transformers 5's AutoTokenizer build.

    python bench/loader_bench.py [--rounds 5] [--models NAME ...]

Each model is a folder holding its shared/models tokenizer files and a
config.json with `model_type` qwen3 (the real-vLLM tier's tiny model, under
which transformers 5 builds Phi-3 and R1-Distill-Llama as a LlamaTokenizer),
loaded both ways in the same run:

* load: a fresh Python process importing brimful and loading the folder
  (`load_model_tokenizer`): wall seconds and peak RSS (ru_maxrss), median of
  --rounds processes; "import" is that process's import of transformers alone;
* count: `count_chat` CPU ms of an ~800 and ~10k-token chat, warm, whole text
  (no piece/chat cache) and through a piece cache with the same chat resent
  plus one turn, median of --rounds; with the engine each load chose.

Names of the npm tokenizer packages (tests/support/npm_tokenizers.py: gemma3,
llama3_1, gptoss) are loaded from their fetched folder with their official
`model_type` (gemma3_text, llama, gpt_oss: gpt-oss renders with harmony).
--load-only skips the count figures.

Ratios are new / old.  Not a test.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import npm_tokenizers  # noqa: E402
from tokenizer_cache import PieceCountCache, load_model_tokenizer  # noqa: E402

MODELS = ROOT.parent.parent / "shared" / "models"
if not MODELS.is_dir():
    MODELS = pathlib.Path("/work/shared/models")
DEFAULT_MODELS = ["microsoft--Phi-3-mini-4k-instruct", "deepseek-ai--DeepSeek-R1-Distill-Llama-8B", "Qwen--Qwen3-8B"]
LOADERS = ("tokenizer_json", "transformers5")
_PROBE = """
import json, resource, sys, time
start = time.perf_counter()
sys.path.insert(0, {root!r})
from tokenizer_cache import load_model_tokenizer
model = load_model_tokenizer({folder!r}, tokenizer_loader={loader!r})
wall = time.perf_counter() - start
print(json.dumps({{"wall": wall, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "engine": model.engine, "cls": model.loader_info.tokenizer_class}}))
"""
_IMPORT = "import time; s = time.perf_counter(); import transformers; print(time.perf_counter() - s)"


NPM_MODEL_TYPES = {"gemma3": "gemma3_text", "llama3_1": "llama", "gptoss": "gpt_oss"}


def model_folder(name: str, root: pathlib.Path) -> pathlib.Path:
    if name in NPM_MODEL_TYPES:
        folder = npm_tokenizers.model_folder(name, root / name, NPM_MODEL_TYPES[name])
        if folder is None:
            raise SystemExit(f"npm tokenizer {name} not fetched: python3 tests/support/npm_tokenizers.py {name}")
        return folder
    folder = root / name
    folder.mkdir()
    for file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (MODELS / name / file).is_file():
            (folder / file).symlink_to(MODELS / name / file)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    return folder


def load_figures(folder: pathlib.Path, loader: str, rounds: int) -> dict:
    runs = []
    for _ in range(rounds):
        out = subprocess.run([sys.executable, "-c", _PROBE.format(root=str(ROOT), folder=str(folder), loader=loader)],
                             capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return {"wall": statistics.median(r["wall"] for r in runs), "rss_mb": statistics.median(r["rss_mb"] for r in runs),
            "engine": runs[0]["engine"], "cls": runs[0]["cls"]}


def chat(tokens: int) -> dict:
    paragraph = ("The proxy counts prompt tokens exactly as vLLM does, clamps the completion limit and "
                 "records lengths. Ünïcödé, 한국어 텍스트, code: def f(x): return x * 2\n")
    text = paragraph * max(1, tokens // 40)
    return {"messages": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": text}]}


def cpu_ms(fn, rounds: int) -> float:
    fn()
    times = []
    for _ in range(rounds):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e3


def count_figures(folder: pathlib.Path, loader: str, rounds: int) -> dict[str, float]:
    model = load_model_tokenizer(folder, tokenizer_loader=loader)
    figures = {}
    for size in (800, 10_000):
        body = chat(size)
        figures[f"whole {size}"] = cpu_ms(lambda body=body: model.count_chat(body), rounds)
        pieces = model.with_piece_cache(PieceCountCache())
        pieces.count_chat(body)
        turn = {"messages": [*body["messages"], {"role": "assistant", "content": "Noted."},
                             {"role": "user", "content": "And one more question?"}]}
        figures[f"pieces {size}+turn"] = cpu_ms(lambda turn=turn, pieces=pieces: pieces.count_chat(turn), rounds)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--load-only", action="store_true", help="load time and memory only, no count figures")
    args = parser.parse_args(argv)
    imports = [float(subprocess.run([sys.executable, "-c", _IMPORT], capture_output=True, text=True,
                                    check=True).stdout.strip().splitlines()[-1]) for _ in range(args.rounds)]
    print(f"import transformers alone: {statistics.median(imports):.2f} s (median of {args.rounds} processes)")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            folder = model_folder(name, pathlib.Path(tmp))
            load = {loader: load_figures(folder, loader, args.rounds) for loader in LOADERS}
            count = {loader: {} if args.load_only else count_figures(folder, loader, args.rounds)
                     for loader in LOADERS}
            old, new = load["tokenizer_json"], load["transformers5"]
            print(f"\n{name}: transformers5 builds {new['cls']}; engines {old['engine']} -> {new['engine']}")
            print(f"  {'':22} {'tokenizer_json':>15} {'transformers5':>14} {'ratio':>6}")
            print(f"  {'load s (process)':22} {old['wall']:15.2f} {new['wall']:14.2f} {new['wall'] / old['wall']:6.2f}")
            print(f"  {'peak RSS MB':22} {old['rss_mb']:15.0f} {new['rss_mb']:14.0f} "
                  f"{new['rss_mb'] / old['rss_mb']:6.2f}")
            for key in count["tokenizer_json"]:
                a, b = count["tokenizer_json"][key], count["transformers5"][key]
                print(f"  {'count_chat ms ' + key:22} {a:15.2f} {b:14.2f} {b / a:6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
