"""Token counts from vLLM 0.32's own tokenizer object, without a server (run by the vLLM venv's python).

    <vllm venv>/bin/python tests/support/vllm_token_counts.py < request.json > counts.json

The request is a JSON list of {"model": name or folder, "texts": [...]}; the
answer is a list of lists: `len(tokenizer.encode(text, add_special_tokens=False))`
per text, which is what vLLM's /tokenize and chat routes count for a prompt
already rendered (chat requests default to add_special_tokens false).  The
tokenizer comes from `vllm.tokenizers.get_tokenizer(model)`, as `vllm serve
model` builds it: vLLM's tokenizer_mode auto, its own model_type overrides,
transformers 5's AutoTokenizer under it.  A hub id is resolved from the
Hugging Face cache (HF_HUB_CACHE), offline.  Standard library and vLLM only:
this file must not import brimful.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from vllm.tokenizers import get_tokenizer

    answer = []
    for item in json.load(sys.stdin):
        tokenizer = get_tokenizer(item["model"])
        answer.append([len(tokenizer.encode(text, add_special_tokens=False)) for text in item["texts"]])
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
