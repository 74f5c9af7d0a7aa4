"""The admitted API surfaces: what differs between them, one small object each.

Every admitted request goes through the same pipeline (`proxy.admitted.exchange`):
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
  events (by their SSE `event:` name where the surface names them), and how a
  stream says it is complete;
* how the decision is made: a completion limit clamped to the room
  (`proxy.admitted.admission.decide`), inputs checked one by one (pooling), or nothing
  counted at all when the prompt lives upstream (`uncounted`).

Adding a surface is one more `Surface` here (and its tests); the pipeline does
not change.  The surfaces: chat, completions, Responses, Anthropic Messages
(+ count_tokens, answered by brimful), and the pooling routes (embeddings,
pooling, score, rerank).

Finish reasons are recorded in OpenAI's words whatever the surface
(Responses' incomplete/max_output_tokens and Messages' max_tokens are
"length"), so the report's share of cut completions means one thing.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from proxy import errors
from proxy.admitted import jsonbody
from proxy.admitted.admission import (
    Decision,
    RequestedLimit,
    decide,
    decide_inputs,
    lax_int,
    read_requested_limit,
)
from proxy.admitted.request import AdmittedRequest
from proxy.config import Policy
from proxy.errors import BrimfulError
from proxy.recording.record import Action
from proxy.sizing.lengths import IMPLICIT_MAX_TOKENS
from tokenizer_cache import (
    CountError,
    CountingModel,
    HarmonyTokenizer,
    ModelTokenizer,
    count_messages,
    count_responses,
    lax_bool,
    responses_terms,
    responses_to_chat,
)


@dataclass(frozen=True)
class UpstreamCount:
    """One upstream request that answers a prompt's exact count: vLLM's /tokenize, or a
    surface's own counting route (Messages: /v1/messages/count_tokens)."""

    body: dict[str, Any]
    path: str = "/tokenize"
    field: str = "count"


# An upstream count request, or a prompt already counted (token ids count as they are).
TokenizeCall = UpstreamCount | int


