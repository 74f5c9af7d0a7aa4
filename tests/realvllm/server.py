"""Start a real vLLM OpenAI-compatible server on loopback, wait until it serves, stop it.

The command line and environment are the measured recipe of
docs/vllm-behaviour.md: an explicit KV-cache size (the default sizing asks
for 0.92 of the machine's RAM and refuses to start), eager mode, bf16, the
hermes tool parser (without it every chat request carrying ``tools`` is a 400),
offline hub access and no usage statistics.

All server output goes to a log file: a failed start shows its tail in the
exception, a passing run keeps the test output clean.

Every server starts under one lock file in the cache (`SERVER_LOCK`): while a
process serves a real vLLM, another process on the machine waits before it
starts one (two would share the cores and the memory, and each one's start
and timing figures would be the other's too). A process's own servers share
the lock (the session's server beside a module's, test_pools' two).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .locking import process_lock
from .venv import SetupError, cache_root, log_tail, quiet_env

LAUNCHER = Path(__file__).with_name("launcher.py")
SERVED_MODEL_NAME = "tiny-qwen"
MAX_MODEL_LEN = 2048
KV_CACHE_BYTES = 64 * 1024 * 1024  # 2 layers x 2 KV heads x 32 x bf16 = 512 B/token -> 131,072 tokens
HEALTH_TIMEOUT_S = 180.0
SERVER_LOCK = ".real-vllm-server.lock"
STOP_TIMEOUT_S = 30.0
# The same tiny model as an embedding model: vLLM 0.32 then serves /v1/embeddings, /pooling,
# /score and /rerank (and no generation routes), converting the causal LM's last hidden state.
POOLING_ARGS = ("--runner", "pooling", "--convert", "embed")


@dataclass(frozen=True)
class RunningServer:
    """A vLLM server this process started; `base_url` has no ``/v1`` suffix."""

    process: subprocess.Popen
    base_url: str
    port: int
    log_path: Path
    startup_seconds: float


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(
    python: Path,
    model_dir: Path,
    port: int,
    served_model_name: str = SERVED_MODEL_NAME,
    extra_args: tuple[str, ...] = (),
    max_model_len: int = MAX_MODEL_LEN,
) -> list[str]:
    """The ``vllm serve`` command line, started through the launcher (see launcher.py).

    Responses (/v1/responses) and Anthropic Messages (/v1/messages) need no flag of
    their own: vLLM 0.32 serves them beside chat for every generating model.
    """
    return [
        str(python),
        str(LAUNCHER),
        "serve",
        str(model_dir),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", str(max_model_len),
        "--dtype", "bfloat16",
        "--enforce-eager",
        "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
        "--served-model-name", served_model_name,
        "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes",
        *extra_args,
    ]  # fmt: skip


def server_env() -> dict[str, str]:
    """Offline, loopback-only, no telemetry (docs/vllm-behaviour.md, step 5)."""
    env = quiet_env()
    env.update(
        VLLM_HOST_IP="127.0.0.1",
        VLLM_LOOPBACK_IP="127.0.0.1",
        # Two cores are shared with the test process: leave torch's thread pool
        # to vLLM's own CPU-worker binding.
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the test process dies (Linux prctl).

    A pytest run killed from outside would otherwise leave a 2.4 GiB server behind.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start_server(
    python: Path,
    model_dir: Path,
    log_path: Path,
    port: int | None = None,
    served_model_name: str = SERVED_MODEL_NAME,
    extra_args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
    max_model_len: int = MAX_MODEL_LEN,
) -> subprocess.Popen:
    """Start vLLM in its own process group with output to `log_path`; does not wait."""
    port = port or free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        return subprocess.Popen(
            serve_command(python, model_dir, port, served_model_name, extra_args, max_model_len),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**server_env(), **(extra_env or {})},
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def is_healthy(base_url: str) -> bool:
    """``GET /health`` answered 200."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def wait_until_healthy(process: subprocess.Popen, base_url: str, log_path: Path, timeout: float) -> None:
    """Poll ``/health`` until 200, failing fast (with the log tail) if the server process exits.

    A failed start takes ~30 s to show in the log; checking the PID each round
    means a crash is reported when it happens, not at the timeout.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = process.poll()
        if code is not None:
            raise SetupError(f"vLLM exited with code {code} before it was healthy; "
                             f"log {log_path}:\n{log_tail(log_path)}")
        if is_healthy(base_url):
            return
        time.sleep(0.5)  # polling interval while waiting for start-up, not test synchronisation
    raise SetupError(f"vLLM was not healthy after {timeout:.0f} s; log {log_path}:\n{log_tail(log_path)}")


def stop_server(process: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM the API server (it stops its engine processes), SIGKILL the group if it hangs."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    # The API server was started in its own session, so its process group id is
    # its pid: this reaches only the processes this helper started.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)


@contextlib.contextmanager
def running_server(
    python: Path,
    model_dir: Path,
    log_path: Path,
    timeout: float = HEALTH_TIMEOUT_S,
    **options: Any,
) -> Iterator[RunningServer]:
    """Start vLLM (once no other process serves one: `SERVER_LOCK`), wait for health, yield it,
    and always stop it (`options` go to `start_server`)."""
    with process_lock(cache_root() / SERVER_LOCK):
        port = free_port()
        started = time.monotonic()
        process = start_server(python, model_dir, log_path, port, **options)
        try:
            base_url = f"http://127.0.0.1:{port}"
            wait_until_healthy(process, base_url, log_path, timeout)
            yield RunningServer(process, base_url, port, log_path, time.monotonic() - started)
        finally:
            stop_server(process)


def process_tree_rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and all its descendants (Linux /proc), for reporting the server's footprint."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command name: state, ppid, ... ; rss (pages) is field 24 overall = index 21 here.
        children.setdefault(int(fields[1]), []).append(int(entry))
        rss[int(entry)] = int(fields[21]) * page
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        total += rss.get(current, 0)
        stack.extend(children.get(current, []))
    return total
