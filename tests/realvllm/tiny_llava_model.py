"""A tiny random-weight LLaVA-1.5-style model (CLIP tower, fixed grid) with the REAL Qwen2.5 tokenizer.

LLaVA-1.5 gives every image the same number of tokens: (336 / 14)**2 = 576
patches, plus CLIP's class token, minus that token again under
``vision_feature_select_strategy`` "default".  This model keeps those numbers
(a one-layer CLIP tower at 336 pixels, patch 14) around a 2-layer Qwen2
language model, so the tokenizer is the shared Qwen2.5 one; the image token is
``<|image_pad|>`` (``image_token_index`` 151655), which brimful's own chat
template (`TEMPLATE`, Qwen2-VL's shape without the vision start/end tokens)
prints for each image part.  Weights as in tiny_vl_model: names from
transformers' class on the meta device, values seeded.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .tiny_model import full_vocab_size
from .tiny_vl_model import IMAGE_PAD, builder_main, save_random_weights, write_files

BUILDER_VERSION = 2
SEED = 20261203

TEMPLATE = """\
{%- for message in messages -%}
<|im_start|>{{ message.role }}{{ '\\n' }}
{%- if message.content is string -%}
{{ message.content }}
{%- else -%}
{%- for part in message.content -%}
{%- if part.type == 'image' -%}<|image_pad|>{{ '\\n' }}
{%- elif part.type == 'text' -%}{{ part.text }}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
<|im_end|>{{ '\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_start|>assistant{{ '\\n' }}{%- endif -%}
"""


def model_config(vocab_size: int) -> dict:
    return {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "image_token_index": IMAGE_PAD,
        "vision_feature_select_strategy": "default",
        "vision_feature_layer": -1,
        "projector_hidden_act": "gelu",
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "qwen2",
            "vocab_size": vocab_size,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
        },
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 336,
            "patch_size": 14,
            "projection_dim": 64,
            "torch_dtype": "bfloat16",
        },
    }


def preprocessor_config() -> dict:
    return {
        "image_processor_type": "CLIPImageProcessor",
        "processor_class": "LlavaProcessor",
        "crop_size": {"height": 336, "width": 336},
        "size": {"shortest_edge": 336},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "resample": 3,
        "rescale_factor": 1 / 255,
    }


def write_tokenizer_dir(out: Path, tokenizer_source: Path) -> None:
    """Everything brimful reads (no weights)."""
    vocab_size = full_vocab_size(tokenizer_source / "tokenizer.json")
    files = {
        "config.json": model_config(vocab_size),
        "preprocessor_config.json": preprocessor_config(),
        "processor_config.json": {
            "image_token": "<|image_pad|>",
            "patch_size": 14,
            "vision_feature_select_strategy": "default",
            "num_additional_image_tokens": 1,
            "processor_class": "LlavaProcessor",
        },
        "generation_config.json": {"bos_token_id": 151643, "eos_token_id": [151645, 151643]},
    }
    write_files(out, tokenizer_source, files, TEMPLATE)


def write_model(out: Path, tokenizer_source: Path) -> None:
    write_tokenizer_dir(out, tokenizer_source)
    save_random_weights(out, "LlavaForConditionalGeneration", SEED)


def main(argv: list[str] | None = None) -> int:
    return builder_main(write_model, "Build the tiny random-weight LLaVA-style test model.", argv)


if __name__ == "__main__":
    sys.exit(main())
