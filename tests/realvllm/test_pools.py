"""Two pools routed by length against two REAL vLLM 0.32 CPU servers of one model: max_model_len 1,024 and 2,048.

The servers start one after the other (the machine's two cores), serve the tiny random model as
`tiny-qwen` each, and brimful routes between them; which server served a request is read from each
vLLM's own `vllm:request_success_total`.  The random model never emits EOS, so every completion is
exactly its limit, and small.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from proxy.app import BrimfulApp
from proxy.config import Config, UpstreamConfig, UpstreamEntry
from tests.realvllm.fixture import prepare, setup_or_skip
from tests.realvllm.server import SERVED_MODEL_NAME, running_server
from tests.support.servers import serve_in_thread
from tests.support.stack import started_up

pytestmark = pytest.mark.realvllm
START_TIMEOUT_S = 900.0


@dataclass
class TwoPools:
    short: str          # base URLs of the two vLLMs
    long: str
    base: str           # brimful's
    client: openai.OpenAI

    def served(self, url: str) -> float:
        """Requests this vLLM finished, by its own /metrics."""
        text = httpx.get(url + "/metrics", timeout=30).text
        return sum(float(m) for m in re.findall(r'^vllm:request_success_total\{[^}]*\} (\S+)$', text, re.M))


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoPools]:
    log_dir = tmp_path_factory.mktemp("realvllm-pools")
    with contextlib.ExitStack() as stack:
        with setup_or_skip():
            python, model_dir, _ = prepare(log_dir)
            # one after the other, each given time: the machine's cores are shared
            short = stack.enter_context(running_server(python, model_dir, log_dir / "short.log",
                                                       timeout=START_TIMEOUT_S, max_model_len=1024))
            long = stack.enter_context(running_server(python, model_dir, log_dir / "long.log",
                                                      timeout=START_TIMEOUT_S))
        config = Config(upstream=UpstreamConfig(url=short.base_url, timeout=120.0),
                        upstreams=[UpstreamEntry(name="long", url=long.base_url)])
        app = BrimfulApp(config)
        base = stack.enter_context(serve_in_thread(app, settle=functools.partial(started_up, app)))
        yield TwoPools(short.base_url, long.base_url, base,
                       openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=120))


def words(n: int) -> list[dict]:
    return [{"role": "user", "content": " ".join(["hello"] * n)}]


@pytest.mark.parametrize("prompt_words, max_tokens, pool", [
    (20, 16, "short"),        # ≈ 30 + 16 fits 1,024
    (20, 1100, "long"),       # the ask does not fit 1,024
    (1100, 8, "long"),        # the prompt alone is past 1,024
])
def test_requests_go_to_the_smallest_real_vllm_that_holds_them(pools: TwoPools, prompt_words: int,
                                                              max_tokens: int, pool: str) -> None:
    before = {name: pools.served(url) for name, url in (("short", pools.short), ("long", pools.long))}
    raw = pools.client.chat.completions.with_raw_response.create(
        model=SERVED_MODEL_NAME, messages=words(prompt_words), max_tokens=max_tokens)
    completion = raw.parse()
    assert completion.usage.completion_tokens == max_tokens           # served in full, as the long vLLM would
    assert raw.headers["x-brimful-max-model-len"] == "2048"
    after = {name: pools.served(url) for name, url in (("short", pools.short), ("long", pools.long))}
    other = "long" if pool == "short" else "short"
    assert (after[pool] - before[pool], after[other] - before[other]) == (1, 0)


def test_what_no_real_vllm_holds_is_refused_with_the_longest_window(pools: TwoPools) -> None:
    before = pools.served(pools.short) + pools.served(pools.long)
    with pytest.raises(openai.BadRequestError) as info:
        pools.client.chat.completions.create(model=SERVED_MODEL_NAME, messages=words(2100), max_tokens=8)
    assert "2048" in info.value.message.replace(",", "")
    assert pools.served(pools.short) + pools.served(pools.long) == before
    text = httpx.get(pools.base + "/metrics").text
    assert 'brimful_pool_requests_total{max_model_len="1024",model="tiny-qwen",upstream="default"}' in text
