"""A JSON request body: parsed once (`parse_object`), and rewritten in place of its top-level values.

brimful changes at most a few top-level fields of a request (the completion
limit, `stream_options`).  Re-serialising the whole parsed body for that
re-escaped every string in it: ~0.4 ms of event-loop time for a 111 KiB
(23k-token) chat, while every small request queued behind it, and the
upstream received the client's JSON re-formatted.  Here the top-level object
is walked with the `json` module's own C scanner, which returns where each
value ends; a rewrite then replaces those values' bytes and copies every
other byte as the client sent it.

The walk costs about what `json.loads` costs, so it only paid off where
re-serialising with the json module was dearer: `with_fields` splices bodies of
4 KiB and more (measured crossover with json.dumps: 4 KiB 10.5 vs 12.0 us, 197 B
5 vs 4 us more; 111 KiB 25 vs 237 us on top of the parse) and re-serialises
smaller ones.  A body the walk does not take (UTF-16/32, not an object) gets no
layout and is re-serialised too.  Since bodies are read and written with orjson
where it agrees with the json module (`loads`, `dumps`), re-serialising is
cheaper than the walk at every size (4 KiB: 0.5 vs 8.5 us); the splice stays
from 4 KiB on for what it keeps, the client's bytes.  A body orjson would write
byte for byte (compact, as most clients send) gets the same bytes by writing
the updated object, without the walk (`_as_orjson_writes_it`).
"""

from __future__ import annotations

import json
import json.decoder
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy import errors
from tokenizer_cache import json_loads, read_json
from tokenizer_cache import plain_json as plain

_DECODER = json.JSONDecoder()           # json.loads's defaults (NaN and Infinity accepted)
# The json module's C scanner and string reader (public attributes, untyped in typeshed).
_SCAN: Callable[[str, int], tuple[Any, int]] = getattr(_DECODER, "scan_once")  # noqa: B009
_SCANSTRING: Callable[[str, int], tuple[str, int]] = getattr(json.decoder, "scanstring")  # noqa: B009
_WS = re.compile(r"[ \t\n\r]*")


def _skip_ws(text: str, idx: int) -> int:
    """The offset after the whitespace at `idx`.  A compact body has none, and testing one
    character first halves the walk of a 4 KiB body (14 -> 8.5 us): a regex call each time was most of it."""
    if idx < len(text) and text[idx] in " \t\n\r":
        match = _WS.match(text, idx)
        assert match is not None
        return match.end()
    return idx


@dataclass(frozen=True)
class Layout:
    """Where the top-level values of a UTF-8 JSON object sit in its body."""

    text: str                                  # the body decoded
    ascii: bool                                # str offsets are byte offsets
    values: dict[str, list[tuple[int, int]]]   # key -> [start, end) of each occurrence (duplicates too)
    close: int                                 # offset of the closing brace


def layout(body: bytes) -> Layout | None:
    """Where the top-level values of `body` sit; None when it is not a UTF-8 JSON object
    (a UTF-16/32 body, a BOM, another top-level type, invalid JSON).

    Meant for a body `json.loads` already accepted: the walk parses each value
    with the same scanner, so it finds the same object.
    """
    if json.detect_encoding(body) != "utf-8":     # UTF-16/32, or a BOM json.loads refuses
        return None
    try:
        return _walk(body.decode("utf-8", "surrogatepass"), body.isascii())
    except (ValueError, StopIteration, IndexError, RecursionError):
        return None


def _walk(text: str, ascii: bool) -> Layout:
    idx = _skip_ws(text, 0)
    if text[idx] != "{":
        raise ValueError("not an object")
    values: dict[str, list[tuple[int, int]]] = {}
    idx = _skip_ws(text, idx + 1)
    if text[idx] != "}":
        while True:
            if text[idx] != '"':
                raise ValueError("expected a key")
            key, idx = _SCANSTRING(text, idx + 1)
            idx = _skip_ws(text, idx)
            if text[idx] != ":":
                raise ValueError("expected ':'")
            start = _skip_ws(text, idx + 1)
            _, end = _SCAN(text, start)             # parses the value to find where it ends
            values.setdefault(key, []).append((start, end))
            idx = _skip_ws(text, end)
            if text[idx] == ",":
                idx = _skip_ws(text, idx + 1)
                continue
            if text[idx] == "}":
                break
            raise ValueError("expected ',' or '}'")
    close = idx
    if _skip_ws(text, close + 1) != len(text):
        raise ValueError("extra data")
    return Layout(text, ascii, values, close)


def rewrite(body: bytes, layout: Layout, fields: Mapping[str, Any]) -> bytes:
    """`body` with each of `fields` set: every occurrence of a present key gets the new
    value in place, absent keys are appended at the end of the object; all other bytes
    stay the client's."""
    edits: list[tuple[int, int, str]] = []      # (start, end, replacement) in str offsets
    appended: list[str] = []
    for key, value in fields.items():
        encoded = _dumps(value)
        spans = layout.values.get(key)
        if spans:
            edits.extend((start, end, encoded) for start, end in spans)
        else:
            appended.append(_dumps(key) + ":" + encoded)
    if appended:
        tail = ("," if layout.values else "") + ",".join(appended)   # no comma in an empty object
        edits.append((layout.close, layout.close, tail))
    edits.sort(key=lambda e: e[0])
    offset = _byte_offsets(layout, [point for start, end, _ in edits for point in (start, end)])
    out: list[bytes] = []
    done = 0
    for start, end, replacement in edits:
        out.append(body[done : offset[start]])
        out.append(replacement.encode("utf-8"))
        done = offset[end]
    out.append(body[done:])
    return b"".join(out)


