"""One model's tokenizer and chat template(s), loaded once, counting many requests.

A model directory holds `tokenizer.json` (the `tokenizers` model vLLM's fast
tokenizer wraps), `tokenizer_config.json` (special tokens, maybe the chat
template) and optionally `chat_template.jinja` (which wins over the config's
template, as in transformers).  Loading parses and compiles everything once;
counting then only validates the request, renders and encodes.
"""

from __future__ import annotations

import copy
import functools
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
from ._content_format import ContentFormat, detect_content_format
from ._data_url import open_media_url
from ._errors import CountError, MediaNotCountable
from ._family import detect_family
from ._harmony import HarmonyOptions
from ._image_size import image_size
from ._jinja import compile_template, parse_template
from ._media import MediaItem, MediaModel, load_media_model
from ._piece_cache import PieceCountCache
from ._piece_count import PieceCounter, PieceTally
from ._protocol import CountingModel
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
    """Counts prompt tokens for one model exactly as vLLM does (HF tokenizer + chat template)."""

    # Which renderer vLLM uses for this model (`_family.Family`).
    family = "hf"

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
    ) -> None:
        self.source_dir = source_dir
        # The model's embedding rows (config.json `vocab_size`), when the
        # directory says: vLLM accepts prompt ids up to the larger of it and the
        # tokenizer's own largest id.
        self.model_vocab_size = model_vocab_size
        self._tokenizer = tokenizer
        self._templates = templates
        self._special_tokens = special_tokens
        self._piece_counter = piece_counter
        # Why this tokenizer is counted whole although a piece cache was offered.
        self.piece_fallback = piece_fallback
        self._identity = identity
        self._media_model = media_model
        # Why media cannot be counted for this model ("" when they can).
        self.media_unsupported = media_unsupported

    # -- public ----------------------------------------------------------

    def count_chat(self, body: dict) -> int:
        """Prompt tokens of a /v1/chat/completions request, media included.

        Raises CountError where vLLM would answer 400, MediaNotCountable where
        the request holds media this model's arithmetic cannot count (then
        forward it unclamped: it is not an invalid request).
        """
        return self.tally_chat(body).tokens

    def tally_chat(self, body: dict) -> PieceTally:
        """`count_chat` plus the work it took (how much was encoded rather than cached)."""
        text, add_special_tokens, media = self._render(body)
        if media:
            tokens = self._count_with_media(text, add_special_tokens, media, body)
            return PieceTally(tokens=tokens, pieces=1, added_tokens=0, encoded_pieces=1, encoded_tokens=tokens)
        return self.tally_text(text, add_special_tokens=add_special_tokens)

    def render_chat(self, body: dict) -> str:
        """The prompt text vLLM would encode for this chat request (media as placeholders)."""
        return self._render(body)[0]

    @property
    def media_family(self) -> str | None:
        """The multimodal arithmetic this model counts images with ("qwen2_vl", "gemma3", ...)."""
        return self._media_model.family if self._media_model is not None else None

    def count_completion(self, body: dict) -> list[int]:
        """Prompt tokens of a /v1/completions request, one figure per prompt."""
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

        Without it, `encode_batch_fast` gives the same ids as `encode` but releases the GIL
        while it works and skips offset tracking: a long prompt counted in a
        worker thread then leaves the event loop running, and counting is
        about twice as fast (bench/count_bench.py).
        """
        if self._piece_counter is not None:
            return self._piece_counter.count(text, add_special_tokens=add_special_tokens)
        encodings = self._tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        # len(Encoding) is the number of ids without building a Python list of
        # them: for 100k tokens that list costs 2-4 ms with the GIL held.
        tokens = len(encodings[0])
        return PieceTally(tokens=tokens, pieces=1, added_tokens=0, encoded_pieces=1, encoded_tokens=tokens)

    def with_piece_cache(self, piece_cache: PieceCountCache | None) -> ModelTokenizer:
        """The same model (same tokenizer and templates, nothing reloaded)
        counting through `piece_cache`, or whole texts when it is None."""
        counter, fallback = None, None
        if piece_cache is not None:
            counter, fallback = PieceCounter.for_tokenizer(self._tokenizer, piece_cache, self._identity)
        clone = copy.copy(self)  # keeps a subclass and its own state
        clone._piece_counter = counter
        clone.piece_fallback = fallback
        return clone

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

    def _render(self, body: Any) -> tuple[str, bool, list[MediaItem]]:
        if not isinstance(body, dict):
            raise CountError("The request body must be a JSON object.")
        _chat.check_no_request_template(body)
        options = _chat.chat_options(body)
        tools = _chat.parse_tools(body)
        template = self._select_template(tools)
        placeholders = self._media_model.placeholders if self._media_model is not None else None
        conversation = _chat.parse_messages(
            body, template.content_format, template.knows_developer, placeholders
        )
        named, extra = _chat.split_kwargs(_chat.template_kwargs(body, options), template.variables)
        variables = {**self._special_tokens, **extra}
        variables.update(
            messages=conversation.messages,
            tools=tools,
            documents=named.get("documents"),
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
        )
        text = render(template.compiled, variables, continue_final_message=options.continue_final_message)
        return text, options.add_special_tokens, conversation.media

    def _count_with_media(self, text: str, add_special_tokens: bool, media: list[MediaItem], body: dict) -> int:
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
                f"in headroom ({self.media_unsupported}).",
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
                    f"'{item.where}' is a {item.part_type} part; headroom counts images given by URL only.",
                    reason="modality",
                    where=item.where,
                )
            sizes.append(image_size(open_media_url(item.url, item.where), item.where))
        ids = self._tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
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
    directory: str | os.PathLike,
    *,
    piece_cache: PieceCountCache | None = None,
    tokenizer_mode: str = "auto",
    harmony_options: HarmonyOptions | None = None,
) -> CountingModel:
    """Load a model directory's tokenizer the way vLLM would for `tokenizer_mode`.

    The renderer follows vLLM's choice (`_family.detect_family`): a gpt-oss
    config gives a HarmonyTokenizer, a Mistral-format folder (or
    tokenizer_mode "mistral") a MistralTokenizer, anything else a
    ModelTokenizer on tokenizer.json and the chat template(s).

    With `piece_cache`, texts are counted piece by piece between added tokens
    and only pieces not seen before are encoded (`_piece_count`), unless the
    tokenizer's pieces are not independent (then `piece_fallback` says why).
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
    model = _load_hf(source_dir)
    if family == "harmony":
        from ._gptoss import HarmonyTokenizer

        harmony = HarmonyTokenizer(
            source_dir, model._tokenizer, model._templates, model._special_tokens, identity=model._identity
        )
        harmony.harmony_options = harmony_options or HarmonyOptions.from_env()
        model = harmony
    return model.with_piece_cache(piece_cache) if piece_cache is not None else model


def _load_hf(source_dir: pathlib.Path) -> ModelTokenizer:
    """tokenizer.json + tokenizer_config.json (+ chat_template.jinja), compiled once."""
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
    )
