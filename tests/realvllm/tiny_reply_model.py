"""A tiny Qwen3 whose weights answer every prompt with one fixed short reply, then stop.

The random-weight tiny model (tiny_model.py) never emits EOS: every answer runs
to its limit, and Claude Code reads a reply cut by ``max_tokens`` as "Claude's
response exceeded the 32000 output token maximum" (docs/agents.md).  An agent
session on the real engine needs replies that end by themselves, at any
temperature.  No training is needed:

- every layer's ``o_proj`` and ``down_proj`` are zero, so attention and the MLP
  add nothing to the residual stream: the hidden state at the last position is
  the embedding of the last token alone, and the next token is a function of
  the last token (a first-order Markov chain);
- ``embed_tokens`` maps every token to the one-hot direction e0, except the
  reply's k tokens, the i-th to e_i;
- the untied ``lm_head`` maps e0 to the reply's first token, e_i to the reply's
  token i + 1, and e_k to ``<|im_end|>`` (the EOS of generation_config.json).

RMSNorm scales a one-hot hidden of width d to sqrt(d) = 8, so the chosen
token's logit is 8 x `LOGIT_WEIGHT` = 64 and every other logit is 0: the others
together weigh ~151,668 e^-64 ≈ 2e-23, so sampling at temperature 1 follows the
chain too.  A prompt ends with the template's generation prompt (never with a
reply token), so every answer is the reply and EOS.  A reply whose tokens repeat
is not a first-order chain and is refused.

Built like the other tiny models (the real tokenizer copied in, a manifest of
builder version, reply and tokenizer hashes, ``build_into``'s staging); the
script half needs the vLLM venv's torch, safetensors and tokenizers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from .tiny_model import (
    HIDDEN_SIZE,
    SEED,
    _copied_files,
    build_into,
    expected_manifest,
    full_vocab_size,
    generation_config,
    model_config,
    special_token_ids,
    weight_shapes,
)

BUILDER_VERSION = 1
REPLY = "Done."
LOGIT_WEIGHT = 8.0


def manifest(tokenizer_source: Path, reply: str = REPLY) -> dict[str, Any]:
    """What a current build records: this builder's version, the reply and the tokenizer files' hashes."""
    return {**expected_manifest(tokenizer_source), "builder": "tiny_reply_model",
            "builder_version": BUILDER_VERSION, "reply": reply}


def ensure_reply_model(model_dir: Path, tokenizer_source: Path, python: Path, log_path: Path,
                       reply: str = REPLY) -> bool:
    """Build the model into `model_dir` unless a current build is there; True when it built.
    The caller holds a lock against concurrent builders (tiny_model.build_into)."""
    command = [str(python), "-m", __name__, "--tokenizer", str(tokenizer_source), "--reply", reply]
    return build_into(model_dir, manifest(tokenizer_source, reply), command, log_path,
                      env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})


def chain(reply_ids: list[int], eos: int) -> list[tuple[int, int]]:
    """(hidden direction, next token) of each link: e0 -> the first reply token, e_i -> token i + 1,
    e_k -> EOS. Refuses a reply a first-order chain cannot say."""
    if len(set(reply_ids)) != len(reply_ids) or eos in reply_ids:
        raise ValueError(f"the reply's tokens {reply_ids} repeat (or hold EOS): not a first-order chain")
    if not 0 < len(reply_ids) < HIDDEN_SIZE:
        raise ValueError(f"a reply of {len(reply_ids)} tokens needs 1 to {HIDDEN_SIZE - 1}")
    return list(enumerate([*reply_ids, eos]))


def write_model(out: Path, tokenizer_source: Path, reply: str) -> None:
    """Write the whole model directory. Needs torch, safetensors and tokenizers (the vLLM venv has them)."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer

    out.mkdir(parents=True, exist_ok=True)
    for name in _copied_files(tokenizer_source):
        shutil.copyfile(tokenizer_source / name, out / name)
    vocab_size = full_vocab_size(tokenizer_source / "tokenizer.json")
    bos, eos = special_token_ids(tokenizer_source)
    config = {**model_config(vocab_size, bos, eos), "tie_word_embeddings": False}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps(generation_config(bos, eos), indent=2, sort_keys=True) + "\n")
    reply_ids = Tokenizer.from_file(str(tokenizer_source / "tokenizer.json")).encode(
        reply, add_special_tokens=False).ids
    links = chain(reply_ids, eos[0])

    generator = torch.Generator().manual_seed(SEED)
    shapes = {**weight_shapes(vocab_size), "lm_head.weight": (vocab_size, HIDDEN_SIZE)}
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape)
        elif name.endswith(("o_proj.weight", "down_proj.weight", "embed_tokens.weight", "lm_head.weight")):
            tensor = torch.zeros(shape)
        else:       # q, k, v, gate, up: anything; their outputs are multiplied by zero
            tensor = torch.randn(shape, generator=generator) * 0.02
        tensors[name] = tensor
    embed, head = tensors["model.embed_tokens.weight"], tensors["lm_head.weight"]
    embed[:, 0] = 1.0
    for direction, token in enumerate(reply_ids, start=1):
        embed[token, 0], embed[token, direction] = 0.0, 1.0
    for direction, token in links:
        head[token, direction] = LOGIT_WEIGHT
    save_file({name: tensor.to(torch.bfloat16).contiguous() for name, tensor in tensors.items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the tiny Qwen3 that answers a fixed reply and stops.")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True,
                        help="directory holding the real Qwen3 tokenizer files")
    parser.add_argument("--reply", default=REPLY)
    args = parser.parse_args(argv)
    write_model(args.out, args.tokenizer, args.reply)
    print(f"tiny reply model ({args.reply!r}) written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
