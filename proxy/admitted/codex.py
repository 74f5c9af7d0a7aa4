"""The one answer brimful words for a single client: a length refusal on a Codex turn.

Codex (codex-rs, measured with 0.171.0) takes a 400 whose `error.code` is
`context_length_exceeded`, or a streamed `response.failed` with that code, as
its context window running out: the turn ends ("Codex ran out of room in the
model's context window") and Codex marks its token usage full, as the usage
of its last request = 95 % of its `model_context_window` minus the usage its
session's requests sum to. Once those sum past the window (a few turns into
any session) that is 0, and its compaction check before the next turn
starts from it: the next turn goes out uncompacted and is refused again, turn
after turn. vLLM's own 400 (`"code": 400`) it does not recognise: it keeps the
last answer's usage, and its next turn compacts. So on a Codex *turn* brimful
refuses with a code Codex does not recognise (`CODE`): its state is then the
one vLLM alone leaves, and its next turn compacts when its config sets
`model_context_window`.

Codex's compaction request keeps OpenAI's answer: there the recognised code
makes Codex drop its oldest items and send the compaction again, where vLLM's
own 400 fails the compaction (and every compaction after it).

The `openai` SDK, LiteLLM and the AI SDK read the same `error.code` (their
`code`, `ContextWindowExceededError`, `APICallError`), so no one answer
serves them and Codex: this keys on Codex's own header, `x-codex-turn-metadata`,
whose `request_kind` says "turn" or "compaction". Every other request, and a
Codex that sends no such header, gets OpenAI's answer. The record keeps
`context_length_exceeded`: the request was refused for length all the same.
"""

from __future__ import annotations

import json
from dataclasses import replace

from proxy.asgi import Headers
from proxy.errors import BrimfulError, ErrorCode

TURN_METADATA = b"x-codex-turn-metadata"
CODE = "prompt_too_long"      # any code but context_length_exceeded: Codex 0.171 matches that one only


def is_turn(headers: Headers) -> bool:
    """The request is a Codex turn (`request_kind` "turn" in its turn metadata)."""
    raw = next((value for name, value in headers if name == TURN_METADATA), None)
    if raw is None:
        return False
    try:
        metadata = json.loads(raw)
    except ValueError:
        return False
    return isinstance(metadata, dict) and metadata.get("request_kind") == "turn"


def refusal(err: BrimfulError, headers: Headers) -> BrimfulError:
    """`err` as a Codex turn gets it: a length refusal with `CODE`, and what makes Codex compact;
    any other error, or any other request, as it is."""
    if err.code != ErrorCode.CONTEXT_LENGTH_EXCEEDED or not is_turn(headers):
        return err
    window = err.details.get("max_model_len")
    setting = f"model_context_window = {window}" if isinstance(window, int) else "model_context_window"
    return replace(err, wire_code=CODE, message=(
        f"{err.message} Codex compacts the conversation before your next message when its config.toml "
        f"sets {setting} (this model's context)."))
