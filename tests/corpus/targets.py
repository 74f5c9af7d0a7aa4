"""The family corpora's targets: one real tokenizer each, and how vLLM was started for it.

Shared by the generator (which builds a tiny model around the tokenizer and
records a real server's answers) and tests/tokenizer_cache/test_family_corpus.py (which lays
out the same files in a folder and counts with brimful).
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Target:
    name: str  # also the corpus file name: tests/corpus/<name>.jsonl
    family: str  # tiny_models.py --family
    cases: str  # cases.py set: "hf", "gptoss" or "mistral"
    server_flags: tuple[str, ...]
    npm: str | None = None  # tests/support/npm_tokenizers.py package name
    mistral_file: str | None = None  # a file in mistral-common's package data
    mistral_sha256: str | None = None
    model_type: str | None = None  # config.json's model_type in the tiny model (HF families)

    @property
    def folder_tokenizer_name(self) -> str:
        """What the Mistral tokenizer file is called in a model folder (as mistral-common finds it)."""
        assert self.mistral_file is not None
        if self.mistral_file.endswith(".json"):
            return "tekken.json"
        return "tokenizer.model." + self.mistral_file.rsplit(".", 1)[-1]


_AUTO_TOOLS = ("--enable-auto-tool-choice",)

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("gptoss", "gpt_oss", "gptoss", (*_AUTO_TOOLS, "--tool-call-parser", "openai"),
               npm="gptoss", model_type="gpt_oss"),
        Target("llama3_1", "llama", "hf", (*_AUTO_TOOLS, "--tool-call-parser", "hermes"),
               npm="llama3_1", model_type="llama"),
        Target("gemma3", "gemma3_text", "hf", (*_AUTO_TOOLS, "--tool-call-parser", "hermes"),
               npm="gemma3", model_type="gemma3_text"),
        # Mistral-Nemo-Instruct-2407's tokenizer (tekken, v3).
        Target("mistral_tekken_v3", "mistral", "mistral", (*_AUTO_TOOLS, "--tool-call-parser", "mistral"),
               mistral_file="tekken_240718.json",
               mistral_sha256="eccd1665d2e477697c33cb7f0daa6f6dfefc57a0a6bceb66d4be52952f827516"),
        # Mistral-7B-Instruct-v0.3's (SentencePiece, v3).
        Target("mistral_spm_v3", "mistral", "mistral", (*_AUTO_TOOLS, "--tool-call-parser", "mistral"),
               mistral_file="mistral_instruct_tokenizer_240323.model.v3",
               mistral_sha256="9addc8bdce5988448ae81b729336f43a81262160ae8da760674badab9d4c7d33"),
        # Mistral-Large-Instruct-2411's (SentencePiece, v7: system prompts and tools in their own tokens).
        Target("mistral_spm_v7", "mistral", "mistral", (*_AUTO_TOOLS, "--tool-call-parser", "mistral"),
               mistral_file="mistral_instruct_tokenizer_241114.model.v7",
               mistral_sha256="1b968b8dc352f42192367337c78ccc61e1eaddc6d641a579372d4f20694beb7a"),
    )
}  # fmt: skip


def mistral_data_dir() -> Path:
    """mistral-common's package data (the tokenizer files it ships) in this environment."""
    return Path(str(importlib.resources.files("mistral_common") / "data"))
