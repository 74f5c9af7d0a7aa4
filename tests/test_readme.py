"""The README's examples, run for real: what it shows is what brimful prints.

The curl/openai examples run against a fake vLLM of the older, rejecting kind
(`max_model_len` 8192) serving `Qwen/Qwen3-8B` and counting with the real
Qwen3 tokenizer; `plan` and `report` are run with the README's own arguments
and their output compared line by line; the `count` example's shell lines run
as written, with `brimful` on the PATH and a Hugging Face cache holding Qwen3.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from proxy.app import BrimfulApp
from proxy.config import Config, LengthLogConfig, ModelConfig, UpstreamConfig
from tests.support.fakevllm import FakeVLLM
from tests.support.servers import serve_in_thread
from tests.support.stack import fake_counter
from tokenizer_cache import load_model_tokenizer

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MODEL = "Qwen/Qwen3-8B"       # the README's examples use a real model name


def block_after(marker: str) -> list[str]:
    """Lines of the first fenced block that starts with a line containing `marker`: in the pages of docs/
    (where the README's long sections move) first, then in the README."""
    for text in [*(p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))), README]:
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("```") and i + 1 < len(lines) and marker in lines[i + 1]:
                end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
                return lines[i + 1:end]
    raise AssertionError(f"no README or docs/ block starting with {marker!r}")


def documented_headers(block: list[str]) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in block if re.match(r"^x-brimful-[a-z-]+: ", line))


@pytest.fixture(scope="module")
def qwen3(qwen3_dir):
    return load_model_tokenizer(qwen3_dir)


@pytest.fixture(scope="module")
def stack(qwen3, qwen3_dir):
    def count(endpoint: str, body: dict) -> int:
        return qwen3.count_chat(body) if endpoint == "chat" else sum(qwen3.count_completion(body))

    with FakeVLLM(model=MODEL, max_model_len=8192, count_prompt=count, mode="legacy") as fake:
        config = Config(upstream=UpstreamConfig(url=fake.base_url, timeout=30.0))
        config.models[MODEL] = ModelConfig(tokenizer=str(qwen3_dir))
        with serve_in_thread(BrimfulApp(config)) as base:
            yield fake, base


@pytest.fixture(scope="module")
def stack_032(qwen3, qwen3_dir):
    """The Responses and Messages examples: the same server, a vLLM 0.32 (it clamps overflow itself,
    and refuses a limit above max_model_len)."""
    with FakeVLLM(model=MODEL, max_model_len=8192, count_prompt=fake_counter(qwen3)) as fake:
        config = Config(upstream=UpstreamConfig(url=fake.base_url, timeout=30.0))
        config.models[MODEL] = ModelConfig(tokenizer=str(qwen3_dir))
        with serve_in_thread(BrimfulApp(config)) as base:
            yield fake, base


def run_python_example(marker: str, old: str, new: str) -> tuple[list[str], list[str], dict]:
    """Run the README's python block containing `marker` with `old` replaced by `new`;
    (what it printed, what its comments say it prints, its namespace)."""
    source = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S) if marker in b).replace(old, new)
    printed: list[str] = []
    namespace: dict = {"print": lambda *a: printed.append(" ".join(map(str, a)))}
    exec(compile(source, "README.md", "exec"), namespace)
    return printed, re.findall(r"print\(.*\)\s+# (\S+)", source), namespace


@pytest.mark.parametrize("path, marker, old", [
    ("/v1/responses", "client.responses", "http://127.0.0.1:8100/v1"),
    ("/v1/messages", "anthropic.Anthropic", "http://127.0.0.1:8100"),
])
def test_surface_python_examples(stack_032, path: str, marker: str, old: str) -> None:
    _, base = stack_032
    printed, documented, namespace = run_python_example(marker, old, base + ("/v1" if old.endswith("/v1") else ""))
    assert printed == documented
    assert printed[:2] == ["clamped", "8177"]
    result = namespace["response"] if path == "/v1/responses" else namespace["message"]
    assert result.usage.input_tokens == 15 and result.usage.output_tokens == 8177


