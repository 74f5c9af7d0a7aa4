"""The real agent CLIs (Claude Code, Codex, opencode), run non-interactively against a local base URL.

They are npm packages installed outside the clone (`.ci/run`:
`~/.cache/brimful/npm`, or `$BRIMFUL_NPM_DIR`; opencode's plugin package in
its `opencode-config` folder, so opencode finds it installed and downloads
nothing: `_opencode_config`). Each run gets a fresh HOME
(and CODEX_HOME), an empty working directory, no telemetry and a timeout;
the URL is loopback, so nothing leaves the machine. A run given a `session`
folder keeps its HOME and working directory there instead, so the next run in
that folder can continue the conversation (`claude -p --continue`, `codex exec
resume --last`, `opencode run --continue`), and the CLI's own transcript can be
read afterwards (`compactions`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REQUIRE = os.environ.get("BRIMFUL_REQUIRE_CLIENTS", "").lower() in ("1", "true", "yes", "require")


def npm_dir() -> Path:
    override = os.environ.get("BRIMFUL_NPM_DIR")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "brimful" / "npm"


# What opencode installs into each of its config folders at start-up (its `Npm.install`), put
# there by .ci/run once; opencode skips the install when the folder's node_modules exists and
# its package-lock.json names every package of its package.json.
OPENCODE_CONFIG = "opencode-config"


def cli(name: str) -> Path | None:
    """The installed CLI `claude`, `codex` or `opencode`, or None."""
    path = npm_dir() / "node_modules" / ".bin" / name
    return path if path.exists() else None


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any]:
        """Claude Code's `--output-format json` result (the last JSON line of stdout)."""
        for line in reversed(self.stdout.strip().splitlines()):
            if line.startswith("{"):
                return dict(json.loads(line))
        raise AssertionError(f"no JSON result in the output:\n{self.stdout[-2000:]}\n{self.stderr[-2000:]}")

    def events(self) -> list[dict[str, Any]]:
        """Every JSON line of stdout (`codex exec --json`, `opencode run --format json`)."""
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith("{")]


def _jsonl(folder: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(folder.rglob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("{"):
                yield json.loads(line)


def claude_compactions(session: Path) -> list[dict[str, Any]]:
    """The compactions Claude Code wrote in a `session` folder's transcript: each boundary's
    `compactMetadata` (`trigger`, `preTokens`: its own estimate of the prompt it compacted)."""
    return [entry.get("compactMetadata") or {} for entry in _jsonl(session / "home" / ".claude" / "projects")
            if entry.get("type") == "system" and entry.get("subtype") == "compact_boundary"]


def codex_compactions(session: Path) -> int:
    """How often Codex replaced a `session` folder's history by a summary (`compacted` lines of its rollouts)."""
    return sum(1 for entry in _jsonl(session / "codex" / "sessions") if entry.get("type") == "compacted")


def opencode_compactions(session: Path) -> int:
    """How many summaries opencode wrote in a `session` folder (assistant messages of mode
    `compaction` in its database)."""
    database = session / "home" / ".local" / "share" / "opencode" / "opencode.db"
    with contextlib.closing(sqlite3.connect(database)) as connection:
        rows = connection.execute("SELECT data FROM message").fetchall()
    return sum(1 for (data,) in rows if json.loads(data).get("mode") == "compaction")


def _opencode_config(home: Path) -> None:
    """opencode's config folder in a fresh HOME, its dependencies already installed: the plugin
    package .ci/run installed (`OPENCODE_CONFIG`), linked, with its package.json and lock. Without
    them each run npm-installs `@opencode-ai/plugin` from registry.npmjs.org into the folder."""
    installed = npm_dir() / OPENCODE_CONFIG
    folder = home / ".config" / "opencode"
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "node_modules").exists():
        (folder / "node_modules").symlink_to(installed / "node_modules", target_is_directory=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(installed / name, folder / name)


def _base_env(home: Path) -> dict[str, str]:
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "TERM") if k in os.environ}
    return {**keep, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "NO_PROXY": "127.0.0.1,localhost",
            "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1"}


@contextlib.contextmanager
def _folders(session: Path | None, prefix: str, *names: str) -> Iterator[list[Path]]:
    """`names` made as sub-folders of `session` (kept: the next run continues there), or of a
    temporary folder removed after the run."""
    with contextlib.ExitStack() as stack:
        root = session if session is not None else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
        folders = [root / name for name in names]
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
        yield folders


def _run(command: list[str], work: Path, env: dict[str, str], timeout: float) -> Run:
    """A CLI run to its end in `work`, with no terminal to ask on (stdin closed)."""
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False, stdin=subprocess.DEVNULL)
    return Run(done.returncode, done.stdout, done.stderr)


