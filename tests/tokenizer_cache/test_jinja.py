"""The chat-template sandbox decides attribute safety once per (type, name), with jinja's answers."""

from __future__ import annotations

import collections
import json
import types

import jinja2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.utils import Namespace

from tokenizer_cache._jinja import compile_template, make_environment


class _Plain:
    value = 1

    def method(self) -> int:
        return 1


def _function() -> None:
    return None


def _generator():
    yield 1


OBJECTS = [
    {}, [], (), set(), frozenset(), "text", b"bytes", 1, 1.5, None, True, collections.deque(),
    collections.OrderedDict(), _Plain(), _Plain, _function, _Plain().method, _generator(), type,
    types.SimpleNamespace(a=1), jinja2.utils.Namespace(a=1),
]
ATTRS = [
    "append", "clear", "pop", "update", "setdefault", "add", "discard", "extend", "insert", "remove", "sort",
    "reverse", "popitem", "appendleft", "keys", "items", "get", "index", "count", "upper", "startswith",
    "split", "strip", "format", "mro", "__class__", "__globals__", "_private", "__code__", "func_code",
    "gi_frame", "gi_code", "__self__", "__func__", "value", "method", "a", "real", "mro_x",
]


def test_decisions_equal_jinjas_own_sandbox_whatever_the_order():
    stock = ImmutableSandboxedEnvironment()
    ours = make_environment()
    for _ in range(2):  # the second pass answers from the table
        for obj in OBJECTS:
            for attr in ATTRS:
                value = getattr(obj, attr, None)
                assert ours.is_safe_attribute(obj, attr, value) == stock.is_safe_attribute(obj, attr, value), (
                    type(obj), attr)


def test_mutating_a_list_is_refused_every_time():
    template = compile_template("{% set x = messages.append(1) %}{{ messages }}")
    for _ in range(3):
        with pytest.raises(SecurityError):
            template.render(messages=[])


def test_the_table_is_bounded():
    env = make_environment()
    for i in range(env._MAX_DECISIONS + 100):
        env.is_safe_attribute({}, f"key{i}", None)
    assert len(env._decisions) == env._MAX_DECISIONS
    assert env.is_safe_attribute([], "append", None) is False  # past the bound: still decided, not stored


def _same(a: object, b: object) -> bool:
    """Equal results, an undefined equal to an undefined of the same name and hint."""
    if isinstance(a, jinja2.Undefined) or isinstance(b, jinja2.Undefined):
        return (type(a), a._undefined_name, a._undefined_hint) == (  # type: ignore[union-attr]
            type(b), b._undefined_name, b._undefined_hint)  # type: ignore[union-attr]
    if callable(a) and callable(b):
        return getattr(a, "__name__", None) == getattr(b, "__name__", None) and getattr(
            a, "__self__", None) is getattr(b, "__self__", None)
    return a == b


@pytest.mark.parametrize("name", ["content", "role", "missing", "items", "get", "keys", "__class__", "__len__",
                                  "startswith", "format", "format_map", "strip", "_private", "mro", "upper"])
def test_dict_and_str_fast_paths_answer_as_the_sandbox_does(name: str):
    """The fast paths of `getattr` (exact dicts and strs) give what jinja's own sandbox gives."""
    ours, theirs = make_environment(), ImmutableSandboxedEnvironment()
    for obj in ({"content": "hi", "role": "user", "items": 3}, {}, "some text", collections.OrderedDict(a=1)):
        assert _same(ours.getattr(obj, name), theirs.getattr(obj, name)), (obj, name)


@pytest.mark.parametrize("name", ["index0", "index", "first", "last", "length", "revindex", "revindex0", "depth",
                                  "depth0", "previtem", "nextitem", "cycle", "changed", "flag", "missing", "items",
                                  "_private", "__class__", "__init__", "_Namespace__attrs", "mro", "format"])
def test_loop_and_namespace_fast_paths_answer_as_the_sandbox_does(name: str):
    """`loop.<attribute>` and `ns.<attribute>` through the fast path equal jinja's own sandbox's answer."""
    ours, theirs = make_environment(), ImmutableSandboxedEnvironment()
    namespace = Namespace(flag=True, items=[1], format="{}".format)
    for index, (_, loop) in enumerate(LoopContext(["a", "b", "c"], jinja2.Undefined)):
        for obj in (loop, namespace):
            assert _same(ours.getattr(obj, name), theirs.getattr(obj, name)), (index, obj, name)


