"""The ASGI application: admission for the two generation routes, pass-through for the rest.

Request path for `POST /v1/chat/completions` and `POST /v1/completions`:
read the body (bounded) → parse JSON once → resolve the model and its
`max_model_len` (proxy.limits) → count prompt tokens (proxy.counting) →
decide (proxy.admission, pure) → forward the client's bytes unchanged, or the
body with only the limit fields rewritten (proxy.forward) → relay the answer
as it arrives, mapping upstream errors (proxy.upstream_errors) → one length
record (proxy.record) per request.

Every other path and method is relayed untouched: method, path, query, body
streamed, headers minus hop-by-hop ones, status and body back as they came.

This is a plain ASGI callable rather than a Starlette router because the hot
path only needs the raw scope, and every layer skipped is CPU saved per
request (issue 6); Starlette still serves headroom's own pages (proxy.live).
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import itertools
import json
import logging
import re
import secrets
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Coroutine, Mapping

from starlette.routing import Router

from . import errors, health, jsonbody
from .admission import Decision, Policy, decide, read_requested_limit
from .config import Config
from .counting import PromptCounter
from .errors import HeadroomError
from .forward import Upstream, forwardable
from .http1 import Response
from .lengthlog import LengthLog
from .backends import Backend, Backends
from .gate import UpstreamGate
from .limits import ModelRegistry
from .live import Recorder
from .metrics import Metrics
from .record import LengthRecord
from .upstream_errors import (
    corrected_max_tokens,
    explain_upstream_error,
    is_length_failure,
    parse_upstream_error,
)

log = logging.getLogger("headroom")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

ADMITTED = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
LOCAL_PATHS = frozenset({"/metrics", "/stats", "/dashboard"}) | health.PATHS   # headroom's own pages
OPEN_PATHS = LOCAL_PATHS | {"/health", "/ping", "/version"}       # no API key needed
MAX_ERROR_BODY = 1024 * 1024      # how much of an upstream error body is read
MAX_BUFFERED_PASSTHROUGH = 1024 * 1024  # larger pass-through request bodies are streamed


class HeadroomApp:
    def __init__(self, config: Config, recorder: Any | None = None) -> None:
        self.config = config
        self.backends = Backends(config)
        self.counter = PromptCounter(config, self.backends)
        self.backends.on_change(self._models_changed)
        self.recorder = recorder if recorder is not None else make_recorder(config)
        metrics = getattr(self.recorder, "metrics", None)   # a test's recorder may have none
        if metrics is not None:
            self.counter.on_parity.append(metrics.set_tokenizer_parity)
            if self.counter.piece_cache is not None:
                metrics.attach_piece_cache(self.counter.piece_cache.stats)
            metrics.attach_gates(lambda: [(b.name, b.gate) for b in self.backends.items])
        self._local = Router(routes=self.recorder.routes() + health.routes(self.backends, self.counter))
        self._background: set[asyncio.Task[Any]] = set()
        self._api_keys = [k.encode() for k in config.server.api_keys]
        self._policies: dict[str | None, Policy] = {}

    def _policy(self, model: str | None) -> Policy:
        """`Config.policy_for`, worked out once per model (it rebuilds a dataclass each call)."""
        policy = self._policies.get(model)
        if policy is None:
            policy = self._policies[model] = self.config.policy_for(model)
        return policy

    @property
    def upstream(self) -> Upstream:
        """The default upstream (`[upstream]`)."""
        return self.backends.default.upstream

    @property
    def registry(self) -> ModelRegistry:
        """The default upstream's model list."""
        return self.backends.default.registry

    # -- lifecycle --------------------------------------------------------------

    async def startup(self) -> None:
        if self.config.length_log.path and self.recorder.lengthlog is None:
            # Made here, inside the serving process: the writer thread does not survive a fork.
            ll = self.config.length_log
            self.recorder.attach_lengthlog(LengthLog(ll.path, max_bytes=ll.max_bytes, backups=ll.backups))
        await self.backends.start()

    async def shutdown(self) -> None:
        for task in list(self._background):
            task.cancel()
        await self.backends.stop()
        await asyncio.to_thread(self.recorder.close)   # flushes the length log

    def _models_changed(self, backend: Backend, models: dict[str, Any]) -> None:
        self.counter.forget_dirs()
        task = asyncio.ensure_future(self.counter.preload(list(models)))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        # Once tokenizers and templates are loaded, move everything alive to the
        # GC's permanent generation: full collections then skip those objects.
        # Measured (bench/proxy_bench.py, 197 B at 1 connection, 2 A/B pairs):
        # p99 1.6-4.9 ms → 1.2-1.3 ms; p50 and CPU per request unchanged.
        task.add_done_callback(lambda _: gc.freeze())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            endpoint = ADMITTED.get(path)
            try:
                if endpoint is not None and scope["method"] == "POST":
                    await self._admitted(scope, receive, send, endpoint)
                elif path in LOCAL_PATHS:
                    await self._local(scope, receive, send)
                else:
                    await self._passthrough(scope, receive, send)
            except Exception:
                # A bug must still answer in the OpenAI shape, never a bare 500 page.
                log.exception("unexpected error while handling %s %s", scope["method"], path)
                await _send_internal_error(send, _request_id(scope))
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:  # pragma: no cover - reported to the server
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- the admitted routes ----------------------------------------------------

    async def _admitted(self, scope: Scope, receive: Receive, send: Send, endpoint: str) -> None:
        started = time.perf_counter()
        request_id = _request_id(scope)
        record = LengthRecord(ts=time.time(), model=None, endpoint=endpoint, request_id=request_id)  # type: ignore[arg-type]
        info_headers: list[tuple[bytes, bytes]] = []
        try:
            self._check_auth(scope)
            body = await _read_body(receive, self.config.server.max_body_bytes, scope)
            request = _parse_json_object(body)
            record.stream = request.get("stream") is True
            n = request.get("n")
            record.n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
            model, backend = await self._resolve_model(request)
            record.model = model
            limit = read_requested_limit(request, endpoint)  # type: ignore[arg-type]
            record.requested_max_tokens = limit.value
            info = backend.registry.get(model)
            max_model_len = info.max_model_len if info else None
            record.max_model_len = max_model_len
            if max_model_len is None:
                # No limit known (a config-less model whose card lacks one): relay untouched.
                decision = Decision("pass", limit.value, limit.value)
                prompt_total = None
            else:
                count = await self.counter.count(model, endpoint, request, len(body))  # type: ignore[arg-type]
                prompt_total = count.total
                record.prompt_tokens = prompt_total
                decision = decide(
                    count.per_prompt,
                    max_model_len,
                    limit,
                    self._policy(model),
                    endpoint=endpoint,  # type: ignore[arg-type]
                    model=model,
                )
            info_headers = _headroom_headers(prompt_total, max_model_len, decision, request_id)
            record.action = decision.action
            record.granted_max_tokens = decision.granted
            if decision.error is not None:
                raise decision.error
            changes: dict[str, Any] = dict(decision.rewrite or {})
            strip_usage = record.stream and self.config.upstream.request_stream_usage and _ask_for_usage(
                request, changes
            )
            out_body = _rewrite(body, request, changes) if changes else body
        except ClientGone:
            log.debug("client left before sending the whole body of %s", scope["path"])
            return
        except HeadroomError as err:
            if not info_headers:
                info_headers = [(b"x-headroom-action", b"rejected"), (b"x-request-id", request_id.encode())]
            record.action = "rejected" if err.status < 500 else "upstream_error"
            await self._send_error(send, err, info_headers, record)
            self._finish(record, started)
            return

        limit_fields = (decision.rewrite and list(decision.rewrite)) or limit.present_fields() or ["max_tokens"]
        work = self._gated(backend.gate, send, info_headers, record, self._forward_admitted(
            backend.upstream, scope, send, out_body, lambda fields: _rewrite(body, request, fields),
            changes, limit_fields, record, info_headers, started, strip_usage,
        ))
        await _until_disconnect(receive, work, on_disconnect=lambda: setattr(record, "error_code", "client_disconnected"))
        self._finish(record, started)

    async def _gated(
        self,
        gate: UpstreamGate,
        send: Send,
        info_headers: list[tuple[bytes, bytes]],
        record: LengthRecord,
        work: Coroutine[Any, Any, None],
    ) -> None:
        """Run `work` holding one of the upstream's request slots (proxy.gate); 503 when none frees."""
        try:
            await gate.acquire()
        except HeadroomError as err:
            work.close()
            record.action = "upstream_error"
            await self._send_error(send, err, info_headers, record)
            return
        except BaseException:          # the client left while waiting
            work.close()
            raise
        try:
            await work
        finally:
            gate.release()

    async def _forward_admitted(
        self,
        upstream: Upstream,
        scope: Scope,
        send: Send,
        body: bytes,
        rewritten: Callable[[Mapping[str, Any]], bytes],
        changes: dict[str, Any],
        limit_fields: list[str],
        record: LengthRecord,
        info_headers: list[tuple[bytes, bytes]],
        started: float,
        strip_usage: bool,
    ) -> None:
        base_headers = forwardable(scope["headers"], _DROP_ADMITTED)
        base_headers.append((b"x-request-id", (record.request_id or "").encode()))
        prompt_param = "messages" if record.endpoint == "chat" else "prompt"
        retried = False
        while True:
            try:
                response = await upstream.send("POST", _path_qs(scope), base_headers, body)
            except HeadroomError as err:
                record.action = "upstream_error"
                await self._send_error(send, err, info_headers, record)
                return
            if response.status < 400:
                break
            raw = await upstream.read_body(response, MAX_ERROR_BODY)
            failure = parse_upstream_error(response.status, raw, response.headers.get("content-type"))
            corrected = None
            if not retried and is_length_failure(failure):
                corrected = corrected_max_tokens(
                    failure, prompt_tokens=record.prompt_tokens, max_model_len=record.max_model_len
                )
            if corrected is not None and corrected < (record.granted_max_tokens or corrected + 1):
                # The upstream counted more than headroom did (a drift headroom did not
                # foresee): retry once with the limit its own numbers allow.
                log.warning(
                    "upstream rejected a clamped request of model %s for length; retrying with %d",
                    record.model, corrected,
                )
                retried = True
                record.length_retries += 1
                self.recorder.count_length_retry(record.model)
                record.granted_max_tokens = corrected
                record.action = "clamped"
                changes = {**changes, **{f: corrected for f in limit_fields}}
                body = rewritten(changes)
                info_headers = _replace_header(info_headers, b"x-headroom-granted-max-tokens", corrected)
                info_headers = _replace_header(info_headers, b"x-headroom-action", "clamped")
                continue
            err = explain_upstream_error(
                failure,
                upstream=upstream.base_url,
                prompt_tokens=record.prompt_tokens,
                max_model_len=record.max_model_len,
                requested_max_tokens=record.requested_max_tokens,
                granted_max_tokens=record.granted_max_tokens,
                prompt_param=prompt_param,
                max_tokens_param=limit_fields[0],
            )
            record.action = "upstream_error"
            await self._send_error(send, err, info_headers, record)
            return

        out_headers = _response_headers(response.raw_headers) + info_headers
        content_type = response.headers.get("content-type", "")
        if content_type.startswith("text/event-stream"):
            await self._relay_stream(upstream, send, response, out_headers, record, started, strip_usage)
            return

        try:
            payload = await upstream.read_body(response)
        except HeadroomError as err:
            record.action = "upstream_error"
            await self._send_error(send, err, info_headers, record)
            return
        out_headers.append((b"content-length", str(len(payload)).encode()))
        record.status = response.status
        await send({"type": "http.response.start", "status": response.status, "headers": out_headers})
        await send({"type": "http.response.body", "body": payload, "more_body": False})
        _read_usage(payload, record)

    async def _relay_stream(
        self,
        upstream: Upstream,
        send: Send,
        response: Response,
        headers: list[tuple[bytes, bytes]],
        record: LengthRecord,
        started: float,
        strip_usage: bool = False,
    ) -> None:
        """Relay SSE bytes as they arrive; a failure after the start becomes an error event.

        With `strip_usage` (headroom asked for the usage chunk the client did
        not), bytes are relayed per complete event so that one event can be
        dropped; nothing waits longer than the end of the event it is in.
        """
        record.status = response.status
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        scanner = SSEScanner(record)
        failure: HeadroomError | None = None
        try:
            while chunk := await response.next_chunk():
                if record.ttfb_ms is None:
                    record.ttfb_ms = (time.perf_counter() - started) * 1000
                if strip_usage:
                    chunk = scanner.drop_usage_events(chunk)
                    if not chunk:
                        continue
                else:
                    scanner.feed(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except asyncio.CancelledError as exc:
            response.close()
            if not _is_shutdown_deadline(exc):
                raise
            # SIGTERM's drain deadline passed with this stream still open: end it
            # with an error event instead of a cut that could look complete.
            failure = errors.shutting_down(self.config.server.shutdown_timeout)
        except Exception as exc:
            mapped = upstream.map_exception(exc, phase="streaming the response")
            failure = mapped if isinstance(mapped, HeadroomError) else errors.upstream_broken(
                upstream.base_url, f"{type(exc).__name__}: {exc}"
            )
        finally:
            response.release()
        if failure is None and not scanner.done:
            failure = errors.upstream_broken(
                upstream.base_url, "the stream ended without its final 'data: [DONE]' event"
            )
        tail = scanner.leftover() if strip_usage else b""
        if failure is not None:
            record.action = "upstream_error"
            record.error_code = str(failure.code)
            tail = (b"\n\n" if not scanner.at_boundary else b"") + failure.sse_event()
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    # -- pass-through -------------------------------------------------------------

    async def _passthrough(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if scope["path"] not in OPEN_PATHS:
                self._check_auth(scope)
            request_id = _request_id(scope)
            headers = forwardable(scope["headers"], _DROP_REQUEST_ID)
            headers.append((b"x-request-id", request_id.encode()))
            length = _content_length(scope)
            body: bytes | AsyncIterator[bytes] | None
            if length is not None and length <= MAX_BUFFERED_PASSTHROUGH:
                body = await _read_body(receive, MAX_BUFFERED_PASSTHROUGH, scope)
            elif length is None and not _has_body(scope):
                body = None
            else:
                body = _stream_body(receive)
            if scope["path"] == "/v1/models" and len(self.backends.items) > 1 and scope["method"] == "GET":
                await self._send_merged_models(send, request_id)
                return
            backend = self._backend_for_body(body) if isinstance(body, bytes) else self.backends.default
            response = await backend.upstream.send(scope["method"], _path_qs(scope), headers, body)
        except ClientGone:
            log.debug("client left before sending the whole body of %s", scope["path"])
            return
        except HeadroomError as err:
            headers = _error_headers(err, [(b"x-request-id", _request_id(scope).encode())])
            await _send_whole(send, err.status, err.body_bytes(), headers)
            return

        async def relay() -> None:
            out = _response_headers(response.raw_headers)
            out.append((b"x-request-id", request_id.encode()))
            if "content-length" in response.headers:
                out.append((b"content-length", response.headers["content-length"].encode()))
            await send({"type": "http.response.start", "status": response.status, "headers": out})
            try:
                while chunk := await response.next_chunk():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except asyncio.CancelledError:
                response.close()
                raise
            except Exception as exc:  # mid-body failure: nothing sane to add to an unknown format
                log.warning("pass-through %s %s broke mid-body: %s", scope["method"], scope["path"], exc)
                response.close()
            finally:
                response.release()
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        await _until_disconnect(receive, relay())

    # -- helpers --------------------------------------------------------------------

    def _check_auth(self, scope: Scope) -> None:
        if not self._api_keys:
            return
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    token = token.strip()
                    if any(hmac.compare_digest(token, key) for key in self._api_keys):
                        return
        raise errors.unauthorized()

    async def _resolve_model(self, request: dict[str, Any]) -> tuple[str, Backend]:
        """The served model a request names (or vLLM's default) and the backend serving it."""
        model = request.get("model")
        if model is not None and not isinstance(model, str):
            raise errors.invalid_field("model", "must be a string naming a served model", model)
        backends = self.backends
        if not backends.loaded:
            await backends.refresh_all()
            if not backends.loaded:
                cause = backends.default.registry.last_exception
                if isinstance(cause, HeadroomError):
                    raise cause
                raise errors.no_model_known(backends.default.upstream.base_url)
        if model is None or model == "":
            for backend in backends.items:
                default = backend.registry.default_model()
                if default is not None:
                    return default, backend
            raise errors.no_model_known(backends.default.upstream.base_url)
        found = backends.for_model(model)
        if found is None:
            await backends.refresh_all(unknown=True)
            found = backends.for_model(model)
            if found is None:
                raise errors.model_not_found(model, backends.names)
        return model, found

    def _backend_for_body(self, body: bytes) -> Backend:
        """Route a pass-through request (e.g. /tokenize, /v1/embeddings) by the `model` in its body."""
        if len(self.backends.items) > 1 and body[:1] == b"{":
            try:
                model = json.loads(body).get("model")
            except (ValueError, AttributeError, RecursionError):
                model = None
            if isinstance(model, str):
                return self.backends.for_model(model) or self.backends.default
        return self.backends.default

    async def _send_merged_models(self, send: Send, request_id: str) -> None:
        """GET /v1/models with several upstreams: one list, in routing order."""
        cards: list[Any] = []
        seen: set[str] = set()
        for backend in self.backends.items:
            try:
                payload = await backend.upstream.get_json("/v1/models")
            except Exception as exc:  # one upstream down: list the others, say so in the log
                log.warning("upstream %s: /v1/models failed: %s", backend.name, exc)
                continue
            for card in payload.get("data", []) if isinstance(payload, dict) else []:
                if isinstance(card, dict) and card.get("id") not in seen:
                    seen.add(card.get("id"))
                    cards.append(card)
        body = json.dumps({"object": "list", "data": cards}, ensure_ascii=False).encode()
        headers = [(b"content-type", b"application/json"), (b"x-request-id", request_id.encode())]
        await _send_whole(send, 200, body, headers)

    async def _send_error(
        self, send: Send, err: HeadroomError, info_headers: list[tuple[bytes, bytes]], record: LengthRecord
    ) -> None:
        record.status = err.status
        if record.error_code is None:
            record.error_code = str(err.code) if err.code is not None else None
        await _send_whole(send, err.status, err.body_bytes(), _error_headers(err, info_headers))

    def _finish(self, record: LengthRecord, started: float) -> None:
        record.latency_ms = (time.perf_counter() - started) * 1000
        if (
            record.prompt_tokens is not None
            and record.upstream_prompt_tokens is not None
            and record.prompt_tokens != record.upstream_prompt_tokens
        ):
            log.warning(
                "prompt-token drift on model %s: headroom counted %d, the upstream reported %d",
                record.model, record.prompt_tokens, record.upstream_prompt_tokens,
            )
        try:
            self.recorder.record(record)
        except Exception:  # recording must never fail a request
            log.exception("could not record a request's length figures")


def make_recorder(config: Config) -> Recorder:
    """Metrics + the recent window for /stats; the length-log file is attached at start-up."""
    return Recorder(Metrics(config.metrics.buckets), window_records=config.metrics.window)


# ---------------------------------------------------------------------------
# Small pure helpers
# ---------------------------------------------------------------------------

class SSEScanner:
    """Reads usage, finish reasons and the [DONE] marker out of relayed SSE bytes.

    Only lines that can carry a value are JSON-parsed (vLLM's compact JSON says
    `"finish_reason":null` / `"usage":null` on every other chunk), so relaying
    costs a substring search per chunk, not a parse.
    """

    def __init__(self, record: LengthRecord) -> None:
        self.record = record
        self.done = False
        self.at_boundary = True
        self._partial = b""
        self._event_tail = b""

    def drop_usage_events(self, chunk: bytes) -> bytes:
        """The complete events in `chunk` minus usage-only ones (their numbers are recorded)."""
        data = self._event_tail + chunk if self._event_tail else chunk
        events = data.split(b"\n\n")
        self._event_tail = events.pop()
        kept = []
        for event in events:
            if _is_usage_only(event):
                _read_usage(event.partition(b"data:")[2], self.record)
                continue
            kept.append(event + b"\n\n")
        out = b"".join(kept)
        if out:
            self.feed(out)
        return out

    def leftover(self) -> bytes:
        """Bytes after the last complete event (relayed as they are at the end)."""
        tail, self._event_tail = self._event_tail, b""
        if tail:
            self.feed(tail)
        return tail

    def feed(self, chunk: bytes) -> None:
        data = self._partial + chunk if self._partial else chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > 4 * 1024 * 1024:   # a line that never ends: stop buffering it
            self._partial = b""
        self.at_boundary = data.endswith(b"\n\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            if payload.startswith(b'{"error"'):
                self._upstream_error()
                continue
            wants_usage = b'"usage"' in payload and b'"usage":null' not in payload
            wants_finish = b'"finish_reason"' in payload and b'"finish_reason":null' not in payload
            if wants_usage or wants_finish:
                _read_usage(payload, self.record)

    def _upstream_error(self) -> None:
        """vLLM reports a failure after a stream started as `data: {"error": {...}}` (then [DONE]).

        The client gets the event as sent; the record says the request failed
        upstream (the upstream's own code is not used: it would make the
        error_code label set unbounded).
        """
        self.record.action = "upstream_error"
        if self.record.error_code is None:
            self.record.error_code = "upstream_stream_error"


async def _send_whole(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """One complete (non-streamed) response: headers with its content-length, then the body."""
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_internal_error(send: Send, request_id: str) -> None:
    err = errors.internal_error(request_id)
    try:
        headers = _error_headers(err, [(b"x-request-id", request_id.encode())])
        await _send_whole(send, err.status, err.body_bytes(), headers)
    except Exception:  # the response had already started: nothing more can be said
        pass


def _is_shutdown_deadline(exc: asyncio.CancelledError) -> bool:
    """uvicorn cancels the requests still running at the graceful-shutdown deadline with this message."""
    return any("timeout graceful shutdown exceeded" in str(arg) for arg in exc.args)


def _is_usage_only(event: bytes) -> bool:
    """vLLM's final usage chunk: `data: {..., "choices":[], "usage":{...}}`."""
    return event.startswith(b"data:") and b'"usage"' in event and (
        b'"choices":[]' in event or b'"choices": []' in event
    )


def _ask_for_usage(request: dict[str, Any], changes: dict[str, Any]) -> bool:
    """Add `stream_options.include_usage` to a stream that lacks it; True when added.

    The upstream's usage lets headroom compare its count with the upstream's
    (drift) and record completion tokens; the extra chunk is removed again
    before it reaches a client that did not ask for it.
    """
    options = request.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return False
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    changes["stream_options"] = {**(options or {}), "include_usage": True}
    return True


def _read_usage(payload: bytes, record: LengthRecord) -> None:
    try:
        data = json.loads(payload)
    except ValueError:
        return
    if not isinstance(data, dict):
        return
    usage = data.get("usage")
    if isinstance(usage, dict):
        if isinstance(usage.get("prompt_tokens"), int):
            record.upstream_prompt_tokens = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            record.completion_tokens = usage["completion_tokens"]
    choices = data.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                record.finish_reasons.append(choice["finish_reason"])


def _headroom_headers(
    prompt: int | None, max_model_len: int | None, d: Decision, request_id: str
) -> list[tuple[bytes, bytes]]:
    headers = [(b"x-headroom-action", d.action.encode()), (b"x-request-id", request_id.encode())]
    if prompt is not None:
        headers.append((b"x-headroom-prompt-tokens", str(prompt).encode()))
    if max_model_len is not None:
        headers.append((b"x-headroom-max-model-len", str(max_model_len).encode()))
    if d.requested is not None:
        headers.append((b"x-headroom-requested-max-tokens", str(d.requested).encode()))
    if d.granted is not None:
        headers.append((b"x-headroom-granted-max-tokens", str(d.granted).encode()))
    return headers


def _replace_header(headers: list[tuple[bytes, bytes]], name: bytes, value: object) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k != name] + [(name, str(value).encode())]


def _error_headers(err: HeadroomError, info: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json")]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in err.headers.items()]
    return headers + info


def _request_id(scope: Scope) -> str:
    """The client's X-Request-Id when it is a sane token, else a new one.

    Sent to the upstream and echoed back, so one id follows a request through
    client logs, headroom's length record and vLLM's logs.  Only printable
    ASCII without spaces, at most 128 characters, is reused: a header value
    headroom sends is never built from arbitrary client bytes.
    """
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            if 0 < len(value) <= 128 and all(33 <= c < 127 for c in value):
                return value.decode("ascii")
            break
    return _new_request_id()


# 80 random bits per process, then a counter: as unique as uuid4().hex (32 hex
# digits), without its urandom system call, ~5 % of the CPU of a small request.
_ID_PREFIX = secrets.token_hex(10)
_ID_COUNTER = itertools.count(1)


def _new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER):012x}"


# headroom sets X-Request-Id itself; on the admitted routes it also reads the
# answer (usage, finish reasons), so it asks for it uncompressed.
_DROP_REQUEST_ID = frozenset({b"x-request-id"})
_DROP_ADMITTED = frozenset({b"accept-encoding", b"x-request-id"})


def _response_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return forwardable(raw, _DROP_REQUEST_ID)


# From this size on, setting a field is cheaper by splicing it into the client's
# bytes than by re-serialising the parsed body (proxy.jsonbody).
SPLICE_ABOVE_BYTES = 4096


def _rewrite(body: bytes, request: dict[str, Any], fields: Mapping[str, Any]) -> bytes:
    """The client's body with `fields` set: spliced into its bytes when large (every
    other byte as sent), re-serialised when small or not splicable (UTF-16/32)."""
    if len(body) >= SPLICE_ABOVE_BYTES:
        layout = jsonbody.layout(body)
        if layout is not None:
            return jsonbody.rewrite(body, layout, fields)
    updated = dict(request)
    updated.update(fields)
    return json.dumps(updated, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _parse_json_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise errors.invalid_json("the body is empty")
    try:
        value = json.loads(body)
    except UnicodeDecodeError:
        raise errors.invalid_json("it is not UTF-8 text") from None
    except RecursionError:
        raise errors.invalid_json("it is nested too deeply") from None
    except ValueError as exc:
        raise errors.invalid_json(str(exc)) from None
    if _LONE_SURROGATE_ESCAPE.search(body) and _has_lone_surrogate(value):
        raise errors.invalid_json(
            "it contains an unpaired UTF-16 surrogate escape (\\ud800-\\udfff without its pair), "
            "which is not Unicode text: no tokenizer can encode it"
        )
    if not isinstance(value, dict):
        raise errors.body_not_object(
            {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(value), "null")
        )
    return value


# A JSON escape for a UTF-16 surrogate (high or low half).  Python's json accepts
# an unpaired one and yields a str that tokenizers reject with TypeError and that
# cannot be encoded to UTF-8 again (a clamped body is re-serialized): both would
# surface as a bare 500.  The regex is a cheap pre-filter; only a body that has
# such an escape (valid pairs included, e.g. an emoji from an ensure_ascii client)
# pays for the exact check.
_LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _path_qs(scope: Scope) -> str:
    path = scope.get("raw_path") or scope["path"].encode()
    if isinstance(path, bytes):
        path = path.decode("latin-1")
    qs = scope.get("query_string") or b""
    return path + ("?" + qs.decode("latin-1") if qs else "")


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _has_body(scope: Scope) -> bool:
    return any(name == b"transfer-encoding" for name, _ in scope["headers"])


class ClientGone(Exception):
    """The client disconnected before its request body was complete.

    An ordinary client fault, not a server error: nothing can be answered and
    nothing reached the upstream, so the handlers end quietly.  (Raising
    CancelledError here escaped the app and uvicorn logged a traceback.)
    """


async def _read_body(receive: Receive, limit: int, scope: Scope) -> bytes:
    declared = _content_length(scope)
    if declared is not None and declared > limit:
        raise errors.body_too_large(declared, limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise errors.body_too_large(size, limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _stream_body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


# How long a request runs before headroom starts watching for its client to
# leave.  Watching costs a task per request (~30 us of CPU measured in-process,
# 15 % of the app's own work on a small chat); most small answers are done
# before this, and a generation that outlives it gets the watcher, which sees
# a disconnect that already happened at once.  A client that leaves is thus
# noticed within this delay at worst: nothing next to vLLM's seconds of work.
WATCH_AFTER_S = 0.05


async def _until_disconnect(
    receive: Receive, work: Awaitable[None], on_disconnect: Callable[[], None] | None = None
) -> None:
    """Run `work`, cancelling it as soon as the client disconnects.

    Cancelling closes the upstream connection, which makes vLLM abort the
    generation and free its KV-cache blocks.

    `work` runs in the calling task; only the wait for the disconnect is a
    task of its own, started WATCH_AFTER_S into the request, whose completion
    cancels this one.  (Running `work` as a second task under `asyncio.wait`
    cost a task, a wait future and four callbacks per request.)
    """
    task = asyncio.current_task()
    assert task is not None
    state = {"finished": False, "disconnected": False}
    watchers: list[asyncio.Future[Any]] = []

    def client_gone(watcher: asyncio.Future[Any]) -> None:
        if state["finished"] or watcher.cancelled():
            return
        state["disconnected"] = True
        task.cancel()

    def watch() -> None:
        if not state["finished"]:
            watcher = asyncio.ensure_future(receive())
            watcher.add_done_callback(client_gone)
            watchers.append(watcher)

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, watch)
    try:
        await work
    except asyncio.CancelledError:
        if not state["disconnected"]:
            raise
        task.uncancel()
        if on_disconnect is not None:
            on_disconnect()
    finally:
        state["finished"] = True
        timer.cancel()
        for watcher in watchers:
            watcher.cancel()