"""Which renderer vLLM 0.32 uses for a model directory: HF template, harmony or mistral-common.

vLLM decides per model, from the files it loads, and brimful must decide the
same way or count a different prompt:

- **harmony** when config.json's `model_type` is `gpt_oss` (vLLM's
  `OnlineRenderer.use_harmony`): chats and Responses are rendered with
  openai-harmony; completions still use the HF tokenizer (tokenizer.json).
- **mistral** when the tokenizer mode is `mistral`, or `auto` (vLLM's default)
  and the folder holds `consolidated*.safetensors` and `tekken.json` or
  `tokenizer.model.v*` (vllm/tokenizers/registry.py `resolve_tokenizer_args`:
  `is_mistral_model_repo` + `any_pattern_in_repo_files`, which match file
  *names* anywhere under a local folder).  mistral-common then encodes chats
  and prompts itself.
- **hf** otherwise: tokenizer.json + the jinja chat template.

For a Hugging Face cache snapshot vLLM lists the Hub repository's files (or,
offline, none, and falls back to hf); brimful only sees what the snapshot
holds, which for a model vLLM loaded in mistral mode includes the
consolidated weights and the tokenizer file it used.  An operator who passes
`--tokenizer-mode` to vLLM sets the same mode for brimful.
"""

from __future__ import annotations

import fnmatch
import json
import os
import pathlib
from typing import Literal

Family = Literal["hf", "harmony", "mistral"]
TokenizerMode = Literal["auto", "hf", "mistral"]
TOKENIZER_MODES: tuple[TokenizerMode, ...] = ("auto", "hf", "mistral")

_MISTRAL_WEIGHTS = ("consolidated*.safetensors",)
_MISTRAL_TOKENIZERS = ("tekken.json", "tokenizer.model.v*")


def model_type(directory: pathlib.Path) -> str | None:
    """config.json's `model_type`, or None when there is no readable config."""
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = config.get("model_type") if isinstance(config, dict) else None
    return value if isinstance(value, str) else None


def _file_names(directory: pathlib.Path) -> list[str]:
    """Base names of every file under `directory` (vLLM's `list_repo_files` for a local path)."""
    names = []
    for root, _dirs, files in os.walk(directory, followlinks=False):
        for name in files:
            if os.path.isfile(os.path.join(root, name)):  # a dangling symlink is no file
                names.append(name)
    return names


def is_mistral_layout(directory: pathlib.Path) -> bool:
    """vLLM's `tokenizer_mode=auto` rule for switching to mistral."""
    names = _file_names(directory)

    def any_match(patterns: tuple[str, ...]) -> bool:
        return any(fnmatch.fnmatch(name, pattern) for pattern in patterns for name in names)

    return any_match(_MISTRAL_WEIGHTS) and any_match(_MISTRAL_TOKENIZERS)


def check_tokenizer_mode(mode: str) -> TokenizerMode:
    if mode not in TOKENIZER_MODES:
        raise ValueError(f"tokenizer_mode must be one of {', '.join(TOKENIZER_MODES)}, got {mode!r}")
    return mode


def detect_family(directory: str | os.PathLike[str], tokenizer_mode: str = "auto") -> Family:
    """The renderer vLLM uses for the model in `directory` under `tokenizer_mode`."""
    mode = check_tokenizer_mode(tokenizer_mode)
    path = pathlib.Path(directory)
    if model_type(path) == "gpt_oss":
        return "harmony"
    if mode == "mistral" or (mode == "auto" and is_mistral_layout(path)):
        return "mistral"
    return "hf"