def _dumps(value: Any) -> str:
    return dumps(value).decode("utf-8")


def loads(body: bytes | str) -> Any:
    """`json.loads(body)`, the same value or error, by orjson where it reads the body as
    json.loads does (about a third of the CPU; `tokenizer_cache.json_loads`)."""
    return json_loads(body)


def dumps(value: Any) -> bytes:
    """`json.dumps(value, ensure_ascii=False, separators=(",", ":"))` in UTF-8, the same JSON
    (byte for byte but for the spelling of some floats, `1e16` for `1e+16`), by orjson where it
    writes the value as the json module does.  Raises UnicodeEncodeError for an unpaired
    surrogate, as encoding json.dumps' text does."""
    if plain(value):
        try:
            return orjson.dumps(value)
        except orjson.JSONEncodeError:      # an integer past 64 bits, an unpaired surrogate
            pass
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _byte_offsets(layout: Layout, points: list[int]) -> dict[int, int]:
    """str offsets → byte offsets in the UTF-8 body (one encode per gap, not per point)."""
    if layout.ascii:
        return {p: p for p in points}
    result: dict[int, int] = {}
    last_char, last_byte = 0, 0
    for p in sorted(set(points)):
        last_byte += len(layout.text[last_char:p].encode("utf-8", "surrogatepass"))
        last_char = p
        result[p] = last_byte
    return result


# From this size on, setting a field is cheaper by splicing it into the client's
# bytes than by re-serialising the parsed body.
SPLICE_ABOVE_BYTES = 4096


def with_fields(body: bytes, parsed: dict[str, Any], fields: Mapping[str, Any]) -> bytes:
    """The client's body with `fields` set: spliced into its bytes when large (every
    other byte as sent), re-serialised when small or not splicable (UTF-16/32)."""
    if len(body) >= SPLICE_ABOVE_BYTES:
        same = _as_orjson_writes_it(body, parsed, fields)
        if same is not None:
            return same
        found = layout(body)
        if found is not None:
            return rewrite(body, found, fields)
    updated = dict(parsed)
    updated.update(fields)
    try:
        return dumps(updated)
    except UnicodeEncodeError:      # an unpaired surrogate (in an UNTOKENIZED field): kept as its escape
        return json.dumps(updated, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _as_orjson_writes_it(body: bytes, parsed: dict[str, Any], fields: Mapping[str, Any]) -> bytes | None:
    """The splice's answer without the walk, for a body orjson would write byte for byte.

    When orjson writes `parsed` as exactly `body` (compact, each key once, each
    value spelt as orjson spells it), every top-level value sits where orjson
    puts it, so writing the updated object is the splice: the same bytes, a
    present key's value replaced in place, an absent one appended at the end,
    and each new value written by orjson as `dumps` writes it (`plain`).  The
    walk cost 9 of the 12 us of a 4 KiB chat's splice; this ~1 us.  Any other
    body (spaces, escapes orjson does not use, duplicate keys, NaN, wide
    integers) is told apart by the comparison and spliced as before.
    """
    if not all(plain(value) for value in fields.values()):
        return None
    try:
        if orjson.dumps(parsed) != body:
            return None
        updated = dict(parsed)
        updated.update(fields)
        return orjson.dumps(updated)
    except orjson.JSONEncodeError:      # an integer past 64 bits, an unpaired surrogate
        return None


def parse_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or the explained 400 brimful answers instead."""
    if not body.strip():
        raise errors.invalid_json("the body is empty")
    try:
        value, by_orjson = read_json(body)
    except UnicodeDecodeError:
        raise errors.invalid_json("it is not UTF-8 text") from None
    except RecursionError:
        raise errors.invalid_json("it is nested too deeply") from None
    except ValueError as exc:
        raise errors.invalid_json(str(exc)) from None
    # orjson refuses an unpaired surrogate: only a body json.loads read can hold one (the
    # regex alone costs ~140 us on a 400 KiB body).
    if not by_orjson and _LONE_SURROGATE_ESCAPE.search(body) and _has_lone_surrogate(
            {k: v for k, v in value.items() if k not in UNTOKENIZED} if isinstance(value, dict) else value):
        raise errors.invalid_json(
            "it contains an unpaired UTF-16 surrogate escape (\\ud800-\\udfff without its pair), "
            "which is not Unicode text: no tokenizer can encode it"
        )
    if not isinstance(value, dict):
        raise errors.body_not_object(
            {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(value), "null")
        )
    return value


# Top-level fields no tokenizer ever sees (brimful counts none of them, vLLM keeps them as
# strings): an unpaired surrogate in them is the client's business, as it is vLLM's
# (pydantic's str takes one), and the body is forwarded with it.
UNTOKENIZED = frozenset({"user", "metadata", "safety_identifier", "prompt_cache_key", "request_id"})

# A JSON escape for a UTF-16 surrogate (high or low half).  Python's json accepts
# an unpaired one and yields a str that tokenizers reject with TypeError and that
# cannot be encoded to UTF-8 again (a clamped body is re-serialized): both would
# surface as a bare 500.  The regex is a cheap pre-filter; only a body that has
# such an escape (valid pairs included, e.g. an emoji from an ensure_ascii client)
# pays for the exact check.
_LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
