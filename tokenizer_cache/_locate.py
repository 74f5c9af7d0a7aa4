"""Find a model's tokenizer files on local disk: a plain directory or the HF cache.

Never downloads: brimful runs next to vLLM, which has already fetched the
model into the Hugging Face cache (`$HF_HOME/hub/models--ORG--NAME/snapshots/<rev>/`),
or the operator points at a directory.
"""

from __future__ import annotations

import os
import pathlib


def holds_tokenizer(directory: pathlib.Path) -> bool:
    """tokenizer.json, or a Mistral tokenizer file (vLLM's mistral mode needs no tokenizer.json)."""
    try:
        if not (directory.is_dir() and os.access(directory, os.R_OK)):
            return False
        if (directory / "tokenizer.json").is_file():
            return True
        return (directory / "tekken.json").is_file() or any(
            entry.is_file() for entry in directory.glob("tokenizer.model.v*")
        )
    except OSError:
        return False


def _looks_like_repo_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith((".", "~"))


def _cache_dir_name(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def _newest_snapshot(repo_dir: pathlib.Path) -> pathlib.Path | None:
    snapshots = repo_dir / "snapshots"
    try:
        candidates = [s for s in snapshots.iterdir() if holds_tokenizer(s)]
    except OSError:
        return None
    if not candidates:
        return None

    def age(snapshot: pathlib.Path) -> tuple[float, str]:
        try:
            return (snapshot.stat().st_mtime, snapshot.name)
        except OSError:
            return (0.0, snapshot.name)

    return max(candidates, key=age)


def default_hf_home() -> pathlib.Path:
    return pathlib.Path(os.environ.get("HF_HOME") or "~/.cache/huggingface").expanduser()


def find_tokenizer_dir(model_id: str, root: str | None, hf_home: str | None = None) -> pathlib.Path | None:
    """The directory to load `model_id`'s tokenizer from, or None.

    `root` wins when it is a readable directory holding tokenizer.json (or,
    for Mistral-format models, tekken.json / tokenizer.model.v*).
    Otherwise the HF cache under `hf_home` (default: $HF_HOME or
    ~/.cache/huggingface) is searched for `model_id`, then for `root` when it
    looks like ORG/NAME; the newest snapshot holding such a file is used.
    """
    if root:
        root_path = pathlib.Path(root).expanduser()
        if holds_tokenizer(root_path):
            return root_path.resolve()
    hub = (pathlib.Path(hf_home).expanduser() if hf_home else default_hf_home()) / "hub"
    repo_ids = [model_id] if model_id else []
    if root and _looks_like_repo_id(root) and root not in repo_ids:
        repo_ids.append(root)
    for repo_id in repo_ids:
        snapshot = _newest_snapshot(hub / _cache_dir_name(repo_id))
        if snapshot is not None:
            return snapshot
    return None
