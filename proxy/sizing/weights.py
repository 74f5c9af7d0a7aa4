"""What the weights take in GPU memory: plain or quantised checkpoints, bytes per parameter stated.

A pure estimate from the parameter count and `config.json`:

* plain checkpoints: parameters × the model dtype's bytes (bf16/fp16 = 2;
  vLLM serves float32 checkpoints in bf16), the article's rule;
* quantised ones (`quantization_config` in config.json, or `--weights-dtype`):
  the linear layers at the quantised width plus their scales, the embeddings
  (and an untied lm_head, vocab_size × hidden_size each) at the model dtype —
  AWQ, GPTQ and vLLM's fp8 leave those unquantised.  Norms and biases are
  counted as quantised: a few MB, an underestimate of that size.

Bytes per quantised parameter:

| scheme | stored per weight, and per group | bytes / param |
|---|---|---|
| fp8 (fp8, fbgemm_fp8, modelopt FP8, compressed-tensors 8-bit float) | 8 bits; fp32 per 128×128 block | 1 + 4 ÷ block |
| int8 (compressed-tensors int 8, W8A8, GPTQ 8-bit) | 8 bits; per-channel scales | 1 |
| int4 AWQ | 4 bits; fp16 scale + 4-bit zero per group (zero_point) | 0.5 + 2.5 ÷ group |
| int4 GPTQ | 4 bits; fp16 scale + packed 4-bit zero per group (even sym) | 0.5 + 2.5 ÷ group |
| int4 compressed-tensors pack-quantized | 4 bits; fp16 scale per group (symmetric) | 0.5 + 2 ÷ group |
| bitsandbytes 4-bit (nf4/fp4) | 4 bits; absmax per 64 (fp32, or 1 B double quant) | 0.5 + 4 (1) ÷ 64 |
| bitsandbytes 8-bit | 8 bits; per-row scale | 1 |

A per-channel scheme (group_size −1) adds a scale per output row: negligible,
not counted.  The real checkpoint size (the sum of its safetensors) is the
ground truth; pass it with `--weights-memory` when it is known.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.sizing.capacity import (
    UnsupportedConfigError,
    config_dtype,
    dtype_bytes,
    text_config,
)

WEIGHT_DTYPES = ("auto", "bf16", "fp16", "fp8", "int8", "int4")
DEFAULT_INT4_GROUP = 128


@dataclass(frozen=True)
class WeightScheme:
    """How the linear layers are stored."""

    name: str                 # "bf16", "fp16", "fp8", "int8", "int4"
    method: str               # quant_method, or "--weights-dtype", or "model dtype"
    bits: int
    bytes_per_param: float    # of a quantised parameter, scales and zeros included
    detail: str               # how bytes_per_param was derived

    @property
    def quantised(self) -> bool:
        return self.bits < 16


@dataclass(frozen=True)
class WeightsEstimate:
    total_bytes: int               # over all GPUs (one tensor-parallel replica)
    scheme: WeightScheme
    params: int
    kept_params: int               # embeddings / lm_head left at the model dtype
    kept_bytes_per_param: int
    notes: tuple[str, ...] = ()

    def per_gpu_bytes(self, tensor_parallel_size: int) -> int:
        """Each GPU holds 1/N of every sharded tensor (norms are replicated: a few MB)."""
        return -(-self.total_bytes // tensor_parallel_size)


def _plain(config: Mapping[str, Any]) -> WeightScheme:
    name = config_dtype(config)
    nbytes = dtype_bytes(name)
    short = {"bfloat16": "bf16", "float16": "fp16"}.get(name, name)
    return WeightScheme(short, "model dtype", 8 * nbytes, float(nbytes), f"{short}: {nbytes} B per parameter")


def _int4(method: str, group: int | None, zero: bool) -> WeightScheme:
    if group is None or group <= 0:
        return WeightScheme("int4", method, 4, 0.5, "4 bits; per-channel scales (negligible)")
    extra = 2 + (0.5 if zero else 0.0)
    what = "fp16 scale + 4-bit zero" if zero else "fp16 scale"
    return WeightScheme("int4", method, 4, 0.5 + extra / group,
                        f"4 bits + {what} per {group} = 0.5 + {extra:g}/{group} B")


def _fp8(method: str, block: Any = None) -> WeightScheme:
    if isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block):
        area = block[0] * block[1]
        return WeightScheme("fp8", method, 8, 1 + 4 / area,
                            f"8 bits + an fp32 scale per {block[0]}×{block[1]} block = 1 + 4/{area} B")
    return WeightScheme("fp8", method, 8, 1.0, "8 bits; per-tensor or per-channel scales (negligible)")


def _int8(method: str) -> WeightScheme:
    return WeightScheme("int8", method, 8, 1.0, "8 bits; per-channel scales (negligible)")


def scheme_from_quantization_config(qc: Mapping[str, Any]) -> WeightScheme:
    """The storage of a `quantization_config` (UnsupportedConfigError for methods not modelled)."""
    method = str(qc.get("quant_method") or qc.get("quant_algo") or "").lower()
    bits = qc.get("bits", qc.get("w_bit"))
    group = qc.get("group_size", qc.get("q_group_size"))
    if method in ("awq", "awq_marlin", "auto_awq"):
        if bits not in (None, 4):
            raise UnsupportedConfigError(f"quantization_config: awq with {bits} bits is not modelled")
        return _int4(method, group if isinstance(group, int) else DEFAULT_INT4_GROUP, bool(qc.get("zero_point", True)))
    if method in ("gptq", "gptq_marlin", "auto_gptq"):
        if bits == 8:
            return _int8(method)
        if bits not in (None, 4):
            raise UnsupportedConfigError(f"quantization_config: gptq with {bits} bits is not modelled")
        return _int4(method, group if isinstance(group, int) else DEFAULT_INT4_GROUP, True)
    if method in ("fp8", "fbgemm_fp8", "deepseek_v4_fp8"):
        return _fp8(method, qc.get("weight_block_size"))
    if method.startswith("modelopt"):
        inner = qc.get("quantization", qc)
        algo = str(inner.get("quant_algo") or qc.get("quant_algo") or "").upper()
        if algo == "FP8":
            return _fp8(method)
        raise UnsupportedConfigError(f"quantization_config: modelopt quant_algo {algo or None!r} is not modelled")
    if method == "compressed-tensors":
        groups = qc.get("config_groups")
        weights = None
        if isinstance(groups, Mapping):
            for g in groups.values():
                if isinstance(g, Mapping) and isinstance(g.get("weights"), Mapping):
                    weights = g["weights"]
                    break
        if weights is None:
            raise UnsupportedConfigError("quantization_config: compressed-tensors without config_groups weights")
        nbits, kind = weights.get("num_bits"), weights.get("type")
        if nbits == 8 and kind == "float":
            return _fp8(method, weights.get("block_structure"))
        if nbits == 8:
            return _int8(method)
        if nbits == 4 and kind == "int":
            gs = weights.get("group_size")
            return _int4(method, gs if isinstance(gs, int) else None, not weights.get("symmetric", True))
        raise UnsupportedConfigError(f"quantization_config: compressed-tensors {nbits}-bit {kind} is not modelled")
    if method == "bitsandbytes":
        if qc.get("load_in_8bit"):
            return _int8(method)
        if qc.get("load_in_4bit"):
            double = bool(qc.get("bnb_4bit_use_double_quant"))
            absmax = 1 if double else 4
            return WeightScheme("int4", method, 4, 0.5 + absmax / 64,
                                f"4 bits + a {absmax}-byte absmax per 64 = 0.5 + {absmax}/64 B")
    raise UnsupportedConfigError(
        f"quantization_config quant_method {method or None!r} is not modelled; pass the checkpoint's size "
        "with --weights-memory"
    )


def weight_scheme(config: Mapping[str, Any], weights_dtype: str = "auto") -> WeightScheme:
    """`--weights-dtype`: auto = the config's quantization_config, else the model dtype."""
    choice = weights_dtype.lower()
    if choice == "auto":
        qc = config.get("quantization_config") or text_config(config).get("quantization_config")
        if isinstance(qc, Mapping):
            return scheme_from_quantization_config(qc)
        return _plain(config)
    if choice in ("bf16", "fp16"):
        return WeightScheme(choice, "--weights-dtype", 16, 2.0, f"{choice}: 2 B per parameter")
    if choice == "fp8":
        return _fp8("--weights-dtype")
    if choice == "int8":
        return _int8("--weights-dtype")
    if choice == "int4":
        return _int4("--weights-dtype", DEFAULT_INT4_GROUP, True)
    raise ValueError(f"unknown weights dtype {weights_dtype!r}; use one of {', '.join(WEIGHT_DTYPES)}")


