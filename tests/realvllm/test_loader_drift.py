"""Live check of the tokenizer loader: brimful counts what a real vLLM 0.32 counts where transformers 5 rebuilds
the tokenizer (tokenizer_cache/_loader.py).

For Phi-3-mini and DeepSeek-R1-Distill-Llama-8B, the tiny model of the surface corpus (their tokenizer
files beside a Qwen3 config.json, tests/realvllm/tiny_model.py) is served by the real vLLM, which builds
both as a LlamaTokenizer.  Texts where that differs from tokenizer.json (after a special token, a leading
space, code, Korean) are sent as chats (vLLM's /tokenize count and the answer's usage.prompt_tokens)
and as prompts (/tokenize): each must equal brimful's count of the served folder, and tokenizer.json read as it is
must be wrong on some of them (so the check can fail).

BRIMFUL_REAL_VLLM as for the other real-vLLM tests: off skips; auto skips when the venv or the server
cannot be had; require fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.realvllm.fixture import MODE_ENV, SHARED_DIR, parse_mode
from tests.realvllm.locking import exclusive_lock
from tests.realvllm.server import SERVED_MODEL_NAME, running_server
from tests.realvllm.tiny_model import ensure_tiny_model
from tests.realvllm.venv import SetupError, cache_root, ensure_vllm_venv
from tokenizer_cache import TokenizerCache

pytestmark = [pytest.mark.slow, pytest.mark.realvllm]

MODELS = {"phi3-mini": "microsoft--Phi-3-mini-4k-instruct",
          "r1-distill-llama-8b": "deepseek-ai--DeepSeek-R1-Distill-Llama-8B"}
TEXTS = [" Hello world", "Hello  world\nsecond line", "def f(x):\n    return x * 2\n", "세종대왕 🐶 한글",
         "naïve café", "  two leading spaces", "<|end|>after a token", "x<|user|> y"]


def _post(base: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        raise AssertionError(f"{path} answered {error.code}: {error.read()[:300]!r}") from None


def _chat(text: str) -> dict[str, Any]:
    return {"model": SERVED_MODEL_NAME, "messages": [{"role": "system", "content": "Be brief."},
                                                     {"role": "user", "content": text},
                                                     {"role": "assistant", "content": text},
                                                     {"role": "user", "content": text}]}


@pytest.mark.parametrize("name", list(MODELS))
def test_brimful_counts_what_vllm_counts_for_a_rebuilt_tokenizer(name: str, tmp_path: Path) -> None:
    mode = parse_mode(os.environ.get(MODE_ENV))
    if mode == "off":
        pytest.skip(f"{MODE_ENV}=off")
    model_dir = cache_root() / "tiny-models-surfaces" / name
    try:
        python = ensure_vllm_venv(log_path=tmp_path / "venv.log").python
        with exclusive_lock(cache_root() / f".tiny-surfaces-{name}.lock"):
            ensure_tiny_model(model_dir, SHARED_DIR / "models" / MODELS[name], python, tmp_path / "build.log")
        # A tiny model, but a slow start on a loaded CPU: more than the default 180 s to get healthy.
        server_cm = running_server(python, model_dir, tmp_path / "server.log", timeout=600)
        server = server_cm.__enter__()
    except (SetupError, RuntimeError, OSError, subprocess.CalledProcessError) as error:
        if mode == "require":
            raise
        pytest.skip(f"real vLLM unavailable ({MODE_ENV}=require makes this an error): {error}")
    try:
        cache = TokenizerCache()
        ours = cache.get(model_dir)
        plain = cache.get(model_dir, tokenizer_loader="tokenizer_json")
        assert (ours.tokenizer_loader, ours.loader_info.tokenizer_class) == ("transformers5", "LlamaTokenizer")  # type: ignore[union-attr]
        plain_wrong = 0
        for text in TEXTS:
            chat = _chat(text)
            tokenized = _post(server.base_url, "/tokenize", {"model": SERVED_MODEL_NAME, "messages": chat["messages"]})
            answered = _post(server.base_url, "/v1/chat/completions", {**chat, "max_tokens": 1})
            counted = ours.count_chat(chat)
            assert counted == tokenized["count"] == answered["usage"]["prompt_tokens"], text
            completion = {"model": SERVED_MODEL_NAME, "prompt": text}
            served = _post(server.base_url, "/tokenize", completion)["count"]
            assert ours.count_completion(completion) == [served], text
            plain_wrong += plain.count_chat(chat) != counted
        assert plain_wrong > 0   # tokenizer.json as it is would miscount here
    finally:
        server_cm.__exit__(None, None, None)
