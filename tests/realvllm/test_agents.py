"""The floor against a REAL vLLM 0.32: a sliver refused only where vLLM alone refuses too.

vLLM 0.32 clamps prompt + max_tokens > max_model_len by itself and refuses
max_tokens > max_model_len; brimful's Messages floor (3,000, at most an eighth
of the context: 256 at this server's 2,048) refuses room below it only in the
second case, in Anthropic's words (docs/agents.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.realvllm.test_surfaces import through
from tests.support.surface_scenarios import Target, prompt_of, words

pytestmark = pytest.mark.realvllm


@pytest.fixture(scope="module")
def target(real_vllm: Any) -> Iterator[Target]:
    yield from through(real_vllm)


def ask(client: anthropic.Anthropic, model: str, n: int, max_tokens: int) -> Any:
    return client.messages.with_raw_response.create(model=model, max_tokens=max_tokens,
                                                    messages=[{"role": "user", "content": words(n)}])


def test_where_vllm_alone_refuses_a_sliver_is_refused_in_anthropics_words(target: Target) -> None:
    floor = target.max_model_len // 8
    n = target.max_model_len - floor + 1 - prompt_of(0)          # one token of room short of the floor
    with pytest.raises(anthropic.BadRequestError) as direct:
        ask(target.anthropic(direct=True), target.model, n, 32000)
    assert "cannot be greater than max_model_len" in str(direct.value)
    with pytest.raises(anthropic.BadRequestError) as refused:
        ask(target.anthropic(), target.model, n, 32000)
    message = refused.value.body["error"]["message"]
    assert message.startswith(f"prompt is too long: {prompt_of(n)} tokens > {target.max_model_len - floor} maximum")
    served = ask(target.anthropic(), target.model, n - 1, 32000)       # the floor fits: served by vLLM
    assert (served.headers["x-brimful-action"], served.headers["x-brimful-granted-max-tokens"]) == (
        "clamped", str(floor))
    assert served.parse().usage.input_tokens == prompt_of(n - 1)


def test_where_vllm_alone_serves_a_sliver_brimful_serves_it_too(target: Target) -> None:
    n = target.max_model_len - 40 - prompt_of(0)                   # 40 tokens of room, below the floor
    direct = ask(target.anthropic(direct=True), target.model, n, 1000).parse()   # 1000 <= max_model_len
    through_brimful = ask(target.anthropic(), target.model, n, 1000)
    assert through_brimful.headers["x-brimful-granted-max-tokens"] == "40"
    message = through_brimful.parse()
    assert message.usage.input_tokens == direct.usage.input_tokens == prompt_of(n)
    assert message.usage.output_tokens <= 40 and direct.usage.output_tokens <= 40
