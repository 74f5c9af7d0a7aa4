"""Chat-template compilation in transformers' jinja environment.

transformers renders chat templates in an `ImmutableSandboxedEnvironment` with
`trim_blocks`, `lstrip_blocks`, the loop-controls extension, its own `tojson`
filter (no HTML escaping, `ensure_ascii=False`), and the globals
`raise_exception` and `strftime_now` (transformers/utils/chat_template_utils.py,
`_compile_jinja_template`).  vLLM renders through that function, so the same
environment here produces the same text.  The `{% generation %}` block tag
(used by templates that mark assistant spans for training masks) is accepted
and renders its body unchanged, as transformers does when no mask is asked for.
"""

from __future__ import annotations

import json
from datetime import datetime
from types import BuiltinMethodType
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}`: renders the body as is."""

    tags = {"generation"}  # noqa: RUF012 - jinja2.ext.Extension declares `tags` as a plain set

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: Any) -> None:
    # Templates call this to refuse a conversation; transformers raises a TemplateError.
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Same signature and result as transformers' override of jinja's tojson
    # (which would HTML-escape and sort keys).
    if not ensure_ascii and indent is None and separators is None and not sort_keys:
        return _TOJSON_ENCODER.encode(x)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


# json.dumps builds a JSONEncoder on every call whose arguments are not its own defaults, as tojson's
# ensure_ascii=False is not; one built once with the same arguments writes the same text (encode keeps
# no state between calls) 10-22 % sooner: 0.03-0.08 ms of a request whose template writes 20 tools.
_TOJSON_ENCODER = json.JSONEncoder(ensure_ascii=False)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


# What `getattr(some_dict, name)` finds: dict's and object's attributes (a dict has no `__dict__`).
_DICT_ATTRIBUTES = frozenset(dir(dict))
# str's public methods the sandbox hands out as they are: not private, not `format`/`format_map`
# (which it wraps), and str is immutable, so none is refused as modifying.
_STR_METHODS = frozenset(name for name in dir(str) if not name.startswith("_")) - {"format", "format_map"}
# A LoopContext's public attributes (what templates read as `loop.<name>`).
_LOOP_ATTRIBUTES = frozenset({"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth",
                              "depth0", "previtem", "nextitem", "cycle", "changed"})


class _ChatTemplateEnvironment(ImmutableSandboxedEnvironment):
    """transformers' sandbox, deciding each attribute's safety once per (type, name).

    The sandbox asks `is_safe_attribute` on every attribute a template reads
    (`message.content`, `x.startswith`, `loop.index`): about 40 % of rendering
    a short chat.  In jinja 3.1 the answer depends only on the object's type
    and the attribute's name (`is_internal_attribute` and
    `modifies_known_mutable` test isinstance and the name, never the value),
    so a table keyed by both gives the same answers.  Bounded, since a
    subscript with a key from the request (`obj[key]` falling back to an
    attribute) can name any attribute.
    """

    _MAX_DECISIONS = 4096

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._decisions: dict[tuple[type, str], bool] = {}

    def getattr(self, obj: Any, attribute: str) -> Any:
        """`message.content` on a plain dict without the failed attribute lookup first.

        The sandbox's `getattr` tries `getattr(obj, attribute)` and, on the
        AttributeError, `obj[attribute]`: raising and catching that error was
        most of the cost of reading a message's fields.  On an exact `dict`,
        the attribute lookup fails precisely when the name is not one of
        dict's (an instance has no `__dict__`), so the subscript comes first
        for those names, with the same undefined when the key is missing.
        Likewise `content.startswith` on an exact `str`: the sandbox would find
        the method, see it is no `format`, judge it safe and hand it out; and
        `loop.index0` or `ns.flag` (`_plain_getattr`)."""
        kind = type(obj)
        if kind is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        if kind is str and attribute in _STR_METHODS:
            return getattr(obj, attribute)
        if (kind is LoopContext and attribute in _LOOP_ATTRIBUTES) or (kind is Namespace and attribute[:1] != "_"):
            return self._plain_getattr(obj, attribute)
        return super().getattr(obj, attribute)

    def _plain_getattr(self, obj: Any, attribute: str) -> Any:
        """`loop.index0`, `ns.flag`: the sandbox would find the attribute (a namespace's, or undefined
        when it has none: it cannot be subscribed), wrap it only if it were a string's `format`, and
        judge it safe (not private, not internal, neither type mutable): the same, without the checks."""
        try:
            value = getattr(obj, attribute)
        except AttributeError:
            return self.undefined(obj=obj, name=attribute)
        wrapped = self.wrap_str_format(value)
        return value if wrapped is None else wrapped

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        """`content.startswith('<tool_response>')`, `namespace(...)`: called as the sandbox would, without its checks.

        The sandbox asks whether the callable is safe (it is: no `unsafe_callable`
        or `alters_data` attribute), then `Context.call` looks for a
        `pass_context`-style marker (neither has one), drops the `_loop_vars` /
        `_block_vars` keywords a template's loops add, and turns a StopIteration
        into an undefined (neither raises one): for a public method of an exact
        `str` other than `format`/`format_map` (which `getattr` hands out
        wrapped, so never reach here as themselves) and for `Namespace`, that is
        a plain call.  ~20 % of rendering a one-message chat.
        """
        if (type(obj) is BuiltinMethodType and type(obj.__self__) is str
                and obj.__name__ in _STR_METHODS) or obj is Namespace:
            kwargs.pop("_loop_vars", None)
            kwargs.pop("_block_vars", None)
            return obj(*args, **kwargs)
        return super().call(context, obj, *args, **kwargs)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr)
        safe = self._decisions.get(key)
        if safe is None:
            safe = super().is_safe_attribute(obj, attr, value)
            if len(self._decisions) < self._MAX_DECISIONS:
                self._decisions[key] = safe
        return safe


def make_environment() -> ImmutableSandboxedEnvironment:
    """A fresh environment configured exactly like transformers' chat-template one."""
    env = _ChatTemplateEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = make_environment()


def environment() -> ImmutableSandboxedEnvironment:
    """The shared environment (stateless once configured, safe to share across threads)."""
    return _ENV


def compile_template(source: str) -> jinja2.Template:
    """Compile once per model; raises jinja2.TemplateSyntaxError on a broken template."""
    return _ENV.from_string(source)


def parse_template(source: str) -> jinja2.nodes.Template:
    """The template's AST (for content-format detection and variable discovery)."""
    return _ENV.parse(source)
