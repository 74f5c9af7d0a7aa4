"""Which rules turn a model folder into the tokenizer vLLM encodes with.

vLLM loads a model's tokenizer with transformers' `AutoTokenizer`.  Up to
vLLM 0.19.0 that was transformers 4, whose fast tokenizers load
`tokenizer.json` as it is ("tokenizer_json").  From vLLM 0.19.1 (vLLM
#30566) it is transformers 5 (5.19.0 for vLLM 0.32), and there
`AutoTokenizer` picks a tokenizer class from `tokenizer_config.json`'s
`tokenizer_class`, config.json's `model_type` (its
MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS table) and the model id; a class
with its own `__init__` (LlamaTokenizer, Qwen2Tokenizer, GemmaTokenizer, ...)
builds its own normalizer, pre-tokenizer and decoder and takes only the
vocabulary and merges from tokenizer.json ("transformers5").  Where the two
disagree vLLM counts what the class built: Phi-3's files under
LlamaTokenizer get Metaspace(prepend_scheme="first") -- no "▁" after a
special token -- and DeepSeek-R1-Distill-Llama's byte-level vocabulary gets
a SentencePiece-style Metaspace pre-tokenizer.

The class rules are not reimplemented here: transformers itself builds the
backend (no torch needed) and its serialisation is what the counting engine
loads, so the count is exact by construction for the transformers version
installed (docs/counting-loader.md has the measurements behind the choice).
`loader_for_vllm` maps an upstream's `GET /version` to the rules it uses.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("brimful.tokenizer")

TRANSFORMERS5 = "transformers5"
TOKENIZER_JSON = "tokenizer_json"
AUTO = "auto"
LOADERS = (AUTO, TRANSFORMERS5, TOKENIZER_JSON)
# The first vLLM release that loads tokenizers with transformers 5 (vLLM #30566).
FIRST_TRANSFORMERS5_VLLM = (0, 19, 1)
_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


class LoaderUnavailable(Exception):
    """transformers 5 cannot build this folder's tokenizer here (not installed, wrong major, refused)."""


def check_loader(name: str) -> str:
    if name not in LOADERS:
        raise ValueError(f"tokenizer_loader must be one of {', '.join(LOADERS)}, got {name!r}")
    return name


def loader_for_vllm(version: str | None) -> str:
    """The loader rules of the transformers a vLLM release ships with.

    `version` is vLLM's `GET /version` answer ("0.32.0", "0.11.1rc2",
    "0.10.2.dev4+g..."); None or an unreadable one (not vLLM, or an old
    release without the route) gives vLLM 0.32's, the release brimful follows.
    """
    match = _VERSION.match(version or "")
    if match is None:
        return TRANSFORMERS5
    release = (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))
    return TRANSFORMERS5 if release >= FIRST_TRANSFORMERS5_VLLM else TOKENIZER_JSON


def resolve_loader(name: str, directory: pathlib.Path) -> str:
    """A concrete loader for `name` and the folder.

    "auto": transformers5 (vLLM 0.32's) for a model folder, one with a
    config.json; tokenizer.json as it is for a folder of tokenizer files only.
    transformers 5 picks the class from the model's `model_type` and id, which
    such a folder does not hold (the copies in shared/models name them in
    SOURCES.md): loaded bare, Phi-3's files would become a LlamaTokenizer,
    although vLLM serving microsoft/Phi-3-mini-4k-instruct (model_type phi3)
    uses tokenizer.json as it is (tests/tokenizer_cache/test_loader_survey.py);
    "transformers5" forces the bare-folder load.  A Hugging Face cache
    snapshot has the model's config.json, so it gets transformers5.
    """
    if check_loader(name) != AUTO:
        return name
    return TRANSFORMERS5 if (directory / "config.json").is_file() else TOKENIZER_JSON


_SNAPSHOT = re.compile(r"(?:^|/)models--([^/]+?)--([^/]+)/snapshots/[^/]+/?$")


def hub_id(directory: pathlib.Path) -> str | None:
    """The model id of a Hugging Face cache snapshot (".../models--org--name/snapshots/rev"), else None.

    transformers matches some ids (deepseek-ai/deepseek-r1-distill-llama-*) to
    tokenizer.json as it is, but vLLM 0.32 hands AutoTokenizer the snapshot's
    path, not the id, so the counting loader does not pass it on by default.
    """
    match = _SNAPSHOT.search(directory.as_posix())
    return f"{match.group(1)}/{match.group(2)}" if match else None


@dataclass(frozen=True)
class BuiltBackend:
    """What transformers 5 built for a folder: the serialised backend and who built it."""

    spec: str  # backend_tokenizer.to_str(): a tokenizer.json the engines load
    tokenizer_class: str  # e.g. "LlamaTokenizer", "TokenizersBackend" (tokenizer.json as it is)
    transformers_version: str
    split_special_tokens: bool


@contextlib.contextmanager
def _quiet_transformers(transformers: Any) -> Iterator[None]:
    """transformers warns about things vLLM's own log already shows (e.g. the Mistral regex note)."""
    tf_logging = transformers.utils.logging
    before = tf_logging.get_verbosity()
    tf_logging.set_verbosity_error()
    try:
        yield
    finally:
        tf_logging.set_verbosity(before)


def _import_transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise LoaderUnavailable(f"transformers is not installed ({exc})") from exc
    version = str(transformers.__version__)
    if not version.startswith("5."):
        raise LoaderUnavailable(f"transformers {version} is installed; these rules need transformers 5")
    return transformers


def build_transformers5(directory: pathlib.Path, name_or_path: str | None = None) -> BuiltBackend:
    """The backend `AutoTokenizer.from_pretrained(directory)` builds, as vLLM 0.32 calls it.

    `name_or_path` is the model id vLLM was started with when it is not the
    folder (transformers maps some ids, e.g. deepseek-ai/deepseek-r1-distill-llama-*,
    to tokenizer.json as it is).  Never downloads; remote code is not run
    (vLLM's default).  Raises LoaderUnavailable when it cannot build.
    """
    transformers = _import_transformers()
    kwargs: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
    try:
        with _quiet_transformers(transformers):
            if name_or_path is not None:
                kwargs["config"] = _config(transformers, directory, name_or_path)
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory), **kwargs)
            backend = tokenizer.backend_tokenizer
    except Exception as exc:  # transformers raises ValueError, OSError, its own kinds
        raise LoaderUnavailable(f"transformers {transformers.__version__} cannot load it: "
                                f"{type(exc).__name__}: {str(exc)[:200]}") from exc
    return BuiltBackend(
        spec=backend.to_str(),
        tokenizer_class=type(tokenizer).__name__,
        transformers_version=str(transformers.__version__),
        split_special_tokens=bool(backend.encode_special_tokens),
    )


def _config(transformers: Any, directory: pathlib.Path, name_or_path: str) -> Any:
    """The model config AutoTokenizer would read, named as vLLM names it."""
    try:
        config = transformers.AutoConfig.from_pretrained(str(directory), local_files_only=True)
    except (ValueError, OSError):
        config = transformers.PretrainedConfig.from_pretrained(str(directory), local_files_only=True)
    config._name_or_path = name_or_path
    return config
