"""Run an ASGI app under a real uvicorn server on 127.0.0.1, in a background thread.

End-to-end tests need real sockets (the official `openai` client talks HTTP).
The server binds port 0 and reports the port the kernel chose, and start-up is
awaited through an event set by uvicorn's own start-up hook — no sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, settle: Callable[[], Awaitable[None]] | None = None) -> None:
        super().__init__(config)
        self.ready = threading.Event()
        self.port: int | None = None
        self._settle = settle
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)
        for server in self.servers:
            for sock in server.sockets:
                self.port = sock.getsockname()[1]
        if self._settle is not None and not self.should_exit:
            await self._settle()
        self.ready.set()

    async def main_loop(self) -> None:
        """Serve until `stop`, woken at once: uvicorn's own loop looks every 0.1 s, which every
        test that starts a server paid on its way out (~0.05 s each, ~120 such tests in the fast tier)."""
        if not await self.on_tick(0):           # the default headers, as uvicorn's first tick sets them
            await self._stopped.wait()

    def stop(self) -> None:
        """From any thread: shut down now (uvicorn's `should_exit`, and wake `main_loop`)."""
        self.should_exit = True
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):       # the loop has ended already
                self._loop.call_soon_threadsafe(self._stopped.set)


@contextlib.contextmanager
def serve_in_thread(app: Any, *, lifespan: str = "on", settle: Callable[[], Awaitable[None]] | None = None,
                    **uvicorn_kwargs: Any) -> Iterator[str]:
    """Serve `app` until the block ends; yields its base URL, e.g. "http://127.0.0.1:41234".

    `settle`, awaited on the server's loop once it listens, delays the yield until it returns
    (the app's own start-up work, so that a test sees only its own traffic).
    """
    # IPPROTO_TCP named: asyncio's loop (this thread's) sets TCP_NODELAY on accepted connections
    # only then, as uvloop (`brimful serve`'s) always does; without it a response sent in parts
    # waits out the client's delayed ACK (~40 ms on Linux) before its second part.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        lifespan=lifespan,
        log_level="warning",
        access_log=False,
        server_header=False,
        date_header=False,
        **uvicorn_kwargs,
    )
    server = _Server(config, settle)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(server.serve(sockets=[sock]))
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)
            server.ready.set()

    thread = threading.Thread(target=run, name="uvicorn-test-server", daemon=True)
    thread.start()
    if not server.ready.wait(timeout=30) or errors:
        raise RuntimeError(f"test server did not start: {errors}")
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()
        thread.join(timeout=30)
        sock.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
