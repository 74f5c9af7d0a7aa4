"""TokenizerCache (bounded LRU, one load per directory) and find_tokenizer_dir."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from tokenizer_cache import (
    CountError,
    ModelTokenizer,
    TokenizerCache,
    find_tokenizer_dir,
    load_model_tokenizer,
)

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
PHI3_MINI = SHARED / "models" / "microsoft--Phi-3-mini-4k-instruct"


class FakeLoader:
    """Records every load; returns a distinct object per call."""

    def __init__(self) -> None:
        self.loaded: list[Path] = []
        self.lock = threading.Lock()

    def __call__(self, directory: Path):
        with self.lock:
            self.loaded.append(directory)
        return object()


def test_cache_returns_the_same_object_for_the_same_directory(tmp_path):
    loader = FakeLoader()
    cache = TokenizerCache(loader=loader)
    first = cache.get(tmp_path)
    assert cache.get(str(tmp_path)) is first
    assert cache.get(tmp_path / "sub" / "..") is first  # keyed by resolved path
    assert loader.loaded == [tmp_path.resolve()]


def test_cache_loads_a_folder_again_once_its_files_changed_and_keeps_one_load_of_it(tmp_path):
    """A chat template replaced on disk (vLLM restarted on it) is read again, not kept from before."""
    import os

    loader = FakeLoader()
    cache = TokenizerCache(loader=loader)
    template = tmp_path / "chat_template.jinja"
    template.write_text("{{ messages }}")
    first = cache.get(tmp_path)
    assert cache.get(tmp_path) is first
    template.write_text("{{ messages }} and more")
    os.utime(template, ns=(1, 1))        # size and time both differ, whatever the file system's clock
    second = cache.get(tmp_path)
    assert second is not first and cache.get(tmp_path) is second
    assert loader.loaded == [tmp_path.resolve()] * 2 and len(cache) == 1
    (tmp_path / "merges.txt").write_text("a b")            # a BPE folder without tokenizer.json
    assert cache.get(tmp_path) is not second


def test_cache_is_bounded_and_evicts_least_recently_used(tmp_path):
    loader = FakeLoader()
    cache = TokenizerCache(max_entries=2, loader=loader)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    cache.get(a)
    cache.get(b)
    cache.get(a)  # a is now most recent
    cache.get(c)  # evicts b
    assert len(cache) == 2
    assert a in cache and c in cache and b not in cache
    cache.get(b)
    assert loader.loaded == [a, b, c, b]


def test_failed_load_is_not_cached_and_is_retried(tmp_path):
    calls = []

    def flaky(directory: Path):
        calls.append(directory)
        if len(calls) == 1:
            raise FileNotFoundError("no tokenizer.json")
        return "ok"

    cache = TokenizerCache(loader=flaky)
    with pytest.raises(FileNotFoundError):
        cache.get(tmp_path)
    assert cache.get(tmp_path) == "ok"
    assert len(calls) == 2


def test_concurrent_first_use_loads_once(tmp_path):
    threads_count = 8
    started = threading.Barrier(threads_count + 1)
    release = threading.Event()
    loads: list[Path] = []

    def slow_loader(directory: Path):
        loads.append(directory)
        assert release.wait(timeout=10), "test never released the loader"
        return object()

    cache = TokenizerCache(loader=slow_loader)
    results: list[object] = []
    errors: list[BaseException] = []

    def worker() -> None:
        started.wait(timeout=10)
        try:
            results.append(cache.get(tmp_path))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    started.wait(timeout=10)  # every worker is about to call get()
    release.set()
    for thread in threads:
        thread.join(timeout=10)

    assert not errors
    assert len(loads) == 1
    assert len(results) == threads_count
    assert all(result is results[0] for result in results)


def test_concurrent_first_use_shares_a_load_failure(tmp_path):
    started = threading.Barrier(5)
    release = threading.Event()

    def failing_loader(directory: Path):
        release.wait(timeout=10)
        raise ValueError("broken tokenizer.json")

    cache = TokenizerCache(loader=failing_loader)
    outcomes: list[str] = []

    def worker() -> None:
        started.wait(timeout=10)
        try:
            cache.get(tmp_path)
            outcomes.append("loaded")
        except ValueError:
            outcomes.append("ValueError")

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    started.wait(timeout=10)
    release.set()
    for thread in threads:
        thread.join(timeout=10)
    assert outcomes == ["ValueError"] * 4


def test_cache_loads_a_real_tokenizer_directory(tmp_path):
    model_dir = tmp_path / "phi3"
    shutil.copytree(PHI3_MINI, model_dir)
    cache = TokenizerCache()
    tokenizer = cache.get(model_dir)
    assert isinstance(tokenizer, ModelTokenizer)
    assert tokenizer.source_dir == model_dir.resolve()
    assert cache.get(model_dir) is tokenizer
    assert tokenizer.count_completion({"prompt": "Hello"}) == [1]


# ---------------------------------------------------------------------------
# find_tokenizer_dir
# ---------------------------------------------------------------------------

def make_snapshot(hub: Path, repo_dir: str, revision: str, mtime: float, with_tokenizer: bool = True) -> Path:
    """A snapshot the way huggingface_hub lays it out: files are symlinks into blobs/."""
    repo = hub / repo_dir
    blobs = repo / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    if with_tokenizer:
        blob = blobs / f"tok-{revision}"
        blob.write_text("{}", encoding="utf-8")
        (snapshot / "tokenizer.json").symlink_to(os.path.relpath(blob, snapshot))
    (snapshot / "config.json").write_text("{}", encoding="utf-8")
    os.utime(snapshot, (mtime, mtime))
    return snapshot


def test_root_directory_with_tokenizer_wins(tmp_path):
    root = tmp_path / "local"
    root.mkdir()
    (root / "tokenizer.json").write_text("{}", encoding="utf-8")
    hub = tmp_path / "hf" / "hub"
    make_snapshot(hub, "models--Qwen--Qwen3-8B", "abc", 1_000)
    assert find_tokenizer_dir("Qwen/Qwen3-8B", str(root), hf_home=str(tmp_path / "hf")) == root.resolve()


def test_hf_cache_newest_snapshot_with_tokenizer_is_used(tmp_path):
    hub = tmp_path / "hf" / "hub"
    make_snapshot(hub, "models--Qwen--Qwen3-8B", "old", 1_000)
    newest = make_snapshot(hub, "models--Qwen--Qwen3-8B", "new", 2_000)
    make_snapshot(hub, "models--Qwen--Qwen3-8B", "newer-but-empty", 3_000, with_tokenizer=False)
    assert find_tokenizer_dir("Qwen/Qwen3-8B", None, hf_home=str(tmp_path / "hf")) == newest


def test_root_that_names_a_repo_is_looked_up_in_the_cache(tmp_path):
    hub = tmp_path / "hf" / "hub"
    snapshot = make_snapshot(hub, "models--deepseek-ai--DeepSeek-V3.1", "r1", 1_000)
    found = find_tokenizer_dir("served-name", "deepseek-ai/DeepSeek-V3.1", hf_home=str(tmp_path / "hf"))
    assert found == snapshot


def test_hf_home_defaults_to_the_environment(tmp_path, monkeypatch):
    hub = tmp_path / "env-hf" / "hub"
    snapshot = make_snapshot(hub, "models--org--name", "r1", 1_000)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "env-hf"))
    assert find_tokenizer_dir("org/name", None) == snapshot


def test_nothing_found_is_none(tmp_path):
    hub = tmp_path / "hf" / "hub"
    make_snapshot(hub, "models--org--name", "r1", 1_000, with_tokenizer=False)
    assert find_tokenizer_dir("org/name", None, hf_home=str(tmp_path / "hf")) is None
    assert find_tokenizer_dir("org/other", str(tmp_path / "missing"), hf_home=str(tmp_path / "hf")) is None


def test_the_public_surface_is_what_the_package_exports() -> None:
    """The proxy imports tokenizer_cache's names from the package, never from its private
    modules, so the inside can move; this pins what the package offers (HTTPX's
    test_exported_members.py; docs/architecture.md)."""
    import tokenizer_cache

    exported = {name for name in dir(tokenizer_cache) if not name.startswith("_")}
    modules = {name for name in exported if type(getattr(tokenizer_cache, name)).__name__ == "module"}
    assert exported - modules == set(tokenizer_cache.__all__) == {
        "CharBoundExceeded", "ChatCacheStats", "ChatCountCache", "CountError", "CountingModel",
        "DEFAULT_CHAT_CACHE_ENTRIES", "DEFAULT_PIECE_CACHE_ENTRIES", "HarmonyOptions",
        "HarmonyTokenizer", "char_bound", "char_bound_message",
        "MistralTokenizer", "ModelTokenizer", "PieceCacheStats", "PieceCountCache", "PieceCounter", "PieceTally",
        "TOKENIZER_LOADERS", "TOKENIZER_MODES", "TokenizerCache", "MediaNotCountable", "detect_family",
        "find_tokenizer_dir", "holds_tokenizer", "load_model_tokenizer", "loader_for_vllm", "responses_to_chat",
        "responses_terms",
        "count_messages", "count_responses", "default_build_cache_dir", "use_build_store",
        "encoded_chars", "start_encode_meter", "json_loads", "lax_bool", "plain_json", "read_json",
    }


def test_the_proxy_uses_only_the_public_surface() -> None:
    import ast
    from pathlib import Path

    proxy = Path(__file__).resolve().parents[2] / "proxy"
    private = []
    for path in proxy.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tokenizer_cache."):
                private.append(f"{path.name}: from {node.module}")
    assert private == []


# ---------------------------------------------------------------------------
# Token ids outside the vocabulary (completions with token-id prompts)
# ---------------------------------------------------------------------------

QWEN3 = Path(__file__).resolve().parents[2].parent / "shared" / "models" / "Qwen--Qwen3-8B"


def qwen3_copy(tmp_path: Path, config: dict | None) -> Path:
    directory = tmp_path / "qwen3"
    directory.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(QWEN3 / name, directory / name)
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(
    ("config", "largest_accepted"),
    [
        # The tiny test model: embedding rows = the tokenizer's ids (151,669).
        ({"vocab_size": 151669}, 151668),
        # Qwen3-8B's config: more rows than tokenizer ids; vLLM takes the larger.
        ({"vocab_size": 151936}, 151935),
        # Fewer rows than the tokenizer's ids: the tokenizer's largest id still counts.
        ({"text_config": {"vocab_size": 1000}}, 151668),
    ],
)
def test_token_ids_beyond_vllms_limit_are_out_of_vocabulary(tmp_path, config, largest_accepted):
    tok = load_model_tokenizer(qwen3_copy(tmp_path, config))
    assert tok.token_id_limit == largest_accepted
    assert tok.count_completion({"prompt": [0, largest_accepted]}) == [2]
    with pytest.raises(CountError, match=f"Token id {largest_accepted + 1} is out of vocabulary"):
        tok.count_completion({"prompt": [[1], [largest_accepted + 1, 5]]})


def test_without_config_json_no_id_is_refused_for_being_large(tmp_path):
    # The model may have more embedding rows than the tokenizer has ids; only vLLM knows.
    tok = load_model_tokenizer(qwen3_copy(tmp_path, None))
    assert tok.max_token_id == 151668 and tok.token_id_limit is None
    assert tok.count_completion({"prompt": [999_999]}) == [1]
    with pytest.raises(CountError):
        tok.count_completion({"prompt": [-1]})


# ---------------------------------------------------------------------------
# Folders that ship the same tokenizer
# ---------------------------------------------------------------------------

def test_folders_with_the_same_tokenizer_share_one_parsed_engine(tmp_path):
    base = load_model_tokenizer(qwen3_copy(tmp_path / "a", {"vocab_size": 151669}))
    variant = load_model_tokenizer(qwen3_copy(tmp_path / "b", {"vocab_size": 151936}))
    # parsed and self-checked once; what each folder's own files say stays its own
    assert variant._tokenizer is base._tokenizer and variant._choice is base._choice
    assert (base.token_id_limit, variant.token_id_limit) == (151668, 151935)

    splitting_dir = qwen3_copy(tmp_path / "c", None)
    config = json.loads((splitting_dir / "tokenizer_config.json").read_text())
    (splitting_dir / "tokenizer_config.json").write_text(json.dumps({**config, "split_special_tokens": True}))
    splitting = load_model_tokenizer(splitting_dir)
    assert splitting._tokenizer is not base._tokenizer
    assert base.count_text("<|im_start|>", add_special_tokens=False) == 1
    assert splitting.count_text("<|im_start|>", add_special_tokens=False) > 1

    reference = load_model_tokenizer(qwen3_copy(tmp_path / "d", None), engine="tokenizers")
    assert reference._choice is not base._choice and reference.engine == "tokenizers"