@dataclass(frozen=True)
class CountSlice:
    """Some of a request's prompts: counted by `count` (on a counting thread), about `size` bytes."""

    count: Callable[[CountingModel], list[int]]
    size: int


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
    limit_fields: tuple[str, ...] = ()   # completion-limit fields, the one that wins first
    default_limit_field = "max_tokens"
    implicit_max_tokens: int | None = None   # what the engine applies when no limit is sent
    stream_end_event = "'data: [DONE]' event"  # named when a stream breaks off without it
    aliases: tuple[str, ...] = ()            # more paths vLLM serves the same route on
    compares_usage = True                    # the upstream's usage counts what brimful counts (drift)
    error_ends_stream = False                # an upstream error event is the stream's last (no [DONE] after)

    # -- the request -------------------------------------------------------------

    def read(self, body: bytes, fields: dict[str, Any]) -> AdmittedRequest:
        """The request as admission and the record see it, read once (400 for a limit vLLM refuses)."""
        return AdmittedRequest(body, fields, stream=self.is_stream(fields), n=self.choices(fields),
                               limit=self.read_limit(fields), stored=self.uncounted(fields))

    def read_limit(self, body: Mapping[str, Any]) -> RequestedLimit:
        """The completion limit the client sent, validated the way vLLM validates it (400 otherwise)."""
        return read_requested_limit(body, self.limit_fields, self.default_limit_field)

    def is_stream(self, body: Mapping[str, Any]) -> bool:
        """As vLLM reads `stream` (pydantic's lax bool: 1 and "true" stream too)."""
        try:
            return lax_bool(body.get("stream")) is True
        except ValueError:
            return False        # vLLM refuses the request

    def choices(self, body: Mapping[str, Any]) -> int:
        """How many completions are generated per prompt (`n`)."""
        n = body.get("n")
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1

    def uncounted(self, body: Mapping[str, Any]) -> str | None:
        """The field that makes this request's prompt invisible to brimful (it is then forwarded
        uncounted, `proxy.admitted.admission.decide_uncounted`), or None: it can be counted."""
        return None

    def count(self, tokenizer: CountingModel, body: dict[str, Any]) -> int | list[int]:
        """Prompt tokens with the model's own tokenizer (one figure per prompt); raises CountError."""
        raise NotImplementedError

    # The upstream may serve prompts longer than its /v1/models window here, which brimful cannot see:
    # a length refusal of brimful's is then sent on and answered only when the upstream refuses too.
    window_may_be_wider = False

    def invalid_prompt(self, exc: CountError, body: Mapping[str, Any]) -> BrimfulError:
        """A count's refusal as this surface's client reads it (the field it names, its own)."""
        return errors.invalid_prompt(exc.message, exc.param or self.prompt_param)

    def decide(self, request: Mapping[str, Any], prompt_tokens: list[int], max_model_len: int,
               limit: RequestedLimit, policy: Policy, *, model: str, count_exact: bool,
               drift_margin: int) -> Decision:
        """Pass, clamp or reject: a completion limit against the room left (chat's rule)."""
        return decide(prompt_tokens, max_model_len, limit, policy, model=model, prompt_param=self.prompt_param,
                      implicit_max_tokens=self.implicit_max_tokens, count_exact=count_exact,
                      drift_margin=drift_margin, floor=policy.floor(self.name))

    def tokenize_calls(self, model: str, body: Mapping[str, Any]) -> list[TokenizeCall]:
        """The upstream /tokenize requests that count this prompt exactly (one per prompt)."""
        raise NotImplementedError

    def prompt_texts(self, tokenizer: CountingModel, body: dict[str, Any]) -> list[str]:
        """The texts vLLM holds to its character bound before encoding (none: no check)."""
        return []

    def prompt_lengths(self, tokenizer: CountingModel, body: dict[str, Any], cap: int) -> list[int]:
        """The lengths of `prompt_texts`, each exact up to `cap` (above it: some length past `cap`,
        the render stopped there: a conversation's text is never built whole only to be refused)."""
        return [len(text) for text in self.prompt_texts(tokenizer, body)]

    def prompt_floor(self, tokenizer: CountingModel, body: dict[str, Any]) -> int:
        """Characters the prompt text has at least, proven from the body before anything is
        prepared or rendered (a chat template's floor by message roles); 0: nothing proven."""
        return 0

    def operator_truncates(self, policy: Policy) -> bool:
        """brimful itself makes vLLM truncate what is too long (then no character bound applies)."""
        return False

    def count_slices(self, body: dict[str, Any], slice_bytes: int) -> list[CountSlice] | None:
        """The count cut into pieces of about `slice_bytes` of request each, counted one after
        another, each within its own share of the counting budget; None: one piece."""
        return None

    def ask_for_usage(self, body: Mapping[str, Any], changes: dict[str, Any]) -> bool:
        """Add what makes a stream report its usage, if it lacks it; True when added (see `is_usage_only`)."""
        return False

    def follow_limit(self, body: Mapping[str, Any], changes: dict[str, Any]) -> None:
        """Change the fields a rewritten completion limit would make vLLM refuse: `min_tokens`
        above it (vLLM's SamplingParams refuses min_tokens > max_tokens) comes down to it."""
        limits = [changes[name] for name in self.limit_fields if isinstance(changes.get(name), int)]
        if not limits or body.get("min_tokens") is None:
            return
        try:
            least = lax_int(body["min_tokens"])
        except ValueError:
            return                  # vLLM refuses it whatever the limit
        if least > min(limits):
            changes["min_tokens"] = min(limits)

    def usage_must_match(self, body: Mapping[str, Any]) -> bool:
        """The upstream's usage must equal brimful's count of this request if the count is right.

        Only such answers may move a model's count trust (proxy.admitted.trust): a
        client asking vLLM to cut its prompt (truncation) gets usage that differs
        for reasons of its own, and no client may change how others are counted.
        """
        return self.compares_usage and not self.client_truncates(body)

    def client_truncates(self, body: Mapping[str, Any]) -> bool:
        """The request asks vLLM to cut the prompt to a length (then counted as cut)."""
        return False

    # -- the answer ----------------------------------------------------------------

    def error_body(self, err: BrimfulError) -> bytes:
        """A whole error answer, in the envelope this surface's clients parse."""
        return err.body_bytes()

    def error_event(self, err: BrimfulError, last_event: bytes = b"") -> bytes:
        """The error as the last event of a stream that already started (`last_event`: the
        payload of the last event relayed before it)."""
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

    # -- stream events: the SSE `event:` name (b"" when none) and the `data:` payload ----

    def is_stream_end(self, event: bytes, payload: bytes) -> bool:
        """The event that says a stream is complete (OpenAI: `[DONE]`)."""
        return payload == b"[DONE]"

    def is_stream_error(self, event: bytes, payload: bytes) -> bool:
        """vLLM reports a failure after a stream started as `data: {"error": {...}}` (then [DONE])."""
        return payload.startswith(b'{"error"')

    def may_carry_usage(self, event: bytes, payload: bytes) -> bool:
        """A cheap test before parsing: vLLM's compact JSON says `"usage":null` and
        `"finish_reason":null` on every chunk that carries neither."""
        wants_usage = b'"usage"' in payload and b'"usage":null' not in payload
        wants_finish = b'"finish_reason"' in payload and b'"finish_reason":null' not in payload
        return wants_usage or wants_finish

    def is_usage_only(self, event: bytes) -> bool:
        """An event brimful asked for and the client did not (removed before it is relayed)."""
        return False


class OpenAIStreamUsage:
    """`stream_options.include_usage`: vLLM then ends a stream with a usage-only chunk.

    The upstream's usage lets brimful compare its count with the upstream's
    (drift) and record completion tokens; the extra chunk is removed again
    before it reaches a client that did not ask for it.
    """

    def ask_for_usage(self, body: Mapping[str, Any], changes: dict[str, Any]) -> bool:
        """Whether brimful asked for the usage chunk the client did not (it is removed again).

        The options are read as vLLM reads them (1 and "true" ask too); a value vLLM refuses
        is left for vLLM to refuse, not replaced by one it accepts. The client's
        `continuous_usage_stats`, inert without `include_usage`, is turned off: with it vLLM
        would put usage on every chunk the client receives.
        """
        options = body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            return False
        try:
            asked = lax_bool(options.get("include_usage")) if options is not None else None
            continuous = lax_bool(options.get("continuous_usage_stats")) if options is not None else None
        except ValueError:
            return False
        if asked:
            return False
        changes["stream_options"] = {**(options or {}), "include_usage": True}
        if continuous:
            changes["stream_options"]["continuous_usage_stats"] = False
        return True

    def is_usage_only(self, event: bytes) -> bool:
        """vLLM's final usage chunk: `data: {..., "choices":[], "usage":{...}}`."""
        return event.startswith(b"data:") and b'"usage"' in event and (
            b'"choices":[]' in event or b'"choices": []' in event
        )


