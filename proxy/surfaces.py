"""The admitted API surfaces: what differs between them, one small object each.

Every admitted request goes through the same pipeline (`proxy.exchange`):
count the prompt, decide, forward, relay, record.  What a surface decides is
only where things are in its JSON and how its clients expect answers:

* which field holds the prompt and which fields hold the completion limit (in
  the engine's order of precedence), and the limit the engine applies when the
  client sends none;
* how the prompt is counted: with the model's tokenizer, or by the upstream's
  own `/tokenize` when no tokenizer is at hand;
* how an error is shaped, as a whole answer and as an event inside a stream
  that already started;
* where usage and finish reasons are read, in a whole answer and in stream
  events, and how a stream says it is complete.

Adding a surface is one more `Surface` here (and its tests); the pipeline does
not change.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenizer_cache import CountingModel

from .admission import RequestedLimit, read_requested_limit
from .errors import HeadroomError

# A request to the upstream's /tokenize, or a prompt already counted (token ids count as they are).
TokenizeCall = dict[str, Any] | int


@dataclass
class Usage:
    """What an answer reports about its lengths (a whole body, or a stream's events so far)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reasons: list[str] = field(default_factory=list)


class Surface:
    """One admitted route.  The defaults are OpenAI's (chat and completions share them)."""

    name: str                        # the record's and the metrics' `endpoint`
    path: str
    prompt_param: str                # the field holding the prompt, named in errors
    limit_fields: tuple[str, ...]    # completion-limit fields, the one that wins first
    default_limit_field = "max_tokens"
    implicit_max_tokens: int | None = None   # what the engine applies when no limit is sent
    stream_end_event = "'data: [DONE]' event"  # named when a stream breaks off without it

    # -- the request -------------------------------------------------------------

    def read_limit(self, body: Mapping[str, Any]) -> RequestedLimit:
        """The completion limit the client sent, validated the way vLLM validates it (400 otherwise)."""
        return read_requested_limit(body, self.limit_fields, self.default_limit_field)

    def is_stream(self, body: Mapping[str, Any]) -> bool:
        return body.get("stream") is True

    def choices(self, body: Mapping[str, Any]) -> int:
        """How many completions are generated per prompt (`n`)."""
        n = body.get("n")
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1

    def count(self, tokenizer: CountingModel, body: dict[str, Any]) -> int | list[int]:
        """Prompt tokens with the model's own tokenizer (one figure per prompt); raises CountError."""
        raise NotImplementedError

    def tokenize_calls(self, model: str, body: Mapping[str, Any]) -> list[TokenizeCall]:
        """The upstream /tokenize requests that count this prompt exactly (one per prompt)."""
        raise NotImplementedError

    def prompt_texts(self, tokenizer: CountingModel, body: dict[str, Any]) -> list[str]:
        """The texts vLLM holds to its character bound before encoding (none: no check)."""
        return []

    def ask_for_usage(self, body: Mapping[str, Any], changes: dict[str, Any]) -> bool:
        """Add what makes a stream report its usage, if it lacks it; True when added (see `is_usage_only`)."""
        return False

    # -- the answer ----------------------------------------------------------------

    def error_body(self, err: HeadroomError) -> bytes:
        """A whole error answer, in the envelope this surface's clients parse."""
        return err.body_bytes()

    def error_event(self, err: HeadroomError) -> bytes:
        """The error as the last event of a stream that already started."""
        return err.sse_event()

    def read_usage(self, data: Any, usage: Usage) -> None:
        """Add what one JSON answer (or stream event) says about lengths to `usage`."""
        if not isinstance(data, dict):
            return
        reported = data.get("usage")
        if isinstance(reported, dict):
            if isinstance(reported.get("prompt_tokens"), int):
                usage.prompt_tokens = reported["prompt_tokens"]
            if isinstance(reported.get("completion_tokens"), int):
                usage.completion_tokens = reported["completion_tokens"]
        choices = data.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                    usage.finish_reasons.append(choice["finish_reason"])

    # -- stream events (the `data:` payload of one SSE line) ----------------------

    def is_stream_end(self, payload: bytes) -> bool:
        """The event that says a stream is complete (OpenAI: `[DONE]`)."""
        return payload == b"[DONE]"

    def is_stream_error(self, payload: bytes) -> bool:
        """vLLM reports a failure after a stream started as `data: {"error": {...}}` (then [DONE])."""
        return payload.startswith(b'{"error"')

    def may_carry_usage(self, payload: bytes) -> bool:
        """A cheap test before parsing: vLLM's compact JSON says `"usage":null` and
        `"finish_reason":null` on every chunk that carries neither."""
        wants_usage = b'"usage"' in payload and b'"usage":null' not in payload
        wants_finish = b'"finish_reason"' in payload and b'"finish_reason":null' not in payload
        return wants_usage or wants_finish

    def is_usage_only(self, event: bytes) -> bool:
        """An event headroom asked for and the client did not (removed before it is relayed)."""
        return False


class OpenAIStreamUsage:
    """`stream_options.include_usage`: vLLM then ends a stream with a usage-only chunk.

    The upstream's usage lets headroom compare its count with the upstream's
    (drift) and record completion tokens; the extra chunk is removed again
    before it reaches a client that did not ask for it.
    """

    def ask_for_usage(self, body: Mapping[str, Any], changes: dict[str, Any]) -> bool:
        options = body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            return False
        if isinstance(options, dict) and options.get("include_usage") is True:
            return False
        changes["stream_options"] = {**(options or {}), "include_usage": True}
        return True

    def is_usage_only(self, event: bytes) -> bool:
        """vLLM's final usage chunk: `data: {..., "choices":[], "usage":{...}}`."""
        return event.startswith(b"data:") and b'"usage"' in event and (
            b'"choices":[]' in event or b'"choices": []' in event
        )


class ChatSurface(OpenAIStreamUsage, Surface):
    name = "chat"
    path = "/v1/chat/completions"
    prompt_param = "messages"
    # vLLM: max_completion_tokens wins when both are given.
    limit_fields = ("max_completion_tokens", "max_tokens")

    def count(self, tokenizer: CountingModel, body: dict[str, Any]) -> int | list[int]:
        return tokenizer.count_chat(body)

    def prompt_texts(self, tokenizer: CountingModel, body: dict[str, Any]) -> list[str]:
        return [tokenizer.render_chat(body)]          # the rendered conversation is one text

    def tokenize_calls(self, model: str, body: Mapping[str, Any]) -> list[TokenizeCall]:
        keys = ("messages", "tools", "add_generation_prompt", "continue_final_message",
                "chat_template_kwargs", "add_special_tokens", "chat_template", "documents")
        return [{"model": model, **{k: body[k] for k in keys if k in body}}]


class CompletionsSurface(OpenAIStreamUsage, Surface):
    name = "completions"
    path = "/v1/completions"
    prompt_param = "prompt"
    limit_fields = ("max_tokens",)
    # vLLM's default completion limit for /v1/completions when max_tokens is omitted
    # (vllm/entrypoints/openai/completion/protocol.py: `max_tokens: int | None = 16`;
    # captures/c18_completions_string_no_max_tokens.json).
    implicit_max_tokens = 16

    def count(self, tokenizer: CountingModel, body: dict[str, Any]) -> int | list[int]:
        return tokenizer.count_completion(body)

    def prompt_texts(self, tokenizer: CountingModel, body: dict[str, Any]) -> list[str]:
        prompt = body.get("prompt")                   # each text prompt is checked on its own
        if isinstance(prompt, str):
            return [prompt]
        return [p for p in prompt if isinstance(p, str)] if isinstance(prompt, list) else []

    def tokenize_calls(self, model: str, body: Mapping[str, Any]) -> list[TokenizeCall]:
        prompt = body.get("prompt")
        prompts = prompt if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else [prompt]
        add_special = body.get("add_special_tokens", True)
        return [
            len(p) if isinstance(p, list) else {"model": model, "prompt": p, "add_special_tokens": add_special}
            for p in prompts
        ]


CHAT = ChatSurface()
COMPLETIONS = CompletionsSurface()
# POST to these paths is admitted; every other path and method passes through.
ADMITTED: dict[str, Surface] = {s.path: s for s in (CHAT, COMPLETIONS)}


def parse_json_payload(payload: bytes) -> Any:
    """A JSON answer or event, or None when it is not JSON (it is then relayed, not read)."""
    try:
        return json.loads(payload)
    except ValueError:
        return None
