"""Which message loop of a chat template can skip the turns it rendered before, proven from its syntax.

A chat template renders a conversation as some text, then one iteration of a
loop over the messages per message, then more text (the generation prompt).
An agent's next request renders the same iterations again, and each renders
what it rendered before exactly when everything it reads is what it read
before.  This module finds that loop and proves, from the template's syntax
tree, that every input an iteration has is one of:

- the message it iterates over;
- an attribute of `loop` (index0, first, last, length, previtem, ...);
- an item of the message list, `messages[i]` (or of the list the loop runs
  over, such as Gemma 3's `loop_messages` or a Llama 3 template's
  `messages[1:]`), or its length;
- an attribute of a `namespace` made outside the loop (Qwen3's
  `ns.last_query_index`, DeepSeek's `ns.is_tool`): the only state an
  iteration can leave to the next one, since a `set` inside a loop is local
  to it and the sandbox refuses every method that mutates;
- a value of a name from outside the loop, constant while it runs;
- constants.

Then it rewrites a copy of the template so that each such read goes through
a hook that passes the value on unchanged and, during an iteration, reports
it (`_render_memo`), and so that the loop asks before each iteration whether
it may be skipped.  The copy renders the same text as the original: the hooks
return what the original expression evaluates to, and the statements added
output nothing.

The proof is on the template's syntax, so a template that reaches those
inputs any other way is refused, and rendered whole as before: the message
list or `loop` used as anything but `messages[i]`, `messages|length` and
`loop.<attribute>` (passed to a macro, aliased, filtered, iterated), a
namespace used as anything but `ns.attr` and `set ns.attr`, `loop.cycle` and
`loop.changed` (state in the loop object), `break` out of the loop, a loop
`else` or filter, names bound over the list, the loop or a namespace inside
the loop, includes and imports, and templates that call anything that is not
a function of its inputs (`strftime_now`, `random`: `_chat_cache.is_pure`).
Macros are part of what an iteration runs, so their bodies are held to the
same rules.
"""

from __future__ import annotations

from dataclasses import dataclass

import jinja2
import jinja2.nodes as nodes
from jinja2.visitor import NodeTransformer

from ._chat_cache import is_pure
from ._jinja import environment

# The hooks the rewritten template calls (`_render_memo.Recorder` binds them per render).
ENTER = "brimful_memo_enter"      # (loop, item, iterated) -> bool: run this iteration (else skip it)
OUTER = "brimful_memo_outer"      # ({name: value}) before the loop: the values of outside names
END = "brimful_memo_end"          # () after the loop
LOOP = "brimful_memo_loop"        # (loop, attribute) -> loop.attribute
ITEM = "brimful_memo_item"        # (list, key) -> list[key]
LENGTH = "brimful_memo_length"    # (list) -> list|length
NS_GET = "brimful_memo_ns_get"    # (ns, attribute) -> ns.attribute
NS_SET = "brimful_memo_ns_set"    # (ns, attribute): after `set ns.attribute = ...`
HOOK_PREFIX = "brimful_memo_"

# What a LoopContext answers from its position and the list alone (never `cycle`, `changed`).
LOOP_ATTRIBUTES = frozenset({"index", "index0", "revindex", "revindex0", "first", "last", "length",
                             "previtem", "nextitem", "depth", "depth0"})
_LENGTH_FILTERS = frozenset({"length", "count"})
_OUTSIDE_TEMPLATE = (nodes.Extends, nodes.Include, nodes.Import, nodes.FromImport, nodes.Block)


class NotProven(Exception):
    """The template's message loop cannot be proven to render a turn the same way twice (the reason)."""


@dataclass(frozen=True)
class LoopProof:
    """A template whose message loop is proven, and the rewritten copy that renders it with hooks."""

    template: jinja2.Template
    outer_names: tuple[str, ...]      # names from outside the loop its iterations may read
    namespace_names: frozenset[str]   # names bound to `namespace(...)`, read and written through hooks


