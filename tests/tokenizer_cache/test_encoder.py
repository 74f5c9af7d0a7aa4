"""`[tokenizers] engine` and `chat_cache_entries` reach the counter; /stats and /metrics say which engine counts.

The engine itself (exactness, the self-check) is tested in tests/tokenizer_cache/test_engine_exactness.py;
these tests follow the configuration through a running brimful.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.config import Config, ConfigError, load_config
from tests.conftest import MODELS
from tests.support.stack import CHAT, MODEL, Stack, running_stack
from tokenizer_cache import _model
from tokenizer_cache._encoder import FastokensEncoder

# The tests that load fastokens serve Phi-3-mini: 0.4 s of CPU to load against Qwen3's 2.4 s.
PHI3_DIR = MODELS / "microsoft--Phi-3-mini-4k-instruct"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "How far is a marathon?"}], "max_tokens": 8}


def samples(stack: Stack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of brimful's /metrics: (name, sorted labels) -> value."""
    text = stack.http.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def counting(stack: Stack) -> dict[str, Any]:
    document = stack.http.get("/stats").json()
    return dict(document["counting"][MODEL])


def configured(**keys: Any) -> Any:
    def configure(config: Config) -> None:
        for key, value in keys.items():
            setattr(config.tokenizers, key, value)
    return configure


def test_the_default_engine_starts_on_tokenizers_and_says_when_fastokens_loads(
    qwen3_dir: Path, fresh_loads: None
) -> None:
    with running_stack(qwen3_dir) as stack:
        assert stack.http.post(CHAT, json=BODY).status_code == 200
        stack.recorder.wait_for(1)
        state = counting(stack)
        metrics = samples(stack)
    assert state["engine"] == "tokenizers"
    assert re.fullmatch(r"fastokens loads once counting with tokenizers has cost [0-9.]+ s \([0-9.]+ s so far\)",
                        state["engine_fallback"]), state["engine_fallback"]
    assert metrics[("brimful_count_engine", (("engine", "tokenizers"), ("model", MODEL)))] == 1


def test_the_default_engine_counts_with_fastokens_once_counting_has_paid_for_it(
    monkeypatch: pytest.MonkeyPatch, fresh_loads: None
) -> None:
    monkeypatch.setattr(_model, "LOAD_COST_RATIO", 1e-9)   # the first count pays for the load
    with running_stack(PHI3_DIR) as stack:
        assert stack.http.post(CHAT, json=BODY).status_code == 200
        assert stack.app.counter._ready[MODEL].engine_settled(timeout=120)
        for _ in range(2):                       # the same chat twice: the second is a chat-cache hit
            assert stack.http.post(CHAT, json={**BODY, "max_tokens": 9}).status_code == 200
        stack.recorder.wait_for(3)
        state = counting(stack)
        metrics = samples(stack)
    assert (state["engine"], state["engine_fallback"], state["engine_failures"]) == ("fastokens", None, 0)
    assert state["mode"] == "local"              # proxy.admitted.trust's figures are still there beside the engine
    assert metrics[("brimful_count_engine", (("engine", "fastokens"), ("model", MODEL)))] == 1
    assert metrics[("brimful_count_engine_failures_total", (("model", MODEL),))] == 0
    assert metrics[("brimful_chat_cache_lookups_total", (("result", "hit"),))] >= 1
    assert metrics[("brimful_chat_cache_entries", ())] >= 1


def test_engine_tokenizers_and_no_chat_cache(qwen3_dir: Path) -> None:
    with running_stack(qwen3_dir, configure=configured(engine="tokenizers", chat_cache_entries=0)) as stack:
        assert stack.http.post(CHAT, json=BODY).status_code == 200
        stack.recorder.wait_for(1)
        assert stack.app.counter.chat_cache is None
        state = counting(stack)
        metrics = samples(stack)
    assert (state["engine"], state["engine_fallback"]) == ("tokenizers", None)
    assert metrics[("brimful_count_engine", (("engine", "tokenizers"), ("model", MODEL)))] == 1
    assert not any(name.startswith("brimful_chat_cache") for name, _ in metrics)


def test_a_failed_self_check_shows_why_not_fastokens(
    monkeypatch: pytest.MonkeyPatch, fresh_loads: None
) -> None:
    monkeypatch.setattr(FastokensEncoder, "ids", lambda self, text, add: [])
    with running_stack(PHI3_DIR, configure=configured(engine="fastokens")) as stack:
        assert stack.http.post(CHAT, json=BODY).status_code == 200
        stack.recorder.wait_for(1)
        state = counting(stack)
        metrics = samples(stack)
    assert state["engine"] == "tokenizers" and "self-check" in state["engine_fallback"]
    assert metrics[("brimful_count_engine", (("engine", "tokenizers"), ("model", MODEL)))] == 1


def test_config_keys_are_validated(tmp_path: Path) -> None:
    path = tmp_path / "brimful.toml"
    path.write_text('[tokenizers]\nengine = "fast"\n')
    message = "'tokenizers.engine' must be one of 'auto', 'tokenizers', 'fastokens'"
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(path, env={})
    assert load_config(env={"BRIMFUL_TOKENIZERS_CHAT_CACHE_ENTRIES": "0"}).tokenizers.chat_cache_entries == 0
    assert load_config(env={"BRIMFUL_TOKENIZERS_ENGINE": "tokenizers"}).tokenizers.engine == "tokenizers"
