"""proxy.admitted.jsonbody: the layout of exactly the objects json.loads reads; rewrites touch only the fields set."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.admitted import jsonbody
from proxy.admitted.jsonbody import layout, rewrite

json_scalars = st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
keys = st.sampled_from(["max_tokens", "max_completion_tokens", "stream_options", "model", "messages", "n", "é"])


def values_at(body: bytes) -> dict | None:
    """The object the layout describes: each key's last occurrence parsed from its span."""
    lay = layout(body)
    if lay is None:
        return None
    return {key: json.loads(lay.text[spans[-1][0]:spans[-1][1]]) for key, spans in lay.values.items()}


def object_or_none(body: bytes) -> dict | None:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) and json.detect_encoding(body) == "utf-8" else None


@pytest.mark.parametrize("body", [
    b'{"model":"m","max_tokens":5}', b' \n{ "a" : 1 , "b" : [1, {"c": "}"}] } \r\n', b"{}", b"{ }",
    b'{"a":1,"a":2}', b'{"x":"\\u00e9\\ud83d\\ude00","y":NaN,"z":-Infinity}', "{\"k\":\"한국어 😀\"}".encode(),
    b"[1,2]", b'"text"', b"3", b"null", b"", b"   ", b"{", b'{"a":1,}', b'{"a" 1}', b'{"a":1}x', b"{a:1}",
    b'{"a":tru}', b"\xef\xbb\xbf{}", "{\"a\":1}".encode("utf-16"), b'{"a":"\x01"}', b'{"a":1}{"b":2}',
    b'{"bad":"\\ud800"}', b"\xff\xfe\x00", b"[" * 100_000 + b"]" * 100_000,
])
def test_a_layout_exactly_for_the_utf8_objects_json_loads_reads(body: bytes) -> None:
    assert values_at(body) == object_or_none(body)


def outcome(fn, arg):  # type: ignore[no-untyped-def]
    """What `fn(arg)` gives, told apart by type (repr: 1 is not 1.0 nor True), or the error it raises."""
    try:
        return "value", repr(fn(arg))
    except Exception as exc:   # the very error is what is compared
        return "error", type(exc), str(exc)


ODD_BODIES = [
    b'{"a":18446744073709551615,"b":18446744073709551616,"c":-9223372036854775809}', b'{"n":1e400}',
    b'{"n":-1E400,"m":1e-400,"z":-0,"y":-0.0}', b'{"big":[123456789012345678901234567890]}',
    b'{"x":NaN}', b'{"x":Infinity}', b'{"s":"\\ud83d\\ude00","t":"\\ud800"}', b'"\\udfff"',
    b"\xed\xa0\x80", b'{"a":"\xed\xa0\x80"}', b"\xef\xbb\xbf{}", "{\"a\":1}".encode("utf-16"),
    "{\"a\":1}".encode("utf-32"), b'{"a":1,"a":2.5}', b'{"a":"\x7f\xc3\xa9"}', b"[" * 2000 + b"]" * 2000,
    b'{"a":"tab\there"}', b"", b" ", b"{} x", b'{"a":1,"b":0,"a":2,"c":{"x":1,"y":2,"x":3}}',
]


@pytest.mark.parametrize("body", [*ODD_BODIES, b'{"model":"m","max_tokens":5}', "{\"k\":\"한국어 😀\"}".encode()])
def test_loads_gives_what_json_loads_gives_or_raises_what_it_raises(body: bytes) -> None:
    assert outcome(jsonbody.loads, body) == outcome(json.loads, body)


@settings(max_examples=300, deadline=None)
@given(json_values, st.booleans())
def test_random_values_load_and_dump_as_with_the_json_module(value: object, ascii: bool) -> None:
    body = json.dumps(value, ensure_ascii=ascii).encode()
    assert outcome(jsonbody.loads, body) == outcome(json.loads, body)
    theirs = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    # the same JSON (floats may be spelt otherwise: 1e16 for 1e+16)
    assert outcome(json.loads, jsonbody.dumps(value)) == outcome(json.loads, theirs)


@pytest.mark.parametrize("value", [{"x": float("nan")}, {"x": [float("inf")]}, {"x": -float("inf")}, {"x": 2**64},
                                   {"x": -(2**63) - 1}, {"x": 1e300}, {"x": "\ud800"}, {1: "int key"}, {"x": (1, 2)}])
def test_dumps_where_orjson_writes_otherwise_is_the_json_modules_text(value: object) -> None:
    """NaN and infinities (orjson: null), integers past 64 bits and unpaired surrogates (orjson
    refuses) are written as json.dumps writes them; the surrogate raises as encoding it does."""
    expected = outcome(lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode(), value)
    if value == {"x": 1e300}:
        assert json.loads(jsonbody.dumps(value)) == value
    else:
        assert outcome(jsonbody.dumps, value) == expected


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8) | keys, json_values, max_size=6), st.data())
def test_random_objects_parse_like_json_loads_and_rewrite_only_what_is_set(obj: dict, data: st.DataObject) -> None:
    separators = data.draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")]))
    body = json.dumps(obj, ensure_ascii=data.draw(st.booleans()), separators=separators).encode()
    parsed = json.loads(body)
    assert values_at(body) == parsed
    lay = layout(body)
    assert lay is not None
    fields = data.draw(st.dictionaries(keys, json_values, max_size=3))
    out = rewrite(body, lay, fields)
    assert json.loads(out) == {**parsed, **fields}
    if not fields:
        assert out == body
    # Every key the rewrite does not set keeps its value's text exactly.
    out_layout = layout(out)
    assert out_layout is not None
    for key in parsed.keys() - fields.keys():
        before = [lay.text[s:e] for s, e in lay.values[key]]
        after = [out_layout.text[s:e] for s, e in out_layout.values[key]]
        assert after == before