def prove_loop(source: str) -> LoopProof:
    """The proof for a template's source; raises NotProven (with the reason) when there is none."""
    env = environment()
    ast = env.parse(source)
    loop, index = _message_loop(ast)
    namespaces = _namespace_names(ast)
    lists = frozenset({"messages", _name(loop.iter)})
    outer: set[str] = set()
    for root in [*loop.body, *ast.find_all(nodes.Macro)]:
        _check_region(root, lists, namespaces, outer)
    _check_no_break(loop.body)
    outer -= {"loop", *lists, *namespaces}
    outer_names = tuple(sorted(outer))
    hooks = _Hooks(lists, namespaces)
    for macro in ast.find_all(nodes.Macro):
        macro.body = [new for node in macro.body for new in hooks.visit_list(node)]
    loop.body = [nodes.If(_call(ENTER, nodes.Name("loop", "load"), nodes.Name(_name(loop.target), "load"),
                                nodes.Name(_name(loop.iter), "load")),
                          [new for node in loop.body for new in hooks.visit_list(node)], [], [])]
    before = nodes.ExprStmt(_call(OUTER, nodes.Dict([nodes.Pair(nodes.Const(name), nodes.Name(name, "load"))
                                                     for name in (*outer_names, *sorted(namespaces))])))
    after = nodes.ExprStmt(_call(END))
    ast.body[index:index + 1] = [before, loop, after]
    for node in (before, loop, after):
        node.set_lineno(loop.lineno, override=False)
    ast.set_environment(env)
    template = env.template_class.from_code(env, env.compile(ast), env.make_globals(None), None)
    return LoopProof(template, outer_names, namespaces)


def _message_loop(ast: nodes.Template) -> tuple[nodes.For, int]:
    """The last loop at the template's top level over a named list that writes output."""
    if any(True for _ in ast.find_all(_OUTSIDE_TEMPLATE)):
        raise NotProven("the template extends, includes or imports other templates")
    if not is_pure(ast):
        raise NotProven("the template calls something that is not a function of its inputs")
    if any(name.name.startswith(HOOK_PREFIX) for name in ast.find_all(nodes.Name)):
        raise NotProven(f"the template uses a name beginning with {HOOK_PREFIX}")
    found = None
    for index, node in enumerate(ast.body):
        if (isinstance(node, nodes.For) and isinstance(node.target, nodes.Name) and isinstance(node.iter, nodes.Name)
                and any(True for _ in node.find_all(nodes.Output))):
            found = (node, index)
    if found is None:
        raise NotProven("no loop over a named message list at the template's top level writes output")
    loop = found[0]
    if loop.else_ or loop.test is not None or loop.recursive:
        raise NotProven("the message loop has an else block, a filter or is recursive")
    return found


def _name(node: nodes.Node) -> str:
    assert isinstance(node, nodes.Name)
    return node.name


def _namespace_names(ast: nodes.Template) -> frozenset[str]:
    """Names ever bound to `namespace(...)`; such a name may be bound to nothing else."""
    names = {assign.target.name for assign in ast.find_all(nodes.Assign)
             if isinstance(assign.target, nodes.Name) and _makes_namespace(assign.node)}
    for name in ast.find_all(nodes.Name):
        if name.ctx != "load" and name.name == "namespace":
            raise NotProven("the template rebinds `namespace`")
    for node in ast.find_all((nodes.Assign, nodes.AssignBlock)):
        assert isinstance(node, (nodes.Assign, nodes.AssignBlock))
        if isinstance(node.target, nodes.Name) and node.target.name in names and not (
                isinstance(node, nodes.Assign) and _makes_namespace(node.node)):
            raise NotProven(f"{node.target.name!r} is bound to a namespace and to something else")
    return frozenset(names)


def _makes_namespace(value: nodes.Node) -> bool:
    return isinstance(value, nodes.Call) and isinstance(value.node, nodes.Name) and value.node.name == "namespace"


def _check_region(root: nodes.Node, lists: frozenset[str], namespaces: frozenset[str], outer: set[str]) -> None:
    """Every read of the list, `loop` and a namespace in the loop body or a macro is one the hooks see."""
    guarded = {"loop", *lists, *namespaces}
    stack: list[tuple[nodes.Node, nodes.Node | None]] = [(root, None)]
    while stack:
        node, parent = stack.pop()
        if isinstance(node, nodes.Name):
            if node.ctx != "load":
                if node.name in guarded:
                    raise NotProven(f"{node.name!r} is bound inside the message loop or a macro")
            else:
                _check_load(node, parent, lists, namespaces)
                outer.add(node.name)
        elif isinstance(node, nodes.NSRef) and node.name not in namespaces:
            raise NotProven(f"{node.name!r} is assigned an attribute but is not a namespace the template makes")
        stack.extend((child, node) for child in node.iter_child_nodes())


