"""`brimful serve` as a subprocess, for the tests that need the real command (load, lifecycle)."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]


class BrimfulProcess:
    """`python -m proxy.cli serve` with its stderr drained; ready once uvicorn's line is out and the port listens."""

    def __init__(self, upstream: str, tmp: Path, tokenizer_dir: Path, extra_toml: str = "",
                 extra_args: list[str] | None = None, fd_limit: int | None = None, model_toml: str = "") -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = tmp / "brimful.toml"
        config.write_text(
            f'[upstream]\nurl = "{upstream}"\ntimeout = 30.0\n{extra_toml}\n'
            f'[models."tiny-qwen"]\ntokenizer = "{tokenizer_dir}"\n{model_toml}\n'
        )
        self.lines: list[str] = []
        self._started = threading.Event()
        self.proc = subprocess.Popen(
            self._command(config, extra_args or []),
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit)))
            if fd_limit is not None else None,
        )
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()
        if not self._started.wait(60) or not wait_listening(self.port, self.proc):
            self.proc.kill()
            raise RuntimeError("brimful did not start:\n" + "\n".join(self.lines[-30:]))

    def _command(self, config: Path, extra_args: list[str]) -> list[str]:
        return [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config), "--port", str(self.port),
                "--log-level", "info", *extra_args]

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())
            if "Application startup complete" in line:
                self._started.set()
        self._started.set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def status(self, field: str) -> int:
        """A /proc/<pid>/status figure in KiB (VmRSS, VmHWM)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._drain.join(5)
        return code


def wait_until(predicate: Any, timeout: float) -> bool:
    """For state in another process, which cannot notify us: re-check until true or timeout."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def wait_listening(port: int, proc: subprocess.Popen[Any], timeout: float = 30) -> bool:
    """After uvicorn's "Application startup complete": it logs that line before it listens, so a
    client sent on the line alone can be refused. True once the port takes a connection."""
    def listening() -> bool:
        if proc.poll() is not None:
            return True                                 # ends the wait: the caller sees it exited
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        except OSError:
            return False
        return True

    return wait_until(listening, timeout) and proc.poll() is None


def reset_peak_rss(pid: int) -> bool:
    """Start VmHWM over from the current RSS (Linux: write 5 to clear_refs); False when not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True