_INT64_MAX = 2 ** 63 - 1


def truncation_keep(value: Any, max_model_len: int, output_limit: bool) -> int | None:
    """The prompt tokens vLLM 0.32 keeps for `truncate_prompt_tokens` = `value` on chat and
    completions (renderers/params.py `_truncation_slice`): N keeps N, -1 keeps max_model_len
    less one when an output limit is set (`max_truncation_tokens`); None: no truncation.

    Raises ValueError for a value vLLM itself refuses (not an int in -1..2**63-1 by
    pydantic's lax rules, or above max_model_len: "cannot be greater than max_model_len").
    """
    if value is None:
        return None
    keep = lax_int(value)
    if not -1 <= keep <= _INT64_MAX or keep > max_model_len:
        raise ValueError("vLLM refuses this truncate_prompt_tokens")
    if keep == -1:
        return max_model_len - 1 if output_limit else max_model_len
    return keep


class TruncatedPrompt(Surface):
    """`truncate_prompt_tokens` on chat and completions: vLLM keeps that many tokens of each
    prompt (the last N or the first N, by `truncation_side`: the count is the same) instead of
    refusing a long one, so brimful decides on the prompt vLLM keeps."""

    def client_truncates(self, body: Mapping[str, Any]) -> bool:
        return body.get("truncate_prompt_tokens") is not None

    def output_limit(self, request: Mapping[str, Any], limit: RequestedLimit, policy: Policy) -> bool:
        """vLLM's `max_output_tokens` is non-zero: a limit is sent (or brimful's default fills one)."""
        return limit.value is not None or policy.default_max_tokens is not None

    def decide(self, request: Mapping[str, Any], prompt_tokens: list[int], max_model_len: int,
               limit: RequestedLimit, policy: Policy, *, model: str, count_exact: bool,
               drift_margin: int) -> Decision:
        try:
            keep = truncation_keep(request.get("truncate_prompt_tokens"), max_model_len,
                                   self.output_limit(request, limit, policy))
        except ValueError:
            return Decision(Action.PASS, limit.value, limit.value)   # vLLM answers its own 400
        if keep is None:
            return super().decide(request, prompt_tokens, max_model_len, limit, policy, model=model,
                                  count_exact=count_exact, drift_margin=drift_margin)
        kept = [min(n, keep) for n in prompt_tokens]
        decision = super().decide(request, kept, max_model_len, limit, policy, model=model,
                                  count_exact=count_exact, drift_margin=drift_margin)
        return replace(decision, counted=sum(kept)) if kept != prompt_tokens else decision


class ChatSurface(TruncatedPrompt, OpenAIStreamUsage, Surface):
    name = "chat"
    path = "/v1/chat/completions"
    prompt_param = "messages"
    # vLLM: max_completion_tokens wins when both are given.
    limit_fields = ("max_completion_tokens", "max_tokens")

    def count(self, tokenizer: CountingModel, body: dict[str, Any]) -> int | list[int]:
        return tokenizer.count_chat(body)

    def prompt_texts(self, tokenizer: CountingModel, body: dict[str, Any]) -> list[str]:
        return [tokenizer.render_chat(body)]          # the rendered conversation is one text

    def prompt_lengths(self, tokenizer: CountingModel, body: dict[str, Any], cap: int) -> list[int]:
        if isinstance(tokenizer, ModelTokenizer):
            return [tokenizer.render_chat_length(body, cap)]
        return super().prompt_lengths(tokenizer, body, cap)

    def prompt_floor(self, tokenizer: CountingModel, body: dict[str, Any]) -> int:
        model = _template_model(tokenizer)
        return 0 if model is None else model.chat_chars_floor(body)

    def tokenize_calls(self, model: str, body: Mapping[str, Any]) -> list[TokenizeCall]:
        return [UpstreamCount(_chat_tokenize_body(model, body))]


class CompletionsSurface(TruncatedPrompt, OpenAIStreamUsage, Surface):
    name = "completions"
    path = "/v1/completions"
    prompt_param = "prompt"
    limit_fields = ("max_tokens",)
    # vLLM's default completion limit for /v1/completions when max_tokens is omitted
    # (vllm/entrypoints/openai/completion/protocol.py: `max_tokens: int | None = 16`;
    # captures/c18_completions_string_no_max_tokens.json).
    implicit_max_tokens = IMPLICIT_MAX_TOKENS["completions"]

    def output_limit(self, request: Mapping[str, Any], limit: RequestedLimit, policy: Policy) -> bool:
        """`max_tokens` is 16 in vLLM 0.32's completions model when absent or null
        (`normalize_null_max_tokens`): only echo's 0 sets no output limit (`max_tokens or 0`)."""
        return limit.value != 0

    def read_limit(self, body: Mapping[str, Any]) -> RequestedLimit:
        """As chat's, except that `echo` with `max_tokens` 0 is vLLM's echo without generation
        (it samples 1 token and returns the prompt): served as sent."""
        try:
            echo = lax_bool(body.get("echo"))
            zero = body.get("max_tokens") is not None and lax_int(body["max_tokens"]) == 0
        except ValueError:
            echo = zero = False
        if echo and zero:
            return RequestedLimit.of(("max_tokens", 0), default_field="max_tokens")
        return super().read_limit(body)

    def uncounted(self, body: Mapping[str, Any]) -> str | None:
        """`prompt_embeds` (vLLM's --enable-prompt-embeds): tensors whose lengths brimful does not
        read; vLLM serves them as prompts of their own, before the text ones (online_renderer.py
        `preprocess_completion`), and its usage counts them, so no count of `prompt` is whole."""
        embeds = body.get("prompt_embeds")
        return "prompt_embeds" if embeds is not None and embeds != [] else None

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
            len(p) if isinstance(p, list) else UpstreamCount({"model": model, "prompt": p,
                                                              "add_special_tokens": add_special})
            for p in prompts
        ]


