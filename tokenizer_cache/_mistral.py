"""Mistral models in vLLM's `mistral` tokenizer mode: mistral-common encodes everything.

With `tokenizer_mode=mistral` (chosen by `auto` for Mistral-format folders,
see `_family`) vLLM 0.32 loads `tekken.json` or `tokenizer.model.v*` into
mistral-common (through transformers' MistralCommonBackend, in
ValidationMode.test) and uses no HF chat template: a chat request's messages
and tools go to `ChatCompletionRequest.from_openai` and
`encode_chat_completion`; a completions prompt is encoded with BOS when
`add_special_tokens` (the default) and never parses special-token text, so a
user typing `[INST]` or `</s>` gets plain text, not control tokens.

The request handling restated here is vLLM's (vllm/renderers/online_renderer.py
`render_chat`, vllm/tokenizers/mistral.py `maybe_serialize_tool_calls`,
`truncate_tool_call_ids`, `validate_request_params`, `MistralTokenizer.encode`
and `apply_chat_template`) and transformers 5.19's
(`MistralCommonBackend.apply_chat_template`, `_maybe_adapt_message`).

mistral-common is an optional dependency (`pip install 'brimful[mistral]'`):
without it loading raises ValueError, and the proxy counts these models with
the upstream's /tokenize, which is exact in this mode.
"""

from __future__ import annotations

import copy
import pathlib
from typing import TYPE_CHECKING, Any, cast

from . import _chat, _completion
from ._errors import CountError
from ._piece_cache import PieceCountCache
from ._piece_count import PieceCounter, PieceTally

if TYPE_CHECKING:
    from mistral_common.tokens.tokenizers.mistral import (
        MistralTokenizer as MistralCommonTokenizer,
    )

_TOOL_CALL_ID_CHARS = 9  # vLLM keeps the last 9 characters of longer ids


def tokenizer_file(directory: pathlib.Path) -> pathlib.Path:
    """The file mistral-common loads from a folder (`get_one_valid_tokenizer_file`):
    tekken.json if present, else the last-named SentencePiece `*.model[.vN[mM]]`."""
    try:
        from mistral_common.tokens.tokenizers.utils import get_one_valid_tokenizer_file
    except ImportError as exc:
        raise _missing_dependency(directory) from exc
    names = [entry.name for entry in directory.iterdir() if entry.is_file()]
    try:
        return directory / get_one_valid_tokenizer_file(names)
    except ValueError:
        raise FileNotFoundError(
            f"{directory} holds no Mistral tokenizer file (tekken.json or tokenizer.model.v*), which "
            "vLLM's mistral tokenizer mode needs."
        ) from None


def _missing_dependency(directory: pathlib.Path) -> ValueError:
    return ValueError(
        f"{directory} is a Mistral-format model, which vLLM tokenizes with mistral-common; install "
        "brimful's 'mistral' extra to count it locally (without it, counts come from the upstream's "
        "/tokenize)."
    )


class MistralTokenizer:
    """Counts prompt tokens for a model vLLM serves in the mistral tokenizer mode."""

    family = "mistral"
    piece_fallback: str | None = "mistral-common encodes whole prompts"

    def __init__(self, source_dir: pathlib.Path, file: pathlib.Path,
                 mistral: MistralCommonTokenizer[Any, Any, Any, Any, Any]) -> None:
        self.source_dir = source_dir
        self.tokenizer_file = file
        self._mistral = mistral
        self._raw = mistral.instruct_tokenizer.tokenizer
        self._version = int(str(self._raw.version.value).split("v")[-1])

    # -- chat -------------------------------------------------------------

    def count_chat(self, body: dict[str, Any]) -> int:
        return len(self.chat_token_ids(body))

    def tally_chat(self, body: dict[str, Any]) -> PieceTally:
        tokens = self.count_chat(body)
        return PieceTally(tokens=tokens, pieces=1, added_tokens=0, encoded_pieces=1, encoded_tokens=tokens)

    def render_chat(self, body: dict[str, Any]) -> str:
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        return self._raw.decode(self.chat_token_ids(body), special_token_policy=SpecialTokenPolicy.KEEP)

    def chat_token_ids(self, body: Any) -> list[int]:
        """The prompt token ids vLLM gets from mistral-common for a chat request."""
        from mistral_common.exceptions import MistralCommonException
        from mistral_common.protocol.instruct.request import ChatCompletionRequest

        messages, tools, continue_final, effort = _request(body)
        try:
            request = ChatCompletionRequest.from_openai(
                messages=[_adapt_message(m) for m in messages],
                tools=tools,
                continue_final_message=continue_final,
                reasoning_effort=effort if self._version >= 15 else None,
            )
            return list(self._mistral.encode_chat_completion(request).tokens)
        except (AssertionError, MistralCommonException, ValueError, TypeError, KeyError) as exc:
            # vLLM's safe_apply_chat_template turns all of these into a 400.
            raise CountError(f"mistral-common refused the conversation: {exc}", param="messages") from exc

    # -- completions ------------------------------------------------------

    def count_completion(self, body: dict[str, Any]) -> list[int]:
        return _completion.count_prompts(body, lambda text, special: self.count_text(text, add_special_tokens=special))

    def count_text(self, text: str, *, add_special_tokens: bool) -> int:
        """`MistralTokenizer.encode`: BOS when add_special_tokens, never EOS; control-token
        text is encoded as plain text."""
        return len(self._raw.encode(text, bos=add_special_tokens, eos=False))

    # -- what the proxy asks of every model ---------------------------------

    def with_piece_cache(self, piece_cache: PieceCountCache | None) -> MistralTokenizer:
        return self  # no per-piece counting: mistral-common has no `tokenizers` model to split

    @property
    def piece_counter(self) -> PieceCounter | None:
        return None

    def __repr__(self) -> str:
        return f"MistralTokenizer({str(self.tokenizer_file)!r})"


