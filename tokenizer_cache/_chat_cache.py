"""Chat counts remembered by the exact inputs of the template, so a repeated request skips rendering.

A chat prompt's token count is a function of the template, the variables
it is rendered with (special tokens, messages, tools, documents, flags,
chat_template_kwargs), `continue_final_message` and `add_special_tokens`,
and of the tokenizer.  When the template calls nothing time- or
randomness-dependent (`strftime_now`, `lipsum`, the `random` filter), the
same inputs render the same text, so a digest of them can stand for it:
the key is a keyed blake2b (key: tokenizer identity + template source +
special tokens) over the variables' JSON, which tells every JSON value
apart (1 / 1.0 / true, key order, string escapes).  Requests that render
with an error are not remembered: they render again and raise again.

What it saves is what vLLM-style request handling repeats: identical
requests (retries, health probes, the same prompt sent by many clients,
benchmarks).  A conversation that grows by a turn is a new key; its pieces
still come from the piece cache.  It only takes requests whose message
text is at most `MAX_CHARS` characters: above that, serialising and
hashing the inputs costs a fair share of counting them.

Rendering a prefix of a conversation cannot stand for the whole in
general: templates look ahead (Qwen3 drops the reasoning of assistant
turns before the last user query, found by a backwards scan), so an
earlier turn renders differently once a turn is added.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jinja2.nodes

DEFAULT_MAX_ENTRIES = 16_384
MAX_CHARS = 32_768
# Template globals / filters whose result is not a function of the inputs.
_IMPURE_NAMES = frozenset({"strftime_now", "lipsum"})
_IMPURE_FILTERS = frozenset({"random"})


def is_pure(ast: jinja2.nodes.Template) -> bool:
    """Whether renders of this template depend on the inputs alone: it names no
    impure global (even to alias it) and applies no impure filter."""
    if any(node.name in _IMPURE_NAMES for node in ast.find_all(jinja2.nodes.Name)):
        return False
    return not any(node.name in _IMPURE_FILTERS for node in ast.find_all(jinja2.nodes.Filter))


def template_key(identity: bytes, source: str, special_tokens: Mapping[str, Any]) -> bytes:
    """The blake2b key naming one model's template: what the inputs' digest is keyed with."""
    material = identity + source.encode("utf-8", "surrogatepass") + json.dumps(special_tokens).encode("ascii")
    return hashlib.blake2b(material, digest_size=32).digest()


def message_chars(messages: list[dict[str, Any]], stop_above: int) -> int:
    """Characters of message text (strings and text parts): the size tests before hashing and before
    the render memo.  Both only compare with a bound, so the sum stops at the first message that
    takes it past `stop_above` (then it is some number above it): an agent's long conversation is
    past both within its system prompt, and is not walked whole on every turn."""
    total = 0
    for message in messages:
        if total > stop_above:
            break
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(part.get("text") or "") for part in content if isinstance(part, dict))
        reasoning = message.get("reasoning")
        if isinstance(reasoning, str):
            total += len(reasoning)
    return total


def inputs_digest(key: bytes, variables: Mapping[str, Any], add_special_tokens: bool) -> bytes | None:
    """The digest of one render's inputs, or None when they are not plain JSON data."""
    try:
        data = json.dumps(variables, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError):
        return None
    hasher = hashlib.blake2b(digest_size=16, key=key)
    hasher.update(b"\x01" if add_special_tokens else b"\x00")
    hasher.update(data.encode("ascii"))
    return hasher.digest()


@dataclass(frozen=True)
class ChatCacheStats:
    entries: int
    max_entries: int
    hits: int
    misses: int


class ChatCountCache:
    """digest → (prompt tokens, prompt characters); bounded LRU, thread-safe, shared by models."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
        self._hits = 0
        self._misses = 0

    def get(self, digest: bytes) -> tuple[int, int] | None:
        with self._lock:
            found = self._entries.get(digest)
            if found is None:
                self._misses += 1
            else:
                self._hits += 1
                self._entries.move_to_end(digest)
            return found

    def put(self, digest: bytes, tokens: int, chars: int) -> None:
        with self._lock:
            self._entries[digest] = (tokens, chars)
            self._entries.move_to_end(digest)
            if len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def stats(self) -> ChatCacheStats:
        with self._lock:
            return ChatCacheStats(len(self._entries), self.max_entries, self._hits, self._misses)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