@pytest.mark.parametrize("path, refusal", [
    ("/v1/responses", "max_output_tokens=65535 cannot be greater"),
    ("/v1/messages", "max_completion_tokens=65535 cannot be greater"),
])
def test_surface_curl_examples(stack_032, path: str, refusal: str) -> None:
    fake, base = stack_032
    block = block_after(f"$ curl -si localhost:8100{path} ")
    body = json.loads(re.search(r"-d '(\{.*\})'", " ".join(block)).group(1))
    response = httpx.post(base + path, json=body, timeout=30)
    assert response.status_code == int(block[2].split()[1])
    assert {k: response.headers[k] for k in documented_headers(block)} == documented_headers(block)
    assert json.loads(block[-1].replace(", ...}", "}"))["id"].split("_")[0].split("-")[0] in response.json()["id"]
    direct = httpx.post(fake.base_url + path, json=body, timeout=30)
    shown = next(b for b in re.findall(r"```\n(HTTP/1.1 400.*?)```", README, re.S) if refusal in b)
    documented = re.search(r'"message":"(.*?) \.\.\."', shown).group(1)
    assert direct.status_code == 400 and direct.json()["error"]["message"].startswith(documented)


def test_python_example(stack) -> None:
    _, base = stack
    source = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S) if "with_raw_response" in b)
    source = source.replace("http://127.0.0.1:8100/v1", base + "/v1")
    printed: list[str] = []
    namespace = {"print": lambda *a: printed.append(" ".join(map(str, a)))}
    exec(compile(source, "README.md", "exec"), namespace)
    documented = re.findall(r"print\(.*\)\s+# (\S+)", source)
    assert printed == documented == ["clamped", "8177"]     # 8192 - 15: the whole room
    assert namespace["completion"].usage.completion_tokens == 8177


def test_curl_clamp_example(stack) -> None:
    fake, base = stack
    block = block_after("$ curl")
    body = json.loads(re.search(r"-d '(\{.*\})'", " ".join(block)).group(1))
    response = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == int(block[2].split()[1])
    assert {k: response.headers[k] for k in documented_headers(block)} == documented_headers(block)
    # …and the same request straight to the (older, rejecting) vLLM:
    direct = httpx.post(fake.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert direct.status_code == 400
    shown = " ".join(next(b for b in re.findall(r"```\n(HTTP/1.1 400.*?)```", README, re.S)
                          if "'max_tokens' or" in b).split("\n")[1:])
    documented = re.search(r'"message":"(.*?) \.\.\."', shown).group(1)
    assert direct.json()["error"]["message"].startswith(documented)


def test_rejection_example(stack, qwen3) -> None:
    _, base = stack
    body = {"model": MODEL, "messages": [{"role": "user", "content": " ".join(["hello"] * 9000)}],
            "max_tokens": 100}
    response = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
    lines = README.splitlines()
    start = lines.index("x-brimful-action: rejected") - 1
    block = lines[start:lines.index("```", start)]
    assert response.status_code == 400
    assert {k: response.headers[k] for k in documented_headers(block)} == documented_headers(block)
    documented = json.loads(" ".join(block[block.index("") + 1:]))
    assert response.json() == documented


def shell_example(marker: str) -> tuple[str, list[str]]:
    """A `$ ` block as (the shell script it types, the output lines it shows after the last command)."""
    block = block_after(marker)
    last = max(i for i, line in enumerate(block) if line.startswith("$ "))
    end = last + 1
    script = [line.removeprefix("$ ") for line in block[:end]]
    return "\n".join(script) + "\n", block[end:]


def test_count_example_runs_as_written(tmp_path, qwen3_dir) -> None:
    # A Hugging Face cache as vLLM leaves it, holding the real Qwen3 tokenizer, and
    # `brimful` on the PATH as after `. .venv/bin/activate`.
    snapshot = tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    for file in qwen3_dir.iterdir():
        (snapshot / file.name).symlink_to(file)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "brimful").write_text(f'#!/bin/sh\nexec {sys.executable} -m proxy.cli "$@"\n')
    (bin_dir / "brimful").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    script, shown = shell_example("$ cat > request.json")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run(["bash", "-euc", script], cwd=work, env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == shown
    assert json.loads((work / "request.json").read_text())["model"] == MODEL


@pytest.mark.parametrize("marker", ["$ brimful plan --preset Qwen3-8B", "$ brimful plan --preset Llama-3.1-70B"])
def test_plan_example(marker: str) -> None:
    block = block_after(marker)
    argv = block[0].split("brimful plan", 1)[1].split()
    out = subprocess.run([sys.executable, "-m", "proxy.commands.plan", *argv], capture_output=True, text=True)
    # exit 1 is the answer "vLLM would not start with this", printed first
    assert out.returncode == (1 if block[1].startswith("DOES NOT FIT") else 0), out.stderr
    assert [line.rstrip() for line in out.stdout.strip().splitlines()] == [line.rstrip() for line in block[1:]]


def test_report_example(tmp_path, qwen3, qwen3_dir) -> None:
    # The traffic of tests/e2e/test_report.py (same seed), recorded by the proxy, then reported.
    rng = random.Random(20261129)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa"]
    log_path = tmp_path / "lengths.jsonl"

    def count(endpoint: str, body: dict) -> int:
        return qwen3.count_chat(body)

    with FakeVLLM(model=MODEL, max_model_len=4096, count_prompt=count) as fake:
        config = Config(upstream=UpstreamConfig(url=fake.base_url, timeout=10.0),
                        length_log=LengthLogConfig(path=str(log_path)))
        config.models[MODEL] = ModelConfig(tokenizer=str(qwen3_dir))
        with serve_in_thread(BrimfulApp(config)) as base, httpx.Client(base_url=base, timeout=10) as client:
            for _ in range(150):
                n_words = int(rng.lognormvariate(4.0, 0.8)) + 1
                client.post("/v1/chat/completions", json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": " ".join(rng.choice(words) for _ in range(n_words))}],
                    "max_tokens": rng.choice([4, 8, 16, 32, 64]),
                })
    block = block_after("$ brimful report")
    out = subprocess.run([sys.executable, "-m", "proxy.commands.report", str(log_path)],
                         capture_output=True, text=True, check=True).stdout
    assert [line.rstrip() for line in out.strip().splitlines()] == [line.rstrip() for line in block[1:]]


