"""A tiny random-weight Qwen3 model that carries the REAL Qwen3 tokenizer and chat template.

vLLM's request handling (template rendering, token counting, validation,
errors, streaming) does not care whether the weights make sense, so a 2-layer,
64-wide model with the real tokenizer gives the real server behaviour in ~20 MB
and a ~30 s start on a 2-core CPU. Its text output is garbage and it never emits
EOS (tests must send a small ``max_tokens``).

Two halves:
- `ensure_tiny_model` runs in the test process (no torch there): it decides
  whether the cached model is current, and if not runs this file as a script
  with the vLLM venv's python, which has torch and safetensors.
- `main` (the script) writes config.json, generation_config.json, the weights
  and copies the tokenizer files. Weights come from a seeded generator, so a
  rebuild is byte-identical.

Shape constraints measured (docs/vllm-behaviour.md, a real vLLM on a CPU): ``head_dim`` must be
at least 32 (16 kills vLLM's CPU attention at the first request) and
``vocab_size`` must be the tokenizer's full size including added tokens
(151,669 for Qwen3) so every id the tokenizer can produce has an embedding row.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Bump when the files this builder writes change: a cached model with another
# version is rebuilt.
BUILDER_VERSION = 1
MANIFEST = "brimful-tiny-model.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# Copied (and hashed into the manifest) when the tokenizer folder has them.
OPTIONAL_FILES = ("chat_template.jinja",)
SEED = 20260101

# Qwen3 special-token ids, from the real tokenizer's added_tokens
# (<|endoftext|> = 151643, <|im_end|> = 151645); other tokenizers' come from
# their own files (`special_token_ids`), which gives these for Qwen3.
BOS_TOKEN_ID = 151643
EOS_TOKEN_IDS = [151645, 151643]

HIDDEN_SIZE = 64
INTERMEDIATE_SIZE = 128
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 32  # >= 32: 16 crashes vLLM's CPU attention backend (docs/vllm-behaviour.md)


def model_config(vocab_size: int, bos_token_id: int = BOS_TOKEN_ID,
                 eos_token_ids: list[int] | None = None) -> dict:
    """config.json for a Qwen3ForCausalLM of the tiny shape above.

    Field names and meaning follow the published Qwen3 configs (model_type
    ``qwen3``); ``max_position_embeddings`` is 40,960 like Qwen3-8B so vLLM's
    ``--max-model-len 2048`` is a real reduction, as in production.  The
    architecture carries any tokenizer: vLLM renders and counts with the
    tokenizer files, whatever the weights.
    """
    eos = eos_token_ids or EOS_TOKEN_IDS
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos[0],
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN_SIZE,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE_SIZE,
        "max_position_embeddings": 40960,
        "max_window_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_hidden_layers": NUM_LAYERS,
        "num_key_value_heads": NUM_KV_HEADS,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,  # halves the file: one [vocab, hidden] matrix
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }


def generation_config(bos_token_id: int = BOS_TOKEN_ID, eos_token_ids: list[int] | None = None) -> dict:
    """generation_config.json: stop ids only, no sampling defaults.

    vLLM applies a model's generation config as default sampling parameters;
    leaving them out keeps requests' behaviour the API defaults.
    """
    return {"bos_token_id": bos_token_id, "eos_token_id": eos_token_ids or EOS_TOKEN_IDS,
            "pad_token_id": bos_token_id}


def special_token_ids(tokenizer_source: Path) -> tuple[int, list[int]]:
    """(bos id, eos ids) of a tokenizer folder: its bos_token (else <|endoftext|>, else its
    eos) and its eos_token followed by the bos when they differ — Qwen3's pair for Qwen3."""
    data = json.loads((tokenizer_source / "tokenizer.json").read_text(encoding="utf-8"))
    ids = dict(data["model"]["vocab"]) if isinstance(data["model"].get("vocab"), dict) else {}
    ids.update({token["content"]: token["id"] for token in data.get("added_tokens", [])})
    config = json.loads((tokenizer_source / "tokenizer_config.json").read_text(encoding="utf-8"))

    def token(key: str) -> str | None:
        value = config.get(key)
        return value.get("content") if isinstance(value, dict) else value

    eos_text = token("eos_token")
    bos_text = token("bos_token") or ("<|endoftext|>" if "<|endoftext|>" in ids else eos_text)
    eos = ids.get(eos_text, 0)
    bos = ids.get(bos_text, eos)
    return bos, [eos] + ([bos] if bos != eos else [])


def full_vocab_size(tokenizer_json: Path) -> int:
    """Size of the tokenizer's id space including added tokens (max id + 1).

    The base BPE vocabulary alone (151,643 for Qwen3) misses the special tokens
    the chat template emits, whose ids would then fall outside the embedding.
    """
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    ids = list(data["model"]["vocab"].values())
    ids += [token["id"] for token in data.get("added_tokens", [])]
    return max(ids) + 1


