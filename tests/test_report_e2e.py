"""A known length distribution pushed through the proxy, read back by `headroom report`.

Requests with prompt lengths and completion limits drawn from a seeded
distribution go client → headroom → fake vLLM (which generates exactly the
granted number of tokens).  headroom writes its length log; `headroom report`
reads it; its percentiles must equal numpy's on the lengths we know we sent.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import httpx
import numpy as np
import pytest

from proxy.app import HeadroomApp
from proxy.config import Config, LengthLogConfig, ModelConfig, UpstreamConfig
from tests.support.fakevllm import FakeVLLM
from tests.support.servers import serve_in_thread
from tokenizer_cache import load_model_tokenizer

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa"]


@pytest.fixture(scope="module")
def qwen3(qwen3_dir):
    return load_model_tokenizer(qwen3_dir)


def test_report_percentiles_match_numpy_on_proxied_traffic(tmp_path, qwen3, qwen3_dir) -> None:
    rng = random.Random(20261129)
    log_path = tmp_path / "lengths.jsonl"
    prompts, completions = [], []

    def count(endpoint: str, body: dict) -> int:
        return qwen3.count_chat(body)

    with FakeVLLM(max_model_len=4096, count_prompt=count) as fake:
        config = Config(
            upstream=UpstreamConfig(url=fake.base_url, timeout=10.0),
            length_log=LengthLogConfig(path=str(log_path)),
        )
        config.models["tiny-qwen"] = ModelConfig(tokenizer=str(qwen3_dir))
        with serve_in_thread(HeadroomApp(config)) as base, httpx.Client(base_url=base, timeout=10) as client:
            for _ in range(150):
                n_words = int(rng.lognormvariate(4.0, 0.8)) + 1      # long-tailed, like real traffic
                body = {
                    "model": "tiny-qwen",
                    "messages": [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(n_words))}],
                    "max_tokens": rng.choice([4, 8, 16, 32, 64]),
                }
                response = client.post("/v1/chat/completions", json=body)
                assert response.status_code == 200
                prompts.append(qwen3.count_chat(body))
                completions.append(response.json()["usage"]["completion_tokens"])
                assert completions[-1] == body["max_tokens"]
    # leaving serve_in_thread ran the shutdown, which flushed the log

    lines = log_path.read_text().splitlines()
    assert len(lines) == 150
    assert all("alpha" not in line and "beta" not in line for line in lines), "no text in records"

    result = subprocess.run(
        [sys.executable, "-m", "proxy.report_cli", str(log_path), "--format", "json"],
        capture_output=True, text=True, check=True,
    )
    report = json.loads(result.stdout)
    model = next(m for m in report["models"] if m["model"] == "tiny-qwen")
    totals = [p + c for p, c in zip(prompts, completions)]
    for name, values in (("prompt_tokens", prompts), ("completion_tokens", completions), ("total_tokens", totals)):
        section = model[name]
        for q in (50, 90, 95, 99):
            assert section[f"p{q}"] == pytest.approx(float(np.percentile(values, q)), abs=1e-9), (name, q)
        assert section["max"] == max(values)
    assert model["requests"] == 150
    assert model["recommendation"]["max_model_len"] % 16 == 0