def run_claude(base_url: str, model: str, prompt: str, *, timeout: float = 240,
               extra_env: dict[str, str] | None = None, args: tuple[str, ...] = (),
               session: Path | None = None) -> Run:
    """`claude -p PROMPT --output-format json` against `base_url` (Anthropic's API shape); in a
    `session` folder that held a run before, pass ``args=("--continue",)`` to go on with it."""
    binary = cli("claude")
    assert binary is not None, "Claude Code is not installed"
    with _folders(session, "brimful-claude-", "home", "work") as (home, work):
        env = {**_base_env(home), "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "dummy",
               "ANTHROPIC_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model,
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", **(extra_env or {})}
        return _run([str(binary), "-p", prompt, "--output-format", "json", *args], work, env, timeout)


def run_codex(base_url: str, model: str, prompt: str, *, timeout: float = 240,
              context_window: int | None = None, headers: dict[str, str] | None = None,
              session: Path | None = None, resume: bool = False) -> Run:
    """`codex exec --skip-git-repo-check PROMPT` with a provider whose base_url is `base_url` (…/v1);
    `resume`: `codex exec resume --last PROMPT`, the `session` folder's latest conversation."""
    binary = cli("codex")
    assert binary is not None, "Codex is not installed"
    with _folders(session, "brimful-codex-", "home", "work", "codex") as (home, work, codex_home):
        window = f"model_context_window = {context_window}\n" if context_window else ""
        (codex_home / "config.toml").write_text(
            f'model = "{model}"\nmodel_provider = "brimful"\n{window}'
            "[model_providers.brimful]\n"
            f'name = "brimful"\nbase_url = "{base_url}"\nwire_api = "responses"\nenv_key = "BRIMFUL_TEST_KEY"\n'
            "request_max_retries = 0\nstream_max_retries = 0\n"
            + "".join(f'http_headers.{name} = "{value}"\n' for name, value in (headers or {}).items()))
        env = {**_base_env(home), "CODEX_HOME": str(codex_home), "BRIMFUL_TEST_KEY": "dummy", "RUST_LOG": "error"}
        command = [str(binary), "exec", "--skip-git-repo-check", "--json", *(["resume", "--last"] if resume else [])]
        return _run([*command, prompt], work, env, timeout)


def run_opencode(base_url: str, model: str, prompt: str, *, context: int, output: int,
                 timeout: float = 240, session: Path | None = None, resume: bool = False) -> Run:
    """`opencode run --format json PROMPT` with an `@ai-sdk/openai-compatible` provider at `base_url`
    (…/v1: chat completions), the model's `limit` as its config says (opencode compacts by it);
    `resume`: `opencode run --continue`, the `session` folder's last conversation."""
    binary = cli("opencode")
    assert binary is not None, "opencode is not installed"
    with _folders(session, "brimful-opencode-", "home", "work") as (home, work):
        _opencode_config(home)
        provider = {"npm": "@ai-sdk/openai-compatible", "name": "brimful",
                    "options": {"baseURL": base_url, "apiKey": "dummy"},
                    "models": {model: {"name": model, "limit": {"context": context, "output": output}}}}
        (work / "opencode.json").write_text(json.dumps({
            "$schema": "https://opencode.ai/config.json", "model": f"brimful/{model}", "autoupdate": False,
            "share": "disabled", "provider": {"brimful": provider}}))
        env = {**_base_env(home), "XDG_DATA_HOME": str(home / ".local" / "share"),
               "XDG_CACHE_HOME": str(home / ".cache"), "OPENCODE_DISABLE_MODELS_FETCH": "1",
               "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
               "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1"}
        run = _run([str(binary), "run", "--format", "json", *(["--continue"] if resume else []), prompt],
                   work, env, timeout)
        assert not (home / ".npm").exists(), "opencode ran npm (a download at test time): see _opencode_config"
        return run


AI_SDK_AGENT = Path(__file__).resolve().parents[1] / "clients" / "ai_sdk_agent.cjs"


def run_ai_sdk(base_url: str, model: str, max_output_tokens: int, *, trim: str | None = None,
               timeout: float = 120) -> dict[str, Any]:
    """tests/clients/ai_sdk_agent.cjs: the AI SDK's tool loop over @ai-sdk/openai-compatible (…/v1)."""
    node = shutil.which("node")
    assert node is not None, "node is not installed"
    done = subprocess.run([node, str(AI_SDK_AGENT), str(npm_dir()), base_url, model,
                           str(max_output_tokens), *([trim] if trim else [])],
                          capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL,
                          env={**os.environ, "NO_PROXY": "127.0.0.1,localhost"})
    return Run(done.returncode, done.stdout, done.stderr).json()


def have(name: str) -> bool:
    """`claude`, `codex`, `opencode` (with its plugin package, `OPENCODE_CONFIG`), or `ai` (the AI SDK
    with @ai-sdk/openai-compatible)."""
    if name == "ai":
        modules = npm_dir() / "node_modules"
        return all((modules / p / "package.json").exists() for p in ("ai", "@ai-sdk/openai-compatible", "zod")) \
            and shutil.which("node") is not None
    if name == "opencode" and not (npm_dir() / OPENCODE_CONFIG / "package-lock.json").exists():
        return False
    return cli(name) is not None and shutil.which("node") is not None


def need(name: str) -> None:
    """Skip the test when CLI `name` (see `have`) is not installed; fail instead under BRIMFUL_REQUIRE_CLIENTS (CI)."""
    if have(name):
        return
    reason = f"{name} is not installed in {npm_dir()} (.ci/run installs it: npm i into that folder)"
    if REQUIRE:
        pytest.fail(reason + " but BRIMFUL_REQUIRE_CLIENTS is set")
    pytest.skip(reason)
