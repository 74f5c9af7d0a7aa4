"""The documentation's examples, run for real: what README.md and docs/*.md show is what brimful prints.

The curl/openai examples run against a fake vLLM of the older, rejecting kind
(`max_model_len` 8192) serving `Qwen/Qwen3-8B` and counting with the real
Qwen3 tokenizer; `plan` and `report` are run with the documented arguments
and their output compared line by line; the `count` example's shell lines run
as written, with `brimful` on the PATH and a Hugging Face cache holding Qwen3.
The README's run command is run too: the checkout built and installed into a
venv of its own, its `brimful serve` in front of a vLLM that comes up late.

`test_every_example_is_run` holds the map from each fenced block of the
documentation to the test that runs it: a new example without a test fails it.
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
from tests.support.docs import BLOCKS, ROOT, block, block_after, python_block
from tests.support.fakevllm import FakeVLLM
from tests.support.servers import serve_in_thread
from tests.support.stack import fake_counter

MODEL = "Qwen/Qwen3-8B"       # the examples use a real model name


def documented_headers(block: list[str]) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in block if re.match(r"^x-brimful-[a-z-]+: ", line))


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
    """Run the documented python block containing `marker` with `old` replaced by `new`;
    (what it printed, what its comments say it prints, its namespace)."""
    source = python_block(marker).replace(old, new)
    printed: list[str] = []
    namespace: dict = {"print": lambda *a: printed.append(" ".join(map(str, a)))}
    exec(compile(source, "docs", "exec"), namespace)
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
    shown = block_after(f"$ curl -si localhost:8100{path} ")
    body = json.loads(re.search(r"-d '(\{.*\})'", " ".join(shown)).group(1))
    response = httpx.post(base + path, json=body, timeout=30)
    assert response.status_code == int(shown[2].split()[1])
    assert {k: response.headers[k] for k in documented_headers(shown)} == documented_headers(shown)
    assert json.loads(shown[-1].replace(", ...}", "}"))["id"].split("_")[0].split("-")[0] in response.json()["id"]
    direct = httpx.post(fake.base_url + path, json=body, timeout=30)
    shown = "\n".join(block(refusal))
    documented = re.search(r'"message":"(.*?) \.\.\."', shown).group(1)
    assert direct.status_code == 400 and direct.json()["error"]["message"].startswith(documented)


def test_python_example(stack) -> None:
    _, base = stack
    source = python_block("client.chat.completions.with_raw_response")
    source = source.replace("http://127.0.0.1:8100/v1", base + "/v1")
    printed: list[str] = []
    namespace = {"print": lambda *a: printed.append(" ".join(map(str, a)))}
    exec(compile(source, "README.md", "exec"), namespace)
    documented = re.findall(r"print\(.*\)\s+# (\S+)", source)
    assert printed == documented == ["clamped", "8177"]     # 8192 - 15: the whole room
    assert namespace["completion"].usage.completion_tokens == 8177


def test_curl_clamp_example(stack) -> None:
    fake, base = stack
    shown = block_after("$ curl -si localhost:8100/v1/chat/completions ")
    body = json.loads(re.search(r"-d '(\{.*\})'", " ".join(shown)).group(1))
    response = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == int(shown[2].split()[1])
    assert {k: response.headers[k] for k in documented_headers(shown)} == documented_headers(shown)
    # …and the same request straight to the (older, rejecting) vLLM:
    direct = httpx.post(fake.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert direct.status_code == 400
    direct_shown = " ".join(block("'max_tokens' or 'max_completion_tokens' is too large")[1:])
    documented = re.search(r'"message":"(.*?) \.\.\."', direct_shown).group(1)
    assert direct.json()["error"]["message"].startswith(documented)


def test_rejection_example(stack, qwen3) -> None:
    _, base = stack
    body = {"model": MODEL, "messages": [{"role": "user", "content": " ".join(["hello"] * 9000)}],
            "max_tokens": 100}
    response = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
    shown = block("\nx-brimful-action: rejected\n")
    assert response.status_code == int(shown[0].split()[1]) == 400
    assert {k: response.headers[k] for k in documented_headers(shown)} == documented_headers(shown)
    documented = json.loads(" ".join(shown[shown.index("") + 1:]))
    assert response.json() == documented


def shell_example(marker: str) -> tuple[str, list[str]]:
    """A `$ ` block as (the shell script it types, the output lines it shows after the last command)."""
    shown = block_after(marker)
    last = max(i for i, line in enumerate(shown) if line.startswith("$ "))
    end = last + 1
    script = [line.removeprefix("$ ") for line in shown[:end]]
    return "\n".join(script) + "\n", shown[end:]


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
    shown = block_after(marker)
    argv = shown[0].split("brimful plan", 1)[1].split()
    out = subprocess.run([sys.executable, "-m", "proxy.commands.plan", *argv], capture_output=True, text=True)
    # exit 1 is the answer "vLLM would not start with this", printed first
    assert out.returncode == (1 if shown[1].startswith("DOES NOT FIT") else 0), out.stderr
    assert [line.rstrip() for line in out.stdout.strip().splitlines()] == [line.rstrip() for line in shown[1:]]


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
    shown = block("\n$ brimful report lengths.jsonl\n")
    out = subprocess.run([sys.executable, "-m", "proxy.commands.report", str(log_path)],
                         capture_output=True, text=True, check=True).stdout
    assert [line.rstrip() for line in out.strip().splitlines()] == [line.rstrip() for line in shown[1:]]


def report_output(*argv: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "proxy.commands.report", *argv],
                         capture_output=True, text=True, check=True).stdout
    return [line.rstrip() for line in out.strip().splitlines()]


def documented(marker: str) -> tuple[list[str], list[str]]:
    """(the documented command's arguments after `brimful report`, the output lines shown)."""
    shown = block_after(marker)
    return shown[0].split("brimful report", 1)[1].split(), [line.rstrip() for line in shown[1:]]


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


# ----------------------------------------------------------------- the two commands, as written

def command_between(start: str, end: str) -> str:
    """The one-line command in the README between two marker comments (as .ci/run reads the test one)."""
    from tests.support.docs import between

    lines = [line for line in between("README.md", start, end).strip().splitlines() if not line.startswith("```")]
    assert len(lines) == 1, lines
    return lines[0]


def test_the_test_command_is_what_ci_runs() -> None:
    """.ci/run takes the test command from between the README's markers; the README shows that command."""
    awk = subprocess.run(["bash", "-c", (ROOT / ".ci" / "run").read_text().split("cmd=$(", 1)[1].split(")\n", 1)[0]],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert awk == command_between("<!-- test-command -->", "<!-- /test-command -->")
    steps = awk.split(" && ")
    assert steps[:2] == ["python3 -m venv .venv", ".venv/bin/pip install -c constraints.txt -e '.[test]'"]
    assert steps[2] == ".venv/bin/python -m pytest"
    project = (ROOT / "pyproject.toml").read_text()
    assert "\ntest = [" in project and '"pytest-xdist' in project    # the fast tier's -n 2


def mirror_hf_cache(tmp_path: Path, qwen3_dir: Path) -> Path:
    """A Hugging Face cache as vLLM leaves it after downloading Qwen/Qwen3-8B (its tokenizer files)."""
    snapshot = tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    for file in qwen3_dir.iterdir():
        (snapshot / file.name).symlink_to(file)
    return tmp_path / "hf"


def install_checkout(tmp_path: Path) -> Path:
    """`python3 -m venv .venv && .venv/bin/pip install .`: the checkout's tracked sources installed into a
    new venv as pip installs them (built in an isolated environment with setuptools from the package
    index, as `pip install .` does); only the dependencies are not fetched again: the new venv sees the
    running interpreter's. Returns the venv's bin/ folder."""
    import sysconfig

    src = tmp_path / "src"
    listed = subprocess.run(["git", "ls-files", "-z", "pyproject.toml", "README.md", "proxy", "tokenizer_cache"],
                            cwd=ROOT, capture_output=True, text=True, check=False)
    tracked = listed.stdout.split("\0") if listed.returncode == 0 else [   # not a git checkout: the tree
        str(p.relative_to(ROOT)) for top in ("proxy", "tokenizer_cache") for p in (ROOT / top).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts] + ["pyproject.toml", "README.md"]
    for name in filter(None, tracked):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes((ROOT / name).read_bytes())
    venv = tmp_path / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input",
           "--python", str(venv / "bin" / "python")]
    installed = subprocess.run([*pip, "install", "--no-deps", str(src)], capture_output=True, text=True, check=False)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run([str(venv / "bin" / "python"), "-c", where],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "_parent_dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import proxy; print(proxy.__file__)"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(site), where          # the installed copy, not a checkout
    return venv / "bin"


class Serving:
    """A `brimful serve` subprocess whose log lines are kept, and awaited by what they say."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        import threading

        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, text: str, timeout: float = 60) -> str:
        with self._changed:
            found = self._changed.wait_for(
                lambda: any(text in line for line in self.lines) or self.proc.poll() is not None, timeout)
            line = next((line for line in self.lines if text in line), None)
        assert found and line is not None, f"no log line with {text!r}:\n" + "\n".join(self.lines[-30:])
        return line

    def stop(self) -> int:
        import signal

        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        self._reader.join(10)
        return code


@pytest.mark.slow
def test_run_command_installs_and_serves(tmp_path, qwen3, qwen3_dir) -> None:
    """The README's run command, offline: install the checkout into a venv, run its `brimful serve` with the
    documented arguments in front of a vLLM that is not up yet (the log lines of docs/deployment.md), then
    the tour's curl request through it."""
    from tests.support.process import wait_listening, wait_until
    from tests.support.servers import free_port

    steps = command_between("<!-- run-command -->", "<!-- /run-command -->").split(" && ")
    assert steps[:2] == ["python3 -m venv .venv", ".venv/bin/pip install ."]
    serve = steps[2].split()
    assert serve[:2] == [".venv/bin/brimful", "serve"]
    bin_dir = install_checkout(tmp_path)
    port = free_port()
    documented_upstream = serve[serve.index("--upstream") + 1]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HF_HOME"] = str(mirror_hf_cache(tmp_path, qwen3_dir))

    def count(endpoint: str, body: dict) -> int:
        return qwen3.count_chat(body) if endpoint == "chat" else sum(qwen3.count_completion(body))

    with FakeVLLM(model=MODEL, max_model_len=8192, count_prompt=count, mode="legacy") as fake:
        fake.ready = False                      # vLLM still loading: its port refuses connections
        argv = [str(bin_dir / "brimful"), *[{documented_upstream: fake.base_url, "8100": str(port)}.get(a, a)
                                            for a in serve[1:]]]
        brimful = Serving(argv, env, tmp_path)
        try:
            waiting = brimful.wait_for("waiting for the upstream at")
            fake.ready = True
            answered = brimful.wait_for("answered GET /v1/models")
            base = f"http://127.0.0.1:{port}"
            assert wait_listening(port, brimful.proc)            # the line comes before uvicorn listens
            assert wait_until(lambda: httpx.get(base + "/ready", timeout=10).status_code == 200, timeout=60)
            shown = block_after("$ curl -si localhost:8100/v1/chat/completions ")
            body = json.loads(re.search(r"-d '(\{.*\})'", " ".join(shown)).group(1))
            response = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
            dashboard = httpx.get(base + "/dashboard", timeout=10)       # package data made it into the wheel
        finally:
            assert brimful.stop() == 0
    assert response.status_code == int(shown[2].split()[1])
    assert {k: response.headers[k] for k in documented_headers(shown)} == documented_headers(shown)
    assert dashboard.status_code == 200 and "<html" in dashboard.text.lower()
    # the lines as logged, without their time stamp; only the wait's length differs
    logged = [re.sub(r"^\S+ \S+ ", "", line).replace(fake.base_url, "http://127.0.0.1:8000")
              for line in (waiting, answered)]
    documented = block("\nWARNING brimful.models: waiting for the upstream at")
    assert [re.sub(r"after \d+ s", "after N s", line) for line in logged] == \
        [re.sub(r"after \d+ s", "after N s", line) for line in documented]
    assert documented_upstream == "http://127.0.0.1:8000"


@pytest.mark.slow
def test_workers_example(tmp_path, qwen3, qwen3_dir) -> None:
    """docs/deployment.md's `brimful serve --upstream … --workers 2`: two workers on one port, both ready."""
    from tests.support.process import BrimfulProcess, wait_until
    from tests.workers.test_supervisor import all_ready

    [line] = block_after("brimful serve --upstream http://127.0.0.1:8000 --workers 2")
    argv = line.split()[2:]
    with FakeVLLM(max_model_len=4096, count_prompt=fake_counter(qwen3)) as fake:
        argv[argv.index("--upstream") + 1] = fake.base_url
        brimful = BrimfulProcess(fake.base_url, tmp_path, qwen3_dir, extra_args=argv)
        try:
            assert wait_until(lambda: all_ready(brimful.base_url), timeout=60), "\n".join(brimful.lines[-30:])
            response = httpx.post(brimful.base_url + "/v1/chat/completions", timeout=30, json={
                "model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 65535})
        finally:
            assert brimful.stop() == 0
    assert response.status_code == 200 and response.headers["x-brimful-action"] == "clamped"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, qwen3, qwen3_dir) -> list[str]:
    """Three length records as brimful writes them (a pass, a clamp, a pass), for the report pipelines."""
    from tests.support.traffic import record_traffic

    log_path = tmp_path_factory.mktemp("recorded") / "lengths.jsonl"
    record_traffic(log_path, qwen3, qwen3_dir, [(40, 16), (90, 65535), (12, 4)], model=MODEL)
    return log_path.read_text().splitlines()


def brimful_on_path(tmp_path: Path) -> dict[str, str]:
    """The environment of a shell with `brimful` on the PATH, as after `. .venv/bin/activate`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "brimful").write_text(f'#!/bin/sh\nexec {sys.executable} -m proxy.cli "$@"\n')
    (bin_dir / "brimful").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}


def test_kubectl_log_pipeline_reports_the_records_only(tmp_path, recorded) -> None:
    """docs/deployment.md's `… | grep '^{"ts":[0-9]' | brimful report -` over a container's interleaved output:
    the report of the records alone, nothing counted as malformed."""
    import logging

    from proxy.logs import JsonFormatter

    shown = " ".join(block("\nkubectl -n ai logs -l app.kubernetes.io/instance=brimful")).replace("\\ ", "")
    pipeline = shown.split(" | ", 1)[1]
    assert pipeline == """grep '^{"ts":[0-9]' | brimful report -"""
    log_path = tmp_path / "lengths.jsonl"
    log_path.write_text("\n".join(recorded) + "\n")
    records = recorded
    json_log = JsonFormatter().format(logging.LogRecord("brimful.models", logging.INFO, "", 0, "hi", None, None))
    mixed = [records[0], "2026-12-02 01:50:00,123 INFO brimful.app: started", records[1], json_log, records[2]]
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", pipeline], input="\n".join(mixed) + "\n",
                         env=brimful_on_path(tmp_path),
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("3 records from 1 file(s) (3 lines; 0 malformed and skipped")
    assert out.split("\n", 1)[1] == report_output_text(str(log_path)).split("\n", 1)[1]


def report_output_text(*argv: str) -> str:
    return subprocess.run([sys.executable, "-m", "proxy.commands.report", *argv],
                          capture_output=True, text=True, check=True).stdout


def test_volume_report_example_merges_every_pods_file(tmp_path, recorded) -> None:
    """docs/deployment.md's `kubectl exec … -- sh -c 'brimful report /var/lib/brimful/*.jsonl'`, the inner
    command run over two pods' files (the chart's volume mode writes /var/lib/brimful/<pod>.jsonl)."""
    [line] = block("\nkubectl -n ai exec deploy/brimful -c brimful -- sh -c")
    inner = re.search(r"sh -c '(.*)'$", line).group(1)
    assert inner == "brimful report /var/lib/brimful/*.jsonl"
    folder = tmp_path / "lengths"
    folder.mkdir()
    (folder / "brimful-a.jsonl").write_text(recorded[0] + "\n")
    (folder / "brimful-b.jsonl").write_text("\n".join(recorded[1:]) + "\n")
    out = subprocess.run(["sh", "-c", inner.replace("/var/lib/brimful", str(folder))], env=brimful_on_path(tmp_path),
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("3 records from 2 file(s) (3 lines; 0 malformed and skipped")


# ----------------------------------------------------------------- every example has its test

# A fenced block of README.md or docs/*.md → the test that runs it (or checks it against the files
# it names, where it needs what this machine lacks: Docker, a cluster).  Each block must match
# exactly one entry, by a piece of its text ("\n" + text: a line's start); a test of this module is
# named alone, one elsewhere as "path::name" under tests/.
FLEET = "sizing/test_engine.py::test_the_fleet_pages_examples_run"
RUN_BY: dict[str, str] = {
    "\npython3 -m venv .venv && .venv/bin/pip install . &&": "test_run_command_installs_and_serves",
    "\nWARNING brimful.models: waiting for the upstream": "test_run_command_installs_and_serves",
    "\npython3 -m venv .venv && .venv/bin/pip install -c constraints.txt": "test_the_test_command_is_what_ci_runs",
    "client.chat.completions.with_raw_response": "test_python_example",
    "\n$ curl -si localhost:8100/v1/chat/completions ": "test_curl_clamp_example",
    "'max_tokens' or 'max_completion_tokens' is too large": "test_curl_clamp_example",
    "\nx-brimful-action: rejected\n": "test_rejection_example",
    "\n$ brimful report lengths.jsonl\n": "test_report_example",
    "\n$ brimful report lengths.jsonl --preset Qwen3-8B": "test_report_rising_example",
    "\n$ brimful report lengths.jsonl --upstream": "test_report_upstream_example",
    "\n$ brimful plan --preset Qwen3-8B": "test_plan_example",
    "\n$ brimful plan --preset Llama-3.1-70B": "test_plan_example",
    "\n$ cat > request.json": "test_count_example_runs_as_written",
    "client.responses.with_raw_response": "test_surface_python_examples",
    "anthropic.Anthropic(": "test_surface_python_examples",
    "\n$ curl -si localhost:8100/v1/responses ": "test_surface_curl_examples",
    "\n$ curl -si localhost:8100/v1/messages ": "test_surface_curl_examples",
    "max_output_tokens=65535 cannot be greater": "test_surface_curl_examples",
    "max_completion_tokens=65535 cannot be greater": "test_surface_curl_examples",
    "\nbrimful serve --upstream http://127.0.0.1:8000 --workers 2": "test_workers_example",
    "\n[[upstreams]]\nname = \"long\"": "test_config.py::test_the_documented_pools_are_two_upstreams",
    "\nbrimful serve --upstream http://127.0.0.1:8001 --upstream":
        "test_config.py::test_upstream_flag_given_twice_makes_a_second_upstream",
    "\nkubectl -n ai logs ": "test_kubectl_log_pipeline_reports_the_records_only",
    "\nkubectl -n ai exec deploy/brimful": "test_volume_report_example_merges_every_pods_file",
    "\nLAYERS: list[set[str]] = [":
        "test_docs_reference.py::test_the_architecture_page_shows_the_layers_the_layout_test_asserts",
    "docker compose --profile gpu up -d": "deploy/test_files.py::test_the_documented_compose_commands",
    "\ndocker build -t registry.example.com/brimful":
        "deploy/test_helm.py::test_the_documented_install_renders_what_the_docs_say",
    "seriesQuery: 'brimful_in_flight_requests": "deploy/test_helm.py::test_the_documented_adapter_rule_feeds_the_hpa",
    "\nmin_completion_tokens_by_surface = { messages = 3000 }":
        "test_config.py::test_the_agents_page_configuration_loads",
    '\ntrim = "oldest"': "test_config.py::test_the_agents_page_configuration_loads",
    "\npython bench/fleet_bench.py --records 1000000": FLEET,
    "TO '/tmp/old.jsonl' (FORMAT json)": FLEET,
    "FROM read_parquet('/tmp/fleet_day/*.parquet') GROUP BY model": FLEET,
}


def test_every_example_is_run() -> None:
    unclaimed = [(b.doc, b.line, b.lines[:1]) for b in BLOCKS if not any(k in "\n" + b.text for k in RUN_BY)]
    assert unclaimed == [], "examples no test runs: add the test and its RUN_BY entry"
    for b in BLOCKS:
        claims = [k for k in RUN_BY if k in "\n" + b.text]
        assert len(claims) == 1 or len({RUN_BY[k] for k in claims}) == 1, (b.doc, b.line, claims)
    for key, target in RUN_BY.items():
        assert any(key in "\n" + b.text for b in BLOCKS), f"RUN_BY entry {key!r} matches no example"
        path, _, name = target.rpartition("::")
        source = (ROOT / "tests" / (path or "test_docs.py")).read_text()
        assert name.startswith("test_") and re.search(rf"^def {name}\(", source, re.M), target
