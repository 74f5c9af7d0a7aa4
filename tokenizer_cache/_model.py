"""One model's tokenizer and chat template(s), loaded once, counting many requests.

A model directory holds `tokenizer.json` (the `tokenizers` model vLLM's fast
tokenizer wraps), `tokenizer_config.json` (special tokens, maybe the chat
template) and optionally `chat_template.jinja` (which wins over the config's
template, as in transformers).  Loading parses and compiles everything once;
counting then only validates the request, renders and encodes.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import jinja2
import jinja2.meta
from tokenizers import Tokenizer

from . import _anthropic, _chat, _completion, _piece_count, _render_memo, _responses
from ._build_store import build_store
from ._char_bound import (
    char_bound,
    check_chars,
    config_token_texts,
    max_chars_per_token,
)
from ._char_bound import max_chars_per_token as _max_chars_per_token  # the name __init__'s argument hides
from ._chat_cache import MAX_CHARS as CHAT_CACHE_MAX_CHARS
from ._chat_cache import (
    ChatCountCache,
    inputs_digest,
    is_pure,
    message_chars,
    template_key,
)
from ._content_format import ContentFormat, detect_content_format
from ._data_url import open_media_url
from ._encoder import (
    LOAD_COST_RATIO,
    DeferredEncoder,
    Encoder,
    EncoderChoice,
    ReferenceEncoder,
    deferred_encoder,
    select_encoder,
)
from ._encoder import logger as _logger
from ._errors import CountError, MediaNotCountable
from ._family import detect_family
from ._harmony import HarmonyOptions
from ._image_size import image_size
from ._jinja import compile_template, parse_template
from ._loader import TRANSFORMERS5, BuiltBackend, LoaderUnavailable, build_transformers5, resolve_loader
from ._loop_proof import LoopProof, NotProven, prove_loop
from ._media import MediaItem, MediaModel, load_media_model
from ._piece_cache import PieceCountCache
from ._piece_count import PieceCounter, PieceTally
from ._protocol import CountingModel
from ._render import render, rendered_length
from ._template_floor import TemplateFloor

# The special-token attributes transformers exposes to templates
# (`special_tokens_map`, merged under the template kwargs in apply_chat_template).
_SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled template plus what vLLM derives from its source once."""

    name: str
    source: str
    compiled: jinja2.Template
    content_format: ContentFormat
    variables: frozenset[str]  # names the template reads from its context
    knows_developer: bool  # mentions the "developer" role, so keeps it
    pure: bool = False  # renders depend on the inputs alone (`_chat_cache.is_pure`)
    floor: TemplateFloor | None = None  # the fewest characters it renders, by roles (`_template_floor`)
    loop_proof: LoopProof | None = None  # its message loop, proven to skip unchanged turns (`_loop_proof`)


@dataclass(frozen=True)
class LoaderInfo:
    """Which rules built the tokenizer a model counts with (`_loader`), for /stats and the log."""

    loader: str = "tokenizer_json"  # "transformers5" or "tokenizer_json": the rules actually applied
    tokenizer_class: str | None = None  # the transformers class that built it (transformers5 only)
    fallback_reason: str | None = None  # why transformers5 was wanted but tokenizer.json is used


