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

from . import _anthropic, _chat, _completion, _responses
from ._content_format import ContentFormat, detect_content_format
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
    ) -> None:
        self.source_dir = source_dir
        self._tokenizer = tokenizer
        self._templates = templates
        self._special_tokens = special_tokens
        self._piece_counter = piece_counter
        # Why this tokenizer is counted whole although a piece cache was offered.
        self.piece_fallback = piece_fallback
        self._identity = identity
        self._merges_inline_system: bool | None = None
        self._disabled_thinking_effort: str | None = None

    # -- public ----------------------------------------------------------

    def count_chat(self, body: dict) -> int:
        """Prompt tokens of a /v1/chat/completions request; raises CountError."""
        return self.tally_chat(body).tokens

    def tally_chat(self, body: dict) -> PieceTally:
        """`count_chat` plus the work it took (how much was encoded rather than cached)."""
        text, add_special_tokens = self._render(body)
        return self.tally_text(text, add_special_tokens=add_special_tokens)

    def render_chat(self, body: dict) -> str:
        """The prompt text vLLM would encode for this chat request."""
        return self._render(body)[0]

    def count_messages(self, body: dict) -> int:
        """Prompt tokens of an Anthropic /v1/messages (or count_tokens) request; raises CountError."""
        return self.count_chat(self.messages_chat(body))

    def messages_chat(self, body: dict) -> dict:
        """The chat request vLLM converts a Messages request to (`_anthropic`)."""
        return _anthropic.to_chat_request(body, merge_inline_system=self.merges_inline_system,
                                          disabled_thinking_effort=self.disabled_thinking_effort)

    def count_responses(self, body: dict) -> int:
        """Prompt tokens of a /v1/responses request; raises CountError."""
        return self.count_chat(self.responses_chat(body))

    def responses_chat(self, body: dict) -> dict:
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
        def prompt(effort: str) -> str | None:
            try:
                return self.render_chat({"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": effort})
            except CountError:
                return None

        none = prompt("none")
        if none is None or any(prompt(effort) == none for effort in _anthropic.EFFORTS):
            return "low"
        return "none"

    def count_completion(self, body: dict) -> list[int]:
        """Prompt tokens of a /v1/completions request, one figure per prompt."""
        if not isinstance(body, dict):
            raise CountError("The request body must be a JSON object.")
        add_special_tokens = _chat._as_bool(body, "add_special_tokens", True)
        counts = []
        for prompt in _completion.parse_prompts(body):
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
        copy = ModelTokenizer(
            self.source_dir,
            self._tokenizer,
            self._templates,
            self._special_tokens,
            piece_counter=counter,
            piece_fallback=fallback,
            identity=self._identity,
        )
        copy._merges_inline_system = self._merges_inline_system
        copy._disabled_thinking_effort = self._disabled_thinking_effort
        return copy

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

    def _render(self, body: Any) -> tuple[str, bool]:
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
        text = render(template.compiled, variables, continue_final_message=options.continue_final_message)
        return text, options.add_special_tokens


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
    directory: str | os.PathLike, *, piece_cache: PieceCountCache | None = None
) -> ModelTokenizer:
    """Load tokenizer.json and compile the chat template(s) of a model directory.

    With `piece_cache`, texts are counted piece by piece between added tokens
    and only pieces not seen before are encoded (`_piece_count`), unless the
    tokenizer's pieces are not independent (then `piece_fallback` says why).
    Raises FileNotFoundError when the directory or its tokenizer.json is
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
    model = ModelTokenizer(source_dir, tokenizer, templates, special_token_variables(config), identity=identity)
    return model.with_piece_cache(piece_cache) if piece_cache is not None else model
