"""vLLM 0.32's scheduler limits and their start-up rules (proxy.sizing.scheduler_limits)."""

from __future__ import annotations

import pytest

from proxy.sizing.gpus import lookup_gpu
from proxy.sizing.scheduler_limits import scheduler_limits, vllm_serve_defaults


@pytest.mark.parametrize("gpu, tokens, seqs", [
    ("H100-80GB", 8192, 1024), ("H200-141GB", 8192, 1024), ("B200-180GB", 16384, 1024),
    ("MI300X-192GB", 16384, 1024), ("A100-80GB", 2048, 256), ("A10-24GB", 2048, 256), ("L40S-48GB", 2048, 256),
])
def test_vllm_serve_defaults_by_gpu(gpu, tokens, seqs):
    g = lookup_gpu(gpu)
    assert vllm_serve_defaults(g.memory_bytes, g.name)[:2] == (tokens, seqs)


def test_defaults_apply_and_chunked_prefill_is_on():
    h100 = lookup_gpu("H100-80GB")
    limits = scheduler_limits(32768, gpu_memory_bytes=h100.memory_bytes, gpu_name=h100.name)
    assert (limits.max_num_seqs, limits.max_num_batched_tokens, limits.chunked_prefill) == (1024, 8192, True)
    assert limits.error is None and "70 GiB" in limits.defaults_from


def test_chunked_prefill_off_with_unset_tokens_raises_them_to_max_model_len():
    h100 = lookup_gpu("H100-80GB")
    limits = scheduler_limits(32768, gpu_memory_bytes=h100.memory_bytes, enable_chunked_prefill=False)
    assert limits.max_num_batched_tokens == 32768 and limits.error is None


def test_chunked_prefill_off_and_tokens_below_max_model_len_is_vllms_error():
    limits = scheduler_limits(32768, gpu_memory_bytes=80 << 30, max_num_batched_tokens=8192,
                              enable_chunked_prefill=False)
    assert limits.error == (
        "max_num_batched_tokens (8192) is smaller than max_model_len (32768). This effectively limits the "
        "maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please "
        "increase max_num_batched_tokens or decrease max_model_len."
    )
    # with chunked prefill on the same numbers are fine: a long prompt is prefilled in chunks
    assert scheduler_limits(32768, gpu_memory_bytes=80 << 30, max_num_batched_tokens=8192).error is None


def test_tokens_below_seqs_is_vllms_error():
    limits = scheduler_limits(4096, gpu_memory_bytes=80 << 30, max_num_seqs=512, max_num_batched_tokens=256)
    assert limits.error == "max_num_batched_tokens (256) must be greater than or equal to max_num_seqs (512)."


def test_warning_when_tokens_exceed_seqs_times_len():
    limits = scheduler_limits(1024, gpu_memory_bytes=80 << 30, max_num_seqs=4, max_num_batched_tokens=8192)
    assert limits.error is None and "exceeds max_num_seqs * max_model_len (4096)" in limits.notes[0]
