"""What the scripted upstream answers (no dependencies: the SDK environments import it too)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Script:
    """How the scripted upstream answers.

    `tool_calls`: tool name → arguments for the first turn that offers that tool
    and has no tool result yet (the first listed tool that the request offers
    is called); `json_content`: the answer to structured-output requests
    (`response_format` json_schema / json_object); `text`: everything else.
    `call_tools` False answers text even when tools are offered.
    """

    tool_calls: dict[str, dict[str, Any]] = field(default_factory=dict)
    json_content: str | None = None
    text: str = "Done."
    call_tools: bool = True
