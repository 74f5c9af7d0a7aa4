"""KV-cache capacity maths: how many tokens and concurrent requests a GPU holds.

Everything here is a pure function of numbers (or of a parsed `config.json`
dict) returning a frozen dataclass, so the planner (`brimful plan`) and the
length report (`brimful report`) share one tested implementation.  The only
I/O is `load_model_config(path)`.

The formulas and the worked examples come from the source article (seed 000,
summarised in docs/vllm-behaviour.md, "KV-cache capacity"):

* KV bytes per token = 2 (K and V) × layers × KV heads × head_dim × dtype bytes.
* KV memory = GPU memory × gpu_memory_utilization − weights − activations.
* KV tokens = floor(KV memory ÷ bytes per token).  The article's 395,717 for
  Qwen3-8B on an H100 is the floor of the exact quotient 395,717.78 (its
  rounded 54.34 GiB would give 395,691), so we keep every intermediate value
  exact (integer bytes) and floor once at the end.
* A request of T tokens occupies ceil(T / block) × block slots; concurrency =
  floor(KV tokens ÷ slots).  GPUs for a target = ceil(target ÷ concurrency).
* Tensor parallelism over N GPUs (vLLM 0.32, `tensor_parallel_split`): each
  GPU holds 1/N of the weights and max(1, KV heads ÷ N) KV heads, so every
  figure above is per GPU and one replica is N GPUs.

Units are explicit everywhere: GiB = 2^30 bytes, GB = 10^9 bytes
(`parse_bytes` refuses an ambiguous "80G").
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from proxy.sizing.kv_groups import (
    KvGroups,
    LayerSpec,
    group_layers,
    hybrid_attention_block_size,
    kv_cache_size_tokens,
    max_concurrency,
    startup_fit,
)

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40
KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12

HOURS_PER_MONTH = 730  # the article's month (365 × 24 ÷ 12)
DEFAULT_UTILIZATION = 0.92  # vLLM's default gpu_memory_utilization, used by the article
DEFAULT_ACTIVATION_BYTES = 4 * GIB  # the article's activations + CUDA graphs allowance
DEFAULT_BLOCK_SIZE = 16

# vLLM v1 start-up error (vllm/v1/core/kv_cache_utils.py, as printed by a real
# vLLM 0.32.0, capture f1_kv_cache_too_small.txt in docs/vllm-behaviour.md; GPU builds
# omit the "(which also controls CPU memory on the CPU backend)" aside).
VLLM_STARTUP_ERROR = (
    "To serve at least one request with the model's max seq len ({max_model_len}), "
    "({needed_gib:.2f} GiB KV cache is needed, which is larger than the available KV cache "
    "memory ({available_gib:.2f} GiB). Based on the available memory, the estimated maximum "
    "model length is {estimated}. Try increasing `gpu_memory_utilization` or decreasing "
    "`max_model_len` when initializing the engine. See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)


class UnsupportedConfigError(ValueError):
    """The config describes an attention layout whose KV size we cannot state exactly."""


class TensorParallelError(ValueError):
    """vLLM refuses this tensor-parallel size for the model; the message is vLLM's own."""


# ---------------------------------------------------------------------------
# units

_UNIT_BYTES = {
    "": 1, "b": 1,
    "kib": KIB, "mib": MIB, "gib": GIB, "tib": TIB,
    "kb": KB, "mb": MB, "gb": GB, "tb": TB,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str | int) -> int:
    """Parse a memory size: "80GiB", "80GB", "24 GB", "14.2 GiB", "85899345920".

    A bare number is bytes.  GiB/MiB/KiB/TiB are powers of two, GB/MB/KB/TB
    powers of ten; "80G" or "80 gigs" are refused because the two readings
    differ by 7 % — the article's warning about mixed units.  Fractions of a
    byte are floored.
    """
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"memory size must not be negative: {text}")
        return text
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"cannot parse memory size {text!r}: use e.g. 80GiB, 80GB or a byte count")
    number, unit = m.group(1), m.group(2).lower()
    if unit not in _UNIT_BYTES:
        raise ValueError(
            f"unknown or ambiguous unit {m.group(2)!r} in {text!r}: "
            "use GiB/MiB/KiB (powers of 2) or GB/MB/KB (powers of 10)"
        )
    return int(Decimal(number) * _UNIT_BYTES[unit])


def format_bytes(n: float, binary: bool = True) -> str:
    """Human form in binary (KiB, MiB, GiB) or decimal (KB, MB, GB) units."""
    units = (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)) if binary else (
        ("TB", TB), ("GB", GB), ("MB", MB), ("KB", KB))
    for name, size in units:
        if abs(n) >= size:
            return f"{n / size:.2f} {name}"
    return f"{n:.0f} B"


def format_both(n: float) -> str:
    """'54.34 GiB (58.35 GB)': both unit systems, so nobody mixes them up."""
    return f"{format_bytes(n)} ({format_bytes(n, binary=False)})"


# ---------------------------------------------------------------------------
# dtypes