def weight_shapes(vocab_size: int) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a Qwen3ForCausalLM checkpoint with tied embeddings."""
    q_width = NUM_HEADS * HEAD_DIM
    kv_width = NUM_KV_HEADS * HEAD_DIM
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab_size, HIDDEN_SIZE)}
    for layer in range(NUM_LAYERS):
        prefix = f"model.layers.{layer}"
        shapes.update(
            {
                f"{prefix}.input_layernorm.weight": (HIDDEN_SIZE,),
                f"{prefix}.post_attention_layernorm.weight": (HIDDEN_SIZE,),
                f"{prefix}.self_attn.q_proj.weight": (q_width, HIDDEN_SIZE),
                f"{prefix}.self_attn.k_proj.weight": (kv_width, HIDDEN_SIZE),
                f"{prefix}.self_attn.v_proj.weight": (kv_width, HIDDEN_SIZE),
                f"{prefix}.self_attn.o_proj.weight": (HIDDEN_SIZE, q_width),
                f"{prefix}.self_attn.q_norm.weight": (HEAD_DIM,),
                f"{prefix}.self_attn.k_norm.weight": (HEAD_DIM,),
                f"{prefix}.mlp.gate_proj.weight": (INTERMEDIATE_SIZE, HIDDEN_SIZE),
                f"{prefix}.mlp.up_proj.weight": (INTERMEDIATE_SIZE, HIDDEN_SIZE),
                f"{prefix}.mlp.down_proj.weight": (HIDDEN_SIZE, INTERMEDIATE_SIZE),
            }
        )
    shapes["model.norm.weight"] = (HIDDEN_SIZE,)
    return shapes


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _copied_files(tokenizer_source: Path) -> list[str]:
    return [*TOKENIZER_FILES, *(name for name in OPTIONAL_FILES if (tokenizer_source / name).is_file())]


def expected_manifest(tokenizer_source: Path) -> dict:
    """What a current build records: builder version and the source tokenizer files' hashes."""
    return {
        "builder_version": BUILDER_VERSION,
        "tokenizer_sha256": {name: file_sha256(tokenizer_source / name) for name in _copied_files(tokenizer_source)},
    }


def is_built(model_dir: Path, manifest: dict) -> bool:
    """True when `model_dir` holds a finished build whose manifest is `manifest`."""
    path = model_dir / MANIFEST
    if not path.exists() or not (model_dir / "model.safetensors").exists():
        return False
    try:
        return json.loads(path.read_text()) == manifest
    except ValueError:
        return False


def build_into(model_dir: Path, manifest: dict, command: list[str], log_path: Path,
               env: dict[str, str] | None = None) -> bool:
    """Run a builder `command` (given ``--out DIR`` last) into `model_dir` unless a build with
    this manifest is there; True when it built.  The caller holds a lock against concurrent
    builders.

    The build happens in a sibling temporary directory renamed into place at
    the end, so a reader never sees half a model.
    """
    from .venv import SetupError, log_tail, quiet_env

    if is_built(model_dir, manifest):
        return False
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}-", dir=model_dir.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the model is no secret
    try:
        with open(log_path, "w") as log:
            result = subprocess.run(
                [*command, "--out", str(staging)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**quiet_env(), **(env or {})},
                timeout=600,
                check=False,
            )
        if result.returncode != 0:
            raise SetupError(f"building {model_dir.name} failed (exit {result.returncode}):\n{log_tail(log_path)}")
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        if model_dir.exists():
            shutil.rmtree(model_dir)
        os.replace(staging, model_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return True


def ensure_tiny_model(model_dir: Path, tokenizer_source: Path, python: Path, log_path: Path) -> bool:
    """Build the tiny model into `model_dir` unless a current build (this builder, the same
    tokenizer files) is already there; True when it built (see `build_into`)."""
    command = [str(python), str(Path(__file__).resolve()), "--tokenizer", str(tokenizer_source)]
    return build_into(model_dir, expected_manifest(tokenizer_source), command, log_path)


def write_model(out: Path, tokenizer_source: Path) -> None:
    """Write the whole model directory. Needs torch and safetensors (the vLLM venv has both)."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for name in _copied_files(tokenizer_source):
        shutil.copyfile(tokenizer_source / name, out / name)
    vocab_size = full_vocab_size(tokenizer_source / "tokenizer.json")
    bos, eos = special_token_ids(tokenizer_source)
    (out / "config.json").write_text(json.dumps(model_config(vocab_size, bos, eos), indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps(generation_config(bos, eos), indent=2, sort_keys=True) + "\n")

    generator = torch.Generator().manual_seed(SEED)
    tensors = {}
    for name, shape in weight_shapes(vocab_size).items():
        # RMSNorm scales: identity, as at initialisation
        tensor = (torch.ones(shape) if name.endswith("norm.weight")
                  else torch.randn(shape, generator=generator) * 0.02)
        tensors[name] = tensor.to(torch.bfloat16).contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the tiny random-weight Qwen3 test model.")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True,
                        help="directory holding the real Qwen3 tokenizer files")
    args = parser.parse_args(argv)
    write_model(args.out, args.tokenizer)
    print(f"tiny model written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
