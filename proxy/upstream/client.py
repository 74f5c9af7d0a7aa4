"""One upstream server: send a request, get a streaming response, failures explained.

`Upstream` is the seam between brimful's logic and how bytes travel
(HTTPX's transports; docs/architecture.md): it takes any `Transport`.  The
default one is `proxy.upstream.http1.Pool`, a lean HTTP/1.1 client on
httptools' parser: httpx's pool was measured at 4.8 ms of CPU per request at
64 connections, and aiohttp's session, though ~20x cheaper, was still ~17-21 % of brimful's CPU
per request (py-spy); see bench/ for the figures.  Tests pass an in-memory
transport instead (tests/support/transport.py).  Every transport failure
leaves here as a `BrimfulError` from `proxy.errors`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from typing import Any, Protocol
from urllib.parse import SplitResult, urlsplit

from proxy import errors
from proxy.asgi import Headers
from proxy.errors import BrimfulError, clip
from proxy.upstream.http1 import (
    Broken,
    ConnectError,
    ConnectTimeout,
    DeadlineExceeded,
    Pool,
    ReadTimeout,
    ResponseHeaders,
)

# RFC 9110 §7.6.1 hop-by-hop headers, plus the ones the HTTP layers recompute.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        # The client's `Expect: 100-continue` was answered by brimful's own server
        # (uvicorn sends 100 when the body is first read); brimful sends the
        # upstream a body it already has, so there is nothing to wait for.
        b"expect",
    }
)

# brimful sets X-Request-Id itself (the client's when sane, else its own).
DROP_REQUEST_ID = frozenset({b"x-request-id"})
# brimful reads an admitted answer (usage, finish reasons), so it asks for it uncompressed.
DROP_ADMITTED = DROP_REQUEST_ID | {b"accept-encoding"}
CAUSE_CHARS = 200            # how much of a transport error's text an explanation quotes
Body = bytes | AsyncIterator[bytes] | None


# Answer headers that carry a URL a client follows.
_URL_HEADERS = frozenset({b"location", b"content-location"})


def _origin(parts: SplitResult) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an absolute http(s) URL, default ports filled in; None otherwise."""
    try:
        host, port = parts.hostname, parts.port
    except ValueError:                  # a port that is not a number
        return None
    if parts.scheme not in ("http", "https") or not host:
        return None
    return parts.scheme, host.lower(), port or (443 if parts.scheme == "https" else 80)


def local_reference(value: bytes, base_url: str) -> bytes | None:
    """`value` (a Location) as a reference to the same path on brimful, when it names the
    upstream at `base_url` (its prefix taken off); None when it names anything else.

    vLLM's FastAPI answers `POST /v1/chat/completions/` with a 307 whose Location is
    built from the Host header, which brimful sets to the upstream's: relayed as sent,
    it gave clients the upstream's address, and clients that follow redirects re-sent
    the request straight to vLLM, past admission.  A path-absolute reference resolves
    against the URL the client used, brimful's own (RFC 9110 §10.2.2).  Pure.
    """
    try:
        text = value.decode("latin-1").strip()
    except UnicodeDecodeError:
        return None
    target = urlsplit(text if "://" in text or text.startswith("//") else "")
    if not text or not target.netloc:
        return None
    base = urlsplit(base_url)
    if text.startswith("//"):            # scheme-relative: the upstream's own scheme
        target = urlsplit(f"{base.scheme}:{text}")
    if _origin(target) is None or _origin(target) != _origin(base):
        return None
    path = target.path
    prefix = base.path.rstrip("/")
    if prefix and (path == prefix or path.startswith(prefix + "/")):
        path = path[len(prefix):]
    # One leading slash: "//host/x" would be read as another host (an open redirect).
    reference = "/" + path.lstrip("/")
    if target.query:
        reference += "?" + target.query
    if target.fragment:
        reference += "#" + target.fragment
    return reference.encode("latin-1")


def client_headers(headers: Headers, base_url: str) -> Headers:
    """An upstream answer's headers as a client may see them: a URL naming the upstream
    (Location, Content-Location) made a reference to brimful; everything else as sent."""
    if not any(k in _URL_HEADERS for k, _ in headers):
        return headers
    out: Headers = []
    for k, v in headers:
        if k in _URL_HEADERS:
            local = local_reference(v, base_url)
            v = v if local is None else local
        out.append((k, v))
    return out


class UpstreamResponse(Protocol):
    """An upstream's answer: status and headers now, the body as it arrives (`proxy.upstream.http1.Http1Response`)."""

    status: int
    raw_headers: Headers
    headers: ResponseHeaders

    async def next_chunk(self) -> bytes: ...          # b"" at the end
    async def read(self, limit: int | None = None) -> bytes: ...
    def release(self) -> None: ...                    # done reading: the connection may be reused
    def close(self) -> None: ...                      # abandon it: the upstream sees the connection close


class Transport(Protocol):
    """How requests reach one upstream origin (`proxy.upstream.http1.Pool`)."""

    async def request(
        self, method: str, path_qs: str, headers: Headers, body: Body, *, timeout: float, idle_timeout: float,
        deadline: float | None = None,
    ) -> UpstreamResponse: ...

    async def close(self) -> None: ...