_CHAT_TOKENIZE_KEYS = ("messages", "tools", "add_generation_prompt", "continue_final_message",
                       "chat_template_kwargs", "add_special_tokens", "chat_template", "mm_processor_kwargs",
                       "media_io_kwargs")


def _chat_tokenize_body(model: str, chat: Mapping[str, Any]) -> dict[str, Any]:
    """A chat request as vLLM's /tokenize takes it, rendering what the chat route renders.

    vLLM 0.32's TokenizeChatRequest has no `documents` or `reasoning_effort`: the chat route
    hands them to the template as kwargs that win over `chat_template_kwargs`, with
    `enable_thinking` = effort != "none" unless the client set it
    (ChatCompletionRequest.build_chat_params), so they go there.
    """
    body = {"model": model, **{k: chat[k] for k in _CHAT_TOKENIZE_KEYS if k in chat}}
    kwargs = chat.get("chat_template_kwargs")
    overrides = {k: chat[k] for k in ("documents", "reasoning_effort") if chat.get(k) not in (None, "auto")}
    effort = chat.get("reasoning_effort")
    if effort is not None and not (isinstance(kwargs, dict) and "enable_thinking" in kwargs):
        overrides["enable_thinking"] = effort != "none"
    if overrides:
        body["chat_template_kwargs"] = {**(kwargs if isinstance(kwargs, dict) else {}), **overrides}
    return body


# ---------------------------------------------------------------------------
# Surfaces that name their stream events (Responses, Anthropic Messages)
# ---------------------------------------------------------------------------

def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _template_model(tokenizer: CountingModel) -> ModelTokenizer | None:
    """The model, when vLLM turns its converted chat into one text held to its character bound
    (a chat template; not harmony, not mistral-common)."""
    if isinstance(tokenizer, ModelTokenizer) and not isinstance(tokenizer, HarmonyTokenizer):
        return tokenizer
    return None


def _many(items: object) -> bool:
    """Enough items to convert the body once more for its floor (`prompt_floor`); a short body is
    not worth it: its render, bounded by `prompt_lengths`, costs about what the conversion does."""
    return isinstance(items, list) and len(items) >= ModelTokenizer.floor_min_messages


class ResponsesSurface(Surface):
    """`/v1/responses`: `instructions` + `input` items, `tools`, `max_output_tokens`.

    vLLM renders it as the equivalent chat (tokenizer_cache `_responses`); a
    request continuing a conversation stored upstream (`previous_response_id`,
    vLLM's response store) cannot be counted and is forwarded uncounted.
    """

    name = "responses"
    path = "/v1/responses"
    prompt_param = "input"
    limit_fields = ("max_output_tokens",)
    default_limit_field = "max_output_tokens"
    stream_end_event = "'response.completed' event"
    error_ends_stream = True
    _END = (b"response.completed", b"response.incomplete")
    _FAILED = (b"error", b"response.failed")
    _SEQUENCE = re.compile(rb'"sequence_number":\s*(\d+)')

    def uncounted(self, body: Mapping[str, Any]) -> str | None:
        return "previous_response_id" if body.get("previous_response_id") is not None else None

    def invalid_prompt(self, exc: CountError, body: Mapping[str, Any]) -> BrimfulError:
        """The converted chat's paths (`messages[3].content`) told as the request's (`input[2].content`)."""
        return errors.invalid_prompt(responses_terms(body, exc.message),
                                     responses_terms(body, exc.param) if exc.param else self.prompt_param)

    def client_truncates(self, body: Mapping[str, Any]) -> bool:
        return "truncation" in body and body.get("truncation") != "disabled"

    def count(self, tokenizer: CountingModel, body: dict[str, Any]) -> int | list[int]:
        return count_responses(tokenizer, body)

    def prompt_texts(self, tokenizer: CountingModel, body: dict[str, Any]) -> list[str]:
        """The converted chat's text, as vLLM renders and checks it; none when vLLM truncates
        (`truncation` "auto") or renders without a chat template (harmony)."""
        model = _template_model(tokenizer)
        if model is None or body.get("truncation", "disabled") != "disabled":
            return []
        return [model.render_chat(model.responses_chat(body))]

    def prompt_lengths(self, tokenizer: CountingModel, body: dict[str, Any], cap: int) -> list[int]:
        model = _template_model(tokenizer)
        if model is None or body.get("truncation", "disabled") != "disabled":
            return []
        return [model.render_chat_length(model.responses_chat(body), cap)]

    def prompt_floor(self, tokenizer: CountingModel, body: dict[str, Any]) -> int:
        model = _template_model(tokenizer)
        if model is None or body.get("truncation", "disabled") != "disabled" or not _many(body.get("input")):
            return 0
        return model.chat_chars_floor(model.responses_chat(body))

    def decide(self, request: Mapping[str, Any], prompt_tokens: list[int], max_model_len: int,
               limit: RequestedLimit, policy: Policy, *, model: str, count_exact: bool,
               drift_margin: int) -> Decision:
        """`truncation` other than "disabled" makes vLLM cut the prompt to what fits instead of
        refusing it: to max_model_len - 1 when a limit is sent, else to max_model_len (which it then
        refuses: no room).  brimful decides on the prompt vLLM will keep (`build_tok_params`)."""
        if "truncation" not in request or request.get("truncation") == "disabled":
            return super().decide(request, prompt_tokens, max_model_len, limit, policy, model=model,
                                  count_exact=count_exact, drift_margin=drift_margin)
        keep = max_model_len - 1 if limit.value is not None else max_model_len
        kept = [min(n, keep) for n in prompt_tokens]
        decision = super().decide(request, kept, max_model_len, limit, policy, model=model,
                                  count_exact=count_exact, drift_margin=drift_margin)
        return replace(decision, counted=sum(kept)) if kept != prompt_tokens else decision

    def tokenize_calls(self, model: str, body: Mapping[str, Any]) -> list[TokenizeCall]:
        return [UpstreamCount(_chat_tokenize_body(model, responses_to_chat(body)))]

    def error_event(self, err: BrimfulError, last_event: bytes = b"") -> bytes:
        found = self._SEQUENCE.findall(last_event)
        return err.responses_event(int(found[-1]) + 1 if found else 0)

    def read_usage(self, data: Any, usage: Usage) -> None:
        """A whole answer is the response object; a stream's terminal event carries it in `response`."""
        if not isinstance(data, dict):
            return
        inner = data.get("response")
        response: dict[str, Any] = inner if isinstance(inner, dict) else data
        reported = response.get("usage")
        if isinstance(reported, dict):
            if (tokens := _int(reported.get("input_tokens"))) is not None:
                usage.prompt_tokens = tokens
            if (tokens := _int(reported.get("output_tokens"))) is not None:
                usage.completion_tokens = tokens
        status = response.get("status")
        if status == "completed":
            usage.finish_reasons.append("stop")
        elif status == "incomplete":
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            usage.finish_reasons.append("length" if reason == "max_output_tokens" else str(reason or "incomplete"))

    def is_stream_end(self, event: bytes, payload: bytes) -> bool:
        return event in self._END if event else payload.endswith((b'"type":"response.completed"}',
                                                                  b'"type":"response.incomplete"}'))

    def is_stream_error(self, event: bytes, payload: bytes) -> bool:
        return event in self._FAILED or payload.startswith(b'{"error"')

    def may_carry_usage(self, event: bytes, payload: bytes) -> bool:
        return self.is_stream_end(event, payload)


