"""brimful in front of an upstream, the way the end-to-end tests build it.

`make_config` is the one test configuration (a model named `tiny-qwen`
counted with a local tokenizer); `running_stack` serves FakeVLLM + brimful
under uvicorn on loopback; `ListRecorder` keeps the length records for
assertions; `call_app` drives brimful in-process, without sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from proxy.app import BrimfulApp
from proxy.config import Config, ModelConfig, ServerConfig, UpstreamConfig
from proxy.recording.metrics import Metrics
from proxy.recording.record import LengthRecord
from proxy.recording.recorder import Recorder
from proxy.serving.server import uvicorn_settings
from tests.support.fakevllm import FakeVLLM
from tests.support.servers import serve_in_thread
from tokenizer_cache import ModelTokenizer, count_messages, count_responses, load_model_tokenizer

CHAT = "/v1/chat/completions"
MODEL = "tiny-qwen"


def make_config(upstream: str, tokenizer_dir: Path | None, *, timeout: float = 10.0,
                max_body_bytes: int | None = None, policy: dict[str, Any] | None = None,
                **upstream_kw: Any) -> Config:
    """One upstream at `upstream`; `tiny-qwen` counted with `tokenizer_dir` (None: by the upstream)."""
    server = ServerConfig() if max_body_bytes is None else ServerConfig(max_body_bytes=max_body_bytes)
    config = Config(server=server,
                    upstream=UpstreamConfig(url=upstream, connect_timeout=2.0, timeout=timeout, **upstream_kw))
    if tokenizer_dir is not None:
        config.models[MODEL] = ModelConfig(tokenizer=str(tokenizer_dir))
    for key, value in (policy or {}).items():
        setattr(config.policy, key, value)
    return config


def fake_counter(tok: Any, offset: int = 0) -> Callable[[str, dict], int]:
    """A FakeVLLM prompt counter from a brimful tokenizer (`offset` tokens off, to simulate drift)."""
    def count(endpoint: str, body: dict) -> int:
        if endpoint == "responses":
            base = count_responses(tok, body)     # as brimful converts for a tokenizer without its own
        elif endpoint == "messages":
            base = count_messages(tok, body)
        else:
            base = tok.count_chat(body) if endpoint == "chat" else sum(tok.count_completion(body))
        return base + offset

    return count


class ListRecorder(Recorder):
    """A Recorder that keeps every record for assertions, and no metrics.

    Records are written after the last response byte is sent, so a test that
    has just read a response waits for the record instead of sleeping.
    """

    def __init__(self) -> None:
        super().__init__(Metrics())
        self.records: list[LengthRecord] = []
        self.length_retries: list[str | None] = []
        self._cond = threading.Condition()

    def record(self, rec: LengthRecord, count_source: str | None = None) -> None:
        with self._cond:
            self.records.append(rec)
            self._cond.notify_all()

    def count_length_retry(self, model: str | None) -> None:
        self.length_retries.append(model)

    def wait_for(self, count: int, timeout: float = 10.0) -> list[LengthRecord]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.records) >= count, timeout), (
                f"expected {count} length records, got {len(self.records)}"
            )
            return list(self.records)

    def record_of(self, request_id: str, timeout: float = 10.0) -> LengthRecord:
        """The record of the request sent with this X-Request-Id (records of earlier tests'
        requests may still be landing: a record is written after the answer's last byte)."""
        def found() -> list[LengthRecord]:
            return [r for r in self.records if r.request_id == request_id]

        with self._cond:
            assert self._cond.wait_for(found, timeout), f"no length record for {request_id}"
            return found()[0]

    def last(self) -> LengthRecord:
        return self.wait_for(len(self.records) or 1)[-1]


class Stack:
    """A running FakeVLLM + brimful, with an openai client and an httpx client on brimful."""

    def __init__(self, fake: FakeVLLM, base_url: str, app: BrimfulApp, recorder: ListRecorder | None) -> None:
        self.fake = fake
        self.base_url = base_url
        self.app = app
        self.recorder = recorder
        self.port = int(base_url.rsplit(":", 1)[1])
        self.client = openai.OpenAI(base_url=base_url + "/v1", api_key="sk-test", max_retries=0, timeout=10)
        self.http = httpx.Client(base_url=base_url, timeout=10)

    def chat_requests(self) -> list[Any]:
        return [r for r in self.fake.requests if r.path == CHAT]

    def next_record(self, before: int) -> LengthRecord:
        assert self.recorder is not None
        return self.recorder.wait_for(before + 1)[before]


@contextlib.contextmanager
def running_stack(
    tokenizer_dir: Path | None,
    *,
    fake_kwargs: dict[str, Any] | None = None,
    recorder: Recorder | str | None = "list",
    configure: Callable[[Config], None] | None = None,
    loaded: dict[Path, ModelTokenizer] | None = None,
    **config_kw: Any,
) -> Iterator[Stack]:
    """FakeVLLM + BrimfulApp under uvicorn; brimful stops before the fake.

    With a tokenizer, the fake counts prompts with it too (as vLLM would count
    them with the model's own files), unless `fake_kwargs` says otherwise.
    `loaded` hands brimful tokenizers the test has loaded already (model folder ->
    tokenizer; loading a dozen families twice takes minutes on this CPU).
    """
    fake_kwargs = dict(fake_kwargs or {})
    if tokenizer_dir is not None and "count_prompt" not in fake_kwargs:
        fake_kwargs["count_prompt"] = fake_counter(_tokenizer(tokenizer_dir))
    with FakeVLLM(**fake_kwargs) as fake:
        rec = ListRecorder() if recorder == "list" else recorder
        assert rec is None or isinstance(rec, Recorder)
        config = make_config(fake.base_url, tokenizer_dir, **config_kw)
        if configure is not None:
            configure(config)
        app = BrimfulApp(config, recorder=rec)
        if loaded:
            _load_from(app, loaded)
        with serve_in_thread(app, settle=functools.partial(started_up, app), **uvicorn_settings(config)) as base:
            yield Stack(fake, base, app, rec if isinstance(rec, ListRecorder) else None)


def _load_from(app: BrimfulApp, loaded: dict[Path, ModelTokenizer]) -> None:
    """brimful's tokenizer cache loads these folders by handing back the given tokenizers."""
    cache = app.counter._cache
    real = cache._loader
    by_dir = {folder.resolve(): tok for folder, tok in loaded.items()}

    def load(directory: Path, **options: Any) -> Any:
        found = by_dir.get(Path(directory).resolve())
        return found if found is not None else real(directory, **options)

    cache._loader = load


async def started_up(app: BrimfulApp) -> None:
    """Until brimful's start-up requests are over: the first model lists, then the tokenizer
    loads and parity probes (POST /tokenize) they start, which could otherwise reach the fake
    in the middle of a test and among its own requests."""
    for backend in app.backends.items:
        await backend.registry.refresh()   # joins the first fetch while it runs
    while app._background:
        await asyncio.gather(*list(app._background), return_exceptions=True)


@functools.lru_cache(maxsize=8)
def _tokenizer(directory: Path) -> ModelTokenizer:
    return load_model_tokenizer(directory)


# ---------------------------------------------------------------------------
# In-process: an ASGI call without a server
# ---------------------------------------------------------------------------

@dataclass
class Answer:
    """What the client received from one in-process call."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


async def call_app(app: Any, method: str, path: str, body: bytes = b"",
                   headers: list[tuple[bytes, bytes]] | None = None) -> Answer:
    """One request to an ASGI app, the way uvicorn delivers it: the body, then a
    disconnect only once the response is complete."""
    answer = Answer()
    done = asyncio.Event()
    delivered = False
    all_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   *(headers or [])]
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": all_headers, "http_version": "1.1", "scheme": "http",
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            answer.headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            answer.chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()

    await app(scope, receive, send)
    done.set()
    return answer
