"""Ask vLLM 0.32's own config code what it derives from a config.json (run with the vLLM venv's python).

Reads a JSON list of cases on stdin, each ``{"config": {...}, "max_model_len": int | null,
"tensor_parallel_sizes": [int, ...]}``; writes one JSON object per case on stdout:
``{"max_model_len": int}`` or ``{"error": "..."}``, and per TP size ``{"ok": bool,
"kv_heads_per_gpu": int | null, "error": str | null}``. Each config is written into a
temporary model folder beside the tiny model's tokenizer files (``argv[1]``), then
``vllm.config.ModelConfig`` parses it exactly as ``vllm serve`` would (no weights are read).
"""

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import launcher  # noqa: F401  (makes importlib.metadata.version("vllm") answer)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _short(exc: Exception) -> str:
    text = str(exc)
    marker = "Value error, "
    if marker in text:          # pydantic wraps vLLM's ValueError
        text = text.split(marker, 1)[1]
    return text.split(" [type=", 1)[0].strip()


def main() -> None:
    from vllm.config import ModelConfig, ParallelConfig

    tokenizer_dir = Path(sys.argv[1])
    cases = json.load(sys.stdin)
    out = []
    for case in cases:
        folder = Path(tempfile.mkdtemp(prefix="brimful-probe-"))
        (folder / "config.json").write_text(json.dumps(case["config"]))
        for name in ("tokenizer.json", "tokenizer_config.json"):
            os.symlink(tokenizer_dir / name, folder / name)
        result: dict = {}
        try:
            mc = ModelConfig(model=str(folder), max_model_len=case.get("max_model_len"), dtype="bfloat16")
            result["max_model_len"] = mc.max_model_len
        except Exception as exc:  # the refusal is the answer
            result["error"] = _short(exc)
            out.append(result)
            continue
        tps = []
        for tp in case.get("tensor_parallel_sizes", []):
            pc = ParallelConfig(tensor_parallel_size=tp)
            try:
                mc.verify_with_parallel_config(pc)
                tps.append({"tp": tp, "ok": True, "kv_heads_per_gpu": mc.get_num_kv_heads(pc), "error": None})
            except Exception as exc:  # vLLM raises ValueError or AssertionError
                tps.append({"tp": tp, "ok": False, "kv_heads_per_gpu": None, "error": _short(exc)})
        result["tensor_parallel"] = tps
        out.append(result)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
