"""The tokenizer loader: which rules build a model's tokenizer, chosen from the upstream's version or the config.

What transformers 5 builds for each shipped tokenizer is surveyed in test_loader_survey.py (slow); here:
the version rule, the folder rule of "auto", and the choice followed through a running brimful to /stats.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.config import Config, ConfigError, load_config
from proxy.upstream.models import ModelRegistry
from tests.conftest import MODELS
from tests.support import fakevllm
from tests.support.stack import CHAT, MODEL, running_stack
from tokenizer_cache import load_model_tokenizer, loader_for_vllm
from tokenizer_cache._loader import hub_id, resolve_loader

PHI3 = MODELS / "microsoft--Phi-3-mini-4k-instruct"

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "How far is a marathon?"}], "max_tokens": 8}


@pytest.mark.parametrize(("version", "loader"), [
    ("0.32.0", "transformers5"), ("0.19.1", "transformers5"), ("0.20.0rc1", "transformers5"),
    ("v0.25.1", "transformers5"), ("0.19.0", "tokenizer_json"), ("0.11.2.dev4+g1a2b3c", "tokenizer_json"),
    ("0.19", "tokenizer_json"), (None, "transformers5"), ("", "transformers5"), ("nightly", "transformers5"),
])  # fmt: skip
def test_vllm_from_0_19_1_loads_with_transformers_5(version: str | None, loader: str) -> None:
    assert loader_for_vllm(version) == loader


def test_auto_applies_transformers_5_to_model_folders_only(tmp_path: Path) -> None:
    assert resolve_loader("auto", tmp_path) == "tokenizer_json"  # tokenizer files only: no model_type to go by
    (tmp_path / "config.json").write_text('{"model_type": "phi3"}')
    assert resolve_loader("auto", tmp_path) == "transformers5"
    assert resolve_loader("tokenizer_json", tmp_path) == "tokenizer_json"
    with pytest.raises(ValueError, match="tokenizer_loader must be one of auto, transformers5, tokenizer_json"):
        resolve_loader("transformers4", tmp_path)


def test_a_hugging_face_cache_snapshot_names_its_hub_id() -> None:
    snapshot = Path("/hf/hub/models--deepseek-ai--DeepSeek-R1-Distill-Llama-8B/snapshots/6a6f4aa")
    assert hub_id(snapshot) == "deepseek-ai/DeepSeek-R1-Distill-Llama-8B"
    assert hub_id(Path("/models/deepseek-ai--DeepSeek-R1-Distill-Llama-8B")) is None


async def test_the_registry_reads_the_upstream_version_with_its_first_model_list() -> None:
    calls: list[str] = []

    async def models() -> Any:
        calls.append("models")
        return {"data": [{"id": "m", "max_model_len": 4096}]}

    async def version() -> Any:
        calls.append("version")
        return {"version": "0.32.0"}

    registry = ModelRegistry(Config(), models, fetch_version=version)
    assert await registry.refresh() and registry.version == "0.32.0"
    assert await registry.refresh()                       # asked again with every list
    assert calls == ["models", "version", "models", "version"]

    async def no_route() -> Any:
        raise RuntimeError("404 Not Found")

    old = ModelRegistry(Config(), models, fetch_version=no_route)
    assert await old.refresh() and old.version is None    # then vLLM 0.32's rules apply


async def test_a_vllm_upgraded_in_place_is_a_new_model_list_and_a_failed_version_read_is_not() -> None:
    """Same models, another vLLM: its tokenizers are built by other rules, so its models start over."""
    answers: list[Any] = [{"version": "0.18.0"}, {"version": "0.18.0"}, RuntimeError("timed out"),
                          {"version": "0.32.0"}]

    async def models() -> Any:
        return {"data": [{"id": "m", "max_model_len": 4096}]}

    async def version() -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    registry = ModelRegistry(Config(), models, fetch_version=version)
    changes: list[str | None] = []
    registry.on_change.append(lambda _: changes.append(registry.version))
    for _ in range(4):
        assert await registry.refresh()
    assert changes == ["0.18.0", "0.32.0"]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory, qwen3_dir: Path) -> Path:
    """Qwen3-8B's files with its official config.json model_type (a model folder), loaded once
    both ways here so that brimful's start-up (one shared load per process) stays quick."""
    folder = tmp_path_factory.mktemp("qwen3")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).symlink_to(qwen3_dir / name)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    for loader in ("auto", "tokenizer_json"):
        load_model_tokenizer(folder, tokenizer_loader=loader)
    return folder


def _counting(stack: Any) -> dict[str, Any]:
    assert stack.http.post(CHAT, json=BODY).status_code == 200
    return dict(stack.http.get("/stats").json()["counting"][MODEL])


