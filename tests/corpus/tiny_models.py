"""Tiny random-weight models around real tokenizers, for real-vLLM ground truth.

vLLM's request handling (rendering, tokenizing, validation) does not depend on
the weights, so a 2-layer, 64-wide model carrying a family's real tokenizer
files makes a real vLLM 0.32 CPU server count prompts exactly as it would for
the full model, in tens of MB and a ~30 s start.  Shapes follow
tests/realvllm/tiny_model.py (head_dim >= 32; vocab_size covers every id the
tokenizer can produce).

Families:
- `gpt_oss`: GptOssForCausalLM (model_type gpt_oss; vLLM renders chats with harmony)
- `llama`: LlamaForCausalLM (model_type llama, as the Llama 3.x configs say)
- `gemma3_text`: Gemma3ForCausalLM (model_type gemma3_text, as gemma-3-1b-it)
- `mistral`: a Mistral-format folder, params.json + consolidated.safetensors +
  the tokenizer file, which vLLM's tokenizer_mode=auto serves in mistral mode

Run with the vLLM venv's python (it has torch, transformers, safetensors):
    python tests/corpus/tiny_models.py --family llama --tokenizer DIR --out DIR
Weights come from a seeded generator, so a rebuild is identical.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

SEED = 20261201
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 128, 2, 4, 2, 32
# Written into each model folder: a cached build whose recipe differs is rebuilt.
BUILDER_VERSION = 1
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def full_vocab_size(tokenizer_json: Path) -> int:
    """max id + 1 over the BPE vocabulary and the added tokens."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
    ids += [token["id"] for token in data.get("added_tokens", [])]
    return max(ids) + 1


def _config(family: str, vocab_size: int):
    import transformers

    common = {
        "vocab_size": vocab_size, "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
    }  # fmt: skip
    if family == "gpt_oss":
        # gpt-oss's own vocabulary size and special ids (<|startoftext|>, <|endoftext|>, <|return|>).
        return transformers.GptOssConfig(
            **{**common, "vocab_size": max(vocab_size, 201088), "intermediate_size": HIDDEN},
            num_local_experts=4, num_experts_per_tok=2, sliding_window=128, max_position_embeddings=131072,
            bos_token_id=199998, eos_token_id=200002, pad_token_id=199999,
        )  # fmt: skip
    if family == "llama":
        # Llama 3.1's context and special ids (<|begin_of_text|>, <|eot_id|>).
        return transformers.LlamaConfig(
            **common, max_position_embeddings=131072, rope_theta=500000.0, bos_token_id=128000,
            eos_token_id=128009, tie_word_embeddings=True,
        )  # fmt: skip
    if family == "gemma3_text":
        # gemma-3-1b-it: 32k context, <bos> = 2, <eos> = 1, <end_of_turn> = 106.
        return transformers.Gemma3TextConfig(
            **common, max_position_embeddings=32768, query_pre_attn_scalar=HEAD_DIM, sliding_window=512,
            bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0,
        )  # fmt: skip
    raise ValueError(f"unknown family {family!r}")


def _model_class(family: str):
    import transformers

    return {
        "gpt_oss": transformers.GptOssForCausalLM,
        "llama": transformers.LlamaForCausalLM,
        "gemma3_text": transformers.Gemma3ForCausalLM,
    }[family]


def build_hf(family: str, tokenizer: Path, out: Path) -> None:
    import torch

    config = _config(family, full_vocab_size(tokenizer / "tokenizer.json"))
    torch.manual_seed(SEED)
    model = _model_class(family)(config).to(torch.bfloat16)
    model.save_pretrained(str(out))
    for name in HF_TOKENIZER_FILES:
        shutil.copyfile(tokenizer / name, out / name)


def _mistral_vocab_size(tokenizer_file: Path) -> int:
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.from_file(str(tokenizer_file)).instruct_tokenizer.tokenizer.n_words


def build_mistral(tokenizer_file: Path, out: Path) -> None:
    """params.json + consolidated.safetensors in Mistral's own layout (vLLM's `mistral_mapping`)."""
    import torch
    from safetensors.torch import save_file

    vocab = _mistral_vocab_size(tokenizer_file)
    out.mkdir(parents=True, exist_ok=True)
    params = {
        "dim": HIDDEN, "n_layers": LAYERS, "head_dim": HEAD_DIM, "hidden_dim": INTERMEDIATE, "n_heads": HEADS,
        "n_kv_heads": KV_HEADS, "norm_eps": 1e-05, "vocab_size": vocab, "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
    }  # fmt: skip
    (out / "params.json").write_text(json.dumps(params, indent=2) + "\n")
    generator = torch.Generator().manual_seed(SEED)

    def weight(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    tensors = {"tok_embeddings.weight": weight(vocab, HIDDEN), "norm.weight": ones(HIDDEN),
               "output.weight": weight(vocab, HIDDEN)}
    for i in range(LAYERS):
        p = f"layers.{i}"
        tensors.update({
            f"{p}.attention.wq.weight": weight(HEADS * HEAD_DIM, HIDDEN),
            f"{p}.attention.wk.weight": weight(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{p}.attention.wv.weight": weight(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{p}.attention.wo.weight": weight(HIDDEN, HEADS * HEAD_DIM),
            f"{p}.attention_norm.weight": ones(HIDDEN),
            f"{p}.ffn_norm.weight": ones(HIDDEN),
            f"{p}.feed_forward.w1.weight": weight(INTERMEDIATE, HIDDEN),
            f"{p}.feed_forward.w2.weight": weight(HIDDEN, INTERMEDIATE),
            f"{p}.feed_forward.w3.weight": weight(INTERMEDIATE, HIDDEN),
        })  # fmt: skip
    save_file(tensors, str(out / "consolidated.safetensors"), metadata={"format": "pt"})
    version = tokenizer_file.name.rsplit(".", 1)[-1]
    name = "tekken.json" if tokenizer_file.suffix == ".json" else "tokenizer.model." + version
    shutil.copyfile(tokenizer_file, out / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", required=True, choices=["gpt_oss", "llama", "gemma3_text", "mistral"])
    parser.add_argument("--tokenizer", type=Path, required=True,
                        help="HF tokenizer folder, or the Mistral tokenizer file")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.family == "mistral":
        build_mistral(args.tokenizer, args.out)
    else:
        build_hf(args.family, args.tokenizer, args.out)
    marker = {"builder_version": BUILDER_VERSION, "family": args.family}
    (args.out / "brimful-tiny-model.json").write_text(json.dumps(marker))
    print(f"tiny {args.family} model written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
