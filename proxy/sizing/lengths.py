"""One definition of each length concept, shared by the metrics, the live view and the report.

* prompt = `upstream_prompt_tokens` when the upstream reported usage (what the
  engine actually processed), else brimful's own `prompt_tokens` (a request
  that never reached it, or a stream without usage).
* completion = `completion_tokens` (usage, summed over all choices).
* total = prompt + completion.  For n > 1 this is the article's rule for
  parallel sampling: the n choices share the prompt's KV blocks, so a request
  costs one prompt plus n outputs, which is what usage reports.  `total` is
  the KV footprint and drives the capacity figures.
* sequence = the longest single sequence, prompt + the longest choice: what
  `max_model_len` bounds (it limits each sequence, not the sum of the
  choices).  Equal to total when n = 1.  For n > 1 usage does not give
  per-choice lengths, so the safe upper bound prompt + min(completion,
  granted limit) is used: the longest choice can be neither longer than all
  choices together nor longer than its cap.  A request with several prompts
  (a completions batch, an embeddings batch) records its longest prompt, and
  its sequence is that prompt + the same bound on its completion: the sum of
  a batch's prompts is no sequence at all.
* percentiles interpolate linearly between closest ranks, numpy's default
  (`method="linear"`): for n sorted values v, p → index h = (n − 1)·p/100,
  v[⌊h⌋] + (h − ⌊h⌋)·(v[⌊h⌋+1] − v[⌊h⌋]).
* `brimful report` recommends `max_model_len` from the estimated percentile of
  what requests *needed* (`proxy.sizing.need`: censored data, cut and refused
  requests bounded), `/stats` still from what they *asked* (`proxy.sizing.demand`);
  either is rounded up to whole KV blocks (vLLM allocates whole blocks anyway),
  then capped at the model's own context and the KV cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# vLLM's default KV-cache block size (tokens per block).
BLOCK_SIZE = 16
# What the engine generates when a request of a surface (by its record's `endpoint`) sends no
# completion limit: /v1/completions' default of 16 tokens, nothing for the pooling routes (a sequence
# is its prompt).  Surfaces absent here get the whole room.  The surfaces read their value from here,
# so that the offline report need not import the request path.
IMPLICIT_MAX_TOKENS: dict[str, int] = {
    "completions": 16, "embeddings": 0, "pooling": 0, "score": 0, "rerank": 0,
}
# The model label of a request that named no resolvable model.
UNKNOWN_MODEL = "unknown"
# No token count of any real request comes near this (2**31 - 1): a larger one is corrupt.
MAX_PLAUSIBLE_TOKENS = 2**31 - 1


def plausible_usage(prompt: int | None, completion: int | None, max_model_len: int | None,
                    n: int, prompts: int = 1) -> tuple[int | None, int | None]:
    """The upstream's usage counts that can be true; None for each that cannot.

    Each served prompt fits the context (0 <= prompt <= max_model_len), and a
    batch's usage sums its `prompts` (completions and pooling inputs); the n
    completions of each prompt together are at most n x max_model_len.
    Without a known max_model_len, only counts in 0..MAX_PLAUSIBLE_TOKENS
    pass.  An upstream reporting -5 or 10**30 must not reach the records a
    max_model_len is recommended from.
    """
    limit = max_model_len if max_model_len is not None else MAX_PLAUSIBLE_TOKENS
    batch = max(prompts, 1)
    if prompt is not None and not 0 <= prompt <= min(batch * limit, MAX_PLAUSIBLE_TOKENS):
        prompt = None
    if completion is not None and not 0 <= completion <= min(batch * max(n, 1) * limit, MAX_PLAUSIBLE_TOKENS):
        completion = None
    return prompt, completion


def effective_prompt_tokens(prompt_tokens: int | None, upstream_prompt_tokens: int | None) -> int | None:
    """The upstream's count when it reported one, else brimful's."""
    return upstream_prompt_tokens if upstream_prompt_tokens is not None else prompt_tokens


def total_tokens(prompt: int | None, completion: int | None) -> int | None:
    """Prompt + completion over all choices: the KV footprint of the request."""
    if prompt is None or completion is None:
        return None
    return prompt + completion


def sequence_tokens(prompt: int | None, completion: int | None, n: int, granted: int | None,
                    longest_prompt: int | None = None) -> int | None:
    """Prompt + the longest choice (an upper bound for n > 1 and for batches): what max_model_len bounds."""
    if prompt is None or completion is None:
        return None
    longest = completion
    if (n > 1 or longest_prompt is not None) and granted is not None:
        longest = min(completion, granted)
    return (longest_prompt if longest_prompt is not None else prompt) + longest


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """numpy.percentile(values, p) with the default linear method, on pre-sorted values."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {p}")
    h = (len(sorted_values) - 1) * p / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo])


def round_up(value: float, multiple: int) -> int:
    """Smallest multiple of `multiple` ≥ value (a fractional percentile rounds up)."""
    if multiple <= 0:
        raise ValueError("multiple must be positive")
    return math.ceil(value / multiple) * multiple


def round_to_blocks(value: float | None, block_size: int = BLOCK_SIZE) -> int | None:
    """A sequence length rounded up to whole KV blocks, at least one block (None stays None)."""
    if value is None:
        return None
    return max(block_size, round_up(value, block_size))
