"""A known length distribution pushed through the proxy, read back by `brimful report`.

Requests with prompt lengths and completion limits drawn from a seeded
distribution go client → brimful → fake vLLM (which generates exactly the
granted number of tokens).  brimful writes its length log; `brimful report`
reads it; its percentiles must equal numpy's on the lengths we know we sent.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import httpx
import numpy as np
import pytest

from proxy.app import BrimfulApp
from proxy.config import Config, LengthLogConfig, ModelConfig, UpstreamConfig
from tests.support.fakevllm import FakeVLLM
from tests.support.servers import serve_in_thread

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa"]


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
        with serve_in_thread(BrimfulApp(config)) as base, httpx.Client(base_url=base, timeout=10) as client:
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
        [sys.executable, "-m", "proxy.commands.report", str(log_path), "--format", "json"],
        capture_output=True, text=True, check=True,
    )
    report = json.loads(result.stdout)
    model = next(m for m in report["models"] if m["model"] == "tiny-qwen")
    totals = [p + c for p, c in zip(prompts, completions, strict=True)]
    for name, values in (("prompt_tokens", prompts), ("completion_tokens", completions), ("total_tokens", totals)):
        section = model[name]
        for q in (50, 90, 95, 99):
            assert section[f"p{q}"] == pytest.approx(float(np.percentile(values, q)), abs=1e-9), (name, q)
        assert section["max"] == max(values)
    assert model["requests"] == 150
    assert model["recommendation"]["max_model_len"] % 16 == 0


def test_report_recommendation_rises_with_demand_that_cannot_fit(tmp_path, qwen3, qwen3_dir) -> None:
    """Issue 16's traffic through the proxy: 30 % refused prompts, 33 % clamped limits on max_model_len 2,048.

    The served lengths can never say more than 2,048; the demanded ones (prompt + the limit asked, refused
    and clamped requests included) are what we sent, and the recommendation follows them.
    """
    from tests.support.traffic import issue16_mix, record_traffic

    log_path = tmp_path / "lengths.jsonl"
    sent = record_traffic(log_path, qwen3, qwen3_dir, issue16_mix(), model="tiny-qwen")
    statuses = [status for _, _, status in sent]
    assert statuses.count(400) == 18 and statuses.count(200) == 42
    assert min(p for p, _, s in sent if s == 400) > 2048 >= max(p for p, _, s in sent if s == 200)
    demanded = [p + asked for p, asked, _ in sent]

    def report(*argv: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "proxy.commands.report", str(log_path), "--format", "json", *argv],
                             capture_output=True, text=True, check=True).stdout
        return next(m for m in json.loads(out)["models"] if m["model"] == "tiny-qwen")

    model = report("--preset", "Qwen3-8B")
    for q in (50, 90, 95, 99):
        assert model["demand_tokens"][f"p{q}"] == pytest.approx(float(np.percentile(demanded, q)), abs=1e-9), q
    assert model["demand_tokens"]["count"] == 60 and model["demand_tokens"]["max"] == max(demanded)
    assert model["rejections"] == {"prompt_too_long": 18}
    asked = model["asked_recommendation"]
    # p99 of what was asked is a 65,535-token ask after ≈ 1,200 tokens; Qwen3-8B's own context stops it at 40,960
    assert asked["wanted"] == math.ceil(np.percentile(demanded, 99) / 16) * 16 > 40960
    assert (asked["max_model_len"], asked["limited_by"]) == (40960, "model_context")
    assert asked["current"] == {"max_model_len": 2048, "total": 60, "fits": 22, "clamped": 20, "refused": 18,
                                "clamped_share": 20 / 60, "refused_share": 18 / 60}
    # what was needed: 22 exact, 20 cut below their asks (censored), 18 refused (completion estimated)
    rec = model["recommendation"]
    assert (rec["exact"], rec["cut"], rec["imputed"]) == (22, 20, 18)
    served = [(p, c) for p, c, s in sent if s == 200]
    # the served completions' estimate ends at the longest cut one (censored past the 22 exact ones), each
    # capped at the refused request's own ask (256): the longest refused prompt + 256 is the last event, the p99
    longest_served = max(r["completion_tokens"] or 0 for r in map(json.loads, log_path.read_text().splitlines()))
    expected = max(p + min(a, longest_served) for p, a, s in sent if s == 400)
    assert expected == 2615 + 256
    assert rec["need"]["value"] == expected and len(served) == 42
    assert rec["max_model_len"] == math.ceil(expected / 16) * 16 > 2048       # it still rises
    assert (rec["current"]["refused"], rec["current"]["cut"]) == (18, pytest.approx(20))
    assert rec["recommended"]["refused"] == 0
    # what served lengths alone say: never above the current limit
    assert model["served_recommendation"]["max_model_len"] <= 2048

    # p80 of the asks lands among the 4,096-token asks
    at_p80 = report("--percentile", "80", "--preset", "Qwen3-8B", "--gpu", "H100-80GB")
    limit = math.ceil(np.percentile(demanded, 80) / 16) * 16
    assert at_p80["asked_recommendation"]["max_model_len"] == limit == 5296      # docs/sizing.md's figure
    # what the need's recommendation buys on an H100: KV held at the p95 of need (at most the recommendation)
    p80 = at_p80["recommendation"]
    c = at_p80["capacity"]
    assert c["p95_demand_kv_tokens"] == min(at_p80["need_tokens"]["p95"], p80["max_model_len"])
    assert c["concurrent_at_p95"] == 395_717 // (math.ceil(c["p95_demand_kv_tokens"] / 16) * 16)

    table = subprocess.run([sys.executable, "-m", "proxy.commands.report", str(log_path), "--preset", "Qwen3-8B"],
                           capture_output=True, text=True, check=True).stdout
    assert "  not served, by reason: prompt too long 18 (30.0%)" in table
    assert "  recorded: refused for length 30.0%, clamped 33.3%, really cut short 33.3%" in table
    assert "            2,048     30.0%   33.3% (0.0% … 33.3%) ← current" in table
