"""The prompt shapes /v1/completions accepts, checked and split into prompts.

OpenAI (and vLLM) accept a string, a list of strings, a list of token ids, or
a list of token-id lists; each element is one prompt.  Token ids are counted
as they are.  An empty prompt is refused, as vLLM refuses it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._errors import CountError

Prompt = str | list[int]

_SHAPES = "a string, an array of strings, an array of token ids, or an array of token-id arrays"
# How many distinct texts of one request count_prompts remembers (~6 MB at most beside the body).
DISTINCT_TEXTS_REMEMBERED = 65_536


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _token_ids(values: list[Any], where: str) -> list[int]:
    if not values:
        raise CountError(f"'{where}' is an empty list of token ids; the prompt cannot be empty.", param="prompt")
    for i, value in enumerate(values):
        if not _is_token_id(value):
            raise CountError(
                f"'{where}[{i}]' must be a non-negative integer token id, got {value!r}.", param="prompt"
            )
    return values


def parse_prompts(body: Mapping[str, Any]) -> list[Prompt]:
    """One entry per prompt: a string to encode, or token ids to count as is."""
    prompt = body.get("prompt")
    if prompt is None:
        if body.get("prompt_embeds") is not None:
            raise CountError(
                "Requests with 'prompt_embeds' cannot be counted from text; brimful counts 'prompt'.",
                param="prompt_embeds",
            )
        raise CountError("'prompt' is required for a completions request.", param="prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise CountError("The prompt cannot be empty.", param="prompt")
        return [prompt]
    if not isinstance(prompt, list):
        raise CountError(f"'prompt' must be {_SHAPES}.", param="prompt")
    if not prompt:
        raise CountError("'prompt' is an empty list; the prompt cannot be empty.", param="prompt")
    first = prompt[0]
    if isinstance(first, str):
        for i, item in enumerate(prompt):
            if not isinstance(item, str):
                raise CountError(f"'prompt[{i}]' must be a string like the other prompts.", param="prompt")
            if not item:
                raise CountError(f"'prompt[{i}]' is empty; the prompt cannot be empty.", param="prompt")
        return list(prompt)
    if isinstance(first, list):
        prompts: list[Prompt] = []
        for i, item in enumerate(prompt):
            if not isinstance(item, list):
                raise CountError(f"'prompt[{i}]' must be an array of token ids.", param="prompt")
            prompts.append(_token_ids(item, f"prompt[{i}]"))
        return prompts
    if _is_token_id(first):
        return [_token_ids(prompt, "prompt")]
    raise CountError(f"'prompt' must be {_SHAPES}.", param="prompt")


def count_prompts(body: Any, count_text: Callable[[str, bool], int],
                  check_ids: Callable[[list[int]], None] | None = None) -> list[int]:
    """Tokens per prompt of a /v1/completions body: texts through `count_text(text,
    add_special_tokens)` (`add_special_tokens` defaults to true here), token ids as they
    are, after `check_ids` (which raises CountError for ids vLLM refuses)."""
    from ._chat import _as_bool

    if not isinstance(body, dict):
        raise CountError("The request body must be a JSON object.")
    add_special_tokens = _as_bool(body, "add_special_tokens", True)
    counts = []
    # A text repeated in one request is counted once (10^6 copies of one input cost one count, not
    # 10^6); the first DISTINCT_TEXTS_REMEMBERED distinct ones are kept, so the table stays small.
    seen: dict[str, int] = {}
    for prompt in parse_prompts(body):
        if isinstance(prompt, str):
            count = seen.get(prompt)
            if count is None:
                count = count_text(prompt, add_special_tokens)
                if len(seen) < DISTINCT_TEXTS_REMEMBERED:
                    seen[prompt] = count
            counts.append(count)
        else:
            if check_ids is not None:
                check_ids(prompt)
            counts.append(len(prompt))
    return counts
