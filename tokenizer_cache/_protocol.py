"""What every model-family counter offers the proxy, whichever renderer vLLM uses."""

from __future__ import annotations

import pathlib
from typing import Any, Protocol

from ._piece_cache import PieceCountCache
from ._piece_count import PieceCounter, PieceTally


class CountingModel(Protocol):
    """A loaded model: counts /v1/chat/completions and /v1/completions bodies as vLLM does.

    Implementations: ModelTokenizer (HF tokenizer + chat template),
    HarmonyTokenizer (gpt-oss), MistralTokenizer (mistral-common).
    Counting methods raise CountError where vLLM answers 400.
    """

    family: str  # "hf", "harmony" or "mistral" (_family.Family)
    source_dir: pathlib.Path
    piece_fallback: str | None

    def count_chat(self, body: dict[str, Any]) -> int: ...

    def tally_chat(self, body: dict[str, Any]) -> PieceTally: ...

    def render_chat(self, body: dict[str, Any]) -> str: ...

    def count_completion(self, body: dict[str, Any]) -> list[int]: ...

    def count_text(self, text: str, *, add_special_tokens: bool) -> int: ...

    def with_piece_cache(self, piece_cache: PieceCountCache | None) -> CountingModel: ...

    @property
    def piece_counter(self) -> PieceCounter | None: ...

