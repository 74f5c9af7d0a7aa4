"""The model's own context bound: the largest `max_model_len` vLLM 0.32 accepts for a config.json.

A pure function of the parsed `config.json`, written after vLLM 0.32's
`_get_and_verify_max_len` (vllm/config/model.py) and
`ModelArchConfigConvertorBase.derive_max_model_len_and_key`
(vllm/transformers_utils/model_arch_config_convertor.py):

* derived length = the smallest of `max_position_embeddings`, `n_positions`,
  `max_seq_len`, `seq_length`, `model_max_length`, `max_target_positions`,
  `max_sequence_length`, `max_seq_length`, `seq_len` that the (text) config
  has; a truthy `model_max_length` then overrides it outright (Command-R);
* none of them → vLLM assumes 2048 and logs a warning;
* `--disable-sliding-window` with a window shorter than that → the window;
* RoPE scaling multiplies the derived length by `factor` for every rope type
  except su/longrope/llama3/yarn/deepseek_yarn/deepseek_llama_scaling, whose
  `max_position_embeddings` is already the scaled length (so Qwen2.5's YaRN
  block with factor 4 does *not* give 131,072 in vLLM 0.32: it stays 32,768);
  Gemma-3 configs are never multiplied; a null factor counts as 1;
* unset `--max-model-len` → that length (longrope: the top-level
  `original_max_position_embeddings`, for speed on short sequences);
* an explicit `--max-model-len` above the derived length is refused ("User-
  specified max_model_len (…) is greater than the derived max_model_len (…)")
  unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.

vLLM reads the config through transformers, so a key missing from the JSON
may still get the config class's default there (Qwen2Config defaults
`max_position_embeddings` to 32,768); this function sees only the JSON and
says so in its `notes` when it falls back to 2048.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.sizing.capacity import text_config

# vLLM 0.32's derive_max_model_len_and_key, in its order.
LENGTH_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
    "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
)
VLLM_FALLBACK_MAX_LEN = 2048
# Rope types whose max_position_embeddings is already scaled (vLLM does not multiply).
PRESCALED_ROPE_TYPES = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"})
# transformers 5's ALLOWED_LAYER_TYPES: a rope dict keyed only by these is per layer type.
_LAYER_TYPES = frozenset({
    "full_attention", "sliding_attention", "chunked_attention", "window_attention", "indexed_attention",
    "compressed_sparse_attention", "heavily_compressed_attention", "minimax_m3_sparse", "conv", "moe",
    "hybrid", "hybrid_sliding", "linear_attention", "sparse", "dense",
})


@dataclass(frozen=True)
class ContextBound:
    """What vLLM derives from the config, and the largest `--max-model-len` it accepts."""

    max_model_len: int          # the largest value vLLM accepts without VLLM_ALLOW_LONG_MAX_MODEL_LEN
    default_max_model_len: int  # what vLLM uses when --max-model-len is not given
    key: str | None             # the config field the bound comes from
    base_length: int            # that field's value, before RoPE scaling
    rope_type: str | None
    scaling_factor: float       # the factor vLLM multiplied by (1.0 when none applies)
    notes: tuple[str, ...] = ()
    derived_text: str = ""      # the derived length as vLLM prints it (a float once RoPE was applied)
    model_max_length_text: str = "None"

    def accepts(self, max_model_len: int) -> bool:
        return 0 < max_model_len <= self.max_model_len

    def refusal(self, max_model_len: int) -> str | None:
        """vLLM 0.32's start-up error for a `--max-model-len` above the bound (None when accepted)."""
        if self.accepts(max_model_len):
            return None
        return (f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
                f"({self.key}={self.derived_text} or model_max_length={self.model_max_length_text} in "
                "model's config.json). To allow overriding this maximum, set the env var "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. "
                "If the model uses relative position encoding (RoPE), positions exceeding derived_max_model_len "
                "lead to nan. If the model uses absolute position encoding, positions exceeding "
                "derived_max_model_len will cause a CUDA array out-of-bounds error.")


def _rope_dicts(cfg: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The rope parameter dicts, one per layer type when nested (transformers: rope_scaling wins)."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, Mapping) or not rope:
        # transformers builds {"rope_type": "default"} from a bare rope_theta
        return [{"rope_type": "default"}] if cfg.get("rope_theta") is not None else []
    if set(rope) <= _LAYER_TYPES:
        return [p for p in rope.values() if isinstance(p, Mapping) and p]
    return [rope]


def _rope_type(params: Mapping[str, Any]) -> str:
    kind = params.get("rope_type") or params.get("type") or "default"
    return "longrope" if kind == "su" else str(kind)


def model_context_bound(config: Mapping[str, Any], *, disable_sliding_window: bool = False) -> ContextBound:
    """The largest `max_model_len` vLLM 0.32 accepts for this config (see the module docstring)."""
    cfg = text_config(config)
    notes: list[str] = []
    derived: float = float("inf")
    key: str | None = None
    for name in LENGTH_KEYS:
        value = cfg.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value < derived:
                key = name
            derived = min(derived, value)
    model_max_length = cfg.get("model_max_length")
    if isinstance(model_max_length, (int, float)) and not isinstance(model_max_length, bool) and model_max_length:
        key, derived = "model_max_length", model_max_length

    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    if disable_sliding_window and isinstance(window, int) and window < derived:
        key, derived = "sliding_window", window

    if derived == float("inf"):
        notes.append(f"config.json has none of {', '.join(LENGTH_KEYS)}: vLLM assumes {VLLM_FALLBACK_MAX_LEN} "
                     "(unless transformers' config class supplies a default for the missing key)")
        key, derived = None, VLLM_FALLBACK_MAX_LEN
    base = int(derived)

    rope = _rope_dicts(cfg)
    rope_type = _rope_type(rope[-1]) if rope else None
    factor = 1.0
    model_type = str(cfg.get("model_type") or "")
    if rope and "gemma3" not in model_type:
        for params in rope:
            if _rope_type(params) not in PRESCALED_ROPE_TYPES:
                factor = params.get("factor", factor)
        if factor is None:
            notes.append("rope factor is null in config.json: vLLM falls back to 1.0")
            factor = 1.0
        factor = float(factor)
        if factor != 1.0:
            notes.append(f"{key} {base:,} × rope factor {factor:g} ({rope_type})")
        elif rope_type in PRESCALED_ROPE_TYPES and any("factor" in p for p in rope):
            notes.append(f"rope type {rope_type}: {key} is already the scaled length, vLLM 0.32 does not "
                         "multiply it by the factor")
    scaled = derived * factor if rope and "gemma3" not in model_type else derived
    bound = int(scaled)
    if isinstance(model_max_length, int) and not isinstance(model_max_length, bool) and model_max_length > bound:
        bound = model_max_length   # vLLM lets a user value up to model_max_length through

    default = int(scaled)
    if any(_rope_type(p) == "longrope" for p in rope):
        original = cfg.get("original_max_position_embeddings")
        if isinstance(original, int) and not isinstance(original, bool):
            default = original
            notes.append(f"longrope: unset --max-model-len defaults to original_max_position_embeddings "
                         f"{original:,}; up to {bound:,} is accepted")
    return ContextBound(max_model_len=bound, default_max_model_len=default, key=key, base_length=base,
                        rope_type=rope_type, scaling_factor=factor, notes=tuple(notes),
                        derived_text=repr(scaled), model_max_length_text=repr(model_max_length))