def _token_text(value: Any) -> str | None:
    """Special tokens appear as strings or as AddedToken dicts `{"content": ...}`."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(content := value.get("content"), str):
        return content
    return None


def special_token_variables(config: Mapping[str, Any]) -> dict[str, Any]:
    """Template variables for the special tokens named in tokenizer_config.json."""
    variables: dict[str, Any] = {}
    for key in _SPECIAL_TOKEN_KEYS:
        text = _token_text(config.get(key))
        if text is not None:
            variables[key] = text
    additional = config.get("additional_special_tokens")
    if isinstance(additional, list):
        texts = [t for t in (_token_text(v) for v in additional) if t is not None]
        variables["additional_special_tokens"] = texts
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):
        # transformers 5 exposes named extra tokens (image_token, …) as attributes.
        for key, value in extra.items():
            text = _token_text(value)
            if isinstance(key, str) and text is not None and key not in variables:
                variables[key] = text
    return variables


def _compile(name: str, source: str, where: pathlib.Path) -> ChatTemplate:
    try:
        compiled = compile_template(source)
        ast = parse_template(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"The chat template {name!r} in {where} does not compile: {exc}") from exc
    return ChatTemplate(
        name=name,
        source=source,
        compiled=compiled,
        content_format=detect_content_format(ast),
        variables=frozenset(jinja2.meta.find_undeclared_variables(ast)),
        knows_developer='"developer"' in source or "'developer'" in source,
        pure=is_pure(ast),
        floor=TemplateFloor(ast),
        loop_proof=_loop_proof(source),
    )


def _loop_proof(source: str) -> LoopProof | None:
    try:
        return prove_loop(source)
    except NotProven:
        return None


def _template_sources(directory: pathlib.Path, config: Mapping[str, Any]) -> dict[str, str]:
    """Named template sources; a single template is named "default"."""
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return {"default": jinja_file.read_text(encoding="utf-8")}
    template = config.get("chat_template")
    if isinstance(template, str):
        return {"default": template}
    if isinstance(template, list):
        sources = {}
        for entry in template:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(
                entry.get("template"), str
            ):
                sources[entry["name"]] = entry["template"]
        return sources
    return {}


class ModelTokenizer:
    """Counts prompt tokens for one model exactly as vLLM does (HF tokenizer + chat template)."""

    # Which renderer vLLM uses for this model (`_family.Family`).
    family = "hf"
    # Conversations shorter than this are rendered, never refused from their roles (`chat_chars_floor`).
    floor_min_messages = 256

    def __init__(
        self,
        source_dir: pathlib.Path,
        tokenizer: Tokenizer,
        templates: dict[str, ChatTemplate],
        special_tokens: dict[str, Any],
        *,
        piece_counter: PieceCounter | None = None,
        piece_fallback: str | None = None,
        identity: bytes | None = None,
        model_vocab_size: int | None = None,
        media_model: MediaModel | None = None,
        media_unsupported: str = "",
        encoder: EncoderChoice | None = None,
        max_chars_per_token: int | None = None,
        chat_cache: ChatCountCache | None = None,
        loader_info: LoaderInfo | None = None,
    ) -> None:
        self.source_dir = source_dir
        # How the tokenizer was built from the folder (`_loader`).
        self.loader_info = loader_info or LoaderInfo()
        # The model's embedding rows (config.json `vocab_size`), when the
        # directory says: vLLM accepts prompt ids up to the larger of it and the
        # tokenizer's own largest id.
        self.model_vocab_size = model_vocab_size
        self._tokenizer = tokenizer
        self._choice = encoder or EncoderChoice(ReferenceEncoder(tokenizer))
        self._encoder: Encoder = self._choice.encoder
        self._templates = templates
        self._special_tokens = special_tokens
        self._piece_counter = piece_counter
        # Why this tokenizer is counted whole although a piece cache was offered.
        self.piece_fallback = piece_fallback
        self._identity = identity
        self._media_model = media_model
        # Why media cannot be counted for this model ("" when they can).
        self.media_unsupported = media_unsupported
        if max_chars_per_token is None:
            max_chars_per_token = _max_chars_per_token(tokenizer.get_vocab(with_added_tokens=True))
        # vLLM's longest token in characters: the character bound's factor (`_char_bound`).
        self.max_chars_per_token = max_chars_per_token
        self._chat_cache = chat_cache if identity is not None else None
        self._template_keys = {
            name: template_key(identity, template.source, special_tokens)
            for name, template in templates.items()
            if template.pure and identity is not None
        }
        self._merges_inline_system: bool | None = None
        self._disabled_thinking_effort: str | None = None
        self._cut_tokens_by_template: dict[str, tuple[str, ...]] = {}

    # -- public ----------------------------------------------------------

    def count_chat(self, body: dict[str, Any], *, max_model_len: int | None = None) -> int:
        """Prompt tokens of a /v1/chat/completions request, media included.

        Raises CountError where vLLM would answer 400, MediaNotCountable where
        the request holds media this model's arithmetic cannot count (then
        forward it unclamped: it is not an invalid request).  With
        `max_model_len`, a rendered prompt longer than vLLM's character bound
        raises CharBoundExceeded before anything is encoded.
        """
        return self.tally_chat(body, max_model_len=max_model_len).tokens

    def tally_chat(self, body: dict[str, Any], *, max_model_len: int | None = None) -> PieceTally:
        """`count_chat` plus the work it took (how much was encoded rather than cached).

        A request without media whose template inputs were counted before
        comes from the chat cache (`_chat_cache`): nothing rendered, nothing
        encoded.  Media requests are never cached: their count depends on the
        images, not only on what the template sees.
        """
        template, variables, options, media = self._prepare(body)
        bound = self._char_bound(body, max_model_len)
        digest = None if media else self._chat_digest(template, variables, options.add_special_tokens)
        if digest is not None:
            assert self._chat_cache is not None
            hit = self._chat_cache.get(digest)
            if hit is not None:
                tokens, chars = hit
                check_chars(chars, bound, max_model_len)
                return PieceTally(tokens=tokens, pieces=0, added_tokens=0, encoded_pieces=0, encoded_tokens=0)
        memo = None if media else self._tally_memo(template, variables, options, bound, max_model_len)
        if memo is not None:
            if digest is not None:
                assert self._chat_cache is not None
                self._chat_cache.put(digest, memo[0].tokens, memo[1])
            return memo[0]
        text = render(template.compiled, variables, continue_final_message=options.continue_final_message)
        check_chars(len(text), bound, max_model_len)
        if media:
            tokens = self._count_with_media(text, options.add_special_tokens, media, body)
            return PieceTally(tokens=tokens, pieces=1, added_tokens=0, encoded_pieces=1, encoded_tokens=tokens)
        tally = self.tally_text(text, add_special_tokens=options.add_special_tokens)
        if digest is not None:
            assert self._chat_cache is not None
            self._chat_cache.put(digest, tally.tokens, len(text))
        return tally

    def _tally_memo(self, template: ChatTemplate, variables: dict[str, Any], options: _chat.ChatOptions,
                    bound: int | None, max_model_len: int | None) -> tuple[PieceTally, int] | None:
        """(count, characters) of a long chat from the iterations of its message loop rendered before
        (`_render_memo`), or None to render it whole: no proof for the template, no piece counter,
        a short chat, the first chat seen with its opening (`_render_memo.seen`), `continue_final_message`
        (cut by the final message's text), or the memo gave up."""
        proof, counter = template.loop_proof, self._piece_counter
        key = self._template_keys.get(template.name)
        if proof is None or counter is None or key is None or options.continue_final_message:
            return None
        messages = variables["messages"]
        if message_chars(messages, _piece_count.PREFIX_MIN_CHARS) < _piece_count.PREFIX_MIN_CHARS:
            return None
        if not _render_memo.seen(counter.cache, key, messages):
            return None
        done = _render_memo.render(proof, variables, key, counter.cache)
        if done is None or (done.reused and done.text and not counter.starts_with_cut(done.text)):
            return None
        chars = done.prefix_chars + len(done.text)
        check_chars(chars, bound, max_model_len)
        if not done.reused and not done.spans:     # the memo went off: counted as a text
            return self.tally_text(done.text, add_special_tokens=options.add_special_tokens), chars
        tally = _render_memo.tally(done, counter, self._loop_cut_tokens(template))
        specials = counter.specials if options.add_special_tokens else 0
        return dataclasses.replace(tally, tokens=tally.tokens + specials), chars

    def _loop_cut_tokens(self, template: ChatTemplate) -> tuple[str, ...]:
        """The cut tokens (`_prefix_count`) the template's source writes: searched for in an iteration's text."""
        found = self._cut_tokens_by_template.get(template.name)
        if found is None:
            assert self._piece_counter is not None
            found = tuple(token for token in self._piece_counter.cut_tokens() if token in template.source)
            self._cut_tokens_by_template[template.name] = found
        return found

    def _chat_digest(self, template: ChatTemplate, variables: dict[str, Any], add_special_tokens: bool) -> bytes | None:
        key = self._template_keys.get(template.name) if self._chat_cache is not None else None
        if key is None or message_chars(variables["messages"], CHAT_CACHE_MAX_CHARS) > CHAT_CACHE_MAX_CHARS:
            return None
        return inputs_digest(key, variables, add_special_tokens)

    def char_bound(self, max_model_len: int | None, truncate_prompt_tokens: int | None = None) -> int | None:
        """The most characters vLLM lets a prompt have (None: it does not refuse by characters)."""
        return char_bound(max_model_len, self.max_chars_per_token, truncate_prompt_tokens)

    def _char_bound(self, body: dict[str, Any], max_model_len: int | None) -> int | None:
        if max_model_len is None:
            return None
        return self.char_bound(max_model_len, body.get("truncate_prompt_tokens"))

    def render_chat(self, body: dict[str, Any]) -> str:
        """The prompt text vLLM would encode for this chat request (media as placeholders)."""
        return self._render(body)[0]

    def render_chat_length(self, body: dict[str, Any], cap: int) -> int:
        """`len(render_chat(body))`, or a length above `cap` once the render passes it (stopped there)."""
        template, variables, options, _ = self._prepare(body)
        return rendered_length(template.compiled, variables, continue_final_message=options.continue_final_message,
                               cap=cap)

    def chat_chars_floor(self, body: Any) -> int:
        """Characters this chat request's rendered prompt has at least, read from its messages' roles
        alone (`_template_floor`), before any message is prepared or rendered; 0 where nothing is
        proven.  Conversations under `floor_min_messages` messages get 0 unread: they are cheap to
        render, and the floor counts no message's content, so only a great many messages can put it
        over vLLM's character bound."""
        if not isinstance(body, dict) or body.get("continue_final_message", False) is not False:
            return 0        # the render is cut after the final message: what follows it is not kept
        messages = body.get("messages")
        if not isinstance(messages, list) or len(messages) < self.floor_min_messages:
            return 0
        try:
            tools = _chat.parse_tools(body)
            kwargs = _chat.template_kwargs(body, _chat.chat_options(body))
            template = self._select_template(_chat.rendered_tools(tools, kwargs))
        except CountError:
            return 0
        roles = Counter(m.get("role") if isinstance(m, dict) else None for m in messages)
        if template.floor is None or ("developer" in roles and not template.knows_developer):
            return 0        # developer messages may merge into one system message (`_developer_as_system`)
        return template.floor.chars(roles)

    def count_messages(self, body: dict[str, Any]) -> int:
        """Prompt tokens of an Anthropic /v1/messages (or count_tokens) request; raises CountError."""
        return self.count_chat(self.messages_chat(body))

    def messages_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat request vLLM converts a Messages request to (`_anthropic`)."""
        return _anthropic.to_chat_request(body, merge_inline_system=self.merges_inline_system,
                                          disabled_thinking_effort=self.disabled_thinking_effort)

    def count_responses(self, body: dict[str, Any]) -> int:
        """Prompt tokens of a /v1/responses request; raises CountError."""
        return self.count_chat(self.responses_chat(body))

    def responses_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat request vLLM renders for a Responses request (`_responses`)."""
        return _responses.to_chat_request(body)

    @property
    def merges_inline_system(self) -> bool:
        """vLLM merges system messages inside a Messages conversation into the first one
        when a template it would render (without tools, or with) refuses them."""
        if self._merges_inline_system is None:
            sources: list[str | None] = [self._templates[name].source for name in ("default", "tool_use")
                                         if name in self._templates]
            self._merges_inline_system = any(_anthropic.detect_merge_inline_system(s) for s in sources or [None])
        return self._merges_inline_system

    @property
    def disabled_thinking_effort(self) -> str:
        """What Messages' `thinking: disabled` becomes: reasoning_effort "none", or "low" when the
        template cannot render "none" or renders it like an effort (vLLM's start-up probe)."""
        if self._disabled_thinking_effort is None:
            self._disabled_thinking_effort = self._probe_disabled_thinking_effort()
        return self._disabled_thinking_effort

    def _probe_disabled_thinking_effort(self) -> str:
        return _anthropic.probe_disabled_thinking_effort(self.render_chat)

    @property
    def media_family(self) -> str | None:
        """The multimodal arithmetic this model counts images with ("qwen2_vl", "gemma3", ...)."""
        return self._media_model.family if self._media_model is not None else None

    def count_completion(self, body: dict[str, Any], *, max_model_len: int | None = None) -> list[int]:
        """Prompt tokens of a /v1/completions request, one figure per prompt.

        With `max_model_len`, each text prompt is held to vLLM's character
        bound first (CharBoundExceeded), as vLLM checks each one.
        """
        if max_model_len is not None and isinstance(body, dict):
            bound = self._char_bound(body, max_model_len)
            for prompt in _completion.parse_prompts(body):
                if isinstance(prompt, str):
                    check_chars(len(prompt), bound, max_model_len)
        return _completion.count_prompts(
            body, lambda text, special: self.count_text(text, add_special_tokens=special),
            check_ids=self._check_in_vocabulary,
        )

    @functools.cached_property
    def max_token_id(self) -> int:
        """The tokenizer's largest id, added tokens included (vLLM's
        `tokenizer.max_token_id`, vllm/tokenizers/hf.py `get_cached_tokenizer`)."""
        return max(self._tokenizer.get_vocab(with_added_tokens=True).values())

    @property
    def token_id_limit(self) -> int | None:
        """The largest prompt token id vLLM accepts (vllm/renderers/base.py
        `validate_token_ids`: the larger of the tokenizer's largest id and the
        model's `vocab_size - 1`), or None when the directory has no config.json:
        then the model may have more rows than the tokenizer has ids (Qwen3-8B:
        151,936 vs 151,669) and refusing any id would refuse what vLLM serves."""
        if self.model_vocab_size is None:
            return None
        return max(self.max_token_id, self.model_vocab_size - 1)

    def _check_in_vocabulary(self, prompt: list[int]) -> None:
        limit = self.token_id_limit
        if limit is not None:
            largest = max(prompt)
            if largest > limit:
                raise CountError(f"Token id {largest} is out of vocabulary", param="prompt")

    def count_text(self, text: str, *, add_special_tokens: bool) -> int:
        """Tokens of `text`; the post-processor decides what add_special_tokens adds."""
        return self.tally_text(text, add_special_tokens=add_special_tokens).tokens

    def tally_text(self, text: str, *, add_special_tokens: bool) -> PieceTally:
        """Count `text`, through the piece cache when this model has one.

        Either way the model's encoder counts what is not cached: the fast
        engine when it passed the self-check at load, else `tokenizers`
        (`engine`, `engine_fallback`).  Both release the GIL, so a long
        prompt counted in a worker thread leaves the event loop running.
        """
        if self._piece_counter is not None:
            return self._piece_counter.count(text, add_special_tokens=add_special_tokens)
        tokens = self._encoder.count(text, add_special_tokens)
        return PieceTally(tokens=tokens, pieces=1, added_tokens=0, encoded_pieces=1, encoded_tokens=tokens)

    def with_piece_cache(self, piece_cache: PieceCountCache | None) -> ModelTokenizer:
        """The same model (same tokenizer, templates and encoder, nothing reloaded)
        counting through `piece_cache`, or whole texts when it is None."""
        return self._copy(piece_cache, self._choice, self._chat_cache)

    def with_chat_cache(self, chat_cache: ChatCountCache | None) -> ModelTokenizer:
        """The same model remembering chat counts in `chat_cache` (None: rendering every request)."""
        cache = self._piece_counter.cache if self._piece_counter is not None else None
        return self._copy(cache, self._choice, chat_cache)

    @property
    def chat_cache(self) -> ChatCountCache | None:
        return self._chat_cache

    def with_encoder(self, encoder: Encoder | EncoderChoice) -> ModelTokenizer:
        """The same model counting with `encoder` (benchmarks and tests compare engines this way)."""
        choice = encoder if isinstance(encoder, EncoderChoice) else EncoderChoice(encoder)
        cache = self._piece_counter.cache if self._piece_counter is not None else None
        return self._copy(cache, choice, self._chat_cache)

    def _copy(
        self, piece_cache: PieceCountCache | None, choice: EncoderChoice, chat_cache: ChatCountCache | None
    ) -> ModelTokenizer:
        counter, fallback = None, None
        if piece_cache is not None:
            counter, fallback = PieceCounter.for_tokenizer(
                self._tokenizer, piece_cache, self._identity, choice.encoder
            )
        clone = copy.copy(self)  # keeps a subclass and its own state
        clone._piece_counter = counter
        clone.piece_fallback = fallback
        clone._choice = choice
        clone._encoder = choice.encoder
        clone._chat_cache = chat_cache if self._identity is not None else None
        return clone

    @property
    def tokenizer_loader(self) -> str:
        """The loader rules this model's tokenizer was built with: "transformers5" or "tokenizer_json"."""
        return self.loader_info.loader

    @property
    def engine(self) -> str:
        """Which engine counts this model's tokens: "fastokens" or "tokenizers"."""
        return self._encoder.name

    def engine_settled(self, timeout: float | None = None, *, now: bool = False) -> bool:
        """True once this model counts with the engine it will keep (a deferred fast engine loaded or
        refused).  `now` starts that load at once instead of after counting has paid for it."""
        encoder = self._encoder
        if not isinstance(encoder, DeferredEncoder):
            return True
        if now:
            encoder.start_now()
        return encoder.wait_settled(timeout)

    @property
    def engine_failures(self) -> int:
        """Texts the fast engine raised on since load (each counted by `tokenizers` instead)."""
        return int(getattr(self._encoder, "failures", 0))

    @property
    def engine_fallback(self) -> str | None:
        """Why this model counts with `tokenizers` although a faster engine was wanted
        (not yet paid for, not installed, cannot load the tokenizer, failed the self-check); None otherwise."""
        if isinstance(self._encoder, DeferredEncoder):
            return self._encoder.fallback_reason
        return self._choice.fallback_reason

    @property
    def piece_counter(self) -> PieceCounter | None:
        """The per-piece counter, or None when this model counts whole texts
        (no piece cache given, or `piece_fallback` says why not)."""
        return self._piece_counter

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def __repr__(self) -> str:
        return f"ModelTokenizer({str(self.source_dir)!r})"

    # -- internals -------------------------------------------------------

    def _select_template(self, tools: list[Any] | None) -> ChatTemplate:
        """transformers' `get_chat_template`: "tool_use" when tools are given and
        such a template exists, else "default"."""
        if not self._templates:
            raise CountError(
                f"The model's tokenizer files in {self.source_dir} define no chat template, so a "
                "chat request cannot be rendered (vLLM refuses it the same way); use /v1/completions "
                "or serve the model with --chat-template."
            )
        if tools is not None and "tool_use" in self._templates:
            return self._templates["tool_use"]
        if "default" in self._templates:
            return self._templates["default"]
        raise CountError(
            "This model has multiple chat templates with no default specified; the request cannot "
            f"be rendered. Available templates: {sorted(self._templates)}."
        )

    def _render(self, body: Any) -> tuple[str, bool, list[MediaItem]]:
        template, variables, options, media = self._prepare(body)
        text = render(template.compiled, variables, continue_final_message=options.continue_final_message)
        return text, options.add_special_tokens, media

    def _prepare(self, body: Any) -> tuple[ChatTemplate, dict[str, Any], _chat.ChatOptions, list[MediaItem]]:
        """The template, the variables it renders this request with (validated), and its media."""
        if not isinstance(body, dict):
            raise CountError("The request body must be a JSON object.")
        _chat.check_no_request_template(body)
        options = _chat.chat_options(body)
        tools = _chat.parse_tools(body)
        kwargs = _chat.template_kwargs(body, options)
        tools = _chat.rendered_tools(tools, kwargs)
        template = self._select_template(tools)
        placeholders = self._media_model.placeholders if self._media_model is not None else None
        conversation = _chat.parse_messages(
            body, template.content_format, template.knows_developer, placeholders
        )
        named, extra = _chat.split_kwargs(kwargs, template.variables)
        variables = {**self._special_tokens, **extra}
        variables.update(
            messages=conversation.messages,
            tools=tools,
            documents=named.get("documents"),
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
        )
        return template, variables, options, conversation.media

    def _count_with_media(self, text: str, add_special_tokens: bool, media: list[MediaItem],
                          body: dict[str, Any]) -> int:
        """Encode the prompt to ids, then let the model's arithmetic expand each image.

        Media requests are counted whole, not piece by piece: the arithmetic
        needs the ids around each placeholder.  Each image's header is read
        before the prompt is encoded, so an image vLLM would refuse fails fast.
        """
        model = self._media_model
        if model is None:
            first = media[0]
            raise MediaNotCountable(
                f"'{first.where}' is a {first.part_type} part and this model has no multimodal arithmetic "
                f"in brimful ({self.media_unsupported}).",
                reason="model",
                where=first.where,
            )
        kwargs = body.get("mm_processor_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise CountError("'mm_processor_kwargs' must be an object.", param="mm_processor_kwargs")
        sizes = []
        for item in media:
            if item.modality != "image" or item.part_type not in ("image_url", "input_image") or item.url is None:
                raise MediaNotCountable(
                    f"'{item.where}' is a {item.part_type} part; brimful counts images given by URL only.",
                    reason="modality",
                    where=item.where,
                )
            sizes.append(image_size(open_media_url(item.url, item.where), item.where))
        ids = self._encoder.ids(text, add_special_tokens)
        return model.count(list(ids), sizes, kwargs)


def _read_config(path: pathlib.Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object.")
    return config


def _model_vocab_size(path: pathlib.Path) -> int | None:
    """config.json's `vocab_size` (or its `text_config`'s, for multimodal models); None if absent."""
    try:
        config = _read_config(path)
    except ValueError:
        return None
    for section in (config, config.get("text_config")):
        if isinstance(section, dict):
            size = section.get("vocab_size")
            if isinstance(size, int) and not isinstance(size, bool) and size > 0:
                return size
    return None


def load_model_tokenizer(
    directory: str | os.PathLike[str],
    *,
    piece_cache: PieceCountCache | None = None,
    tokenizer_mode: str = "auto",
    harmony_options: HarmonyOptions | None = None,
    engine: str = "auto",
    chat_cache: ChatCountCache | None = None,
    tokenizer_loader: str = "auto",
    name_or_path: str | None = None,
) -> CountingModel:
    """Load a model directory's tokenizer the way vLLM would for `tokenizer_mode`.

    The renderer follows vLLM's choice (`_family.detect_family`): a gpt-oss
    config gives a HarmonyTokenizer, a Mistral-format folder (or
    tokenizer_mode "mistral") a MistralTokenizer, anything else a
    ModelTokenizer on tokenizer.json and the chat template(s).

    With `piece_cache`, texts are counted piece by piece between added tokens
    and only pieces not seen before are encoded (`_piece_count`), unless the
    tokenizer's pieces are not independent (then `piece_fallback` says why).
    `engine` picks the encoder ("auto": fastokens when it passes the
    self-check, see `_encoder.select_encoder`).  With `chat_cache`, a chat
    request whose template inputs were counted before is not rendered again
    (`_chat_cache`).  `tokenizer_loader` picks the rules that build the
    tokenizer from the folder (`_loader`: "transformers5", as vLLM 0.32;
    "tokenizer_json", as vLLM before 0.19.1; "auto": transformers5 for a
    folder with a config.json, `_loader.resolve_loader`), and `name_or_path`
    is the name transformers is to see as the model's (default: the folder).
    vLLM 0.32 resolves a hub id to its cache snapshot before AutoTokenizer
    (`get_non_weight_snapshot_path`), so transformers sees the folder and its
    id rules (deepseek-ai/deepseek-r1-distill-llama-* -> tokenizer.json as it
    is) never apply: the default is what vLLM 0.32 builds
    (tests/tokenizer_cache/test_probe_parity.py).
    Raises FileNotFoundError when the directory or its tokenizer file is
    missing, ValueError when a file is malformed or the tokenizer mode unknown.
    Never downloads.
    """
    source_dir = pathlib.Path(directory).expanduser().resolve()
    if not source_dir.is_dir():
        raise FileNotFoundError(f"Tokenizer directory {source_dir} does not exist.")
    family = detect_family(source_dir, tokenizer_mode)
    if family == "mistral":
        from ._mistral import load_mistral_tokenizer

        return load_mistral_tokenizer(source_dir)
    model = _load_hf_shared(source_dir, engine, resolve_loader(tokenizer_loader, source_dir),
                            name_or_path)
    if chat_cache is not None:
        model = model.with_chat_cache(chat_cache)
    if family == "harmony":
        from ._gptoss import HarmonyTokenizer

        harmony = HarmonyTokenizer(
            source_dir, model._tokenizer, model._templates, model._special_tokens, identity=model._identity,
            encoder=model._choice, max_chars_per_token=model.max_chars_per_token, loader_info=model.loader_info,
        )
        harmony.harmony_options = harmony_options or HarmonyOptions.from_env()
        model = harmony
    return model.with_piece_cache(piece_cache) if piece_cache is not None else model


# Loaded folders, shared by every TokenizerCache of the process: parsing a
# tokenizer.json and building the fast engine takes seconds per model
# (Qwen3-8B: ~0.3 s for `tokenizers`, ~1.2 s more for fastokens and its
# self-check), and a model's loaded state is read-only once built (each cache
# adds its own piece and chat caches to a copy).  Keyed by the files' sizes
# and modification times, so a folder changed on disk is loaded afresh.
_LOADED_MAX = 16
_loaded: OrderedDict[tuple[Any, ...], ModelTokenizer] = OrderedDict()
_loaded_lock = threading.Lock()

# Parsed tokenizers and their chosen encoders, keyed by what they encode (the
# tokenizer.json bytes and split_special_tokens, as `identity` is) and the
# engine asked for: folders that ship the same tokenizer (fine-tunes, a base
# model and its variants, one model behind two upstreams) parse it and build
# and self-check the fast engine once.  Both are read-only once built.
_engines: OrderedDict[tuple[bytes, str], tuple[Tokenizer, EncoderChoice, int]] = OrderedDict()
_K = TypeVar("_K")
_V = TypeVar("_V")

# What transformers 5 built, kept by what AutoTokenizer reads (`_build_key`): folders that differ only
# in what it ignores (a config.json's sizes, the weights) build once; a build takes 0.4-1.8 s of CPU.
_built: OrderedDict[tuple[Any, ...], BuiltBackend] = OrderedDict()
# the files AutoTokenizer and the tokenizer classes read, and config.json's fields that choose the class
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "chat_template.jinja",
                    "chat_template.json")
_CLASS_FIELDS = ("model_type", "tokenizer_class", "auto_map", "architectures")


def _build_key(source_dir: pathlib.Path, name_or_path: str | None) -> tuple[Any, ...]:
    """The tokenizer files' bytes, the config fields that pick the tokenizer class, and the id vLLM passes
    (an absolute folder path matches none of transformers' id patterns, so the folder itself is not in it)."""
    digest = hashlib.blake2b(digest_size=20)
    for name in _TOKENIZER_FILES:
        try:
            data = (source_dir / name).read_bytes()
        except OSError:
            continue
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    config = _read_config(source_dir / "config.json")
    text = config.get("text_config")
    fields = {k: config.get(k) for k in _CLASS_FIELDS}
    fields["text_config"] = {k: text.get(k) for k in _CLASS_FIELDS} if isinstance(text, dict) else None
    return digest.digest(), json.dumps(fields, sort_keys=True, default=str), name_or_path


def folder_signature(source_dir: pathlib.Path) -> tuple[tuple[str, int, int], ...]:
    """The size and modification time of each file a tokenizer or renderer is built from."""
    names = (*_TOKENIZER_FILES, "config.json", "preprocessor_config.json", "processor_config.json", "tekken.json")
    signature = []
    for name in names:
        try:
            stat = (source_dir / name).stat()
        except OSError:
            continue
        signature.append((name, stat.st_size, stat.st_mtime_ns))
    return tuple(signature)


def _kept(table: OrderedDict[_K, _V], key: _K, build: Callable[[], _V]) -> _V:
    """`table[key]`, built (outside the lock) when missing; past `_LOADED_MAX` entries the least recently used go."""
    with _loaded_lock:
        found = table.get(key)
        if found is not None:
            table.move_to_end(key)
            return found
    value = build()
    with _loaded_lock:
        table[key] = value
        while len(table) > _LOADED_MAX:
            table.popitem(last=False)
    return value


def _load_hf_shared(source_dir: pathlib.Path, engine: str, loader: str, name_or_path: str | None) -> ModelTokenizer:
    key = (source_dir, engine, loader, name_or_path, folder_signature(source_dir))
    return _kept(_loaded, key, lambda: _load_hf(source_dir, engine, loader, name_or_path))


def _stored_build(key: tuple[Any, ...], source_dir: pathlib.Path, name_or_path: str | None) -> BuiltBackend:
    """The build this machine made before (`_build_store`), else a new one, kept for the next process."""
    store = build_store()
    built = store.get(key)
    if built is None:
        built = build_transformers5(source_dir, name_or_path)
        store.put(key, built)
    return built


def _tokenizer_spec(
    source_dir: pathlib.Path, raw: bytes, config: Mapping[str, Any], loader: str, name_or_path: str | None
) -> tuple[bytes, bool, LoaderInfo]:
    """The tokenizer.json the engines load, split_special_tokens, and how it was built.

    transformers5: what transformers 5's AutoTokenizer builds from the folder
    (`_loader.build_transformers5`); where it cannot, tokenizer.json as it is,
    with the reason (logged: counts may then differ from vLLM's).
    """
    split_special_tokens = bool(config.get("split_special_tokens", False))
    if loader != TRANSFORMERS5:
        return raw, split_special_tokens, LoaderInfo()
    try:
        key = _build_key(source_dir, name_or_path)
        built = _kept(_built, key, lambda: _stored_build(key, source_dir, name_or_path))
    except LoaderUnavailable as exc:
        _logger.warning("%s: counting with tokenizer.json as it is, not as vLLM's transformers 5 loads it: %s",
                        source_dir, exc)
        return raw, split_special_tokens, LoaderInfo(fallback_reason=str(exc))
    info = LoaderInfo(loader=TRANSFORMERS5, tokenizer_class=built.tokenizer_class)
    return built.spec.encode("utf-8"), built.split_special_tokens, info


def _load_hf(
    source_dir: pathlib.Path, engine: str = "auto", loader: str = TRANSFORMERS5, name_or_path: str | None = None
) -> ModelTokenizer:
    """tokenizer.json + tokenizer_config.json (+ chat_template.jinja), compiled once."""
    tokenizer_file = source_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise FileNotFoundError(
            f"{source_dir} has no tokenizer.json; brimful needs the model's fast-tokenizer file "
            "(the one the Hugging Face repository ships) to count tokens."
        )
    try:
        raw = tokenizer_file.read_bytes()
    except OSError as exc:
        raise ValueError(f"{tokenizer_file} could not be loaded by `tokenizers`: {exc}") from exc
    config = _read_config(source_dir / "tokenizer_config.json")
    raw, split_special_tokens, loader_info = _tokenizer_spec(source_dir, raw, config, loader, name_or_path)
    # The file's bytes name the tokenizer in piece-cache keys (cheaper than
    # re-serialising it); split_special_tokens changes what the same file encodes.
    identity = hashlib.blake2b(raw + (b"\x01" if split_special_tokens else b"\x00"), digest_size=32).digest()
    tokenizer, encoder, longest_token = _kept(_engines, (identity, engine),
                                              lambda: _build_engine(engine, raw, split_special_tokens, tokenizer_file))
    templates = {
        name: _compile(name, source, source_dir)
        for name, source in _template_sources(source_dir, config).items()
    }
    media_model, media_unsupported = load_media_model(source_dir, tokenizer, config)
    return ModelTokenizer(
        source_dir,
        tokenizer,
        templates,
        special_token_variables(config),
        identity=identity,
        model_vocab_size=_model_vocab_size(source_dir / "config.json"),
        media_model=media_model,
        media_unsupported=media_unsupported,
        encoder=encoder,
        max_chars_per_token=max(longest_token, max_chars_per_token((), config_token_texts(config))),
        loader_info=loader_info,
    )


def _build_engine(
    engine: str, raw: bytes, split_special_tokens: bool, tokenizer_file: pathlib.Path
) -> tuple[Tokenizer, EncoderChoice, int]:
    """The parsed tokenizer, its encoder and its longest token in characters (vLLM's character
    bound; reading the vocabulary costs 0.1-0.8 s), kept in `_engines` by what they encode."""
    started = time.perf_counter()
    try:
        tokenizer = Tokenizer.from_buffer(raw)
    except Exception as exc:  # tokenizers raises its own Exception type
        raise ValueError(f"{tokenizer_file} could not be loaded by `tokenizers`: {exc}") from exc
    loaded_in = time.perf_counter() - started
    # transformers counts without truncation/padding whatever tokenizer.json
    # stores, and splits special-token text only when the config asks to.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    tokenizer.encode_special_tokens = split_special_tokens
    source = str(tokenizer_file.parent)
    if engine == "auto":  # the fast engine once counting has paid for its load (`_encoder.DeferredEncoder`)
        encoder = deferred_encoder(tokenizer, raw, budget_seconds=LOAD_COST_RATIO * loaded_in, source=source)
    else:
        encoder = select_encoder(tokenizer, raw.decode("utf-8"), engine=engine, source=source)
    return tokenizer, encoder, _max_chars_per_token(tokenizer.get_vocab(with_added_tokens=True))
