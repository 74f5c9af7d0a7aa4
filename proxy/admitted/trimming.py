"""Trimming a conversation that outgrew the context: which whole turns go, in which order (pure).

Asked for per request (`x-brimful-trim: oldest | middle`), per model in the
configuration (`trim`), or by the Responses API's own `truncation: "auto"`
(OpenAI: drop whole input items from the start, keep `instructions`). The
exchange counts each candidate exactly and keeps the fewest drops that fit
(`proxy.admitted.exchange`); this module only says what a drop is.

A *unit* is what is dropped at once. After the kept user turn it is one
assistant turn (a run of model-written items: messages, calls, reasoning) with
everything up to the next one: the tool results that answer it (chat `tool`
messages, Messages `tool_result` blocks, Responses `*_output` items; a result
always goes with its call, by id) and the user's next question. Dropping such
a unit leaves the roles in an order every chat template and mistral-common
accept (Gemma's and Mistral's alternation, a tool result right after its call).
Before the kept user turn (only under `truncation: "auto"`, which keeps the
last user turn rather than the first) a unit is a whole round from one user
turn to the next, so what is left still begins with a user turn. Never
dropped: system and developer messages, the kept user turn, and the latest unit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Strategy = Literal["oldest", "middle"]
STRATEGIES: tuple[Strategy, ...] = ("oldest", "middle")
HEADER = b"x-brimful-trim"
_KEPT_ROLES = ("system", "developer")


@dataclass(frozen=True)
class Unit:
    start: int          # the unit is items[start:end]
    end: int
    droppable: bool


@dataclass(frozen=True)
class Plan:
    """How to trim one request: the field holding the conversation, the strategy, and the order
    in which units go (`order[:k]` are the units dropped when k are needed)."""

    field: str
    strategy: Strategy
    units: tuple[Unit, ...]
    order: tuple[int, ...]

    def items_dropped(self, k: int) -> int:
        return sum(self.units[i].end - self.units[i].start for i in self.order[:k])

    def without(self, items: Sequence[Any], k: int) -> list[Any]:
        """The conversation with the first `k` units of `order` dropped."""
        gone = {i for i in self.order[:k]}
        return [item for u, unit in enumerate(self.units) if u not in gone for item in items[unit.start:unit.end]]


def _role(item: Any) -> str | None:
    if not isinstance(item, Mapping):
        return None
    role = item.get("role")
    return role if isinstance(role, str) else None


def _is_result(surface: str, item: Any) -> bool:
    """A tool's result, which answers a call before it (chat `tool`, Messages `tool_result`, Responses `*_output`)."""
    if not isinstance(item, Mapping):
        return False
    if surface == "chat":
        return item.get("role") == "tool"
    if surface == "messages":
        content = item.get("content")
        return item.get("role") == "user" and isinstance(content, list) and any(
            isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content)
    kind = item.get("type")
    return isinstance(kind, str) and kind.endswith("_output")


def _is_assistant(surface: str, item: Any) -> bool:
    """An item the model wrote: an assistant message, or (Responses) a call or a reasoning item."""
    if _role(item) == "assistant":
        return True
    kind = item.get("type") if surface == "responses" and isinstance(item, Mapping) else None
    return isinstance(kind, str) and (kind == "reasoning" or kind.endswith("_call") or kind == "mcp_list_tools")


def _is_user_turn(surface: str, item: Any) -> bool:
    """A message the user wrote (not a tool result): what a conversation may restart at."""
    if surface == "responses" and isinstance(item, str):
        return True
    return _role(item) == "user" and not _is_result(surface, item)


def _ids(surface: str, item: Any, results: bool) -> set[str]:
    """The call ids an item makes (results=False) or answers (results=True)."""
    if not isinstance(item, Mapping):
        return set()
    if surface == "responses":
        value = item.get("call_id")
        ours = _is_result(surface, item) if results else _is_assistant(surface, item)
        return {value} if ours and isinstance(value, str) else set()
    if surface == "chat":
        if results:
            value = item.get("tool_call_id") if item.get("role") == "tool" else None
            return {value} if isinstance(value, str) else set()
        calls = item.get("tool_calls")
        return {c["id"] for c in calls if isinstance(c, Mapping) and isinstance(c.get("id"), str)} if isinstance(
            calls, list) else set()
    content = item.get("content")
    if not isinstance(content, list):
        return set()
    kind, key = ("tool_result", "tool_use_id") if results else ("tool_use", "id")
    return {b[key] for b in content if isinstance(b, Mapping) and b.get("type") == kind and isinstance(b.get(key), str)}