# Anthropic stop_reason → the finish reason the record keeps (OpenAI's words).
_ANTHROPIC_FINISH = {"max_tokens": "length", "end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls"}
_MESSAGES_COUNT_KEYS = ("messages", "system", "tools", "tool_choice", "thinking", "output_config",
                        "chat_template_kwargs")


THINKING_MIN_BUDGET = 1024      # vLLM 0.32's AnthropicThinkingConfigEnabled.budget_tokens (ge=1024)


def _thinking_budget(body: Mapping[str, Any]) -> int | None:
    """`thinking.budget_tokens` of an Anthropic request with extended thinking on, else None."""
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return None
    try:
        return lax_int(thinking.get("budget_tokens"))      # pydantic's lax int: 1500.0 and "1500" too
    except ValueError:
        return None                                         # vLLM refuses it whatever the limit


class MessagesSurface(Surface):
    """`/v1/messages` (Anthropic): `system`, `messages` with content blocks, `tools`, `max_tokens`.

    vLLM converts it to a chat request (`AnthropicServingMessages
    .to_chat_completion_request`; tokenizer_cache `_anthropic`); without a local
    tokenizer it is counted by vLLM's own /v1/messages/count_tokens.
    """

    name = "messages"
    path = "/v1/messages"
    prompt_param = "messages"
    limit_fields: tuple[str, ...] = ("max_tokens",)
    stream_end_event = "'message_stop' event"
    error_ends_stream = True

    def count(self, tokenizer: CountingModel, body: dict[str, Any]) -> int | list[int]:
        return count_messages(tokenizer, body)

    def decide(self, request: Mapping[str, Any], prompt_tokens: list[int], max_model_len: int,
               limit: RequestedLimit, policy: Policy, *, model: str, count_exact: bool,
               drift_margin: int) -> Decision:
        """Chat's rule, kept valid for extended thinking: vLLM refuses `thinking.budget_tokens`
        at or above `max_tokens`, and below 1,024 (anthropic/protocol.py). A grant that leaves
        room for a budget of 1,024 gets the budget lowered under it (`follow_limit`); one that
        does not is raised to the least limit the budget allows, vLLM 0.32 clamping the output
        itself (it refuses only a limit above max_model_len), as it would for the client's own."""
        decision = super().decide(request, prompt_tokens, max_model_len, limit, policy, model=model,
                                  count_exact=count_exact, drift_margin=drift_margin)
        budget = _thinking_budget(request)
        granted = decision.granted
        ceiling = policy.max_tokens_ceiling
        if (budget is None or decision.rewrite is None or granted is None or granted > budget
                or granted - 1 >= THINKING_MIN_BUDGET or budget + 1 > max_model_len
                or (decision.requested is not None and budget + 1 > decision.requested)
                or (ceiling is not None and budget + 1 > ceiling)):     # the operator's ceiling holds
            return decision
        least = budget + 1
        action = Action.PASS if least == decision.requested else decision.action
        return replace(decision, action=action, granted=least, rewrite={f: least for f in decision.rewrite})

    def follow_limit(self, body: Mapping[str, Any], changes: dict[str, Any]) -> None:
        """A lowered `max_tokens` lowers the thinking budget under it, where vLLM allows one."""
        super().follow_limit(body, changes)
        budget = _thinking_budget(body)
        limit = changes.get("max_tokens")
        if budget is not None and isinstance(limit, int) and THINKING_MIN_BUDGET <= limit - 1 < budget:
            changes["thinking"] = {**body["thinking"], "budget_tokens": limit - 1}

    def prompt_texts(self, tokenizer: CountingModel, body: dict[str, Any]) -> list[str]:
        """The converted chat's text, as vLLM renders and checks it (none without a chat template)."""
        model = _template_model(tokenizer)
        return [] if model is None else [model.render_chat(model.messages_chat(body))]

    def prompt_lengths(self, tokenizer: CountingModel, body: dict[str, Any], cap: int) -> list[int]:
        model = _template_model(tokenizer)
        return [] if model is None else [model.render_chat_length(model.messages_chat(body), cap)]

    def prompt_floor(self, tokenizer: CountingModel, body: dict[str, Any]) -> int:
        model = _template_model(tokenizer)
        if model is None or not _many(body.get("messages")):
            return 0
        return model.chat_chars_floor(model.messages_chat(body))

    def tokenize_calls(self, model: str, body: Mapping[str, Any]) -> list[TokenizeCall]:
        request = {"model": model, **{k: body[k] for k in _MESSAGES_COUNT_KEYS if k in body}}
        return [UpstreamCount(request, path="/v1/messages/count_tokens", field="input_tokens")]

    def error_body(self, err: BrimfulError) -> bytes:
        return err.anthropic_body_bytes()

    def error_event(self, err: BrimfulError, last_event: bytes = b"") -> bytes:
        return err.anthropic_event()

    def read_usage(self, data: Any, usage: Usage) -> None:
        """A whole answer, or the stream's message_start (`message.usage`) and message_delta (`usage`).

        vLLM's `input_tokens` excludes prompt-cache reads and writes when it
        reports them (Anthropic's definition); the prompt is their sum.
        """
        if not isinstance(data, dict):
            return
        inner = data.get("message")
        message: dict[str, Any] = inner if isinstance(inner, dict) else data
        reported = message.get("usage")
        if isinstance(reported, dict):
            if (tokens := _int(reported.get("input_tokens"))) is not None:
                for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
                    tokens += _int(reported.get(key)) or 0
                usage.prompt_tokens = tokens
            # message_start says 0 output tokens so far; the message_delta at the end has them all.
            output = _int(reported.get("output_tokens"))
            if output is not None and data.get("type") != "message_start":
                usage.completion_tokens = output
        delta = data.get("delta")
        stop = delta.get("stop_reason") if isinstance(delta, dict) else data.get("stop_reason")
        if isinstance(stop, str):
            usage.finish_reasons.append(_ANTHROPIC_FINISH.get(stop, stop))

    def is_stream_end(self, event: bytes, payload: bytes) -> bool:
        return event == b"message_stop" if event else payload == b'{"type":"message_stop"}'

    def is_stream_error(self, event: bytes, payload: bytes) -> bool:
        return event == b"error" or payload.startswith(b'{"type":"error"')

    def may_carry_usage(self, event: bytes, payload: bytes) -> bool:
        if event:
            return event in (b"message_start", b"message_delta")
        return payload.startswith((b'{"type":"message_start"', b'{"type":"message_delta"'))