def _request(body: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, bool, str | None]:
    """(messages, tools, continue_final_message, reasoning_effort) as vLLM hands them on."""
    if not isinstance(body, dict):
        raise CountError("The request body must be a JSON object.")
    _chat.check_no_request_template(body)
    if body.get("chat_template_kwargs") is not None:
        raise CountError("chat_template is not supported for Mistral tokenizers.", param="chat_template")
    effort = body.get("reasoning_effort")
    if effort is not None:
        from mistral_common.protocol.instruct.request import ReasoningEffort

        if not isinstance(effort, str) or effort not in list(ReasoningEffort):
            raise CountError(
                f"reasoning_effort={effort} is not supported by Mistral models. Supported values are: "
                f"{[e.value for e in ReasoningEffort]}.",
                param="reasoning_effort",
            )
    add_generation = _chat._as_bool(body, "add_generation_prompt", True)
    continue_final = _chat._as_bool(body, "continue_final_message", False)
    if add_generation and continue_final:
        raise CountError(
            "Cannot set both `add_generation_prompt` and `continue_final_message` to True.",
            param="continue_final_message",
        )
    tools = _tools(body)
    raw = _chat.message_list(body)
    if not raw:
        raise CountError("'messages' is empty: send at least one message.", param="messages")
    messages = [_message(m, f"messages[{i}]") for i, m in enumerate(raw)]
    last = messages[-1]["role"]
    if add_generation and last == "assistant":
        raise CountError(
            "Cannot set `add_generation_prompt` to True when the last message is from the assistant. "
            "Consider using `continue_final_message` instead.",
            param="messages",
        )
    if continue_final and last != "assistant":
        raise CountError(
            "Cannot set `continue_final_message` to True when the last message is not from the assistant.",
            param="messages",
        )
    return messages, tools, continue_final, effort


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """`[tool.model_dump() for tool in request.tools]`: name, description and parameters
    always (null when missing), `strict` and `defer_loading` when sent."""
    parsed = _chat.parse_tools(body)
    if parsed is None:
        return None
    tools = []
    for raw, tool in zip(body["tools"], parsed, strict=True):
        function = dict(tool["function"])
        for key in ("strict", "defer_loading"):
            if raw["function"].get(key) is not None:
                function[key] = raw["function"][key]
        dumped: dict[str, Any] = {"type": "function", "function": function}
        if raw.get("defer_loading") is not None:
            dumped["defer_loading"] = raw["defer_loading"]
        tools.append(dumped)
    return tools


def _message(message: Any, where: str) -> dict[str, Any]:
    """One request message after vLLM's request model and its Mistral fix-ups."""
    role = _chat.check_message_shape(message, where)
    message = copy.deepcopy(message)
    legacy = message.pop("reasoning_content", None)
    if legacy is not None and message.get("reasoning") is None:
        message["reasoning"] = legacy
    content = message.get("content")
    if isinstance(content, list):
        for i, part in enumerate(content):
            if isinstance(part, dict) and (part.get("type") in _chat._MEDIA_PART_TYPES or any(
                key in part for key in _chat._MEDIA_KEYS
            )):
                raise _chat.media_not_countable(f"{where}.content[{i}]", str(part.get("type")))
    if role == "assistant":
        calls = message.get("tool_calls")
        if calls is None:
            calls = []
        if not isinstance(calls, list):
            raise _chat._bad_type(f"{where}.tool_calls", "an array of tool calls", calls)
        for call in calls:
            call_id = call.get("id") if isinstance(call, dict) else None
            if not isinstance(call_id, str):
                raise CountError(f"'{where}.tool_calls' entries need a string 'id'.", param="messages")
            call["id"] = call_id[-_TOOL_CALL_ID_CHARS:]
        message["tool_calls"] = calls
    elif role in ("tool", "tool_results") and "tool_call_id" in message:
        call_id = message["tool_call_id"]
        if not isinstance(call_id, str):
            raise _chat._bad_type(f"{where}.tool_call_id", "a string", call_id)
        message["tool_call_id"] = call_id[-_TOOL_CALL_ID_CHARS:]
    return cast(dict[str, Any], message)


def _adapt_message(message: dict[str, Any]) -> dict[str, Any]:
    """transformers' `_maybe_adapt_message` for text: parts without a type are dropped."""
    content = message.get("content")
    if not content or isinstance(content, str):
        return message
    return {**message, "content": [part for part in content if not isinstance(part, dict) or part.get("type")]}


def load_mistral_tokenizer(directory: pathlib.Path) -> MistralTokenizer:
    """Load the folder's tekken.json / tokenizer.model.v* as vLLM does (ValidationMode.test)."""
    file = tokenizer_file(directory)
    try:
        from mistral_common.protocol.instruct.validator import ValidationMode
        from mistral_common.tokens.tokenizers.mistral import (
            MistralTokenizer as MistralCommonTokenizer,
        )
    except ImportError as exc:
        raise _missing_dependency(directory) from exc
    try:
        mistral = MistralCommonTokenizer.from_file(str(file), mode=ValidationMode.test)
    except Exception as exc:  # mistral-common raises its own types and plain asserts
        raise ValueError(f"{file} could not be loaded by mistral-common: {exc}") from exc
    return MistralTokenizer(directory, file, mistral)