def _anchor(surface: str, items: Sequence[Any], keep_first_user: bool) -> int | None:
    """The user turn kept: the first (trimming) or the last (`truncation: "auto"`, which drops
    from the start: whole rounds before it, so what is left still begins with a user turn)."""
    turns = [i for i, item in enumerate(items) if _is_user_turn(surface, item)]
    if not turns:
        return None
    return turns[0] if keep_first_user else turns[-1]


def _spans(surface: str, items: Sequence[Any], anchor: int | None) -> list[list[int]]:
    """[start, end, kept] spans: before the kept user turn whole rounds (each from a user turn),
    after it whole assistant turns with what follows them up to the next one (results, the next
    question), so that dropping one leaves the roles in the order every template accepts."""
    spans: list[list[int]] = []
    joinable = False
    for i, item in enumerate(items):
        if _role(item) in _KEPT_ROLES or i == anchor:
            spans.append([i, i + 1, 1])
            joinable = False
            continue
        if anchor is not None and i < anchor:
            starts = _is_user_turn(surface, item)
        else:
            starts = _is_assistant(surface, item) and not _is_assistant(surface, items[i - 1])
        if starts or not joinable:
            spans.append([i, i + 1, 0])
            joinable = True
        else:
            spans[-1][1] = i + 1
    return spans


def _pair_calls(surface: str, items: Sequence[Any], spans: list[list[int]]) -> list[list[int]]:
    """Spans merged so that each tool result is in the span of the call it answers."""
    out: list[list[int]] = []
    calls: dict[str, int] = {}
    for span in spans:
        out.append(list(span))
        for i in range(span[0], span[1]):
            for ref in _ids(surface, items[i], results=True):
                j = calls.get(ref)
                if j is not None and j < len(out) - 1:
                    out[j:] = [[out[j][0], out[-1][1], max(s[2] for s in out[j:])]]
                    calls = {k: min(v, j) for k, v in calls.items()}
            for made in _ids(surface, items[i], results=False):
                calls[made] = len(out) - 1
    return out


def units(surface: str, items: Sequence[Any], *, keep_first_user: bool = True) -> list[Unit]:
    """The conversation cut into units, each marked droppable or not (the latest never is)."""
    spans = _pair_calls(surface, items, _spans(surface, items, _anchor(surface, items, keep_first_user)))
    return [Unit(start, end, not kept and n < len(spans) - 1) for n, (start, end, kept) in enumerate(spans)]


def drop_order(found: Sequence[Unit], strategy: Strategy) -> tuple[int, ...]:
    """Droppable units in the order they go: oldest first, or from the middle outwards."""
    droppable = [i for i, unit in enumerate(found) if unit.droppable]
    if strategy == "oldest":
        return tuple(droppable)
    middle = (len(droppable) - 1) / 2
    ranked = sorted(enumerate(droppable), key=lambda pair: (abs(pair[0] - middle), pair[0]))
    return tuple(unit for _, unit in ranked)


def plan(surface: str, body: Mapping[str, Any], strategy: Strategy, *, keep_first_user: bool = True) -> Plan | None:
    """The trimming plan for a request, or None when nothing in it can be dropped."""
    field = "input" if surface == "responses" else "messages"
    items = body.get(field)
    if not isinstance(items, list) or len(items) < 2:
        return None
    found = tuple(units(surface, items, keep_first_user=keep_first_user))
    order = drop_order(found, strategy)
    return Plan(field, strategy, found, order) if order else None


def requested_strategy(value: bytes | None, configured: str) -> Strategy | None:
    """The strategy a request asks for (its header wins over the model's configuration), or None
    for none; raises ValueError on a header value that names no strategy."""
    if value is None:
        return configured if configured in STRATEGIES else None
    text = value.decode("latin-1").strip().lower()
    if text in ("off", "none", ""):
        return None
    if text not in STRATEGIES:
        raise ValueError(text)
    return text