class MessagesCountSurface(MessagesSurface):
    """`/v1/messages/count_tokens`: answered by brimful from its own count (proxy.serving.count_tokens)."""

    name = "messages_count_tokens"
    path = "/v1/messages/count_tokens"
    limit_fields = ()


# ---------------------------------------------------------------------------
# Pooling: inputs embedded or scored, nothing generated
# ---------------------------------------------------------------------------

Input = Any     # a text, token ids, or a chat request (a conversation); anything else vLLM refuses


def _add_special_tokens(body: Mapping[str, Any], default: bool) -> bool:
    value = body.get("add_special_tokens", default)
    return value if isinstance(value, bool) else default


def _input_bytes(item: Input) -> int:
    """About the request bytes an input took (what the counting budget weighs): a text its
    characters, token ids a few bytes each, a conversation its texts.  Iterative: a body
    may nest as deep as json.loads allows, deeper than Python recursion does."""
    total = 0
    pending = [item]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            total += len(value) + 3
        elif isinstance(value, list) and value and isinstance(value[0], int):
            total += 4 * len(value) + 2
        elif isinstance(value, (list, dict)):
            pending.extend(value.values() if isinstance(value, dict) else value)
            total += 2
        else:
            total += 8
    return total


class PoolingSurface(Surface):
    """The pooling routes vLLM serves for an embedding model: every input must fit max_model_len.

    vLLM refuses the whole request when one input is longer than
    max_model_len (an input of exactly max_model_len tokens is served) and
    does not say which; brimful names each (`proxy.admitted.admission.decide_inputs`).
    The client's own `truncate_prompt_tokens` (-1: max_model_len) is applied
    to the counts as vLLM applies it; brimful truncates only when the
    operator opted in (`[policy] truncate_inputs`), and says so.
    """

    prompt_param = "input"
    implicit_max_tokens = 0          # nothing is generated: a sequence is its prompt (IMPLICIT_MAX_TOKENS)
    truncate_field = "truncate_prompt_tokens"

    def client_truncates(self, body: Mapping[str, Any]) -> bool:
        return body.get(self.truncate_field) is not None

    def operator_truncates(self, policy: Policy) -> bool:
        return policy.truncate_inputs

    def inputs(self, body: Mapping[str, Any]) -> list[Input]:
        """What is embedded, one entry per vLLM prompt."""
        raise NotImplementedError

    def truncation(self, body: Mapping[str, Any], index: int, max_model_len: int) -> int | None:
        """The tokens vLLM keeps of input `index` (None: all of it).  Read as pydantic's lax int, as
        vLLM reads it ("512" and 512.0 truncate too); ValueError where vLLM refuses the value."""
        raw = body.get(self.truncate_field)
        if raw is None:
            return None
        limit = lax_int(raw)
        if limit < -1:
            raise ValueError(f"{self.truncate_field} must be -1 or more")
        if limit == 0:
            return None
        return max_model_len if limit == -1 else limit

    def count(self, tokenizer: CountingModel, body: dict[str, Any]) -> int | list[int]:
        return self.count_items(tokenizer, body, self.inputs(body))

    def count_items(self, tokenizer: CountingModel, body: Mapping[str, Any], items: list[Input]) -> list[int]:
        """The counts of `items` (some of the inputs), in order; a run of texts goes to the model in one
        call, which counts each distinct text of it once (`tokenizer_cache._completion.count_prompts`)."""
        counts: list[int] = []
        texts: list[Any] = []
        special = _add_special_tokens(body, True)

        def flush() -> None:
            if texts:
                counts.extend(tokenizer.count_completion({"prompt": list(texts), "add_special_tokens": special}))
                texts.clear()

        for item in items:
            if isinstance(item, str):
                texts.append(item)
                continue
            flush()
            if isinstance(item, dict):
                counts.append(tokenizer.count_chat(item))
            elif isinstance(item, list):
                counts.append(len(item))
            else:
                counts.extend(tokenizer.count_completion({"prompt": item, "add_special_tokens": special}))
        flush()
        return counts

    def count_slices(self, body: dict[str, Any], slice_bytes: int) -> list[CountSlice] | None:
        """Many inputs are counted in slices of about `slice_bytes` each (by their own sizes, so
        one long input among short ones weighs what it is), one long input on its own."""
        items = self.inputs(body)
        if len(items) < 2:
            return None
        sizes = [_input_bytes(item) for item in items]
        if sum(sizes) <= slice_bytes:
            return None
        slices: list[CountSlice] = []
        start, held = 0, 0
        for end, size in enumerate([*sizes, 0]):
            if end == len(items) or (held and held + size > slice_bytes):
                slices.append(CountSlice(functools.partial(self.count_items, body=body, items=items[start:end]),
                                         held))
                start, held = end, 0
            held += size
        return slices

    def prompt_texts(self, tokenizer: CountingModel, body: dict[str, Any]) -> list[str]:
        """Every text input is held to vLLM's character bound on its own (TokenizeParams per prompt)."""
        return [item for item in self.inputs(body) if isinstance(item, str)]

    def tokenize_calls(self, model: str, body: Mapping[str, Any]) -> list[TokenizeCall]:
        calls: list[TokenizeCall] = []
        for item in self.inputs(body):
            if isinstance(item, dict):
                calls.append(UpstreamCount(_chat_tokenize_body(model, item)))
            elif isinstance(item, list):
                calls.append(len(item))
            else:
                calls.append(UpstreamCount({"model": model, "prompt": item,
                                            "add_special_tokens": _add_special_tokens(body, True)}))
        return calls

    def decide(self, request: Mapping[str, Any], prompt_tokens: list[int], max_model_len: int,
               limit: RequestedLimit, policy: Policy, *, model: str, count_exact: bool,
               drift_margin: int) -> Decision:
        try:
            kept = [self.truncation(request, i, max_model_len) for i in range(len(prompt_tokens))]
        except ValueError:
            return Decision(Action.PASS, None)     # a value vLLM's request model refuses: its 400, not ours
        if any(k is not None and k > max_model_len for k in kept):
            return Decision(Action.PASS, None)     # vLLM refuses a truncation above max_model_len itself
        effective = [n if k is None else min(n, k) for n, k in zip(prompt_tokens, kept, strict=True)]
        decision = decide_inputs(effective, max_model_len, model=model, prompt_param=self.prompt_param,
                                 truncate_field=self.truncate_field, truncate=policy.truncate_inputs,
                                 count_exact=count_exact)
        if decision.counted is None and effective != prompt_tokens:
            return replace(decision, counted=sum(effective))
        return decision


