"""A tiny random-weight Qwen2-VL model with the REAL Qwen2.5 tokenizer, for image ground truth.

vLLM's multimodal path (media loading, the Qwen2-VL processor's smart_resize
grid, placeholder expansion, usage counting) does not care whether the weights
make sense, so a 1-block vision tower and a 2-layer language model give the
real server behaviour in ~25 MB.

The files:
- tokenizer.json / tokenizer_config.json: copied from
  ``shared/models/Qwen--Qwen2.5-7B-Instruct`` (Qwen2-VL shares that vocabulary,
  ``<|vision_start|>`` … ``<|video_pad|>`` = 151652-151656).
- config.json: a ``Qwen2VLForConditionalGeneration`` with the real patch
  arithmetic (patch 14, spatial merge 2, temporal patch 2) and tiny widths
  (text head_dim 32: 16 kills vLLM's CPU attention, docs/vllm-behaviour.md).
- preprocessor_config.json: Qwen2VLImageProcessor in the flat
  ``min_pixels``/``max_pixels`` form the published Qwen2-VL/2.5-VL repositories
  use; ``max_pixels`` is 512 merged tokens' worth instead of 16,384 so the vision
  tower and vLLM's start-up profiling stay cheap on a CPU (same code path).
- chat_template.jinja: brimful's own template with the shape of Qwen2-VL's
  (ChatML turns, a default system turn, ``<|vision_start|><|image_pad|>
  <|vision_end|>`` per image part, optional "Picture N: " labels): written here,
  not copied, and iterating over content so vLLM hands it the "openai" form.
  `STRING_TEMPLATE` is the same without the loop: vLLM then puts the
  placeholders in front of the message text ("string" form).

Weights: names and shapes come from transformers' own model class built on the
meta device (so vLLM's loader finds what a real checkpoint has); values come
from a seeded generator, so a rebuild is byte-identical.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from .tiny_model import build_into, file_sha256, full_vocab_size

BUILDER_VERSION = 1
MANIFEST = "brimful-tiny-vl-model.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SEED = 20261201

# Qwen2.5 special tokens (shared/models/Qwen--Qwen2.5-7B-Instruct/tokenizer.json).
BOS_TOKEN_ID = 151643  # <|endoftext|>
EOS_TOKEN_IDS = [151645, 151643]  # <|im_end|>, <|endoftext|>
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = 151652, 151653, 151655, 151656

MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 512

OPENAI_TEMPLATE = """\
{%- set seen = namespace(images=0, videos=0) -%}
{%- for message in messages -%}
{%- if loop.first and message.role != 'system' -%}
<|im_start|>system
You are a helpful assistant.<|im_end|>{{ '\\n' }}
{%- endif -%}
<|im_start|>{{ message.role }}{{ '\\n' }}
{%- if message.content is string -%}
{{ message.content }}
{%- else -%}
{%- for part in message.content -%}
{%- if part.type == 'image' or 'image' in part or 'image_url' in part -%}
{%- set seen.images = seen.images + 1 -%}
{%- if add_vision_id %}Picture {{ seen.images }}: {% endif -%}
<|vision_start|><|image_pad|><|vision_end|>
{%- elif part.type == 'video' or 'video' in part -%}
{%- set seen.videos = seen.videos + 1 -%}
{%- if add_vision_id %}Video {{ seen.videos }}: {% endif -%}
<|vision_start|><|video_pad|><|vision_end|>
{%- elif 'text' in part -%}
{{ part.text }}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
<|im_end|>{{ '\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant{{ '\\n' }}
{%- endif -%}
"""

STRING_TEMPLATE = """\
{%- for message in messages -%}
{%- if loop.first and message.role != 'system' -%}
<|im_start|>system
You are a helpful assistant.<|im_end|>{{ '\\n' }}
{%- endif -%}
<|im_start|>{{ message.role }}{{ '\\n' }}{{ message.content }}<|im_end|>{{ '\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant{{ '\\n' }}
{%- endif -%}
"""

TEXT = {"hidden": 64, "intermediate": 128, "layers": 2, "heads": 2, "kv_heads": 1}  # head_dim 32
VISION = {"depth": 1, "embed_dim": 64, "heads": 2, "mlp_ratio": 2}


def model_config(vocab_size: int) -> dict:
    """config.json for a Qwen2VLForConditionalGeneration (transformers 5 layout: text_config + vision_config)."""
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "image_token_id": IMAGE_PAD,
        "video_token_id": VIDEO_PAD,
        "vision_start_token_id": VISION_START,
        "vision_end_token_id": VISION_END,
        "tie_word_embeddings": True,  # one [vocab, hidden] matrix
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "qwen2_vl_text",
            "vocab_size": vocab_size,
            "hidden_size": TEXT["hidden"],
            "intermediate_size": TEXT["intermediate"],
            "num_hidden_layers": TEXT["layers"],
            "num_attention_heads": TEXT["heads"],
            "num_key_value_heads": TEXT["kv_heads"],
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            # mrope sections add up to head_dim / 2
            "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
            "rope_theta": 1000000.0,
            "bos_token_id": BOS_TOKEN_ID,
            "eos_token_id": EOS_TOKEN_IDS[0],
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
        },
        "vision_config": {
            "model_type": "qwen2_vl_vision",
            "depth": VISION["depth"],
            "embed_dim": VISION["embed_dim"],
            "hidden_size": TEXT["hidden"],
            "mlp_ratio": VISION["mlp_ratio"],
            "num_heads": VISION["heads"],
            "in_channels": 3,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "hidden_act": "quick_gelu",
        },
    }


def preprocessor_config() -> dict:
    """preprocessor_config.json in the published Qwen2-VL form (flat min/max pixels)."""
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "rescale_factor": 1 / 255,
        "resample": 3,
    }


def generation_config() -> dict:
    return {"bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_IDS, "pad_token_id": BOS_TOKEN_ID}


def write_files(out: Path, tokenizer_source: Path, files: dict[str, dict], template: str | None = None) -> None:
    """Copy the tokenizer files and write the JSON `files` (and chat_template.jinja)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_source / name, out / name)
    for name, content in files.items():
        (out / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
    if template is not None:
        (out / "chat_template.jinja").write_text(template, encoding="utf-8")


def write_tokenizer_dir(out: Path, tokenizer_source: Path, template: str = OPENAI_TEMPLATE) -> None:
    """Everything brimful reads (no weights): what the fast tier counts with."""
    files = {
        "config.json": model_config(full_vocab_size(tokenizer_source / "tokenizer.json")),
        "preprocessor_config.json": preprocessor_config(),
        "generation_config.json": generation_config(),
    }
    write_files(out, tokenizer_source, files, template)


def expected_manifest(tokenizer_source: Path, module: str = __name__, version: int = BUILDER_VERSION) -> dict:
    return {
        "builder": module,
        "builder_version": version,
        "tokenizer_sha256": {name: file_sha256(tokenizer_source / name) for name in TOKENIZER_FILES},
    }


def ensure_built(
    model_dir: Path,
    tokenizer_source: Path,
    python: Path,
    log_path: Path,
    module: str = __name__,
    version: int = BUILDER_VERSION,
) -> bool:
    """Run builder `module` (``python -m module --tokenizer --out``) into `model_dir` unless a
    current build is there; True when it built (tiny_model.build_into).  The caller holds a lock."""
    command = [str(python), "-m", module, "--tokenizer", str(tokenizer_source)]
    return build_into(model_dir, expected_manifest(tokenizer_source, module, version), command, log_path,
                      env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})


def checkpoint_names(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """transformers 5 holds a CLIP/SigLIP tower without its "vision_model" level in
    memory; checkpoints, and vLLM's loader, keep it."""
    prefix = "model.vision_tower."
    return {
        prefix + "vision_model." + name[len(prefix):]
        if name.startswith(prefix) and not name.startswith(prefix + "vision_model.")
        else name: shape
        for name, shape in shapes.items()
    }


def random_weights(shapes: dict[str, tuple[int, ...]], seed: int) -> dict:
    """Seeded bf16 tensors: norms one, biases zero, the rest N(0, 0.02). Needs torch."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in sorted(shapes.items()):
        if name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "ln_q.weight")):
            tensor = torch.ones(shape)
        elif name.endswith("bias"):
            tensor = torch.zeros(shape)
        else:
            tensor = torch.randn(shape, generator=generator) * 0.02
        tensors[name] = tensor.to(torch.bfloat16).contiguous()
    return tensors


def save_random_weights(out: Path, architecture: str, seed: int) -> None:
    """model.safetensors for `out`/config.json: tensor names and shapes from transformers'
    class `architecture` built on the meta device, seeded values, the tied lm_head left
    out, checkpoint names.  Needs torch, safetensors and transformers (the vLLM venv)."""
    import torch
    import transformers
    from safetensors.torch import save_file

    config = transformers.AutoConfig.from_pretrained(out)
    with torch.device("meta"):
        model = getattr(transformers, architecture)(config)
        shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    shapes.pop("lm_head.weight", None)  # tied to the embedding
    tensors = random_weights(checkpoint_names(shapes), seed)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def builder_main(write_model: Callable[[Path, Path], None], description: str, argv: list[str] | None) -> int:
    """The command line every builder module runs as: --out DIR --tokenizer DIR."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with the real tokenizer files")
    args = parser.parse_args(argv)
    write_model(args.out, args.tokenizer)
    print(f"written to {args.out}")
    return 0


def write_model(out: Path, tokenizer_source: Path) -> None:
    write_tokenizer_dir(out, tokenizer_source)
    save_random_weights(out, "Qwen2VLForConditionalGeneration", SEED)


def main(argv: list[str] | None = None) -> int:
    return builder_main(write_model, "Build the tiny random-weight Qwen2-VL test model.", argv)


if __name__ == "__main__":
    sys.exit(main())
