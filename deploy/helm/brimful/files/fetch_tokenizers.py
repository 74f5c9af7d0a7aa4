"""Fetch only the tokenizer files of some models into a Hugging Face cache layout.

The brimful chart runs this in an init container (the brimful image, standard
library only) when brimful has no volume holding the model: each ORG/NAME[@rev]
given becomes $HF_HOME/hub/models--ORG--NAME/snapshots/<rev>/, where brimful
finds it by model id or by vLLM's `root`.  brimful itself never downloads.

    python fetch_tokenizers.py Qwen/Qwen3-8B deepseek-ai/DeepSeek-V3.1@main

Environment: HF_HOME (where the cache is), HF_ENDPOINT (default
https://huggingface.co, or a mirror), HF_TOKEN (gated models).  A file already
present is kept.  Exit status 1 when a required file cannot be fetched.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REQUIRED = ("tokenizer.json", "tokenizer_config.json")
# Read by brimful when present: the chat template, and what names the model family.
OPTIONAL = ("chat_template.jinja", "chat_template.json", "special_tokens_map.json", "config.json",
            "generation_config.json", "preprocessor_config.json")
TIMEOUT_S = 60


def snapshot_dir(hf_home: Path, repo: str, revision: str) -> Path:
    return hf_home / "hub" / ("models--" + repo.replace("/", "--")) / "snapshots" / revision


def file_url(endpoint: str, repo: str, revision: str, name: str) -> str:
    return f"{endpoint.rstrip('/')}/{repo}/resolve/{urllib.parse.quote(revision, safe='')}/{name}"


def fetch(url: str, target: Path, token: str | None) -> bool:
    """Download url to target (atomically); False when the file does not exist there (404)."""
    request = urllib.request.Request(url, headers={"User-Agent": "brimful-fetch-tokenizers"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            data = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(data)
    partial.replace(target)
    return True


def fetch_model(spec: str, hf_home: Path, endpoint: str, token: str | None) -> list[str]:
    """Fetch one ORG/NAME[@revision]; returns the problems (empty: done)."""
    repo, _, revision = spec.partition("@")
    revision = revision or "main"
    if repo.count("/") != 1 or not all(repo.split("/")):
        return [f"{spec!r} is not ORG/NAME[@revision]"]
    directory = snapshot_dir(hf_home, repo, revision)
    directory.mkdir(parents=True, exist_ok=True)
    problems = []
    for name in REQUIRED + OPTIONAL:
        target = directory / name
        if target.is_file():
            continue
        url = file_url(endpoint, repo, revision, name)
        try:
            found = fetch(url, target, token)
        except (OSError, urllib.error.URLError) as exc:
            found = False
            if name in REQUIRED:
                problems.append(f"{repo}: {name}: {exc}")
                continue
        if not found and name in REQUIRED:
            problems.append(f"{repo}: {name} not found at {url}")
    if not problems:
        print(f"{repo}@{revision}: tokenizer files in {directory}", flush=True)
    return problems


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: fetch_tokenizers.py ORG/NAME[@revision] ...", file=sys.stderr)
        return 2
    hf_home = Path(os.environ.get("HF_HOME") or "~/.cache/huggingface").expanduser()
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    token = os.environ.get("HF_TOKEN") or None
    problems = [p for spec in argv for p in fetch_model(spec, hf_home, endpoint, token)]
    for problem in problems:
        print(f"fetch_tokenizers: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