def test_a_template_reads_message_fields_and_string_methods_as_before():
    source = ("{% for m in messages %}{{ m.role }}:{{ m.content.strip() }}{{ m.missing is defined }}"
              "{{ m.items is defined }}{% if m.content.startswith('x') %}!{% endif %}{% endfor %}")
    messages = [{"role": "user", "content": " x1 "}, {"role": "assistant", "content": "y"}]
    expected = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(source)
    assert compile_template(source).render(messages=messages) == expected.render(messages=messages)
    assert compile_template("{{ 'a{}'.format(1) }}").render() == "a1"
    with pytest.raises(SecurityError):
        compile_template("{{ 'a'.__class__.__mro__ }}").render()


class _Unsafe:
    unsafe_callable = True

    def __call__(self) -> str:
        return "called"


@jinja2.pass_context
def _with_context(context: object, name: str) -> object:
    return context.get(name)  # type: ignore[attr-defined]


def _stops() -> None:
    raise StopIteration


# Calls as templates make them, at the top level and inside a loop (where jinja adds `_loop_vars`).
_CALLS = [
    "{{ text.startswith('<tool') }}{{ text.endswith('>', 0, 3) }}{{ text.split('o', 1) }}{{ text.strip('<') }}",
    "{% set ns = namespace(flag=true, n=messages|length - 1) %}{{ ns.flag }}{{ ns.n }}",
    "{% for m in messages %}{{ m.content.startswith('h') }}{{ m.content.replace('h', 'j') }}"
    "{% set ns = namespace(i=loop.index0) %}{{ ns.i }}{% endfor %}",
    "{{ with_context('text') }}{% for m in messages %}{{ with_context('m').role }}{% endfor %}",
    "{{ stops() is defined }}{% for m in messages %}{{ stops() }}{% endfor %}",
    "{{ text.upper }}{{ ''.join(['a', 'b']) }}{{ 'a{}'.format(1) }}{{ 'x{0.__class__}y'.format(1) }}",
]


@pytest.mark.parametrize("source", _CALLS)
def test_calls_render_as_in_jinjas_own_sandbox(source: str) -> None:
    """The fast path of `call` (a str's methods, `namespace`) renders what jinja's own sandbox renders; a
    callable that wants the context, or raises StopIteration, still goes through jinja's `call`."""
    values = {"text": "<tool>output</tool>", "messages": [{"role": "user", "content": "hi"}],
              "with_context": _with_context, "stops": _stops}
    stock = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(source)
    assert compile_template(source).render(**values) == stock.render(**values)


def test_what_the_sandbox_refuses_to_call_is_still_refused() -> None:
    with pytest.raises(SecurityError):
        compile_template("{{ thing() }}").render(thing=_Unsafe())


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(st.characters(codec=None)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=_JSON_VALUES, ensure_ascii=st.booleans(), indent=st.none() | st.integers(0, 4),
       separators=st.none() | st.just((",", ":")), sort_keys=st.booleans())
def test_tojson_writes_what_json_dumps_writes(value: object, ensure_ascii: bool, indent: int | None,
                                              separators: tuple[str, str] | None, sort_keys: bool) -> None:
    """transformers' tojson is json.dumps with these arguments: the encoder kept for its defaults writes the
    same text (NaN, wide integers, lone surrogates, non-ASCII) and every other call goes to json.dumps."""
    tojson = make_environment().filters["tojson"]
    assert tojson(value) == json.dumps(value, ensure_ascii=False)
    arguments = {"ensure_ascii": ensure_ascii, "indent": indent, "separators": separators, "sort_keys": sort_keys}
    assert tojson(value, **arguments) == json.dumps(value, **arguments)


def test_tojson_refuses_what_json_dumps_refuses() -> None:
    tojson = make_environment().filters["tojson"]
    for value in ({"a": {1, 2}}, [b"bytes"], {(1, 2): 3}):
        with pytest.raises(TypeError) as expected:
            json.dumps(value, ensure_ascii=False)
        with pytest.raises(TypeError) as got:
            tojson(value)
        assert str(got.value) == str(expected.value)
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        tojson(loop)