_DTYPE_BYTES = {
    "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2,
    "fp32": 4, "float32": 4, "float": 4,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def config_dtype(config: Mapping[str, Any]) -> str:
    """The model's dtype as vLLM's `--dtype auto` resolves it.

    `torch_dtype` (transformers 4) or `dtype` (transformers 5), from the text
    config first.  vLLM serves float32 checkpoints in bfloat16 by default and
    a missing dtype means float32, so both give bfloat16 here.
    """
    text = text_config(config)
    name = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    if not isinstance(name, str) or name in ("float32", "float"):
        return "bfloat16"
    return name


def dtype_bytes(kv_cache_dtype: str, config: Mapping[str, Any] | None = None) -> int:
    """Bytes per element of the KV cache for vLLM's `--kv-cache-dtype`.

    `auto` means "same as the model": the config's dtype (see `config_dtype`),
    bf16 when there is no config.
    """
    name = kv_cache_dtype.lower()
    if name == "auto":
        name = config_dtype(config) if config is not None else "bfloat16"
    try:
        return _DTYPE_BYTES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {kv_cache_dtype!r}; use auto, bf16, fp16 or fp8") from None


# ---------------------------------------------------------------------------
# KV bytes per token from config.json

# Fields that mark layer layouts we do not model (state-space / mixed layers
# whose rule differs per architecture).  Named in the error.
_UNSUPPORTED_LAYOUT_FIELDS = (
    "hybrid_override_pattern",  # Nemotron-H
    "layers_block_type",        # Jamba, Granite-4 hybrid
    "attn_type_list",           # MiniMax
    "attn_layer_indices",       # Zamba / Falcon-H1 style
    "block_types",              # RecurrentGemma
)
_FULL = {"full_attention", "attention", "global", "global_attention"}
_SLIDING = {"sliding_attention", "sliding_window", "local", "local_attention"}
_CHUNKED = {"chunked_attention"}
_LINEAR = {"linear_attention", "mamba", "mamba2", "gated_deltanet", "deltanet", "lightning_attention"}
# transformers 5's default `sliding_window` for config classes that have one when
# config.json leaves the key out (MistralConfig, Gemma2Config, Gemma3TextConfig,
# GptOssConfig, Cohere2Config, Ministral); Qwen2/Qwen3 only with use_sliding_window.
_DEFAULT_WINDOW = {"mistral": 4096, "ministral": 4096, "gemma2": 4096, "gemma3_text": 4096, "gemma3": 4096,
                   "gpt_oss": 128, "cohere2": 4096, "qwen2": 4096, "qwen3": 4096, "qwen2_moe": 4096,
                   "qwen3_moe": 4096}
# transformers' interleaving when config.json has no `layer_types`: layer i slides
# when (i + 1) is not a multiple of the pattern (Gemma 2 and gpt-oss 2, Gemma 3
# `sliding_window_pattern`, default 6; Cohere 2 `sliding_window_pattern`, default 4).
_DEFAULT_PATTERN = {"gemma2": 2, "gpt_oss": 2, "gemma3_text": 6, "gemma3": 6, "cohere2": 4}

# vLLM models whose attention reads only the model-wide CacheConfig.sliding_window, never layer_types
_WINDOW_FROM_CACHE_CONFIG = {"qwen2_moe", "qwen3_moe", "mixtral"}

LayerKind = tuple[str, int | None]   # ("full" | "sliding" | "chunked" | "linear", window or chunk)


def _sliding_window(cfg: Mapping[str, Any]) -> int | None:
    """The window vLLM uses: 0 and null mean none; Qwen2-style `use_sliding_window: false` too;
    Gemma 3's bidirectional variant halves it (transformers' Gemma3TextConfig)."""
    model_type = cfg.get("model_type")
    window = cfg.get("sliding_window", _DEFAULT_WINDOW.get(str(model_type)))
    qwen_style = "use_sliding_window" in cfg or str(model_type).startswith(("qwen2", "qwen3"))
    if qwen_style and not cfg.get("use_sliding_window", False):
        return None
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None
    if model_type in ("gemma3_text", "gemma3") and cfg.get("use_bidirectional_attention"):
        window = window // 2 + 1
    return window


def _declared_layer_types(cfg: Mapping[str, Any], num_layers: int, window: int | None) -> list[str] | None:
    """`layer_types` as transformers 5 fills it in for the model types that derive one."""
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise UnsupportedConfigError(
                f"config.json 'layer_types' must list {num_layers} layers (got {layer_types!r:.80})"
            )
        return [str(t) for t in layer_types]
    model_type = str(cfg.get("model_type"))
    if model_type in _DEFAULT_PATTERN:
        pattern = cfg.get("sliding_window_pattern", _DEFAULT_PATTERN[model_type])
        if not isinstance(pattern, int) or pattern <= 0:
            raise UnsupportedConfigError(f"config.json 'sliding_window_pattern' is invalid: {pattern!r}")
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    if model_type in ("qwen2", "qwen3") and window is not None:
        start = cfg.get("max_window_layers", 28)
        return ["sliding_attention" if i >= start else "full_attention" for i in range(num_layers)]
    if model_type == "qwen2_moe" and window is not None:
        start = cfg.get("max_window_layers", 28)
        return ["sliding_attention" if (i + 1) % 2 and i < start else "full_attention" for i in range(num_layers)]
    if model_type in ("llama4_text", "llama4") and cfg.get("attention_chunk_size"):
        nope = cfg.get("no_rope_layers") or [int((i + 1) % cfg.get("no_rope_layer_interval", 4) != 0)
                                             for i in range(num_layers)]
        return ["chunked_attention" if flag else "full_attention" for flag in nope]
    return None


def _layer_kinds(cfg: Mapping[str, Any], num_layers: int) -> list[LayerKind]:
    """What vLLM 0.32 makes of every layer: full, sliding (with its window), chunked local, or linear.

    vLLM's models take each layer's window from `layer_types` (Gemma 2/3,
    gpt-oss, Llama, Cohere 2), or — when every layer slides or there is no
    `layer_types` (Mistral v0.1, Phi-3, Qwen2 with use_sliding_window) — from
    the model-wide `sliding_window` (`EngineArgs.create_engine_config` sets
    CacheConfig.sliding_window only then).  gpt-oss slides on its even layers
    whatever the config says (vllm/model_executor/models/gpt_oss.py).
    """
    for name in _UNSUPPORTED_LAYOUT_FIELDS:
        if cfg.get(name) is not None:
            raise UnsupportedConfigError(
                f"config.json field {name!r} describes a hybrid layer layout brimful does not "
                "model; compute the KV size per token from the full-attention layers by hand "
                "and pass it via a hand-written config"
            )
    interval = cfg.get("full_attention_interval")
    if cfg.get("layer_types") is None and interval is not None:
        # transformers' Qwen3-Next / Qwen3.5 rule: layer i is full attention
        # when (i + 1) is a multiple of the interval, linear otherwise.
        if not isinstance(interval, int) or interval <= 0:
            raise UnsupportedConfigError(f"config.json 'full_attention_interval' is invalid: {interval!r}")
        return [("full" if (i + 1) % interval == 0 else "linear", None) for i in range(num_layers)]
    window = _sliding_window(cfg)
    types = _declared_layer_types(cfg, num_layers, window)
    if types is None:
        return [("sliding", window) if window is not None else ("full", None) for _ in range(num_layers)]
    if cfg.get("model_type") == "gpt_oss":
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    if window is not None and cfg.get("model_type") in ("cohere2", "cohere2_moe"):
        window += 1   # vLLM's Cohere 2 layers see sliding_window + 1 tokens (models/commandr.py)
    if cfg.get("model_type") in _WINDOW_FROM_CACHE_CONFIG and not all(t in _SLIDING for t in types):
        # these vLLM models take no per-layer window: mixed layer_types leave CacheConfig.sliding_window unset
        return [("full", None) for _ in range(num_layers)]
    kinds: list[LayerKind] = []
    for t in types:
        if t in _FULL:
            kinds.append(("full", None))
        elif t in _SLIDING:
            kinds.append(("sliding", window) if window is not None else ("full", None))
        elif t in _CHUNKED:
            chunk = cfg.get("attention_chunk_size")
            kinds.append(("chunked", chunk) if isinstance(chunk, int) and chunk > 0 else ("full", None))
        elif t in _LINEAR:
            kinds.append(("linear", None))
        else:
            raise UnsupportedConfigError(f"config.json 'layer_types' has unknown layer type {t!r}")
    sliding = sum(kind == "sliding" for kind, _ in kinds)
    if cfg.get("model_type") in ("qwen2", "qwen3") and 0 < sliding < num_layers:
        raise UnsupportedConfigError(
            f"vLLM refuses this config: {sliding} of {num_layers} layers slide (max_window_layers "
            f"{cfg.get('max_window_layers')!r}), and its Qwen2 model asserts \"Sliding window for some but all "
            "layers is not supported\""
        )
    return kinds


@dataclass(frozen=True)
class KvLayout:
    """What one token costs in the KV cache, and how that was derived."""

    attention: str             # "mha", "gqa", "mla" or "hybrid"
    num_layers: int            # num_hidden_layers
    kv_layers: int             # layers that store per-token K/V
    elements_per_layer: int    # per token per layer (K+V for MHA/GQA, the latent for MLA)
    dtype_bytes: int
    bytes_per_token: int
    kv_heads: int | None = None          # per GPU (= the model's KV heads without tensor parallelism)
    head_dim: int | None = None
    notes: tuple[str, ...] = ()
    tensor_parallel_size: int = 1
    kv_heads_total: int | None = None    # the model's num_key_value_heads
    # Every layer as vLLM sees it: ("full" | "sliding" | "chunked" | "linear", window or chunk);
    # empty means every layer is full attention.
    layer_kinds: tuple[LayerKind, ...] = ()
    # Gated DeltaNet (Qwen3-Next, Qwen3.5) linear layers: their fixed state per GPU (0: not modelled)
    linear_state_bytes: int = 0

    @property
    def local_layers(self) -> int:
        """Sliding-window and chunked-local layers: their cost stops growing at the window."""
        return sum(kind in ("sliding", "chunked") for kind, _ in self.layer_kinds)

    @property
    def layer_bytes_per_token(self) -> int:
        """One attention layer's bytes per token (K+V, or the MLA latent)."""
        return self.elements_per_layer * self.dtype_bytes

    def kv_groups(self, block_size: int, hybrid_manager: bool = True, mamba_cache_mode: str = "align") -> KvGroups:
        """vLLM's KV-cache groups for this layout at this block size (see `proxy.sizing.kv_groups`).

        Gated DeltaNet layers are Mamba specs: the attention block grows until a page holds their
        state, which is padded to the page, and a request holds 2 pages in mamba_cache_mode "align"
        (vLLM's default with prefix caching), 1 in "none".  Other linear layers are left out (their
        state is not modelled, see the note).
        """
        kinds = self.layer_kinds or tuple(("full", None) for _ in range(self.kv_layers))
        per_token = self.layer_bytes_per_token
        state = self.linear_state_bytes
        if state:
            block_size = hybrid_attention_block_size(block_size, per_token, state)
        specs: list[LayerSpec] = []
        for kind, window in kinds:
            if kind == "linear":
                if state:
                    specs.append(LayerSpec("mamba", block_size, 0, None, state, block_size * per_token,
                                           2 if mamba_cache_mode == "align" else 1))
            else:
                specs.append(LayerSpec(kind, block_size, per_token, window))  # type: ignore[arg-type]
        return group_layers(specs, hybrid_manager)


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language-model part of a config (multimodal configs nest it)."""
    for key in ("text_config", "llm_config", "language_config"):
        inner = config.get(key)
        if isinstance(inner, Mapping):
            return inner
    return config


def _int_field(cfg: Mapping[str, Any], name: str) -> int:
    value = cfg.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UnsupportedConfigError(f"config.json has no usable {name!r} (got {value!r})")
    return value


@dataclass(frozen=True)
class TensorParallelSplit:
    """How vLLM 0.32 splits one model's attention over `size` GPUs."""

    size: int
    attention_heads: int                 # num_attention_heads
    kv_heads: int | None                 # num_key_value_heads (None for MLA: one latent, no KV heads)
    attention_heads_per_gpu: int
    kv_heads_per_gpu: int | None         # max(1, kv_heads ÷ size)
    kv_head_replicas: int                # GPUs holding a copy of each KV head (1 unless size > kv_heads)


def tensor_parallel_split(config: Mapping[str, Any], size: int) -> TensorParallelSplit:
    """vLLM 0.32's two tensor-parallel rules, with its own messages (TensorParallelError).

    * `ModelConfig.verify_with_parallel_config` (vllm/config/model.py), at start-up:
      "Total number of attention heads (64) must be divisible by tensor parallel size (3)."
    * `QKVParallelLinear.__init__` (vllm/model_executor/layers/linear.py), at
      weight loading, through `divide()` (vllm/distributed/utils.py): with size
      ≥ KV heads, size must be a multiple of the KV heads (each head is then
      replicated size ÷ KV heads times), else the KV heads must be a multiple of
      size — an AssertionError "8 is not divisible by 3" / "16 is not
      divisible by 12".
    Per GPU vLLM caches `max(1, KV heads // size)` heads (`get_num_kv_heads`);
    MLA models cache the whole latent on every GPU.
    """
    if size < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1, got {size}")
    cfg = text_config(config)
    heads = _int_field(cfg, "num_attention_heads")
    if heads % size:
        raise TensorParallelError(
            f"Total number of attention heads ({heads}) must be divisible by tensor parallel size ({size})."
        )
    if cfg.get("kv_lora_rank") is not None and cfg.get("qk_rope_head_dim") is not None:
        return TensorParallelSplit(size, heads, None, heads // size, None, size)
    kv = cfg.get("num_key_value_heads") or heads
    if size >= kv:
        if size % kv:
            raise TensorParallelError(f"{size} is not divisible by {kv}")
        replicas = size // kv
    else:
        if kv % size:
            raise TensorParallelError(f"{kv} is not divisible by {size}")
        replicas = 1
    return TensorParallelSplit(size, heads, kv, heads // size, max(1, kv // size), replicas)


def valid_tensor_parallel_sizes(config: Mapping[str, Any], up_to: int = 8) -> list[int]:
    """The sizes 1..up_to vLLM accepts for this model (8 = the GPUs of one node)."""
    sizes = []
    for size in range(1, up_to + 1):
        try:
            tensor_parallel_split(config, size)
        except TensorParallelError:
            continue
        sizes.append(size)
    return sizes


def gated_delta_net_state_bytes(config: Mapping[str, Any], tensor_parallel_size: int = 1,
                                mamba_ssm_cache_dtype: str = "auto") -> int:
    """One Gated DeltaNet layer's state per GPU (`MambaStateShapeCalculator.gated_delta_net_state_shape`),
    0 when the config has no such layers.

    conv: (k_dim × k_heads × 2 + v_dim × v_heads) ÷ TP × (conv kernel − 1), in the model dtype;
    recurrent: v_heads ÷ TP × v_dim × k_dim, in `mamba_ssm_cache_dtype` — "auto" is the model dtype,
    or Qwen3.5's `mamba_ssm_dtype` (`Qwen3_5ForConditionalGenerationConfig`).  vLLM's CPU backend on an
    AVX-512-BF16 machine forces float32 (vllm/platforms/cpu.py).
    """
    cfg = text_config(config)
    names = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
             "linear_conv_kernel_dim")
    if any(not isinstance(cfg.get(n), int) for n in names):
        return 0
    k_heads, v_heads, k_dim, v_dim, kernel = (int(cfg[n]) for n in names)
    conv_dim = k_dim * k_heads * 2 + v_dim * v_heads
    if conv_dim % tensor_parallel_size or v_heads % tensor_parallel_size:
        raise TensorParallelError(f"{v_heads} is not divisible by {tensor_parallel_size}")
    model_bytes = dtype_bytes("auto", config)
    ssm = mamba_ssm_cache_dtype
    if ssm == "auto":
        ssm = str(cfg.get("mamba_ssm_dtype") or "auto")
    ssm_bytes = model_bytes if ssm == "auto" else dtype_bytes(ssm)
    conv = conv_dim // tensor_parallel_size * (kernel - 1) * model_bytes
    return conv + v_heads // tensor_parallel_size * v_dim * k_dim * ssm_bytes


def _layout_notes(kinds: list[LayerKind], state: int) -> list[str]:
    """What the per-token figure leaves out: linear layers' state, local layers' window."""
    num_layers = len(kinds)
    linear = sum(kind == "linear" for kind, _ in kinds)
    kv_layers = num_layers - linear
    notes: list[str] = []
    if state:
        notes.append(
            f"hybrid: {kv_layers} of {num_layers} layers are full attention and counted per token; the {linear} "
            f"Gated DeltaNet layers keep a fixed state of {state:,} B each per request, which vLLM pads to one "
            "attention page (it enlarges the attention block size to fit it)"
        )
    elif linear:
        notes.append(
            f"hybrid: {kv_layers} of {num_layers} layers are full attention and counted per token; "
            f"the {linear} linear-attention layers keep a fixed per-sequence state "
            "that is not included (and vLLM enlarges the block size to match it), so concurrency "
            "is an upper bound"
        )
    local = [(kind, window) for kind, window in kinds if kind in ("sliding", "chunked")]
    if local:
        windows = sorted({w for _, w in local if w is not None})
        what = "chunked local attention (chunk" if local[0][0] == "chunked" else "sliding window (window"
        notes.append(
            f"{len(local)} of {num_layers} layers use {what} {', '.join(f'{w:,}' for w in windows)} tokens): "
            "with vLLM's hybrid KV-cache manager a request holds at most the window plus the tokens in flight "
            "there (without it, every token), so KV per token counts every layer but tokens and concurrency "
            "come from vLLM's KV-cache groups"
        )
    return notes


def kv_layout(config: Mapping[str, Any], kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1,
              mamba_ssm_cache_dtype: str = "auto") -> KvLayout:
    """Per-token KV-cache size of a HF `config.json`, as vLLM allocates it.

    * MHA/GQA: 2 × KV layers × `num_key_value_heads` (default
      `num_attention_heads`) × `head_dim` (default hidden_size ÷ heads) × bytes.
    * MLA (DeepSeek-V2/V3, Kimi-K2: `kv_lora_rank` + `qk_rope_head_dim`):
      vLLM caches one latent of kv_lora_rank + qk_rope_head_dim elements per
      token per layer — no K/V pair, no per-head copies.  DeepSeek-V3.1:
      61 × 576 × 2 = 70,272 B = 68.6 KiB (kv_reference.json).
    * Hybrid linear + full attention (`layer_types` with linear layers, or
      `full_attention_interval`, e.g. Qwen3.5 / Qwen3-Next): only the
      full-attention layers grow with the sequence, so only they count per
      token.  The linear layers' fixed per-sequence state is *not* included,
      and vLLM enlarges the attention block size for these models so pages
      match that state; both are reported in `notes`, and concurrency from
      this figure is an upper bound.
    * Sliding-window and chunked-local layers (Gemma 2/3, gpt-oss, Mistral v0.1,
      Phi-3, Llama 4): counted in the per-token figure like full layers, and
      listed in `layer_kinds`; what they really cost — at most their window
      plus the tokens in flight, per request — comes from `KvLayout.kv_groups`,
      vLLM's own grouping (`proxy.sizing.kv_groups`).  `use_sliding_window: false`
      (Qwen2.5) and `sliding_window: null` or 0 mean no sliding layers.
    * `tensor_parallel_size` N: the figure is per GPU, with max(1, KV heads ÷ N)
      heads (`tensor_parallel_split`, which refuses what vLLM refuses); an MLA
      latent is not split.
    """
    cfg = text_config(config)
    nbytes = dtype_bytes(kv_cache_dtype, config)
    num_layers = _int_field(cfg, "num_hidden_layers")
    split = tensor_parallel_split(config, tensor_parallel_size) if tensor_parallel_size != 1 else None

    if cfg.get("kv_lora_rank") is not None and cfg.get("qk_rope_head_dim") is not None:
        if cfg.get("index_topk") is not None:
            raise UnsupportedConfigError(
                "config.json field 'index_topk' (DeepSeek sparse attention) adds an indexer "
                "cache and a different fp8 layout (656 bytes per token per layer); not modelled"
            )
        latent = _int_field(cfg, "kv_lora_rank") + _int_field(cfg, "qk_rope_head_dim")
        return KvLayout(
            attention="mla", num_layers=num_layers, kv_layers=num_layers,
            elements_per_layer=latent, dtype_bytes=nbytes,
            bytes_per_token=num_layers * latent * nbytes,
            notes=(f"MLA: one latent of kv_lora_rank + qk_rope_head_dim = {latent} elements "
                   "per token per layer" + (", on every GPU" if split else ""),),
            tensor_parallel_size=tensor_parallel_size,
        )

    heads = _int_field(cfg, "num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        hidden = _int_field(cfg, "hidden_size")
        if hidden % heads:
            raise UnsupportedConfigError(
                f"config.json has no 'head_dim' and hidden_size {hidden} is not a multiple of "
                f"num_attention_heads {heads}"
            )
        head_dim = hidden // heads
    kinds = _layer_kinds(cfg, num_layers)
    linear = sum(kind == "linear" for kind, _ in kinds)
    kv_layers = num_layers - linear
    state = gated_delta_net_state_bytes(config, tensor_parallel_size, mamba_ssm_cache_dtype) if linear else 0
    notes = _layout_notes(kinds, state)
    local = [kind for kind, _ in kinds if kind in ("sliding", "chunked")]
    attention = "hybrid" if kv_layers < num_layers else ("mha" if kv_heads == heads else "gqa")
    per_gpu = kv_heads
    if split is not None:
        assert split.kv_heads_per_gpu is not None
        per_gpu = split.kv_heads_per_gpu
        if split.kv_head_replicas > 1:
            notes.append(f"tensor parallel {tensor_parallel_size} > {kv_heads} KV heads: each GPU caches one head, "
                         f"every head is replicated on {split.kv_head_replicas} GPUs")
    elements = 2 * per_gpu * head_dim
    return KvLayout(
        attention=attention, num_layers=num_layers, kv_layers=kv_layers,
        elements_per_layer=elements, dtype_bytes=nbytes,
        bytes_per_token=kv_layers * elements * nbytes,
        kv_heads=per_gpu, head_dim=head_dim, notes=tuple(notes),
        tensor_parallel_size=tensor_parallel_size, kv_heads_total=kv_heads,
        layer_kinds=tuple(kinds) if local or linear else (), linear_state_bytes=state,
    )


def kv_bytes_per_token(config: Mapping[str, Any], kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1) -> int:
    return kv_layout(config, kv_cache_dtype, tensor_parallel_size).bytes_per_token


def load_model_config(path: str | Path) -> dict[str, Any]:
    """Read a HF `config.json` (a file, or a model directory containing one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    with p.open(encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{p} is not a JSON object")
    return data


# ---------------------------------------------------------------------------
# model presets: the article's models (official config.json values; parameter
# counts from the safetensors metadata of the hub repositories)


@dataclass(frozen=True)
class Preset:
    name: str
    config: Mapping[str, Any]
    params: int


def _preset(name: str, layers: int, heads: int, kv_heads: int, hidden: int, params: int,
            vocab: int, context: int, **extra: Any) -> Preset:
    return Preset(name, {
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "hidden_size": hidden, "head_dim": 128,
        "torch_dtype": "bfloat16", "vocab_size": vocab, "tie_word_embeddings": False,
        "max_position_embeddings": context, **extra,
    }, params)


# The parameter counts also follow from the shapes (embeddings + lm_head +
# layers × (q, k, v, o, MLP, norms)); tests/sizing/test_capacity.py recomputes two.
PRESETS: dict[str, Preset] = {p.name: p for p in (
    _preset("Qwen2.5-7B", 28, 28, 4, 3584, 7_615_616_512, 152_064, 32_768),
    _preset("Mistral-7B-v0.3", 32, 32, 8, 4096, 7_248_023_552, 32_768, 32_768),
    _preset("Qwen3-8B", 36, 32, 8, 4096, 8_190_735_360, 151_936, 40_960),
    _preset("Qwen2.5-32B", 64, 40, 8, 5120, 32_763_876_352, 152_064, 32_768),
    _preset("Qwen2.5-72B", 80, 64, 8, 8192, 72_706_203_648, 152_064, 32_768),
    # the "70B in bf16 on one 80 GiB GPU"
    _preset("Llama-3.1-70B", 80, 64, 8, 8192, 70_553_706_496, 128_256, 131_072,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
)}


def lookup_preset(name: str) -> Preset:
    key = name.lower().removesuffix("-instruct")
    for preset in PRESETS.values():
        if preset.name.lower() == key:
            return preset
    raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")


# ---------------------------------------------------------------------------
# memory, tokens, concurrency


@dataclass(frozen=True)
class GpuMemoryBudget:
    """One GPU's memory as vLLM splits it: × utilization, − weights, − activations = the KV cache."""

    gpu_memory_bytes: int
    utilization: float
    usable_bytes: int          # gpu memory × utilization (floored to a byte)
    weights_bytes: int
    activation_bytes: int
    kv_memory_bytes: int       # usable − weights − activations (may be negative)

    @property
    def shortfall_bytes(self) -> int:
        """How much memory is missing before any KV cache is left (0 when some is)."""
        return max(0, -self.kv_memory_bytes)


def weights_bytes(params: int, bytes_per_param: int = 2) -> int:
    """Weights memory of an unquantised checkpoint: parameters × dtype bytes."""
    return params * bytes_per_param


def kv_memory(gpu_memory_bytes: int, utilization: float, weights: int,
              activations: int = DEFAULT_ACTIVATION_BYTES) -> GpuMemoryBudget:
    """KV memory = GPU memory × utilization − weights − activations.

    The product is computed in decimal from the utilization's shortest repr
    (0.92 is 0.92, not 0.92000000000000003996), so results do not depend on
    binary float noise.
    """
    if not 0 < utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    usable = int(Decimal(gpu_memory_bytes) * Decimal(repr(utilization)))
    return GpuMemoryBudget(
        gpu_memory_bytes=gpu_memory_bytes, utilization=utilization, usable_bytes=usable,
        weights_bytes=weights, activation_bytes=activations,
        kv_memory_bytes=usable - weights - activations,
    )


def kv_tokens(kv_memory_bytes: int, bytes_per_token: int) -> int:
    """Tokens the KV memory holds: floor(memory ÷ bytes per token), 0 if none."""
    if bytes_per_token <= 0:
        raise ValueError("bytes_per_token must be positive")
    return max(0, kv_memory_bytes) // bytes_per_token


def kv_blocks(kv_memory_bytes: int, bytes_per_token: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Whole KV blocks vLLM can allocate (vLLM logs blocks × block_size as its token count)."""
    return max(0, kv_memory_bytes) // (bytes_per_token * block_size)


def slots_per_request(tokens: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Slots one request occupies: whole blocks, ceil(tokens ÷ block) × block."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    return -(-tokens // block_size) * block_size


def concurrent_requests(tokens_in_kv: int, tokens_per_request: int,
                        block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Requests of this length that fit at once (memory bound): floor(KV tokens ÷ slots)."""
    if tokens_per_request <= 0:
        raise ValueError("tokens_per_request must be positive")
    return tokens_in_kv // slots_per_request(tokens_per_request, block_size)


def parallel_sampling_tokens(prompt_tokens: int, completion_tokens_per_choice: int, n: int) -> int:
    """KV tokens of one request with n choices: the prompt's blocks are shared,
    so one prompt plus n outputs (the article's rule for parallel sampling)."""
    return prompt_tokens + n * completion_tokens_per_choice


def gpus_for_target(target_concurrency: int, per_gpu_concurrency: int) -> int | None:
    """GPUs (replicas) needed: ceil(target ÷ per-GPU); None when one GPU holds none."""
    if per_gpu_concurrency <= 0:
        return None
    return -(-target_concurrency // per_gpu_concurrency)


def monthly_cost(gpus: int, hourly_usd: float, hours: float = HOURS_PER_MONTH) -> float:
    return gpus * hourly_usd * hours


def mean_last_block_waste(block_size: int) -> float:
    """Mean empty slots in a request's last block, (B − 1) ÷ 2, for lengths
    uniform modulo B: 7.5 at B = 16, 63.5 at B = 128."""
    return (block_size - 1) / 2


@dataclass(frozen=True)
class UtilizationStep:
    step: float
    bytes: int
    tokens: int


def utilization_step(gpu_memory_bytes: int, bytes_per_token: int, step: float = 0.01) -> UtilizationStep:
    """What +step of gpu_memory_utilization buys: H100 + 0.01 ≈ 0.8 GiB ≈ 5,825 Qwen3-8B tokens."""
    extra = int(Decimal(gpu_memory_bytes) * Decimal(repr(step)))
    return UtilizationStep(step=step, bytes=extra, tokens=extra // bytes_per_token)


@dataclass(frozen=True)
class StartupCheck:
    """Would vLLM start with this max_model_len?  (`_check_enough_kv_cache_memory`)"""

    max_model_len: int
    needed_bytes: int            # whole blocks for one max_model_len request
    available_bytes: int
    fits: bool
    estimated_max_model_len: int  # the longest length that fits (whole blocks)
    message: str | None           # vLLM's error text when it would refuse
    fix: str | None


def single_group(bytes_per_token: int, block_size: int = DEFAULT_BLOCK_SIZE) -> KvGroups:
    """The KV-cache groups of a model whose every layer is full attention: one group, one block table."""
    return group_layers([LayerSpec("full", block_size, bytes_per_token)])


def startup_check(max_model_len: int, kv_memory_bytes: int, bytes_per_token: int,
                  block_size: int = DEFAULT_BLOCK_SIZE, groups: KvGroups | None = None,
                  in_flight_tokens: int | None = None) -> StartupCheck:
    """vLLM refuses to start when one request of max_model_len tokens does not
    fit the KV cache less the one block its pool holds back (the null block,
    vLLM 0.32 `get_kv_cache_configs`); it allocates whole blocks from every
    KV-cache group.  shared/vllm/captures/f1_kv_cache_too_small.txt shows both:
    262,144 B is 4 blocks of 65,536 B, and vLLM names 384 = 3 × 128 tokens.
    Message text from a real vLLM 0.32.0 (docs/vllm-behaviour.md, "Lengths on vLLM 0.32.0").
    """
    groups = groups or single_group(bytes_per_token, block_size)
    fit = startup_fit(kv_memory_bytes, groups, max_model_len,
                      max_model_len if in_flight_tokens is None else in_flight_tokens)
    estimated = fit.estimated_max_model_len
    if fit.fits:
        return StartupCheck(max_model_len, fit.needed_bytes, fit.check_bytes, True, estimated, None, None)
    message = VLLM_STARTUP_ERROR.format(
        max_model_len=max_model_len, needed_gib=fit.needed_bytes / GIB,
        available_gib=fit.check_bytes / GIB, estimated=estimated,
    )
    if estimated > 0:
        fix = (f"start vLLM with --max-model-len {estimated} or less, or free memory: raise "
               "--gpu-memory-utilization, use --kv-cache-dtype fp8, a bigger GPU or tensor parallelism")
    else:
        fix = ("no KV memory is left after weights and activations: use a bigger GPU, quantised "
               "weights or tensor parallelism, or raise --gpu-memory-utilization")
    return StartupCheck(max_model_len, fit.needed_bytes, fit.check_bytes, False, estimated, message, fix)


# ---------------------------------------------------------------------------
# the whole plan


@dataclass(frozen=True)
class PlanInputs:
    bytes_per_token: int
    gpu_memory_bytes: int
    weights_bytes: int
    utilization: float = DEFAULT_UTILIZATION
    activation_bytes: int = DEFAULT_ACTIVATION_BYTES
    block_size: int = DEFAULT_BLOCK_SIZE
    tokens_per_request: int = 1500
    max_model_len: int | None = None
    target_concurrency: int | None = None
    gpu_hourly_usd: float | None = None
    max_num_seqs: int | None = None      # vLLM's cap on sequences running at once (None: not applied)
    tensor_parallel_size: int = 1        # GPUs per replica; every other figure is per GPU
    # vLLM's KV-cache groups (None: every layer full attention, bytes_per_token × block_size per block)
    kv_groups: KvGroups | None = None
    # max_num_batched_tokens × concurrent batches (`max_in_flight_tokens`): what a sliding or chunked
    # layer holds beyond its window; None counts a whole request (never less than vLLM reserves)
    in_flight_tokens: int | None = None

    def groups(self) -> KvGroups:
        return self.kv_groups or single_group(self.bytes_per_token, self.block_size)

    def in_flight(self) -> int:
        if self.in_flight_tokens is not None:
            return self.in_flight_tokens
        return max(self.max_model_len or 0, self.tokens_per_request)


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    memory: GpuMemoryBudget
    kv_tokens: int
    kv_blocks: int
    slots_per_request: int
    concurrent_requests: int
    gpus_for_target: int | None
    monthly_cost_usd: float | None
    utilization_step: UtilizationStep
    mean_last_block_waste: float
    startup: StartupCheck | None
    # the article's comparison: every request reserving max_model_len slots
    concurrent_at_max_model_len: int | None = None
    gpus_at_max_model_len: int | None = None
    monthly_cost_at_max_model_len_usd: float | None = None
    warnings: tuple[str, ...] = field(default=())
    # `concurrent_requests` is the memory bound; vLLM runs at most max_num_seqs at once
    concurrency: int = 0
    limited_by: str = "memory"           # "memory" or "max_num_seqs"
    # pool blocks one request of tokens_per_request takes, summed over vLLM's KV-cache groups
    blocks_per_request: int = 0
    # what vLLM logs at start-up for max_model_len: "KV cache size: N tokens, Maximum concurrency ...: X"
    vllm_kv_cache_tokens: int | None = None
    vllm_max_concurrency: float | None = None


def _kv_figures(inputs: PlanInputs, kv_memory_bytes: int) -> tuple[int, int, int, int, int | None, float | None]:
    """(KV tokens, pool blocks, blocks per request, slots per request, vLLM's tokens, vLLM's concurrency).

    With only full attention KV tokens are the article's floor(memory ÷ bytes per
    token); with sliding, chunked or linear layers a token count depends on the
    length, so it is vLLM's own figure at max_model_len (or at tokens_per_request).
    """
    groups, in_flight = inputs.groups(), inputs.in_flight()
    blocks = groups.num_blocks(kv_memory_bytes)
    per_request = groups.blocks_per_request(inputs.tokens_per_request, in_flight)
    vllm_tokens = vllm_conc = None
    if inputs.max_model_len is not None:
        vllm_conc = max_concurrency(blocks, groups, inputs.max_model_len, in_flight)
        vllm_tokens = kv_cache_size_tokens(blocks, groups, inputs.max_model_len, in_flight)
    if len(groups.groups) > 1 or groups.groups[0].spec.kind != "full":
        length = inputs.max_model_len or inputs.tokens_per_request
        tokens = kv_cache_size_tokens(blocks, groups, length, in_flight)
        slots = per_request * groups.block_size
    else:
        tokens = kv_tokens(kv_memory_bytes, inputs.bytes_per_token)
        slots = slots_per_request(inputs.tokens_per_request, groups.block_size)
    return tokens, blocks, per_request, slots, vllm_tokens, vllm_conc


def make_plan(inputs: PlanInputs) -> Plan:
    """Combine the steps above into one answer (what `brimful plan` prints)."""
    memory = kv_memory(inputs.gpu_memory_bytes, inputs.utilization,
                       inputs.weights_bytes, inputs.activation_bytes)
    tokens, blocks, per_request, slots, vllm_tokens, vllm_conc = _kv_figures(inputs, memory.kv_memory_bytes)
    groups = inputs.groups()
    per_gpu = blocks // per_request
    effective, limited_by = per_gpu, "memory"
    if inputs.max_num_seqs is not None and inputs.max_num_seqs < per_gpu:
        effective, limited_by = inputs.max_num_seqs, "max_num_seqs"
    tp = inputs.tensor_parallel_size
    gpus = None
    cost = None
    if inputs.target_concurrency is not None:
        replicas = gpus_for_target(inputs.target_concurrency, effective)
        gpus = None if replicas is None else replicas * tp
        if gpus is not None and inputs.gpu_hourly_usd is not None:
            cost = monthly_cost(gpus, inputs.gpu_hourly_usd)
    startup = None
    at_max = gpus_at_max = cost_at_max = None
    warnings: list[str] = []
    if memory.kv_memory_bytes <= 0:
        warnings.append(
            "weights and activations exceed the usable memory: no KV cache is left "
            "(vLLM: No available memory for the cache blocks)"
        )
    if inputs.max_model_len is not None:
        startup = startup_check(inputs.max_model_len, memory.kv_memory_bytes, inputs.bytes_per_token,
                                inputs.block_size, groups, inputs.in_flight())
        at_max = blocks // groups.blocks_per_request(inputs.max_model_len, inputs.in_flight())
        if inputs.max_num_seqs is not None:
            at_max = min(at_max, inputs.max_num_seqs)
        if inputs.target_concurrency is not None:
            replicas_at_max = gpus_for_target(inputs.target_concurrency, at_max)
            gpus_at_max = None if replicas_at_max is None else replicas_at_max * tp
            if gpus_at_max is not None and inputs.gpu_hourly_usd is not None:
                cost_at_max = monthly_cost(gpus_at_max, inputs.gpu_hourly_usd)
        if not startup.fits:
            warnings.append(
                f"max_model_len {inputs.max_model_len} exceeds the KV cache "
                f"({tokens} tokens): vLLM refuses to start"
            )
    return Plan(
        inputs=inputs, memory=memory, kv_tokens=tokens, kv_blocks=blocks, slots_per_request=slots,
        concurrent_requests=per_gpu, gpus_for_target=gpus, monthly_cost_usd=cost,
        utilization_step=utilization_step(inputs.gpu_memory_bytes, inputs.bytes_per_token),
        mean_last_block_waste=mean_last_block_waste(inputs.block_size),
        startup=startup, concurrent_at_max_model_len=at_max, gpus_at_max_model_len=gpus_at_max,
        monthly_cost_at_max_model_len_usd=cost_at_max, warnings=tuple(warnings),
        concurrency=effective, limited_by=limited_by, blocks_per_request=per_request,
        vllm_kv_cache_tokens=vllm_tokens, vllm_max_concurrency=vllm_conc,
    )