def _chat_messages(value: Any) -> bool:
    """A non-empty list of objects with a string role, as vLLM 0.32's embeddings tell a conversation
    in `input` from texts (pooling/embed/protocol.py `_is_chat_messages`)."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in value)


def _conversations(messages: Any) -> list[Any]:
    """One conversation, or a batch of them (a list of lists of messages)."""
    if isinstance(messages, list) and messages and all(isinstance(m, list) for m in messages):
        return list(messages)
    return [messages]


class EmbeddingsSurface(PoolingSurface):
    """`/v1/embeddings`: `input` (text, texts, token ids) or chat `messages` (one conversation or a batch)."""

    name = "embeddings"
    path = "/v1/embeddings"
    # vLLM 0.32 holds embeddings to the pooler config's max_embed_len where one is set (chunked
    # processing splits longer inputs): EmbeddingTokenizeParamsMixin, pooling/base/protocol.py.
    window_may_be_wider = True

    def inputs(self, body: Mapping[str, Any]) -> list[Input]:
        messages = body.get("messages")
        raw = body.get("input")
        if messages is None and (_chat_messages(raw) or (
                isinstance(raw, list) and raw and all(_chat_messages(c) for c in raw))):
            # EmbeddingChatInputRequest, EmbeddingBatchChatInputRequest: a conversation, or a batch of them,
            # in `input` (a batch's lists of messages are no token ids)
            messages = raw
        if messages is not None:
            options = {k: body[k] for k in ("add_generation_prompt", "continue_final_message",
                                            "chat_template_kwargs") if k in body}
            return [{"messages": conversation, "add_generation_prompt": False,
                     "add_special_tokens": _add_special_tokens(body, False), **options}
                    for conversation in _conversations(messages)]
        if isinstance(raw, list) and raw and all(isinstance(x, (str, list)) for x in raw):
            return list(raw)
        if raw is None:
            raise CountError("'input' is required: the text, texts or token ids to embed.", "input")
        if not isinstance(raw, (str, list)):
            raise CountError("'input' must be a string, a list of strings, a list of token ids or a list of "
                             "lists of token ids.", "input")
        return [raw]


class PoolingRouteSurface(EmbeddingsSurface):
    """`/pooling`: the same inputs as embeddings, or an IO-processor plugin's `data`."""

    name = "pooling"
    path = "/pooling"
    window_may_be_wider = False      # FixedMaxLenTokenizeParamsMixin: max_model_len, whatever the pooler

    def uncounted(self, body: Mapping[str, Any]) -> str | None:
        """vLLM 0.32's IOProcessorRequest (pooling/pooling/protocol.py): `data` of the plugin's own
        shape, which only the plugin turns into prompts."""
        return "data" if "data" in body and "input" not in body and "messages" not in body else None