def test_stats_show_the_loader_vllm_0_32_implies(model_folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", "brimful")
    with running_stack(model_folder) as stack:
        state = _counting(stack)
    assert (state["tokenizer_loader"], state["tokenizer_class"], state["tokenizer_loader_fallback"]) == (
        "transformers5", "Qwen2Tokenizer", None)
    assert state["mode"] == "local"                      # the parity probe found no drift
    assert any(f"model {MODEL}: tokenizer" in r.getMessage() and "loader transformers5 (Qwen2Tokenizer)"
               in r.getMessage() for r in caplog.records)


def test_an_older_vllm_and_the_override_read_tokenizer_json(model_folder: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    folder = model_folder
    monkeypatch.setattr(fakevllm, "VLLM_VERSION", "0.18.1")
    with running_stack(folder) as stack:
        assert _counting(stack)["tokenizer_loader"] == "tokenizer_json"
    monkeypatch.setattr(fakevllm, "VLLM_VERSION", "0.32.0")

    def forced(config: Config) -> None:
        config.models[MODEL].tokenizer_loader = "tokenizer_json"

    with running_stack(folder, configure=forced) as stack:
        assert _counting(stack)["tokenizer_loader"] == "tokenizer_json"


def test_the_override_is_validated(tmp_path: Path) -> None:
    path = tmp_path / "brimful.toml"
    path.write_text('[models."m"]\ntokenizer_loader = "transformers4"\n')
    with pytest.raises(ConfigError, match="tokenizer_loader"):
        load_config(path, env={})
    path.write_text('[models."m"]\ntokenizer_loader = "transformers5"\n')
    assert load_config(path, env={}).models["m"].tokenizer_loader == "transformers5"


def test_folders_that_differ_only_in_what_autotokenizer_ignores_share_one_build(
        tmp_path: Path, fresh_loads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config.json's sizes do not change the tokenizer transformers 5 builds, its model_type does:
    the build is kept by what AutoTokenizer reads, and only a different class choice builds again."""
    from tokenizer_cache import _model

    builds: list[Path] = []
    real = _model.build_transformers5

    def counting(directory: Path, name_or_path: str | None = None) -> Any:
        builds.append(directory)
        return real(directory, name_or_path)

    monkeypatch.setattr(_model, "build_transformers5", counting)
    folders = []
    for name, config in [("a", {"model_type": "qwen3", "max_position_embeddings": 40960}),
                         ("b", {"model_type": "qwen3", "max_position_embeddings": 2048}),
                         ("c", {"model_type": "llama"})]:
        folder = tmp_path / name
        folder.mkdir()
        for file in ("tokenizer.json", "tokenizer_config.json"):
            (folder / file).symlink_to(PHI3 / file)
        (folder / "config.json").write_text(json.dumps(config))
        folders.append(folder)
    counts = [load_model_tokenizer(f).count_text("<|user|>Hi there", add_special_tokens=False) for f in folders]
    assert [b.name for b in builds] == ["a", "c"]
    assert counts[0] == counts[1]


# -- transformers 5's builds kept on disk (`tokenizer_cache._build_store`) --

def test_a_build_is_read_back_from_disk_by_the_next_process(
        tmp_path: Path, fresh_loads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """What one process built, the next reads instead of building: same spec, no transformers call."""
    from tokenizer_cache import _model
    from tokenizer_cache._build_store import BuildStore

    store = BuildStore(tmp_path / "builds")
    monkeypatch.setattr(_model, "build_store", lambda: store)
    first = load_model_tokenizer(PHI3, tokenizer_loader="transformers5")
    assert len(list((tmp_path / "builds").glob("*.json"))) == 1
    expected = first.count_text("<|user|>Hi there", add_special_tokens=False)
    for table in (_model._loaded, _model._engines, _model._built):   # as in a new process
        table.clear()

    def no_build(directory: Path, name_or_path: str | None = None) -> Any:
        raise AssertionError("built again although the build was on disk")

    monkeypatch.setattr(_model, "build_transformers5", no_build)
    second = load_model_tokenizer(PHI3, tokenizer_loader="transformers5")
    assert second.count_text("<|user|>Hi there", add_special_tokens=False) == expected
    assert second.loader_info == first.loader_info


def test_a_damaged_or_foreign_build_file_is_rebuilt(tmp_path: Path) -> None:
    from tokenizer_cache._build_store import BuildStore
    from tokenizer_cache._loader import BuiltBackend

    store = BuildStore(tmp_path)
    key = (b"digest", "{}", None)
    built = BuiltBackend(spec="{}", tokenizer_class="LlamaTokenizer", transformers_version="5.19.0",
                         split_special_tokens=False)
    store.put(key, built)
    assert store.get(key) == built
    assert store.get((b"other", "{}", None)) is None
    (path,) = tmp_path.glob("*.json")
    path.write_bytes(path.read_bytes()[:10])                 # cut short
    assert store.get(key) is None
    path.write_text(json.dumps({"spec": "{}"}))              # not a build
    assert store.get(key) is None
    assert not list(tmp_path.glob(".tmp-*"))                 # written whole or not at all
    assert BuildStore(None).get(key) is None                 # "" in the config: nothing kept
    BuildStore(None).put(key, built)


def test_a_build_depends_on_the_releases_that_made_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenizer_cache import _build_store
    from tokenizer_cache._loader import BuiltBackend

    key = (b"digest", "{}", None)
    built = BuiltBackend(spec="{}", tokenizer_class="Qwen2Tokenizer", transformers_version="5.19.0",
                         split_special_tokens=False)
    _build_store.BuildStore(tmp_path).put(key, built)
    monkeypatch.setattr(_build_store, "_release", lambda package: "9.9.9")
    assert _build_store.BuildStore(tmp_path).get(key) is None


def test_the_build_cache_follows_the_config(tmp_path: Path) -> None:
    from tokenizer_cache import _build_store, use_build_store

    previous = use_build_store(tmp_path / "x")
    try:
        path = tmp_path / "brimful.toml"
        path.write_text(f'[tokenizers]\nbuild_cache_dir = "{tmp_path / "builds"}"\n')
        config = load_config(path, env={})
        assert config.tokenizers.build_cache_dir == str(tmp_path / "builds")
        from proxy.admitted.counting import PromptCounter
        from proxy.upstream.backends import Backends
        PromptCounter(config, Backends(config))
        assert _build_store.build_store().directory == tmp_path / "builds"
        config.tokenizers.build_cache_dir = ""
        PromptCounter(config, Backends(config))
        assert _build_store.build_store().directory is None
        config.tokenizers.build_cache_dir = None
        PromptCounter(config, Backends(config))
        assert _build_store.build_store().directory == _build_store.default_directory()
    finally:
        _build_store._store = previous
