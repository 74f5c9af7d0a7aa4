"""Requests queued on a worker that dies, in a network namespace of their own, for test_handover.py.

`python -m tests.workers.queued_kill TOKENIZER_DIR [MIGRATE]` enters a new network namespace (so
that `net.ipv4.tcp_migrate_req` is MIGRATE, default 0, whatever the host says: with 0 the kernel
resets a closed listener's queue instead of moving it to another listener of the port), runs
`brimful serve --workers 2` in front of the fake vLLM there, stops worker 1 with SIGSTOP, opens
connections until at least QUEUED of them wait in worker 1's accept queue (each with a whole chat
request sent) and worker 0 has answered one, kills worker 1 with SIGKILL, and reads what each
queued connection gets.  It prints one JSON document; it exits SKIP with the reason when the
namespace cannot be made here.

Which connections wait on worker 1 is read from the kernel, not guessed: a listening socket's
accept queue length is its rx_queue in /proc/net/tcp (and /proc/net/tcp6), found by the inode
that worker 1's descriptors point at.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import select
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
MIGRATE_REQ = Path("/proc/sys/net/ipv4/tcp_migrate_req")
SKIP = 77
QUEUED = 6
CHAT = json.dumps({"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()


def own_network(migrate: str = "0") -> str | None:
    """A network namespace of this process's own, loopback up, tcp_migrate_req `migrate`; else why not."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        return f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sh", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sh", b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))
    if not MIGRATE_REQ.exists():
        return None                    # before Linux 5.14: the kernel never migrates
    try:
        MIGRATE_REQ.write_text(migrate)
    except OSError as exc:
        if MIGRATE_REQ.read_text().strip() != migrate:
            return f"cannot set net.ipv4.tcp_migrate_req to {migrate} in the namespace: {exc}"
    return None


def accept_queue(pid: int, port: int) -> int:
    """How many connections wait in the accept queue of the listening socket that `pid` holds on `port`."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with _gone_ok():
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, queues, inode = fields[1], fields[3], fields[4], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port and inode in inodes:
                return int(queues.split(":")[1], 16)
    raise LookupError(f"pid {pid} holds no listening socket on port {port}")


class _gone_ok:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return isinstance(exc, FileNotFoundError)


def send_chat(port: int) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=60)
    conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: brimful\r\ncontent-type: application/json\r\n"
                 b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(CHAT), CHAT))
    return conn


def answer(conn: socket.socket) -> str:
    """The status line the connection gets, or the error reading it."""
    try:
        data = b""
        while b"\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                return f"closed after {len(data)} bytes"
            data += chunk
        return data.split(b"\r\n", 1)[0].decode()
    except OSError as exc:
        return type(exc).__name__
    finally:
        conn.close()


def queue_on_stopped_worker(port: int, pid: int) -> tuple[list[socket.socket], list[str]]:
    """Chats on new connections until QUEUED wait on the stopped worker and worker 0 answered one.

    SO_REUSEPORT hashes each connection to a worker, so stopping at QUEUED alone left worker 0 none
    about 1 run in 64; a connection queued past QUEUED is kept and read like the first ones.
    """
    queued: list[socket.socket] = []
    others: list[str] = []
    for _ in range(400):
        if len(queued) >= QUEUED and others:
            break
        before = accept_queue(pid, port)
        conn = send_chat(port)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:       # the kernel queued it on worker 1, or worker 0 answers
            if accept_queue(pid, port) > before:
                queued.append(conn)
                break
            if select.select([conn], [], [], 0.01)[0]:
                others.append(answer(conn))
                break
        else:
            raise RuntimeError("a connection neither queued on the stopped worker nor answered in 30 s")
    return queued, others


def run(tokenizer_dir: Path) -> dict[str, Any]:
    import signal
    import tempfile

    import httpx

    from tests.support.fakevllm import FakeVLLM
    from tests.support.process import BrimfulProcess, wait_until

    def ready(base: str) -> bool:
        with httpx.Client(base_url=base, timeout=30) as http:
            page = http.get("/ready")
        return page.status_code == 200 and len(page.json()["workers"]) == 2

    with FakeVLLM() as fake, tempfile.TemporaryDirectory() as tmp:
        brimful = BrimfulProcess(fake.base_url, Path(tmp), tokenizer_dir, extra_args=["--workers", "2"])
        try:
            if not wait_until(lambda: ready(brimful.base_url), timeout=60):
                raise RuntimeError("not ready:\n" + "\n".join(brimful.lines[-30:]))
            with httpx.Client(base_url=brimful.base_url, timeout=30) as http:
                pids = {w["index"]: w["pid"] for w in http.get("/stats").json()["workers"]}
            os.kill(pids[1], signal.SIGSTOP)
            queued, others = queue_on_stopped_worker(brimful.port, pids[1])
            os.kill(pids[1], signal.SIGKILL)
            answers = [answer(conn) for conn in queued]
            code = brimful.stop()
        finally:
            brimful.stop(signal.SIGKILL)
    return {"queued": len(queued), "answers": answers, "others": others, "exit": code,
            "log": brimful.lines[-40:]}


def main() -> int:
    reason = own_network(sys.argv[2] if len(sys.argv) > 2 else "0")
    if reason is not None:
        print(json.dumps({"skip": reason}))
        return SKIP
    print(json.dumps(run(Path(sys.argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
