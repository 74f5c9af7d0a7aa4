"""Known traffic pushed through brimful into a fake vLLM, its length log written: the report tests' input.

`issue16_mix` is issue 16's day of traffic on a `max_model_len` of 2,048: 22
requests that fit, 18 whose prompts (≈ 2,509–2,615 tokens) cannot, and 20
that ask for 4,096 or 65,535 completion tokens after a ≈ 1,200-token prompt
and are clamped.  `record_traffic` sends it and returns what each request
demanded (prompt tokens counted with the real tokenizer, the limit asked).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx

from proxy.app import BrimfulApp
from proxy.config import Config, LengthLogConfig, ModelConfig, UpstreamConfig
from tests.support.fakevllm import FakeVLLM
from tests.support.servers import serve_in_thread


def issue16_mix(seed: int = 16) -> list[tuple[int, int]]:
    """(words of "hello ", max_tokens) per request, in a shuffled but fixed order."""
    mix = [(990, 500)] * 22 + [(2500 + 6 * k, 256) for k in range(17)] + [(2606, 256)]
    mix += [(1190, 4096)] * 10 + [(1190, 65535)] * 10
    random.Random(seed).shuffle(mix)
    return mix


def record_traffic(log_path: Path, tokenizer: Any, tokenizer_dir: Path, mix: list[tuple[int, int]], *,
                   model: str, max_model_len: int = 2048) -> list[tuple[int, int, int]]:
    """Send `mix` as chat requests through brimful; (prompt tokens, max_tokens, status) per request."""
    def count(endpoint: str, body: dict) -> int:
        return tokenizer.count_chat(body)

    sent: list[tuple[int, int, int]] = []
    with FakeVLLM(model=model, max_model_len=max_model_len, count_prompt=count) as fake:
        config = Config(upstream=UpstreamConfig(url=fake.base_url, timeout=10.0),
                        length_log=LengthLogConfig(path=str(log_path)))
        config.models[model] = ModelConfig(tokenizer=str(tokenizer_dir))
        with serve_in_thread(BrimfulApp(config)) as base, httpx.Client(base_url=base, timeout=10) as client:
            for words, asked in mix:
                body = {"model": model, "messages": [{"role": "user", "content": "hello " * words}],
                        "max_tokens": asked}
                status = client.post("/v1/chat/completions", json=body).status_code
                sent.append((tokenizer.count_chat(body), asked, status))
    # leaving serve_in_thread ran brimful's shutdown, which flushed the length log
    return sent
