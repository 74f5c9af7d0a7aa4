"""The real Supervisor over toy workers, for tests/workers/test_restarts.py.

`python -m tests.workers.toy_supervisor STATE COUNT` serves COUNT workers on a free
loopback port and prints it.  Each worker answers every connection with one
line, "<slot> <pid>", and closes it, and serves the sockets the supervisor hands
it (proxy.workers.handover) the same way.  Each start appends its pid to
STATE/slot-<i>.starts; a replacement (not the slot's first start) of a slot
with a STATE/gate-<i> FIFO blocks opening it until the test opens its other
end, so a test can hold a replacement's start for as long as it needs.  With a
STATE/cannot-start file every worker exits at once with uvicorn's start-up failure (3).  With a
STATE/stop-at-start file the supervisor gets SIGTERM as it forks its first worker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path

from proxy.workers.handover import Handover
from proxy.workers.siblings import WorkerSlot
from proxy.workers.supervisor import Supervisor, listening_sockets


async def serve(slot: WorkerSlot, sock: socket.socket) -> int:
    line = f"{slot.index} {os.getpid()}\n".encode()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(line)
        await writer.drain()
        writer.close()

    def answer_handed(conn: socket.socket) -> None:
        with conn:
            conn.sendall(line)             # one short line: the new socket's buffer takes it whole

    # SIGTERM through the loop, then unblocked: the supervisor holds it from the fork until the
    # worker handles it (as proxy.signals.Server does), so one sent meanwhile arrives now.
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    await asyncio.start_server(answer, sock=sock)
    Handover(slot.channel).start(answer_handed)
    await stop.wait()
    return 0


def main(state: Path, count: int) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")

    def run_worker(slot: WorkerSlot, sock: socket.socket) -> int:
        # SIGTERM is held until `serve` (the test opens a held replacement's gate before it stops the supervisor).
        starts = state / f"slot-{slot.index}.starts"
        first = not starts.exists()
        gate = state / f"gate-{slot.index}"
        with starts.open("a") as f:
            f.write(f"{os.getpid()}\n")
        if (state / "cannot-start").exists():
            return 3
        if not first and gate.exists():
            with gate.open() as f:         # blocks until the test opens the FIFO for writing
                f.read()
        return asyncio.run(serve(slot, sock))

    sockets = listening_sockets("127.0.0.1", 0, count)
    print(sockets[0].getsockname()[1], flush=True)
    if (state / "stop-at-start").exists():     # delivered when the first fork unblocks it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        os.kill(os.getpid(), signal.SIGTERM)
    directory = state / "workers"
    directory.mkdir()
    return Supervisor(sockets, run_worker, directory).run()


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
