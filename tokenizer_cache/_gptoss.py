"""A gpt-oss model: chats and Responses through harmony, completions through tokenizer.json.

vLLM 0.32 tokenizes /v1/completions prompts with the model's HF tokenizer
like for any model, but renders chat and Responses requests with harmony
(`_harmony`), so the folder's chat template, or its absence, does not matter.
"""

from __future__ import annotations

from typing import Any

from . import _harmony
from ._char_bound import check_chars
from ._harmony import HarmonyOptions
from ._model import ModelTokenizer
from ._piece_count import PieceTally


class HarmonyTokenizer(ModelTokenizer):
    """ModelTokenizer whose chat counts are vLLM's harmony prompts."""

    family = "harmony"
    harmony_options: HarmonyOptions = HarmonyOptions()

    def tally_chat(self, body: dict[str, Any], *, max_model_len: int | None = None) -> PieceTally:
        # vLLM's character bound holds for the prompt text (harmony renders to ids:
        # the bound is checked on their text, as the engine sees it).
        ids = self.chat_token_ids(body)
        if max_model_len is not None:
            check_chars(len(_harmony.encoding().decode(ids)), self._char_bound(body, max_model_len), max_model_len)
        tokens = len(ids)
        return PieceTally(tokens=tokens, pieces=1, added_tokens=0, encoded_pieces=1, encoded_tokens=tokens)

    def chat_token_ids(self, body: Any) -> list[int]:
        """The prompt token ids vLLM builds for a /v1/chat/completions request."""
        return _harmony.render(_harmony.chat_messages(body, self.harmony_options))

    def render_chat(self, body: dict[str, Any]) -> str:
        return _harmony.encoding().decode(self.chat_token_ids(body))

    def count_responses(self, body: Any) -> int:
        """Prompt tokens (`usage.input_tokens`) of a /v1/responses request.

        Raises CountError where vLLM answers 400, and with param
        "previous_response_id" for a request continuing a stored response,
        which only vLLM's store can render.
        """
        return len(self.responses_token_ids(body))

    def responses_token_ids(self, body: Any) -> list[int]:
        return _harmony.render(_harmony.responses_messages(body, self.harmony_options))

    def __repr__(self) -> str:
        return f"HarmonyTokenizer({str(self.source_dir)!r})"