def access_control(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """An upstream answer's CORS headers (vLLM's --allowed-origins): an answer brimful builds from
    that answer carries them, so a browser reads it as it would have read the upstream's."""
    return [(k, v) for k, v in headers if k.lower().startswith(b"access-control-")]


def forwardable(headers: Iterable[tuple[bytes, bytes]], extra_drop: frozenset[bytes] = frozenset()) -> Headers:
    """Headers minus hop-by-hop ones (and any named in `Connection`), names lower-cased.

    Bytes in, bytes out: both sides of the proxy (ASGI and proxy.upstream.http1) speak
    bytes, so nothing is decoded and encoded again on the way through.
    """
    pairs = [(k.lower(), v) for k, v in headers]
    drop = HOP_BY_HOP | extra_drop
    for k, v in pairs:
        if k == b"connection":
            drop = drop | {token.strip().lower() for token in v.split(b",")}
    return [(k, v) for k, v in pairs if k not in drop]


class Upstream:
    """A long-lived client for one upstream base URL."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 5.0,
        timeout: float = 900.0,
        idle_timeout: float | None = None,
        max_connections: int = 1024,
        api_key: str | None = None,
        transport: Transport | None = None,
        show_url: bool = False,
        forward_authorization: bool = True,
        total_timeout: float = 0.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # The URL as clients may see it in errors: only when the operator opts in
        # (server.show_upstream_url); the logs always name it.
        self.public_url: str | None = self.base_url if show_url else None
        self.forward_authorization = forward_authorization
        self.total_timeout = total_timeout          # 0: off; else one request's whole time, headers to last byte
        self.connect_timeout = connect_timeout
        self.timeout = timeout                      # until the response headers
        self.idle_timeout = idle_timeout if idle_timeout is not None else timeout  # between body chunks
        self.api_key = api_key
        self._transport: Transport = transport if transport is not None else Pool(
            self.base_url, connect_timeout=connect_timeout, limit=max_connections
        )

    async def close(self) -> None:
        await self._transport.close()

    def outgoing_headers(self, headers: Headers) -> Headers:
        """Apply the Authorization policy: the upstream key when set, else the client's (unless stripped)."""
        if self.api_key is None and self.forward_authorization:
            return headers
        kept = [(k, v) for k, v in headers if k != b"authorization"]
        if self.api_key is not None:
            kept.append((b"authorization", f"Bearer {self.api_key}".encode("latin-1")))
        return kept

    async def send(
        self,
        method: str,
        path_qs: str,
        headers: Headers,
        body: Body,
        *,
        timeout: float | None = None,
    ) -> UpstreamResponse:
        """Send one request; the caller reads (or releases) the returned response.

        `path_qs` is always a path on the configured upstream: a request can
        never make brimful connect anywhere else.  `timeout` replaces both the
        first-byte and the idle timeout (model discovery has its own).
        """
        if not path_qs.startswith("/"):
            path_qs = "/" + path_qs
        deadline = asyncio.get_running_loop().time() + self.total_timeout if self.total_timeout else None
        try:
            return await self._transport.request(
                method, path_qs, self.outgoing_headers(headers), body,
                timeout=timeout if timeout is not None else self.timeout,
                idle_timeout=timeout if timeout is not None else self.idle_timeout,
                deadline=deadline,
            )
        except BaseException as exc:
            mapped = self.map_exception(exc, phase="waiting for the response headers")
            if mapped is exc:
                raise     # not a transport failure (a client gone mid-body, a cancellation)
            raise mapped from exc

    def map_exception(self, exc: BaseException, *, phase: str) -> BaseException:
        """Transport failures → the explained 502/504; anything else passes through unchanged."""
        if isinstance(exc, BrimfulError):
            return exc
        if isinstance(exc, ConnectError):
            return errors.upstream_unreachable(self.public_url, str(exc))
        if isinstance(exc, DeadlineExceeded):
            return errors.request_deadline(self.public_url, self.total_timeout)
        if isinstance(exc, ConnectTimeout):
            return errors.upstream_timeout(self.public_url, "connecting", self.connect_timeout)
        if isinstance(exc, (ReadTimeout, TimeoutError)):
            seconds = self.timeout if phase == "waiting for the response headers" else self.idle_timeout
            return errors.upstream_timeout(self.public_url, phase, seconds)
        if isinstance(exc, Broken):
            return errors.upstream_broken(self.public_url, clip(str(exc), CAUSE_CHARS))
        if isinstance(exc, OSError):
            return errors.upstream_broken(self.public_url, clip(f"{type(exc).__name__}: {exc}", CAUSE_CHARS))
        return exc

    async def read_body(self, response: UpstreamResponse, limit: int | None = None) -> bytes:
        """Read a whole (non-streamed) body; transport failures become BrimfulError."""
        try:
            return await response.read(limit)
        except BaseException as exc:
            raise self.map_exception(exc, phase="reading the response body") from exc
        finally:
            response.release()

    async def get_json(self, path: str, timeout: float | None = None) -> Any:
        """GET a JSON document; with `timeout` (model discovery), a silence past it is said as such."""
        try:
            response = await self.send("GET", path, [(b"accept", b"application/json")], None, timeout=timeout)
            body = await self.read_body(response)
        except BrimfulError as err:
            if timeout is not None and err.code == errors.ErrorCode.UPSTREAM_TIMEOUT:
                raise errors.discovery_timeout(self.public_url, path, timeout) from err
            raise
        if response.status != 200:
            raise ValueError(f"HTTP {response.status} from {path}: {body[:200]!r}")
        return json.loads(body)

    async def post_json(self, path: str, payload: Any) -> tuple[int, Any]:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        response = await self.send("POST", path, [(b"content-type", b"application/json")], data)
        body = await self.read_body(response)
        try:
            return response.status, json.loads(body)
        except ValueError:
            return response.status, None