def report_output(*argv: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "proxy.commands.report", *argv],
                         capture_output=True, text=True, check=True).stdout
    return [line.rstrip() for line in out.strip().splitlines()]


def documented(marker: str) -> tuple[list[str], list[str]]:
    """(the documented command's arguments after `brimful report`, the output lines shown)."""
    block = block_after(marker)
    return block[0].split("brimful report", 1)[1].split(), [line.rstrip() for line in block[1:]]


def test_report_rising_example(tmp_path, qwen3, qwen3_dir) -> None:
    """Issue 16's traffic (tests/support/traffic.py) recorded by the proxy, then reported against Qwen3-8B."""
    from tests.support.traffic import issue16_mix, record_traffic

    log_path = tmp_path / "lengths.jsonl"
    record_traffic(log_path, qwen3, qwen3_dir, issue16_mix(), model=MODEL)
    argv, shown = documented("$ brimful report lengths.jsonl --preset Qwen3-8B")
    argv[argv.index("lengths.jsonl")] = str(log_path)
    assert report_output(*argv) == shown


def test_report_upstream_example(tmp_path, qwen3, qwen3_dir) -> None:
    """Six 301 + 600-token requests through the proxy, then one read of a real vLLM 0.32's /metrics as it
    was while six such requests fought over its 16 blocks (tests/data/vllm032_cpu/pressure_3.txt)."""
    from tests.realvllm.tiny_model import model_config
    from tests.support.traffic import record_traffic

    log_path = tmp_path / "lengths.jsonl"
    record_traffic(log_path, qwen3, qwen3_dir, [(292, 600)] * 6, model="tiny-qwen", max_model_len=1024)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(model_config(151_669)))
    argv, shown = documented("$ brimful report lengths.jsonl --upstream")
    with FakeVLLM(model="tiny-qwen") as vllm:
        vllm.metrics_text = (ROOT / "tests" / "data" / "vllm032_cpu" / "pressure_3.txt").read_text()
        argv = [{"lengths.jsonl": str(log_path), "http://127.0.0.1:8000": vllm.base_url,
                 "tiny-qwen/config.json": str(config)}.get(a, a) for a in argv]
        out = [line.replace(vllm.base_url, "http://127.0.0.1:8000") for line in report_output(*argv)]
    assert out == shown
