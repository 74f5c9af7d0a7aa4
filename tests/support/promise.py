"""The promise, as a judge: is an outcome through brimful at least as good as vLLM's alone?

For one request sent twice, once to vLLM and once through brimful:
* vLLM answers 200 → brimful answers 200 with at least as many completion tokens;
* vLLM refuses it for length → brimful answers 200 whenever any completion fits
  (at least its floor, where vLLM refuses the limit anyway: docs/agents.md), else
  a 400 with the exact prompt count and advice (tokens to remove) that works;
* vLLM refuses it for another reason → brimful refuses it too (4xx), never a 5xx.

`sweep_cases` is the grid the issue asks for: prompt sizes around
max_model_len × completion limits × every surface with a completion limit
(chat, completions, Responses, Anthropic Messages) × streamed or not.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
ENDPOINTS = (CHAT, COMPLETIONS, RESPONSES, MESSAGES)
# The completion-limit field of each surface.
LIMIT_FIELD = {CHAT: "max_tokens", COMPLETIONS: "max_tokens", RESPONSES: "max_output_tokens", MESSAGES: "max_tokens"}
OFFSETS = (-64, -33, -17, -16, -15, -9, -2, -1, 0, 1, 2, 17, 64)
STREAM_OFFSETS = (-16, -1, 0, 1)


@dataclass(frozen=True)
class Outcome:
    status: int
    completion_tokens: int | None = None       # generated (the tiny random model never stops early)
    code: Any = None
    message: str = ""
    details: dict[str, Any] | None = None      # error.brimful

    @property
    def length_refusal(self) -> bool:
        text = self.message.lower()
        return self.status == 400 and any(w in text for w in (
            "context length", "max_model_len", "input tokens", "max_tokens must be at least"))


@dataclass(frozen=True)
class Case:
    endpoint: str          # CHAT or COMPLETIONS
    prompt_tokens: int
    limit: int | None
    stream: bool

    @property
    def name(self) -> str:
        kind = {CHAT: "chat", COMPLETIONS: "cmpl", RESPONSES: "resp", MESSAGES: "msgs"}[self.endpoint]
        return f"{kind}-{self.prompt_tokens}-{self.limit}{'-stream' if self.stream else ''}"


def limits_for(prompt: int, max_model_len: int) -> list[int | None]:
    room = max_model_len - prompt
    values: list[int | None] = [None, 1, 16, room - 1, room, room + 1, max_model_len, 65535]
    seen: list[int | None] = []
    for value in values:
        if (value is None or value >= 1) and value not in seen:
            seen.append(value)
    return seen


def sweep_cases(max_model_len: int, endpoints: tuple[str, ...] = ENDPOINTS) -> Iterator[Case]:
    for endpoint in endpoints:
        for offset in OFFSETS:
            prompt = max_model_len + offset
            for limit in limits_for(prompt, max_model_len):
                yield Case(endpoint, prompt, limit, False)
                if offset in STREAM_OFFSETS:
                    yield Case(endpoint, prompt, limit, True)


def send(client: httpx.Client, url: str, case: Case, body: dict[str, Any]) -> Outcome:
    """POST one request; a stream is read to its end and its usage taken (each surface's own)."""
    payload = dict(body)
    if case.limit is not None:
        payload[LIMIT_FIELD[case.endpoint]] = case.limit
    if case.stream:
        payload["stream"] = True
        if case.endpoint in (CHAT, COMPLETIONS):
            payload["stream_options"] = {"include_usage": True}
    response = client.post(url + case.endpoint, json=payload)
    if response.status_code != 200:
        try:
            error = response.json().get("error", {})
        except ValueError:
            error = {"message": response.text}
        if not isinstance(error, dict):
            error = {"message": str(error)}
        details = error.get("brimful")
        code = error.get("code")
        if case.endpoint == MESSAGES and isinstance(details, dict):   # Anthropic's envelope has no code
            code = details.get("code")
        return Outcome(response.status_code, code=code, message=str(error.get("message", "")), details=details)
    key = "completion_tokens" if case.endpoint in (CHAT, COMPLETIONS) else "output_tokens"
    if not case.stream:
        return Outcome(200, response.json()["usage"][key])
    completion = None
    for line in response.text.split("\n"):
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            if "error" in event:
                return Outcome(500, message=str(event["error"]))
            usage = event.get("usage") or (event.get("response") or {}).get("usage")
            if isinstance(usage, dict) and usage.get(key) is not None:
                completion = usage[key]
    return Outcome(200, completion)


def judge(case: Case, through: Outcome, direct: Outcome, max_model_len: int,
          resend: Callable[[int], Outcome]) -> str | None:
    """None when `through` is at least as good as `direct`, else what is worse.

    `resend(tokens_to_remove)` sends the same request with the prompt that much
    shorter, through brimful: the advice of a refusal must make it pass.
    """
    if through.status >= 500:
        return f"brimful answered {through.status}: {through.message[:200]}"
    if direct.status == 200:
        if through.status != 200:
            return f"refused ({through.status} {through.message[:160]}) where vLLM served"
        if (through.completion_tokens or 0) < (direct.completion_tokens or 0):
            return f"granted {through.completion_tokens} where vLLM granted {direct.completion_tokens}"
        return None
    if direct.length_refusal:
        # The floor (docs/agents.md): where vLLM refuses the limit anyway (above max_model_len),
        # brimful may refuse room below its floor instead of granting a sliver; its advice then
        # leaves room for the floor.
        floor = through.details.get("min_completion_tokens", 1) if through.details else 1
        if not (case.limit or 0) > max_model_len:
            floor = 1
        room = max_model_len - case.prompt_tokens
        if case.prompt_tokens < max_model_len and (room >= floor or through.status == 200):
            if through.status != 200 or not through.completion_tokens:
                return f"vLLM refused for length, a completion fits, brimful answered {through.status}"
            return None
        if through.status != 400 or through.code != "context_length_exceeded" or not through.details:
            return f"an unsaveable prompt got {through.status} {through.code}, not brimful's explained 400"
        if through.details.get("prompt_tokens") != case.prompt_tokens:
            return f"the refusal says {through.details.get('prompt_tokens')} tokens, the prompt is {case.prompt_tokens}"
        cut = through.details["tokens_to_remove"]
        if cut != case.prompt_tokens + floor - max_model_len:
            return f"advises removing {cut} tokens, {case.prompt_tokens + floor - max_model_len} would do"
        again = resend(cut)
        if again.status != 200:
            return f"following the advice (remove {cut}) still gets {again.status} {again.message[:120]}"
        return None
    if not 400 <= through.status < 500:
        return f"vLLM refused ({direct.status}), brimful answered {through.status}"
    return None