def _check_load(node: nodes.Name, parent: nodes.Node | None, lists: frozenset[str],
                namespaces: frozenset[str]) -> None:
    name = node.name
    if name == "loop":
        if not (isinstance(parent, nodes.Getattr) and parent.node is node and parent.attr in LOOP_ATTRIBUTES):
            raise NotProven("`loop` is used otherwise than as loop.<index, first, last, length, ...>")
    elif name in lists:
        item = isinstance(parent, nodes.Getitem) and parent.node is node and not isinstance(parent.arg, nodes.Slice)
        length = (isinstance(parent, nodes.Filter) and parent.node is node and parent.name in _LENGTH_FILTERS
                  and not parent.args and not parent.kwargs and parent.dyn_args is None and parent.dyn_kwargs is None)
        if not (item or length):
            raise NotProven(f"the message list {name!r} is used otherwise than as {name}[i] or {name}|length")
    elif name in namespaces:
        if not (isinstance(parent, nodes.Getattr) and parent.node is node):
            raise NotProven(f"the namespace {name!r} is used otherwise than as {name}.attribute")
    elif name == "self":
        raise NotProven("the template uses `self`")


def _check_no_break(body: list[nodes.Node]) -> None:
    """No `break` of the message loop itself (a nested loop's own are fine)."""
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, nodes.Break):
            raise NotProven("the message loop can break")
        if isinstance(node, nodes.For):
            stack.extend(node.iter_child_nodes(exclude=("body", "else_")))
            continue
        stack.extend(node.iter_child_nodes())


def _call(hook: str, *args: nodes.Expr) -> nodes.Call:
    return nodes.Call(nodes.Name(hook, "load"), list(args), [], None, None)


class _Hooks(NodeTransformer):
    """The rewrite: each guarded read becomes a call of its hook with the same operands."""

    def __init__(self, lists: frozenset[str], namespaces: frozenset[str]) -> None:
        self._lists = lists
        self._namespaces = namespaces

    def visit_Getattr(self, node: nodes.Getattr) -> nodes.Node:
        self.generic_visit(node)
        if isinstance(node.node, nodes.Name):
            if node.node.name == "loop":
                return _call(LOOP, node.node, nodes.Const(node.attr)).set_lineno(node.lineno)
            if node.node.name in self._namespaces:
                return _call(NS_GET, node.node, nodes.Const(node.attr)).set_lineno(node.lineno)
        return node

    def visit_Getitem(self, node: nodes.Getitem) -> nodes.Node:
        self.generic_visit(node)
        if isinstance(node.node, nodes.Name) and node.node.name in self._lists:
            return _call(ITEM, node.node, node.arg).set_lineno(node.lineno)
        return node

    def visit_Filter(self, node: nodes.Filter) -> nodes.Node:
        self.generic_visit(node)
        if isinstance(node.node, nodes.Name) and node.node.name in self._lists and node.name in _LENGTH_FILTERS:
            return _call(LENGTH, node.node).set_lineno(node.lineno)
        return node

    def visit_Assign(self, node: nodes.Assign) -> nodes.Node | list[nodes.Node]:
        self.generic_visit(node)
        return self._after_write(node)

    def visit_AssignBlock(self, node: nodes.AssignBlock) -> nodes.Node | list[nodes.Node]:
        self.generic_visit(node)
        return self._after_write(node)

    def _after_write(self, node: nodes.Assign | nodes.AssignBlock) -> nodes.Node | list[nodes.Node]:
        target = node.target
        if isinstance(target, nodes.NSRef):
            note = nodes.ExprStmt(_call(NS_SET, nodes.Name(target.name, "load"), nodes.Const(target.attr)))
            return [node, note.set_lineno(node.lineno)]
        return node
