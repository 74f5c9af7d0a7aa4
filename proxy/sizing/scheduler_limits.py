"""vLLM 0.32's per-step limits: `max_num_seqs`, `max_num_batched_tokens`, chunked prefill.

They bound the work of one scheduler step, not a request's length (seed 004,
docs/vllm-behaviour.md):
a request beyond them waits, it is not refused.  `max_num_seqs` also caps
how many sequences run at once, whatever the KV cache could hold.  Two rules
stop vLLM at start-up (`SchedulerConfig.verify_max_model_len`,
vllm/config/scheduler.py), quoted here word for word:

* chunked prefill off and `max_num_batched_tokens < max_model_len` — a
  prompt of max_model_len tokens could never be scheduled in one step;
* `max_num_batched_tokens < max_num_seqs`.

Defaults of `vllm serve` (`EngineArgs.get_batch_defaults`,
vllm/engine/arg_utils.py), by the device's total memory:

| device | max_num_batched_tokens | max_num_seqs |
|---|---|---|
| ≥ 160 GiB (B200, MI300X) | 16,384 | 1,024 |
| ≥ 70 GiB and not an A100 (H100, H200) | 8,192 | 1,024 |
| anything else (A100, L40S, A10, L4, …) | 2,048 | 256 |

`--performance-mode throughput` doubles both when they are not set.  Chunked
prefill is on by default for generative models; turned off with
max_num_batched_tokens unset, vLLM raises the default to max_model_len.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    defaults_from: str            # why these defaults ("H100-class GPU (≥ 70 GiB)", ...), "" if both given
    error: str | None             # vLLM's start-up ValueError, when it would refuse
    notes: tuple[str, ...] = ()


def vllm_serve_defaults(gpu_memory_bytes: int, gpu_name: str | None = None) -> tuple[int, int, str]:
    """(max_num_batched_tokens, max_num_seqs, reason) that `vllm serve` picks for one GPU."""
    name = (gpu_name or "").lower()
    if gpu_memory_bytes >= 160 * GIB:
        return 16384, 1024, "GPU with ≥ 160 GiB"
    if gpu_memory_bytes >= 70 * GIB and "a100" not in name:
        return 8192, 1024, "GPU with ≥ 70 GiB, not an A100"
    return 2048, 256, "GPU with < 70 GiB or an A100"


def scheduler_limits(
    max_model_len: int | None,
    *,
    gpu_memory_bytes: int,
    gpu_name: str | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    enable_chunked_prefill: bool = True,
) -> SchedulerLimits:
    """The limits vLLM would run with, and its start-up error if it would refuse them."""
    default_tokens, default_seqs, why = vllm_serve_defaults(gpu_memory_bytes, gpu_name)
    seqs = default_seqs if max_num_seqs is None else max_num_seqs
    tokens = default_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    notes: list[str] = []
    if max_num_batched_tokens is None and not enable_chunked_prefill and max_model_len is not None:
        tokens = max(max_model_len, tokens)
    error = None
    if max_model_len is not None and tokens < max_model_len and not enable_chunked_prefill:
        error = (f"max_num_batched_tokens ({tokens}) is smaller than max_model_len ({max_model_len}). "
                 "This effectively limits the maximum sequence length to max_num_batched_tokens and makes "
                 "vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease "
                 "max_model_len.")
    elif tokens < seqs:
        error = f"max_num_batched_tokens ({tokens}) must be greater than or equal to max_num_seqs ({seqs})."
    if error is None and max_model_len is not None and tokens > seqs * max_model_len:
        notes.append(f"vLLM warns: max_num_batched_tokens ({tokens}) exceeds max_num_seqs * max_model_len "
                     f"({seqs * max_model_len}). This may lead to unexpected behavior.")
    if max_model_len is None and not enable_chunked_prefill:
        notes.append("max_model_len unknown: the chunked-prefill rule (max_num_batched_tokens ≥ max_model_len) "
                     "was not checked")
    given = max_num_seqs is not None and max_num_batched_tokens is not None
    return SchedulerLimits(seqs, tokens, enable_chunked_prefill, "" if given else why, error, tuple(notes))
