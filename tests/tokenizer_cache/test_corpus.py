"""Every case of the shared prompt-token corpus, counted with the real tokenizer files.

Counts must equal what vLLM reported (`expected_prompt_tokens`); a case vLLM
rejected (`expected_error`) must raise CountError.  The same corpus is then
run through `brimful count --jsonl`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.commands import count as count_cli
from tests.support.corpus import CASES, CORPUS_FILES, SHARED, check_case
from tokenizer_cache import TokenizerCache


@pytest.fixture(scope="module")
def cache() -> TokenizerCache:
    return TokenizerCache(max_entries=16)


def test_corpus_is_complete():
    assert len(CASES) == 320
    assert len({case["id"] for case in CASES}) == 320


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_case(case: dict, cache: TokenizerCache):
    check_case(case, cache)


def test_count_cli_jsonl_runs_the_whole_corpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    combined = tmp_path / "all_cases.jsonl"
    combined.write_text("".join(path.read_text(encoding="utf-8") for path in CORPUS_FILES), encoding="utf-8")

    assert count_cli.main(["--jsonl", str(combined), "--models-root", str(SHARED)]) == 0

    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["id"] for line in lines] == [case["id"] for case in CASES]
    for case, line in zip(CASES, lines, strict=True):
        if case["expected_error"] is not None:
            assert "error" in line and "prompt_tokens" not in line, case["id"]
        else:
            assert line.get("prompt_tokens") == case["expected_prompt_tokens"], case["id"]


def test_count_cli_single_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    model_dir = str(SHARED / "models" / "microsoft--Phi-3-mini-4k-instruct")
    request = tmp_path / "body.json"

    request.write_text(json.dumps({"prompt": [[1, 2, 3], [4]]}), encoding="utf-8")
    assert count_cli.main(["--tokenizer", model_dir, str(request)]) == 0
    assert json.loads(capsys.readouterr().out) == {"prompt_tokens": 4, "per_prompt": [3, 1]}

    request.write_text(json.dumps({"messages": []}), encoding="utf-8")
    assert count_cli.main(["--tokenizer", model_dir, str(request)]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["param"] == "messages"

    request.write_text("{not json", encoding="utf-8")
    assert count_cli.main(["--tokenizer", model_dir, str(request)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "not valid JSON" in captured.err
