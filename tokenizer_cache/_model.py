"""One model's tokenizer and chat template(s), loaded once, counting many requests.

A model directory holds `tokenizer.json` (the `tokenizers` model vLLM's fast
tokenizer wraps), `tokenizer_config.json` (special tokens, maybe the chat
template) and optionally `chat_template.jinja` (which wins over the config's
template, as in transformers).  Loading parses and compiles everything once;
counting then only validates the request, renders and encodes.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from dataclasses import dataclass
from typing import Any, Mapping

import jinja2
import jinja2.meta
from tokenizers import Tokenizer

from . import _chat, _completion
from ._char_bound import (
    char_bound,
    check_chars,
    config_token_texts,
    max_chars_per_token,
)
from ._chat_cache import MAX_CHARS as CHAT_CACHE_MAX_CHARS
from ._chat_cache import (
    ChatCountCache,
    inputs_digest,
    is_pure,
    message_chars,
    template_key,
)
from ._content_format import ContentFormat, detect_content_format
from ._encoder import Encoder, EncoderChoice, ReferenceEncoder, select_encoder
from ._errors import CountError
from ._jinja import compile_template, parse_template
from ._piece_cache import PieceCountCache
from ._piece_count import PieceCounter, PieceTally
from ._render import render

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


def _token_text(value: Any) -> str | None:
    """Special tokens appear as strings or as AddedToken dicts `{"content": ...}`."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
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
    )


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
    """Counts prompt tokens for one model exactly as vLLM does."""

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
        encoder: EncoderChoice | None = None,
        max_chars_per_token: int | None = None,
        chat_cache: ChatCountCache | None = None,
    ) -> None:
        self.source_dir = source_dir
        self._tokenizer = tokenizer
        self._choice = encoder or EncoderChoice(ReferenceEncoder(tokenizer))
        self._encoder: Encoder = self._choice.encoder
        self._templates = templates
        self._special_tokens = special_tokens
        self._piece_counter = piece_counter
        # Why this tokenizer is counted whole although a piece cache was offered.
        self.piece_fallback = piece_fallback
        self._identity = identity
        if max_chars_per_token is None:
            max_chars_per_token = _max_chars_per_token(tokenizer, {})
        # vLLM's longest token in characters: the character bound's factor (`_char_bound`).
        self.max_chars_per_token = max_chars_per_token
        self._chat_cache = chat_cache if identity is not None else None
        self._template_keys = {
            name: template_key(identity, template.source, special_tokens)
            for name, template in templates.items()
            if template.pure and identity is not None
        }

    # -- public ----------------------------------------------------------

    def count_chat(self, body: dict, *, max_model_len: int | None = None) -> int:
        """Prompt tokens of a /v1/chat/completions request; raises CountError.

        With `max_model_len`, a rendered prompt longer than vLLM's character
        bound raises CharBoundExceeded before anything is encoded.
        """
        return self.tally_chat(body, max_model_len=max_model_len).tokens

    def tally_chat(self, body: dict, *, max_model_len: int | None = None) -> PieceTally:
        """`count_chat` plus the work it took (how much was encoded rather than cached).

        A request whose template inputs were counted before comes from the
        chat cache (`_chat_cache`): nothing rendered, nothing encoded.
        """
        template, variables, options = self._prepare(body)
        bound = self._char_bound(body, max_model_len)
        digest = self._chat_digest(template, variables, options.add_special_tokens)
        if digest is not None:
            assert self._chat_cache is not None
            hit = self._chat_cache.get(digest)
            if hit is not None:
                tokens, chars = hit
                check_chars(chars, bound, max_model_len)
                return PieceTally(tokens=tokens, pieces=0, added_tokens=0, encoded_pieces=0, encoded_tokens=0)
        text = render(template.compiled, variables, continue_final_message=options.continue_final_message)
        check_chars(len(text), bound, max_model_len)
        tally = self.tally_text(text, add_special_tokens=options.add_special_tokens)
        if digest is not None:
            assert self._chat_cache is not None
            self._chat_cache.put(digest, tally.tokens, len(text))
        return tally

    def _chat_digest(self, template: ChatTemplate, variables: dict[str, Any], add_special_tokens: bool) -> bytes | None:
        key = self._template_keys.get(template.name) if self._chat_cache is not None else None
        if key is None or message_chars(variables["messages"]) > CHAT_CACHE_MAX_CHARS:
            return None
        return inputs_digest(key, variables, add_special_tokens)

    def char_bound(self, max_model_len: int | None, truncate_prompt_tokens: int | None = None) -> int | None:
        """The most characters vLLM lets a prompt have (None: it does not refuse by characters)."""
        return char_bound(max_model_len, self.max_chars_per_token, truncate_prompt_tokens)

    def _char_bound(self, body: dict, max_model_len: int | None) -> int | None:
        if max_model_len is None:
            return None
        return self.char_bound(max_model_len, body.get("truncate_prompt_tokens"))

    def render_chat(self, body: dict) -> str:
        """The prompt text vLLM would encode for this chat request."""
        return self._render(body)[0]

    def count_completion(self, body: dict, *, max_model_len: int | None = None) -> list[int]:
        """Prompt tokens of a /v1/completions request, one figure per prompt.

        With `max_model_len`, each text prompt is held to vLLM's character
        bound first (CharBoundExceeded), as vLLM checks each one.
        """
        if not isinstance(body, dict):
            raise CountError("The request body must be a JSON object.")
        add_special_tokens = _chat._as_bool(body, "add_special_tokens", True)
        bound = self._char_bound(body, max_model_len)
        prompts = _completion.parse_prompts(body)
        for prompt in prompts:
            if isinstance(prompt, str):
                check_chars(len(prompt), bound, max_model_len)
        counts = []
        for prompt in prompts:
            if isinstance(prompt, str):
                counts.append(self.count_text(prompt, add_special_tokens=add_special_tokens))
            else:
                counts.append(len(prompt))
        return counts

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
        return ModelTokenizer(
            self.source_dir,
            self._tokenizer,
            self._templates,
            self._special_tokens,
            piece_counter=counter,
            piece_fallback=fallback,
            identity=self._identity,
            encoder=choice,
            max_chars_per_token=self.max_chars_per_token,
            chat_cache=chat_cache,
        )

    @property
    def engine(self) -> str:
        """Which engine counts this model's tokens: "fastokens" or "tokenizers"."""
        return self._encoder.name

    @property
    def engine_failures(self) -> int:
        """Texts the fast engine raised on since load (each counted by `tokenizers` instead)."""
        return int(getattr(self._encoder, "failures", 0))

    @property
    def engine_fallback(self) -> str | None:
        """Why this model counts with `tokenizers` although a faster engine was wanted
        (not installed, cannot load the tokenizer, failed the self-check); None otherwise."""
        return self._choice.fallback_reason

    @property
    def piece_counter(self) -> PieceCounter | None:
        """The per-piece counter, or None when this model counts whole texts
        (no piece cache given, or `piece_fallback` says why not)."""
        return self._piece_counter

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def has_chat_template(self) -> bool:
        return bool(self._templates)

    def __repr__(self) -> str:
        return f"ModelTokenizer({str(self.source_dir)!r})"

    # -- internals -------------------------------------------------------

    def _select_template(self, tools: list | None) -> ChatTemplate:
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

    def _render(self, body: Any) -> tuple[str, bool]:
        template, variables, options = self._prepare(body)
        text = render(template.compiled, variables, continue_final_message=options.continue_final_message)
        return text, options.add_special_tokens

    def _prepare(self, body: Any) -> tuple[ChatTemplate, dict[str, Any], _chat.ChatOptions]:
        """The template and the variables it renders this request with (validated)."""
        if not isinstance(body, dict):
            raise CountError("The request body must be a JSON object.")
        _chat.check_no_request_template(body)
        options = _chat.chat_options(body)
        tools = _chat.parse_tools(body)
        template = self._select_template(tools)
        conversation = _chat.parse_messages(body, template.content_format, template.knows_developer)
        named, extra = _chat.split_kwargs(_chat.template_kwargs(body, options), template.variables)
        variables = {**self._special_tokens, **extra}
        variables.update(
            messages=conversation,
            tools=tools,
            documents=named.get("documents"),
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
        )
        return template, variables, options


