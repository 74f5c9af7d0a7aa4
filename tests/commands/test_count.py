"""`brimful count` without --tokenizer: the tokenizer comes from the Hugging Face cache."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from proxy.commands import count as count_cli

BODY = {"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "Why does ice float on water?"}]}


def run(argv: list[str], body: dict) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    parser = count_cli.argparse.ArgumentParser()
    count_cli._add_arguments(parser)
    args = parser.parse_args(argv)
    stdin = io.StringIO(json.dumps(body))
    original = count_cli.sys.stdin
    count_cli.sys.stdin = stdin
    try:
        code = count_cli._run_single(args, out, err)
    finally:
        count_cli.sys.stdin = original
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def hf_home(tmp_path: Path, qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    for file in qwen3_dir.iterdir():
        (snapshot / file.name).symlink_to(file)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    return tmp_path


def test_the_requests_model_is_found_in_the_cache(hf_home: Path, qwen3_dir: Path) -> None:
    assert run([], BODY)[:2] == (0, '{"prompt_tokens": 15}\n')
    assert run(["--tokenizer", str(qwen3_dir)], BODY)[:2] == (0, '{"prompt_tokens": 15}\n')
    assert run(["--model", "Qwen/Qwen3-8B"], {**BODY, "model": "served-name"})[:2] == (0, '{"prompt_tokens": 15}\n')


def test_a_model_not_in_the_cache_says_where_it_looked(hf_home: Path) -> None:
    code, out, err = run([], {**BODY, "model": "nobody/nothing"})
    assert (code, out) == (count_cli.EXIT_BAD_INPUT, "")
    assert f"no tokenizer for nobody/nothing in the Hugging Face cache ({hf_home / 'hub'})" in err
    code, _, err = run([], {"messages": BODY["messages"]})
    assert code == count_cli.EXIT_BAD_INPUT and "pass --tokenizer DIR or --model ID" in err


@pytest.mark.parametrize(("endpoint", "body"), [
    ("responses", {"model": "m", "input": "Why does ice float on water?"}),
    ("messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Why does ice float?"}]}),
])
def test_a_mistral_model_counts_responses_and_messages_as_the_proxy_does(
    tmp_path: Path, endpoint: str, body: dict
) -> None:
    """MistralTokenizer has no count_responses/count_messages methods of its own: the
    CLI counts through the same functions as proxy.admitted.surfaces (the chat of vLLM's conversion)."""
    from tests.corpus.targets import TARGETS, mistral_data_dir
    from tokenizer_cache import count_messages, count_responses, load_model_tokenizer

    folder = tmp_path / "mistral"
    folder.mkdir()
    (folder / "consolidated.safetensors").touch()
    (folder / "tekken.json").symlink_to(mistral_data_dir() / str(TARGETS["mistral_tekken_v3"].mistral_file))
    model = load_model_tokenizer(folder)
    assert model.family == "mistral"
    expected = (count_responses if endpoint == "responses" else count_messages)(model, body)
    code, out, err = run(["--tokenizer", str(folder), "--endpoint", endpoint], body)
    assert (code, json.loads(out), err) == (count_cli.EXIT_OK, {"prompt_tokens": expected}, "")
