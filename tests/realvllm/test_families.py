"""Live check of the families whose renderer is not a chat template: brimful against a real vLLM now.

The recorded corpora (tests/tokenizer_cache/test_family_corpus.py) fix what vLLM 0.32 answered
when they were made; this test asks the vLLM venv installed today, so a
different oss-harmony or mistral-common under vLLM, or a change in brimful,
shows up as a mismatch. For gpt-oss and one Mistral tokenizer it builds the
tiny model of tests/corpus/, serves it (one server per target, stopped after)
and sends every request of the target's set: each served request's
`usage.prompt_tokens` (`input_tokens` for Responses) must equal brimful's
count, and each request vLLM refuses must be refused by brimful too.

BRIMFUL_REAL_VLLM as for the other real-vLLM tests: off skips; auto skips
when the venv, the tokenizer files or the server cannot be had; require fails.
"""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
from pathlib import Path

import pytest

from tests.corpus import generate
from tests.corpus.targets import TARGETS
from tests.realvllm.fixture import MODE_ENV, parse_mode
from tests.realvllm.venv import SetupError, ensure_vllm_venv
from tests.support.corpus import count_case as count
from tokenizer_cache import CountError, TokenizerCache

pytestmark = [pytest.mark.slow, pytest.mark.realvllm]


@pytest.mark.parametrize("name", ["gptoss", "mistral_tekken_v3"])
def test_brimful_counts_what_vllm_reports_now(name: str, tmp_path: Path):
    mode = parse_mode(os.environ.get(MODE_ENV))
    if mode == "off":
        pytest.skip(f"{MODE_ENV}=off")
    target = TARGETS[name]
    with contextlib.ExitStack() as stack:
        try:
            python = ensure_vllm_venv(log_path=tmp_path / "venv.log").python
            base = stack.enter_context(generate.served(target, python, tmp_path))
        except (SetupError, RuntimeError, OSError, subprocess.CalledProcessError) as error:
            if mode == "require":
                raise
            pytest.skip(f"real vLLM unavailable ({MODE_ENV}=require makes this an error): {error}")
        # The served folder itself: brimful sees exactly the files vLLM loaded.
        folder = generate.build_model(target, python, tmp_path / "build.log")
        model = TokenizerCache().get(folder)
        assert model.family == ("harmony" if name == "gptoss" else "mistral"), folder
        mismatches = []
        for shape, endpoint, body in generate.CASES[target.cases]():
            answer = generate.send(base, endpoint, copy.deepcopy(body))
            try:
                ours: int | str = count(model, {"endpoint": endpoint, "request": body})
            except CountError as exc:
                ours = f"refused: {exc.message[:60]}"
            theirs = answer.count if answer.error is None else f"refused: {answer.error[:60]}"
            if (answer.error is None) != isinstance(ours, int) or (answer.error is None and ours != theirs):
                mismatches.append(f"{shape}: brimful {ours!r}, vLLM {theirs!r}")
        assert not mismatches, "\n".join(mismatches)
