"""The fewest characters a chat template can render for a conversation, read from the template.

vLLM refuses a rendered prompt longer than its character bound (`_char_bound`).
A body of 10^6 empty messages is far over that bound, but finding so by
preparing and rendering it costs seconds of CPU.  This module reads the
template's syntax tree once and gives a lower bound on the rendered length
from the messages' roles alone: when even that is over the bound, the request
is refused before its messages are prepared or rendered.

The bound is proven from the template, never guessed from trial renders.  It
counts only output every successful render must contain:
- literal text, and string constants (and the message's own `role`, whose
  value is known) joined by `+` or `~`; any other expression counts 0;
- of an `if`, the shortest branch whose test can be true for this role (a
  test on the role is decided, anything else may go either way);
- `for <m> in messages` (the variable itself, unfiltered, never reassigned
  anywhere in the template) counts each message by its role; an iteration
  that reaches `continue` counts what it wrote before it; a loop with `break`,
  and every other loop, count 0 (they may run no iteration);
- a path through `raise_exception(...)` renders nothing (vLLM refuses it), so
  it is left out of the minimum; a conversation on which every path raises
  gets no bound (the template's own error is the answer);
- macros, call and filter blocks, assignments count 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2.nodes as nodes

_INF = math.inf
# Roles evaluated per request at most (the commonest first); the rest count 0.
MAX_ROLES = 16


@dataclass(frozen=True)
class _Message:
    """The loop variable of a message loop: only its role is known."""

    role: str


class _Unknown:
    pass


_UNKNOWN = _Unknown()


@dataclass(frozen=True)
class _Min:
    """Fewest characters on paths that go on (`normal`) and on paths that reach `continue` (`exit`)."""

    normal: float
    exit: float = _INF

    def then(self, other: _Min) -> _Min:
        return _Min(self.normal + other.normal, min(self.exit, self.normal + other.exit))

    def either(self, other: _Min) -> _Min:
        return _Min(min(self.normal, other.normal), min(self.exit, other.exit))


_ZERO = _Min(0.0)
_RAISES = _Min(_INF)


class TemplateFloor:
    """A template's lower bound on rendered characters, by the roles of the conversation's messages."""

    def __init__(self, ast: nodes.Template) -> None:
        self._body = ast.body
        # A template that rebinds `messages` loops over something else under its name.
        self._sound = not any(name.name == "messages" for name in ast.find_all(nodes.Name) if name.ctx != "load")
        self._per_role: dict[tuple[int, str], float] = {}
        self._nested: dict[int, bool] = {}

    def chars(self, roles: Mapping[str | None, int]) -> int:
        """At least this many characters for a conversation whose messages have these roles
        (role → how many; None for a message that is not an object); 0 when nothing is proven."""
        if not self._sound:
            return 0
        known = sorted(((count, role) for role, count in roles.items() if isinstance(role, str)), reverse=True)
        walk = _Walk(self, {role: count for count, role in known[:MAX_ROLES]})
        floor = walk.statements(self._body, {}).normal
        return 0 if floor == _INF else int(floor)

    def iteration(self, loop: nodes.For, role: str, walk: _Walk) -> float:
        """One iteration's minimum for a message of `role`: cached per loop and role, unless the
        body holds a message loop of its own (whose sum depends on the conversation's roles)."""
        key = (id(loop), role)
        cached = self._per_role.get(key)
        if cached is not None:
            return cached
        assert isinstance(loop.target, nodes.Name)
        result = walk.statements(loop.body, {loop.target.name: _Message(role)})
        value = min(result.normal, result.exit)
        nested = self._nested.get(id(loop))
        if nested is None:
            nested = self._nested[id(loop)] = any(
                isinstance(inner.iter, nodes.Name) and inner.iter.name == "messages"
                for inner in loop.find_all(nodes.For))
        if not nested and len(self._per_role) < 64 * MAX_ROLES:
            self._per_role[key] = value
        return value


class _Walk:
    """One evaluation of the tree for one conversation's role counts."""

    def __init__(self, floor: TemplateFloor, roles: Mapping[str, int]) -> None:
        self._floor = floor
        self._roles = roles

    def statements(self, body: Sequence[nodes.Node], env: dict[str, Any]) -> _Min:
        env = dict(env)
        total = _ZERO
        for node in body:
            total = total.then(self.statement(node, env))
            if total.normal == _INF:
                break
            if isinstance(node, nodes.Assign) and isinstance(node.target, nodes.Name):
                value = _value(node.node, env)
                env[node.target.name] = value
            elif not isinstance(node, nodes.Output):
                for name in node.find_all(nodes.Name):   # whatever a nested block binds is unknown after it
                    if name.ctx == "store":
                        env.pop(name.name, None)
        return total

    def statement(self, node: nodes.Node, env: dict[str, Any]) -> _Min:
        if isinstance(node, nodes.Output):
            return self.output(node, env)
        if isinstance(node, nodes.If):
            return self.branch(node, env)
        if isinstance(node, nodes.For):
            return self.loop(node, env)
        if isinstance(node, nodes.Continue):
            return _Min(_INF, 0.0)
        if isinstance(node, nodes.With):        # its names shadow whatever was known outside
            bound = {name.name for target in node.targets for name in target.find_all(nodes.Name)}
            return self.statements(node.body, {k: v for k, v in env.items() if k not in bound})
        if isinstance(node, (nodes.Scope, nodes.ScopedEvalContextModifier)):
            return self.statements(node.body, env)
        return _ZERO      # macros, call and filter blocks, assignments, anything else: 0 proven

    def output(self, node: nodes.Output, env: dict[str, Any]) -> _Min:
        total = 0
        for child in node.nodes:
            if isinstance(child, nodes.TemplateData):
                total += len(child.data)
            elif _raises(child):
                return _RAISES
            else:
                total += _str_min(child, env) or 0
        return _Min(float(total))

    def branch(self, node: nodes.If, env: dict[str, Any]) -> _Min:
        arms: list[tuple[nodes.Node, list[nodes.Node]]] = [(node.test, node.body)]
        arms += [(elif_.test, elif_.body) for elif_ in node.elif_]
        result: _Min | None = None
        for test, body in arms:
            truth = _truth(test, env)
            if truth is False:
                continue
            taken = self.statements(body, env)
            result = taken if result is None else result.either(taken)
            if truth is True:
                return result
        rest = self.statements(node.else_, env)
        return rest if result is None else result.either(rest)

    def loop(self, node: nodes.For, env: dict[str, Any]) -> _Min:
        over_messages = (isinstance(node.iter, nodes.Name) and node.iter.name == "messages"
                         and node.iter.name not in env and isinstance(node.target, nodes.Name)
                         and node.test is None and not node.recursive and not _breaks(node.body))
        if not over_messages:
            return _ZERO
        total = 0.0
        for role, count in self._roles.items():
            total += count * self._floor.iteration(node, role, self)
        return _Min(total)


def _breaks(body: Sequence[nodes.Node]) -> bool:
    """A `break` of this loop (not of a loop nested in it)."""
    for node in body:
        if isinstance(node, nodes.Break):
            return True
        if isinstance(node, nodes.For):
            continue
        if _breaks(list(node.iter_child_nodes())):
            return True
    return False


def _raises(expr: nodes.Node) -> bool:
    return (isinstance(expr, nodes.Call) and isinstance(expr.node, nodes.Name)
            and expr.node.name == "raise_exception")


def _value(expr: nodes.Node, env: Mapping[str, Any]) -> Any:
    """The expression's value where it is known (constants, the message's role), else _UNKNOWN."""
    if isinstance(expr, nodes.Const):
        return expr.value
    if isinstance(expr, (nodes.List, nodes.Tuple)):
        items = [_value(item, env) for item in expr.items]
        return _UNKNOWN if any(item is _UNKNOWN for item in items) else items
    if isinstance(expr, nodes.Name):
        return env.get(expr.name, _UNKNOWN)
    if isinstance(expr, (nodes.Getattr, nodes.Getitem)):
        owner = _value(expr.node, env)
        key = expr.attr if isinstance(expr, nodes.Getattr) else _value(expr.arg, env)
        if isinstance(owner, _Message) and key == "role":
            return owner.role
        return _UNKNOWN
    if isinstance(expr, nodes.Compare) and len(expr.ops) == 1:
        left, right = _value(expr.expr, env), _value(expr.ops[0].expr, env)
        if left is _UNKNOWN or right is _UNKNOWN or isinstance(left, _Message) or isinstance(right, _Message):
            return _UNKNOWN
        return _compare(expr.ops[0].op, left, right)
    return _UNKNOWN


def _compare(op: str, left: Any, right: Any) -> Any:
    if op == "eq":
        return left == right
    if op == "ne":
        return left != right
    if op in ("in", "notin") and isinstance(right, (list, str)) and isinstance(left, str):
        return (left in right) == (op == "in")
    return _UNKNOWN


def _truth(expr: nodes.Node, env: Mapping[str, Any]) -> bool | None:
    """True, False, or None when the test could go either way."""
    if isinstance(expr, nodes.Not):
        inner = _truth(expr.node, env)
        return None if inner is None else not inner
    if isinstance(expr, nodes.And):
        left, right = _truth(expr.left, env), _truth(expr.right, env)
        if left is False or right is False:
            return False
        return True if left is True and right is True else None
    if isinstance(expr, nodes.Or):
        left, right = _truth(expr.left, env), _truth(expr.right, env)
        if left is True or right is True:
            return True
        return False if left is False and right is False else None
    value = _value(expr, env)
    if value is _UNKNOWN or isinstance(value, _Message):
        return None
    return bool(value)


def _str_min(expr: nodes.Node, env: Mapping[str, Any]) -> int | None:
    """If the expression renders (no error), it is a string of at least this length; None: not
    known to be a string."""
    value = _value(expr, env)
    if isinstance(value, str):
        return len(value)
    if isinstance(expr, nodes.Add):
        left, right = _str_min(expr.left, env), _str_min(expr.right, env)
        if left is None and right is None:
            return None
        # One side is a string, so `+` joins strings or raises (vLLM refuses that too).
        return (left or 0) + (right or 0)
    if isinstance(expr, nodes.Concat):
        return sum(_str_min(part, env) or 0 for part in expr.nodes)
    if isinstance(expr, nodes.CondExpr):
        truth = _truth(expr.test, env)
        yes = _str_min(expr.expr1, env)
        no = 0 if expr.expr2 is None else _str_min(expr.expr2, env)
        if truth is True:
            return yes
        if truth is False:
            return no
        return None if yes is None or no is None else min(yes, no)
    return None
