"""Validation parity with a real vLLM 0.32 where the counter, not the template, decides.

Completions token ids: vLLM refuses an id above max(tokenizer's largest id,
config.json vocab_size - 1) with 400 "Token id N is out of vocabulary"; the
tokenizer brimful loads from the same model directory must draw the line at
the same id.
"""

from __future__ import annotations

import httpx
import pytest

from tokenizer_cache import CountError, load_model_tokenizer

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]


@pytest.mark.parametrize("offset", [0, 1, 1000])
def test_out_of_vocabulary_token_ids_are_refused_where_vllm_refuses_them(real_vllm, offset: int) -> None:
    tokenizer = load_model_tokenizer(real_vllm.tokenizer_dir)
    assert tokenizer.token_id_limit is not None
    prompt = [9707, tokenizer.token_id_limit + offset]
    answer = httpx.post(f"{real_vllm.base_url}/v1/completions",
                        json={"model": real_vllm.model, "prompt": prompt, "max_tokens": 1}, timeout=60)
    if offset == 0:
        assert answer.status_code == 200
        assert tokenizer.count_completion({"prompt": prompt}) == [answer.json()["usage"]["prompt_tokens"]]
    else:
        assert answer.status_code == 400
        message = answer.json()["error"]["message"]
        assert message == f"Token id {prompt[1]} is out of vocabulary"
        with pytest.raises(CountError) as caught:
            tokenizer.count_completion({"prompt": prompt})
        assert caught.value.message == message
