"""proxy.serving.server: what one client connection may cost, driven over raw sockets (the client is the fault).

Each test holds brimful (under uvicorn, with proxy.serving.server's protocol) to
small limits and sends what a hostile or broken client sends: an endless
head, half a request line, a body that stops, nothing at all, more
connections than allowed, framing llhttp refuses late.  The claims: each is
answered in OpenAI's error shape where HTTP allows an answer (or closed when
nothing was sent), nothing reaches the upstream, and ordinary requests are
served meanwhile.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy import errors
from proxy.config import Config
from proxy.serving.server import connection_cap, error_response, limits_from
from tests.support.fakevllm import FaultSpec
from tests.support.stack import Stack, running_stack

CHAT = "/v1/chat/completions"
MAX_HEAD = 4096
TIMEOUT = 0.5


def limited(config: Config) -> None:
    config.server.max_header_bytes = MAX_HEAD
    config.server.header_timeout = TIMEOUT
    config.server.body_timeout = TIMEOUT


@pytest.fixture(scope="module")
def stack(qwen3_dir: Path) -> Iterator[Stack]:
    with running_stack(qwen3_dir, configure=limited) as st:
        yield st


def connect(stack: Stack) -> socket.socket:
    return socket.create_connection(("127.0.0.1", stack.port), timeout=10)


def read_all(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def openai_error(raw: bytes, status: int) -> dict[str, Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), raw[:300]
    assert b"content-type: application/json" in head and b"connection: close" in head
    error = json.loads(body)["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    return error


def chat_body() -> bytes:
    return json.dumps({"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 3}).encode()


def test_a_head_over_the_limit_is_431_and_closed(stack: Stack) -> None:
    before = len(stack.fake.requests)
    with connect(stack) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: h\r\nx-big: ")
        try:
            for _ in range(64):                       # up to 4 MiB of one header line
                sock.sendall(b"a" * 65536)
        except OSError:                               # brimful closed the connection mid-way
            pass
        error = openai_error(read_all(sock), 431)
    assert error["code"] == "request_header_too_large"
    assert str(MAX_HEAD) in error["message"]
    # nothing of it reached the upstream (brimful's own periodic GET /v1/models may have)
    assert not [r for r in stack.fake.requests[before:] if "x-big" in r.headers]


@pytest.mark.parametrize("head", [
    b"GET /v1/models?q=" + b"a" * (2 * MAX_HEAD) + b" HTTP/1.1\r\nhost: h\r\n\r\n",      # a long query string
    b"GET /v1/models HTTP/1.1\r\nhost: h\r\nx-big: " + b"a" * (2 * MAX_HEAD) + b"\r\n\r\n",
])
def test_a_head_over_the_limit_in_one_write_is_431(stack: Stack, head: bytes) -> None:
    """The whole head in one read (issue 25): the limit holds without a second read too."""
    with connect(stack) as sock:
        sock.sendall(head)
        error = openai_error(read_all(sock), 431)
    assert error["code"] == "request_header_too_large"


def test_half_a_request_line_is_408_after_the_head_timeout(stack: Stack) -> None:
    with connect(stack) as sock:
        sock.sendall(b"GET /v1/mod")
        error = openai_error(read_all(sock), 408)
    assert error["code"] == "request_timeout" and f"{TIMEOUT:g} s" in error["message"]


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(stack: Stack) -> None:
    with connect(stack) as sock:
        assert read_all(sock) == b""


def test_a_body_that_stops_is_408_and_never_forwarded(stack: Stack) -> None:
    before = len(stack.fake.requests)
    body = chat_body()
    with connect(stack) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nhost: h\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                     % (CHAT.encode(), len(body)) + body[:10])
        error = openai_error(read_all(sock), 408)
    assert error["code"] == "request_timeout" and "request body" in error["message"]
    assert not any(r.path == CHAT for r in stack.fake.requests[before:])


def test_a_slow_answer_is_not_cut_by_the_client_timeouts(stack: Stack) -> None:
    """The limits time the client's sending only: a generation longer than both still arrives, and
    the keep-alive connection carries the next request."""
    stack.fake.tokens_per_second = 4 / TIMEOUT            # 3 tokens: 1.5 x the timeouts
    try:
        with connect(stack) as sock:
            body = chat_body()
            request = (b"POST %s HTTP/1.1\r\nhost: h\r\ncontent-type: application/json\r\ncontent-length: %d"
                       b"\r\n\r\n" % (CHAT.encode(), len(body)) + body)
            for _ in range(2):
                sock.sendall(request)
                data = b""
                while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
                    chunk = sock.recv(65536)
                    assert chunk, data[:300]
                    data += chunk
                assert data.startswith(b"HTTP/1.1 200 ")
    finally:
        stack.fake.tokens_per_second = None


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


@pytest.mark.parametrize("head", [
    b"POST /tokenize HTTP/1.1\r\nhost: h\r\ntransfer-encoding: xchunked\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: h\r\ntransfer-encoding: xchunked\r\n\r\n",
    b"POST /tokenize HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
    b"POST /tokenize HTTP/1.1\r\nhost: h\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd",
    b"GARBAGE\r\n\r\n",
], ids=["te_xchunked_passthrough", "te_xchunked_admitted", "te_not_final", "two_lengths", "garbage"])
def test_framing_the_parser_refuses_is_a_400_and_reaches_nobody(stack: Stack, head: bytes) -> None:
    before, partial = len(stack.fake.requests), len(stack.fake.partial_requests)
    with connect(stack) as sock:
        sock.sendall(head)
        error = openai_error(read_all(sock), 400)
    assert error["code"] == "invalid_http_request"
    # A complete request afterwards is served, and only it reached the upstream.
    assert stack.http.get("/version").status_code == 200
    assert [r.path for r in stack.fake.requests[before:]] == ["/version"]
    assert len(stack.fake.partial_requests) == partial


def test_at_the_connection_limit_the_idlest_makes_room(qwen3_dir: Path) -> None:
    def configure(config: Config) -> None:
        limited(config)
        config.server.header_timeout = 30.0
        config.server.max_connections = 4

    with running_stack(qwen3_dir, configure=configure) as st:
        idle = [connect(st) for _ in range(4)]
        try:
            idle[1].sendall(b"GET /v1/models HTTP/1.1\r\n")      # a slow head is idle too
            for _ in range(3):                                  # a new connection per request
                assert httpx.get(st.base_url + "/version", timeout=10).status_code == 200
            assert read_all(idle[0]) == b"", "the oldest idle connection was closed to make room"
        finally:
            for sock in idle:
                sock.close()


def test_at_the_connection_limit_with_every_connection_busy_a_new_one_gets_503(qwen3_dir: Path) -> None:
    def configure(config: Config) -> None:
        config.server.max_connections = 2

    with running_stack(qwen3_dir, configure=configure) as st:
        hold = threading.Event()
        st.fake.fail_next.extend([FaultSpec(kind="respond", status=200, gate=hold, path="/version",
                                            body={"version": "x"})] * 2)
        busy = [connect(st) for _ in range(2)]
        try:
            for sock in busy:
                sock.sendall(b"GET /version HTTP/1.1\r\nhost: h\r\n\r\n")
            assert st.fake.wait_until(lambda f: sum(r.path == "/version" for r in f.requests) >= 2, timeout=10)
            with connect(st) as third:
                error = openai_error(read_all(third), 503)
            assert error["code"] == "too_many_connections"
        finally:
            hold.set()
            for sock in busy:
                sock.close()


# -- pure pieces ---------------------------------------------------------------------------

def test_the_connection_cap_stays_under_the_descriptor_limit() -> None:
    assert connection_cap(0, 20_000, 1024) == 20_000 - 1024 - 256
    assert connection_cap(500, 20_000, 1024) == 500
    assert connection_cap(50_000, 20_000, 1024) == 20_000 - 1024 - 256
    assert connection_cap(0, 100, 1024) == 16
    config = Config()
    config.server.max_connections = 10
    assert limits_from(config, 20_000).max_connections == 10


def test_refusals_are_whole_http_answers_that_close() -> None:
    raw = error_response(errors.header_too_large(10))
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b"content-length: %d" % len(body) in head and b"connection: close" in head
    assert json.loads(body)["error"]["code"] == "request_header_too_large"
