"""The chat-template sandbox decides attribute safety once per (type, name), with jinja's answers."""

from __future__ import annotations

import collections
import types

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

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