def embedding_params(config: Mapping[str, Any]) -> int | None:
    """vocab_size × hidden_size, twice unless tie_word_embeddings (None when either is missing)."""
    cfg = text_config(config)
    vocab, hidden = cfg.get("vocab_size"), cfg.get("hidden_size")
    if not isinstance(vocab, int) or not isinstance(hidden, int):
        return None
    tied = cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    return vocab * hidden * (1 if tied else 2)


def estimate_weights(params: int, config: Mapping[str, Any], scheme: WeightScheme) -> WeightsEstimate:
    """Bytes of `params` parameters stored as `scheme` (see the module docstring)."""
    if not scheme.quantised:
        nbytes = int(scheme.bytes_per_param)
        return WeightsEstimate(params * nbytes, scheme, params, 0, nbytes)
    kept_bytes = dtype_bytes(config_dtype(config))
    kept = embedding_params(config)
    notes: list[str] = []
    if kept is None:
        kept = 0
        notes.append("config.json lacks vocab_size or hidden_size: the embeddings are counted as quantised "
                     "(an underestimate)")
    kept = min(kept, params)
    quantised = params - kept
    total = kept * kept_bytes + math.ceil(quantised * scheme.bytes_per_param)
    return WeightsEstimate(total, scheme, params, kept, kept_bytes, tuple(notes))