def _max_chars_per_token(tokenizer: Tokenizer, config: Mapping[str, Any]) -> int:
    return max_chars_per_token(tokenizer.get_vocab(with_added_tokens=True), config_token_texts(config))


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


def load_model_tokenizer(
    directory: str | os.PathLike,
    *,
    piece_cache: PieceCountCache | None = None,
    engine: str = "auto",
    chat_cache: ChatCountCache | None = None,
) -> ModelTokenizer:
    """Load tokenizer.json and compile the chat template(s) of a model directory.

    With `piece_cache`, texts are counted piece by piece between added tokens
    and only pieces not seen before are encoded (`_piece_count`), unless the
    tokenizer's pieces are not independent (then `piece_fallback` says why).
    `engine` picks the encoder ("auto": fastokens when it passes the
    self-check, see `_encoder.select_encoder`).  With `chat_cache`, a chat
    request whose template inputs were counted before is not rendered again
    (`_chat_cache`).  Raises FileNotFoundError when the directory or its tokenizer.json is
    missing, ValueError when a file is malformed.  Never downloads.
    """
    source_dir = pathlib.Path(directory).expanduser().resolve()
    if not source_dir.is_dir():
        raise FileNotFoundError(f"Tokenizer directory {source_dir} does not exist.")
    tokenizer_file = source_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise FileNotFoundError(
            f"{source_dir} has no tokenizer.json; headroom needs the model's fast-tokenizer file "
            "(the one the Hugging Face repository ships) to count tokens."
        )
    try:
        raw = tokenizer_file.read_bytes()
        tokenizer = Tokenizer.from_buffer(raw)
    except Exception as exc:  # tokenizers raises its own Exception type
        raise ValueError(f"{tokenizer_file} could not be loaded by `tokenizers`: {exc}") from exc
    # transformers counts without truncation/padding whatever tokenizer.json
    # stores, and splits special-token text only when the config asks to.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    config = _read_config(source_dir / "tokenizer_config.json")
    tokenizer.encode_special_tokens = bool(config.get("split_special_tokens", False))
    templates = {
        name: _compile(name, source, source_dir)
        for name, source in _template_sources(source_dir, config).items()
    }
    # The file's bytes name the tokenizer in piece-cache keys (cheaper than
    # re-serialising it); split_special_tokens changes what the same file encodes.
    identity = hashlib.blake2b(
        raw + (b"\x01" if tokenizer.encode_special_tokens else b"\x00"), digest_size=32
    ).digest()
    choice = select_encoder(tokenizer, raw.decode("utf-8"), engine=engine, source=str(source_dir))
    model = ModelTokenizer(
        source_dir, tokenizer, templates, special_token_variables(config), identity=identity, encoder=choice,
        max_chars_per_token=_max_chars_per_token(tokenizer, config), chat_cache=chat_cache,
    )
    return model.with_piece_cache(piece_cache) if piece_cache is not None else model