def test_rewrite_keeps_the_clients_bytes_and_replaces_every_duplicate() -> None:
    body = '{ "model" : "m",\n  "max_tokens": 99999, "note": "é\\u00e9", "max_tokens" : 65535 }'.encode()
    lay = layout(body)
    assert lay is not None and not lay.ascii
    out = rewrite(body, lay, {"max_tokens": 100, "stream_options": {"include_usage": True}})
    assert out == ('{ "model" : "m",\n  "max_tokens": 100, "note": "é\\u00e9", "max_tokens" : 100 '
                   ',"stream_options":{"include_usage":true}}').encode()


def test_rewrite_of_an_empty_object_adds_members_without_a_leading_comma() -> None:
    body = b"{ }"
    lay = layout(body)
    assert lay is not None
    assert rewrite(body, lay, {"max_tokens": 7, "n": 1}) == b'{ "max_tokens":7,"n":1}'


def test_bodies_the_walk_does_not_take_get_no_layout() -> None:
    assert layout("{\"a\":1}".encode("utf-16")) is None      # json.loads reads UTF-16; it is re-serialised
    assert layout(b"[1]") is None


def test_parse_object_refuses_an_unpaired_surrogate_whichever_parser_read_the_body() -> None:
    """orjson refuses an unpaired surrogate escape, so json.loads reads such a body and the check
    runs on it; a pair, or one in a field no tokenizer sees, passes as before."""
    from proxy.errors import BrimfulError

    with pytest.raises(BrimfulError, match="unpaired UTF-16 surrogate"):
        jsonbody.parse_object(b'{"messages":[{"role":"user","content":"a\\ud800b"}]}')
    assert jsonbody.parse_object(b'{"user":"\\udfff","n":1}') == {"user": "\udfff", "n": 1}
    assert jsonbody.parse_object(b'{"content":"\\ud83d\\ude00"}') == {"content": "\U0001f600"}
    assert type(jsonbody.parse_object(b'{"n":123456789012345678901234567890}')["n"]) is int


def _spliced(body: bytes, fields: dict) -> bytes:
    lay = layout(body)
    assert lay is not None
    return rewrite(body, lay, fields)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8) | keys, json_values, max_size=6), st.data())
def test_a_body_as_orjson_writes_it_gets_the_splices_bytes_without_the_walk(obj: dict, data: st.DataObject) -> None:
    writer = data.draw(st.sampled_from(["orjson", "compact", "compact-ascii", "spaced"]))
    if writer == "orjson":
        try:
            body = orjson.dumps(obj)
        except orjson.JSONEncodeError:      # an integer past 64 bits
            body = json.dumps(obj, separators=(",", ":")).encode()
    else:
        body = json.dumps(obj, ensure_ascii=writer == "compact-ascii",
                          separators=(", ", ": ") if writer == "spaced" else (",", ":")).encode()
    parsed = jsonbody.parse_object(body)
    fields = data.draw(st.dictionaries(keys, json_values, max_size=3))
    fast = jsonbody._as_orjson_writes_it(body, parsed, fields)
    if fast is not None:
        assert fast == _spliced(body, fields)
    # From SPLICE_ABOVE_BYTES on, with_fields is the splice whichever way it got there.
    padded = body[:-1] + (b"," if parsed else b"") + b'"pad":"' + b"x" * jsonbody.SPLICE_ABOVE_BYTES + b'"}'
    assert jsonbody.with_fields(padded, jsonbody.parse_object(padded), fields) == _spliced(padded, fields)


def test_the_orjson_route_is_taken_for_the_bodies_it_fits() -> None:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "é" * 3000}], "max_tokens": 65535,
                         "temperature": 0.7})
    parsed = jsonbody.parse_object(body)
    fields = {"max_tokens": 100, "stream_options": {"include_usage": True}}
    assert jsonbody._as_orjson_writes_it(body, parsed, fields) == _spliced(body, fields)


@pytest.mark.parametrize("body", [
    b'{"model":"m","max_tokens":1,"max_tokens":2}',          # a duplicate key: both are replaced
    b'{"model":"m","max\\u005ftokens":1}',                    # an escape orjson does not write
    b'{"model": "m","max_tokens":1}',                          # a space
    b'{"t":1.00,"max_tokens":1}',                              # a float spelt otherwise
    b'{"t":NaN,"max_tokens":1}',                               # orjson writes null
    b'{"t":18446744073709551616,"max_tokens":1}',              # past 64 bits
    b'{"user":"\\ud800","max_tokens":1}',                      # an unpaired surrogate (an untokenized field)
])
def test_bodies_orjson_would_write_otherwise_are_left_to_the_splice(body: bytes) -> None:
    fields = {"max_tokens": 5}
    assert jsonbody._as_orjson_writes_it(body, jsonbody.parse_object(body), fields) is None


def test_new_values_orjson_would_write_otherwise_are_left_to_the_splice() -> None:
    body = b'{"model":"m"}'
    assert jsonbody._as_orjson_writes_it(body, jsonbody.parse_object(body), {"n": float("nan")}) is None
    assert jsonbody._as_orjson_writes_it(body, jsonbody.parse_object(body), {"n": 2**64}) is None
