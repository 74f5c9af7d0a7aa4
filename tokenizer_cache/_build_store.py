"""transformers 5's builds kept on disk, so a process builds a tokenizer once per machine, not once per start.

A build (`_loader.build_transformers5`) costs 0.4-4.8 s of CPU per model and
every process paid it: each `serve --workers N` worker, each replacement of
a worker that died, each restart.  Its result is a pure function of what
AutoTokenizer reads (`_model._build_key`: the tokenizer files' bytes, the
config fields that pick the class, the id vLLM passes) and of the
transformers and tokenizers releases, so that is the file's name here and a
stored build is the build.  Nothing is trusted that does not parse as one;
any failure to read or write costs only the rebuild.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import tempfile
from importlib import metadata
from typing import Any

from ._loader import BuiltBackend

logger = logging.getLogger("brimful.tokenizer")

# Bump when what is stored, or how a build is made from the folder, changes.
FORMAT = 1
MAX_ENTRIES = 64  # ~5-13 MB each for the large vocabularies


def default_directory() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(pathlib.Path.home() / ".cache")
    return pathlib.Path(base) / "brimful" / "tokenizer-builds"


def _release(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


class BuildStore:
    """Builds by key in `directory` (None: nothing kept)."""

    def __init__(self, directory: pathlib.Path | None) -> None:
        self.directory = directory
        self._releases = f"{_release('transformers')}\0{_release('tokenizers')}"

    def _path(self, key: tuple[Any, ...]) -> pathlib.Path | None:
        if self.directory is None:
            return None
        digest = hashlib.sha256(f"{FORMAT}\0{self._releases}\0{key!r}".encode()).hexdigest()
        return self.directory / f"{digest}.json"

    def get(self, key: tuple[Any, ...]) -> BuiltBackend | None:
        path = self._path(key)
        if path is None:
            return None
        try:
            stored = json.loads(path.read_bytes())
            built = BuiltBackend(spec=str(stored["spec"]), tokenizer_class=str(stored["tokenizer_class"]),
                                 transformers_version=str(stored["transformers_version"]),
                                 split_special_tokens=bool(stored["split_special_tokens"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return built

    def put(self, key: tuple[Any, ...], built: BuiltBackend) -> None:
        path = self._path(key)
        if path is None:
            return
        data = json.dumps({"spec": built.spec, "tokenizer_class": built.tokenizer_class,
                           "transformers_version": built.transformers_version,
                           "split_special_tokens": built.split_special_tokens}).encode()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False) as tmp:
                tmp.write(data)
            os.replace(tmp.name, path)   # whole or absent: a reader never sees half a build
            self._prune(path.parent)
        except OSError as exc:
            logger.debug("could not keep the tokenizer build in %s: %s", path.parent, exc)

    @staticmethod
    def _prune(directory: pathlib.Path) -> None:
        entries = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for stale in entries[MAX_ENTRIES:]:
            stale.unlink(missing_ok=True)


_store = BuildStore(default_directory())


def build_store() -> BuildStore:
    return _store


def use_build_store(directory: str | os.PathLike[str] | None) -> BuildStore:
    """Where this process keeps builds (`[tokenizers] build_cache_dir`; "" or None: nowhere); the old store."""
    global _store
    previous = _store
    _store = BuildStore(pathlib.Path(directory).expanduser() if directory else None)
    return previous
