"""Re-capture tests/data/vllm032_surfaces/: a real vLLM 0.32's verbatim answers on Responses, Messages and pooling.

Run by hand (not a test), one server at a time (~2.4 GiB, ~40-60 s to start each):
    .venv/bin/python -m tests.realvllm.capture_surfaces [generate] [killed] [pooling]
(all three when none is named).

Three kinds of server, started in turn with the tiny Qwen3 model of tests/realvllm:
* the generate runner (the flags of tests/realvllm/server.py): Responses and
  Messages answers, whole and streamed, and their length refusals;
* the same, once per surface, with its EngineCore process killed in the middle
  of a stream: what a client receives when the engine dies mid-answer;
* the pooling runner (`--runner pooling --convert embed`): embeddings, pooling,
  score and rerank.
Each file holds the request, the status, the headers and the body (JSON) or the
raw SSE text (`body_raw`), as the shared captures do (../shared/vllm/captures).
tests/support/fakevllm.py answers the same way; tests/support/test_fakevllm_surfaces.py checks it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import server as srv
from .fixture import prepare

OUT = Path(__file__).resolve().parents[1] / "data" / "vllm032_surfaces"
MODEL = srv.SERVED_MODEL_NAME


def words(n: int) -> str:
    """n tokens of Qwen3 text (" hello" is one token)."""
    return " ".join(["hello"] * n)


GENERATE: dict[str, tuple[str, dict[str, Any]]] = {
    "r01_responses_plain": ("/v1/responses", {"input": "Hello!", "max_output_tokens": 4, "temperature": 0}),
    "r02_responses_stream": ("/v1/responses", {"input": "Hello!", "max_output_tokens": 3, "temperature": 0,
                                               "stream": True}),
    "r03_responses_max_output_gt_mml": ("/v1/responses", {"input": "Hello!", "max_output_tokens": 65535}),
    "r04_responses_prompt_over": ("/v1/responses", {"input": words(2100), "max_output_tokens": 4}),
    "r05_responses_prompt_eq_mml": ("/v1/responses", {"input": words(2040), "max_output_tokens": 4}),
    "r06_responses_previous_response_unknown": ("/v1/responses", {"input": "Hi", "previous_response_id": "resp_x",
                                                                  "max_output_tokens": 4}),
    "r07_responses_over_room": ("/v1/responses", {"input": words(2030), "max_output_tokens": 100,
                                                  "temperature": 0}),
    "r08_responses_stream_prompt_over": ("/v1/responses", {"input": words(2100), "max_output_tokens": 4,
                                                           "stream": True}),
    "m01_messages_plain": ("/v1/messages", {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 4,
                                            "temperature": 0}),
    "m02_messages_stream": ("/v1/messages", {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 3,
                                             "temperature": 0, "stream": True}),
    "m03_messages_max_tokens_gt_mml": ("/v1/messages", {"messages": [{"role": "user", "content": "Hello!"}],
                                                        "max_tokens": 65535}),
    "m04_messages_prompt_over": ("/v1/messages", {"messages": [{"role": "user", "content": words(2100)}],
                                                  "max_tokens": 4}),
    "m05_messages_prompt_eq_mml": ("/v1/messages", {"messages": [{"role": "user", "content": words(2040)}],
                                                    "max_tokens": 4}),
    "m06_messages_max_tokens_missing": ("/v1/messages", {"messages": [{"role": "user", "content": "Hello!"}]}),
    "m07_messages_unknown_model": ("/v1/messages", {"model": "nope", "messages": [{"role": "user", "content": "Hi"}],
                                                    "max_tokens": 4}),
    "m08_count_tokens": ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "Hello!"}]}),
    "m09_count_tokens_prompt_over": ("/v1/messages/count_tokens",
                                     {"messages": [{"role": "user", "content": words(2100)}]}),
    "m10_messages_stream_prompt_over": ("/v1/messages", {"messages": [{"role": "user", "content": words(2100)}],
                                                         "max_tokens": 4, "stream": True}),
    "m11_messages_over_room": ("/v1/messages", {"messages": [{"role": "user", "content": words(2030)}],
                                                "max_tokens": 100, "temperature": 0}),
}
# A stream whose engine is killed after `after` events (a long answer, so it is still running).
ENGINE_KILLED: dict[str, tuple[str, dict[str, Any]]] = {
    "x01_chat_stream_engine_killed": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 1500, "stream": True,
        "stream_options": {"include_usage": True}}),
    "x02_responses_stream_engine_killed": ("/v1/responses", {"input": "Hello!", "max_output_tokens": 1500,
                                                             "stream": True}),
    "x03_messages_stream_engine_killed": ("/v1/messages", {"messages": [{"role": "user", "content": "Hello!"}],
                                                           "max_tokens": 1500, "stream": True}),
}
KILL_AFTER_EVENTS = 6
POOLING: dict[str, tuple[str, dict[str, Any]]] = {
    "p01_embeddings": ("/v1/embeddings", {"input": ["Hello there", "second one"]}),
    "p02_embeddings_input_over": ("/v1/embeddings", {"input": ["ok", words(2100)]}),
    "p03_embeddings_input_eq_mml": ("/v1/embeddings", {"input": words(2048)}),
    "p04_embeddings_truncate_all": ("/v1/embeddings", {"input": ["ok", words(2100)], "truncate_prompt_tokens": -1}),
    "p05_embeddings_truncate_gt_mml": ("/v1/embeddings", {"input": ["ok"], "truncate_prompt_tokens": 3000}),
    "p06_embeddings_token_ids": ("/v1/embeddings", {"input": [[9707, 1052], [5569, 825, 1052]]}),
    "p07_embeddings_messages": ("/v1/embeddings", {"messages": [{"role": "user", "content": "hi"}]}),
    "p08_pooling": ("/pooling", {"input": ["ok there"]}),
    "p09_score": ("/score", {"queries": "what is it", "documents": ["one doc", "another doc here"]}),
    "p10_rerank": ("/rerank", {"query": "what is it", "documents": ["one doc", "another doc here"]}),
    "p11_score_over": ("/score", {"queries": "what is it", "documents": ["one doc", words(2100)]}),
}


def _request(base: str, path: str, body: dict[str, Any]) -> http.client.HTTPResponse:
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=300)
    connection.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    return connection.getresponse()


def capture(base: str, path: str, body: dict[str, Any], on_event: Any = None) -> dict[str, Any]:
    """One request; a stream is read raw (`body_raw`), `on_event(count)` called as events arrive."""
    request = {"model": MODEL, **body}
    started = time.monotonic()
    response = _request(base, path, request)
    headers = {k.lower(): v for k, v in response.getheaders()}
    record: dict[str, Any] = {"request": {"method": "POST", "path": path, "json": request},
                              "status": response.status, "headers": headers}
    if headers.get("content-type", "").startswith("text/event-stream"):
        raw, events = b"", 0
        try:
            while chunk := response.read1(65536):
                raw += chunk
                if on_event is not None and raw.count(b"\n\n") > events:
                    events = raw.count(b"\n\n")
                    on_event(events)
        except http.client.IncompleteRead as cut:
            raw += cut.partial
            record["ended"] = "the connection closed without the chunked body's last chunk"
        record["body_raw"] = raw.decode("utf-8")
    else:
        data = response.read()
        try:
            record["body"] = json.loads(data)
        except ValueError:
            record["body_text"] = data.decode("utf-8", errors="replace")
    record["elapsed_s"] = round(time.monotonic() - started, 3)
    return record


def engine_core_pids(root: int) -> list[int]:
    """The EngineCore processes under `root` (vLLM names them in their command line)."""
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        with contextlib.suppress(OSError):
            for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                stack.append(int(child))
                if b"EngineCore" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(int(child))
    return found


def write(out: Path, name: str, record: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(name, record["status"], flush=True)


@contextlib.contextmanager
def serving(python: Path, model_dir: Path, log: Path, extra: tuple[str, ...]) -> Iterator[srv.RunningServer]:
    with srv.running_server(python, model_dir, log, extra_args=extra) as server:
        yield server


def main(argv: list[str]) -> int:
    out = OUT
    sections = set(argv) or {"generate", "killed", "pooling"}
    with tempfile.TemporaryDirectory() as tmp:
        python, model_dir, _ = prepare(Path(tmp))
        log = Path(tmp) / "server.log"
        if "generate" in sections:
            with serving(python, model_dir, log, ()) as server:
                for name, (path, body) in GENERATE.items():
                    write(out, name, capture(server.base_url, path, body))
        for name, (path, body) in ENGINE_KILLED.items() if "killed" in sections else ():
            with serving(python, model_dir, log, ()) as server:
                killed: list[int] = []

                def kill(events: int, server: srv.RunningServer = server, killed: list[int] = killed) -> None:
                    if events >= KILL_AFTER_EVENTS and not killed:
                        for pid in engine_core_pids(server.process.pid):
                            os.kill(pid, signal.SIGKILL)
                            killed.append(pid)

                record = capture(server.base_url, path, body, on_event=kill)
                record["note"] = f"EngineCore (pid {killed}) killed with SIGKILL after {KILL_AFTER_EVENTS} events"
                write(out, name, record)
        if "pooling" not in sections:
            return 0
        with serving(python, model_dir, log, srv.POOLING_ARGS) as server:
            for name, (path, body) in POOLING.items():
                record = capture(server.base_url, path, body)
                for item in (record.get("body") or {}).get("data") or []:
                    for key in ("embedding", "data"):     # 64 floats of noise each: 4 keep the shape
                        if isinstance(item, dict) and isinstance(item.get(key), list):
                            item[key] = item[key][:4]
                write(out, name, record)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
