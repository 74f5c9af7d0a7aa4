"""Decide whether a chat template wants message content as a string or as parts.

vLLM (`--chat-template-content-format auto`, the default) walks the template's
jinja AST: if the template loops over a message's `content`, it is given the
OpenAI form (a list of `{"type": "text", "text": ...}` parts, "openai");
otherwise parts are flattened to one string ("string").  See vLLM's
`_detect_content_format` and its helpers in vllm/renderers/hf.py.

The walk follows names the way templates actually reach the content:

* directly: `{% for part in message['content'] %}` where `message` is a loop
  variable over `messages` (or over an alias of it such as `loop_messages`,
  `messages[1:]`, `messages | reverse`);
* through an alias: `{% set c = message.content %}{% for p in c %}`;
* through a macro parameter: `{% macro render(content) %}{% for p in content %}`
  called as `render(message.content)` (Qwen3.5's template does this).

Like vLLM, scopes are ignored (a name is a name wherever it is assigned); the
question is only whether such a loop exists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal

import jinja2.nodes as nodes

ContentFormat = Literal["string", "openai"]


def _unwrap(node: nodes.Node) -> nodes.Node:
    """Strip what does not change which object is iterated: filters, tests, slices."""
    while True:
        # One arm per type: merged with `or`, mypy no longer narrows Filter.node (Expr | None) to Expr.
        if isinstance(node, nodes.Filter) and node.node is not None:  # noqa: SIM114
            node = node.node
        elif isinstance(node, nodes.Test):  # noqa: SIM114
            node = node.node
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
            node = node.node
        else:
            return node


def _is_name(node: nodes.Node, names: set[str]) -> bool:
    node = _unwrap(node)
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name in names


def _is_item_of(node: nodes.Node, names: set[str]) -> bool:
    """`messages[0]`, `messages[i]`: one element picked out of a messages list."""
    node = _unwrap(node)
    return (
        isinstance(node, nodes.Getitem)
        and not isinstance(node.arg, nodes.Slice)
        and _is_name(node.node, names)
    )


def _assign_targets(root: nodes.Template) -> Iterator[tuple[str, nodes.Node]]:
    for assign in root.find_all(nodes.Assign):
        if isinstance(assign.target, nodes.Name):
            yield assign.target.name, assign.node


def _closure(root: nodes.Template, seed: set[str], derives: Callable[[nodes.Node, set[str]], bool]) -> set[str]:
    """Grow `seed` with every name assigned from an expression `derives(expr, names)` accepts."""
    names = set(seed)
    changed = True
    while changed:
        changed = False
        for target, value in _assign_targets(root):
            if target not in names and derives(value, names):
                names.add(target)
                changed = True
    return names


def _macro_params_fed_by(root: nodes.Template, accepts: Callable[[nodes.Node], bool]) -> set[str]:
    """Macro parameter names that some call passes an argument `accepts` likes."""
    macros = {m.name: m for m in root.find_all(nodes.Macro)}
    params: set[str] = set()
    for call in root.find_all(nodes.Call):
        if not (isinstance(call.node, nodes.Name) and call.node.name in macros):
            continue
        arg_names = [a.name for a in macros[call.node.name].args]
        for position, arg in enumerate(call.args):
            if position < len(arg_names) and accepts(arg):
                params.add(arg_names[position])
        for keyword in call.kwargs:
            if keyword.key in arg_names and accepts(keyword.value):
                params.add(keyword.key)
    return params


def detect_content_format(root: nodes.Template) -> ContentFormat:
    """'openai' if the template iterates over a message's content, else 'string'."""
    messages = _closure(root, {"messages"}, _is_name)

    message_vars: set[str] = set()
    for loop in root.find_all(nodes.For):
        if isinstance(loop.target, nodes.Name) and _is_name(loop.iter, messages):
            message_vars.add(loop.target.name)
    # `{% set m = messages[0] %}` and `{% set m = message %}` name one message too.
    message_vars = _closure(
        root, message_vars, lambda v, names: _is_name(v, names) or _is_item_of(v, messages)
    )

    def is_content(expr: nodes.Node, content_names: set[str]) -> bool:
        if _is_name(expr, content_names):
            return True
        node = _unwrap(expr)
        if isinstance(node, (nodes.Getattr, nodes.Getitem)):
            inner = node.node
            key_ok = (isinstance(node, nodes.Getattr) and node.attr == "content") or (
                isinstance(node, nodes.Getitem)
                and isinstance(node.arg, nodes.Const)
                and node.arg.value == "content"
            )
            return key_ok and (_is_name(inner, message_vars) or _is_item_of(inner, messages))
        return False

    content_names: set[str] = set()
    while True:
        grown = _closure(root, content_names, is_content)
        grown |= _macro_params_fed_by(root, lambda arg: is_content(arg, grown))  # noqa: B023 - called before `grown` changes
        if grown == content_names:
            break
        content_names = grown

    for loop in root.find_all(nodes.For):
        if is_content(loop.iter, content_names):
            return "openai"
    return "string"