def _texts(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


class ScoreSurface(PoolingSurface):
    """`/score` (and `/v1/score`): each query and each document is an input (bi-encoder).

    A cross-encoder scores query and document together, so its usage counts
    pairs: usage is not compared with brimful's per-text count.  A text's
    refusal is safe either way (a pair holding it is longer still).
    """

    name = "score"
    path = "/score"
    aliases: tuple[str, ...] = ("/v1/score",)
    compares_usage = False
    prompt_param = "documents"

    def prompt_texts(self, tokenizer: CountingModel, body: dict[str, Any]) -> list[str]:
        """None held to the bound here: a cross-encoder renders pairs, and per-side limits truncate."""
        return []
    _PAIRS = (("queries", "documents"), ("queries", "items"), ("text_1", "text_2"), ("data_1", "data_2"))

    def _sides(self, body: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
        for left, right in self._PAIRS:
            if left in body or right in body:
                return _texts(body.get(left)), _texts(body.get(right))
        return [], []

    def uncounted(self, body: Mapping[str, Any]) -> str | None:
        queries, documents = self._sides(body)
        return None if all(isinstance(t, str) for t in queries + documents) else self.prompt_param

    def inputs(self, body: Mapping[str, Any]) -> list[Input]:
        queries, documents = self._sides(body)
        return [*queries, *documents]

    def truncation(self, body: Mapping[str, Any], index: int, max_model_len: int) -> int | None:
        base = super().truncation(body, index, max_model_len)
        name = "max_tokens_per_query" if index < len(self._sides(body)[0]) else "max_tokens_per_doc"
        per = lax_int(body[name]) if name in body else 0     # a plain int field in vLLM: lax, "100" too
        if per > 0:
            return per if base is None else min(per, base)
        return base


class RerankSurface(ScoreSurface):
    """`/rerank` (and `/v1/rerank`, `/v2/rerank`): one `query`, its `documents`."""

    name = "rerank"
    path = "/rerank"
    aliases = ("/v1/rerank", "/v2/rerank")

    def _sides(self, body: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
        return [body.get("query")], _texts(body.get("documents"))


CHAT = ChatSurface()
COMPLETIONS = CompletionsSurface()
RESPONSES = ResponsesSurface()
MESSAGES = MessagesSurface()
MESSAGES_COUNT = MessagesCountSurface()
EMBEDDINGS = EmbeddingsSurface()
POOLING = PoolingRouteSurface()
SCORE = ScoreSurface()
RERANK = RerankSurface()
# POST to these paths is admitted; every other path and method passes through.
ADMITTED: dict[str, Surface] = {
    path: s for s in (CHAT, COMPLETIONS, RESPONSES, MESSAGES, EMBEDDINGS, POOLING, SCORE, RERANK)
    for path in (s.path, *s.aliases)
}
# POST to these paths is answered by brimful itself, never forwarded.
ANSWERED: dict[str, Surface] = {MESSAGES_COUNT.path: MESSAGES_COUNT}


def parse_json_payload(payload: bytes) -> Any:
    """A JSON answer or event, or None when it is not JSON (it is then relayed, not read)."""
    try:
        return jsonbody.loads(payload)
    except (ValueError, RecursionError):     # nested past the interpreter's limit: not read either
        return None
