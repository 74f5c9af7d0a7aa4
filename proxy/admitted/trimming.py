"""Trimming a conversation that outgrew the context: which whole turns go, in which order (pure).

Asked for per request (`x-brimful-trim: oldest | middle`), per model in the
configuration (`trim`), or by the Responses API's own `truncation: "auto"`
(OpenAI: drop whole input items from the start, keep `instructions`). The
exchange counts each candidate exactly and keeps the fewest drops that fit
(`proxy.admitted.exchange`); this module only says what a drop is.

A *unit* is what is dropped at once: one message or input item, with what
belongs to it — an assistant turn's tool calls and their results go together
(chat `tool` messages, Messages `tool_result` blocks in the following user
message, Responses `function_call_output` items), and a Responses `reasoning`
item goes with the item after it. Never dropped: system and developer
messages, the first user message (except under `truncation: "auto"`, which
OpenAI defines as dropping from the start), and the latest unit.
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


def _belongs_to_previous(surface: str, item: Any) -> bool:
    """An item that cannot stand without the one before it (a tool result after its call)."""
    if not isinstance(item, Mapping):
        return False
    if surface == "chat":
        return item.get("role") == "tool"
    if surface == "messages":
        content = item.get("content")
        return item.get("role") == "user" and isinstance(content, list) and any(
            isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content)
    return item.get("type") == "function_call_output"


def _leads_next(surface: str, item: Any) -> bool:
    """An item that belongs with the one after it (Responses: reasoning before its call or message)."""
    return surface == "responses" and isinstance(item, Mapping) and item.get("type") == "reasoning"


def units(surface: str, items: Sequence[Any], *, keep_first_user: bool = True) -> list[Unit]:
    """The conversation cut into units, each marked droppable or not."""
    spans: list[list[int]] = []
    leading = False
    for i, item in enumerate(items):
        if spans and (leading or (_belongs_to_previous(surface, item) and _role(items[spans[-1][0]]) not in
                                  _KEPT_ROLES)):
            spans[-1][1] = i + 1
        else:
            spans.append([i, i + 1])
        leading = _leads_next(surface, item)
    found: list[Unit] = []
    first_user_seen = not keep_first_user
    for n, (start, end) in enumerate(spans):
        role = _role(items[start]) or ("user" if surface == "responses" and isinstance(items[start], str) else None)
        kept = role in _KEPT_ROLES or n == len(spans) - 1
        if role == "user" and not first_user_seen:
            first_user_seen = True
            kept = True
        found.append(Unit(start, end, not kept))
    return found


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
