"""vLLM 0.32's KV-cache manager for every attention layout: layer specs, groups, blocks, concurrency.

A pure model of what `vllm/v1/core/kv_cache_utils.py` (0.32.0) does at start-up,
so `brimful plan` gives the figures vLLM itself logs:

    CPU KV cache size: N tokens, Maximum concurrency for L tokens per request: X.XXx

1. Every layer has a spec (`vllm/v1/kv_cache_interface.py`): full attention
   (`FullAttentionSpec`, MLA's `MLAAttentionSpec`), sliding window
   (`SlidingWindowSpec`), chunked local attention (`ChunkedLocalAttentionSpec`)
   or a linear-attention state (`MambaSpec`).  A page is one block of one
   layer: block_size × bytes per token (a Mamba page is its fixed state).
2. `get_kv_cache_groups` splits the layers into groups that share a block
   table: one group when all specs are equal or of one type
   (`UniformTypeKVCacheSpecs`); otherwise pages are unified
   (`unify_kv_cache_spec_page_size`: a smaller page's block size is scaled up,
   or the page padded) and each kind is cut into groups of the same number of
   layers (`_get_kv_cache_groups_uniform_page_size`), the last one padded.
   With the hybrid manager off (`--disable-hybrid-kv-cache-manager`, and by
   default for chunked local attention) sliding and chunked layers next to
   full ones are allocated as full attention (`unify_hybrid_kv_cache_specs`).
3. One block of the shared pool holds a page of every layer of the widest
   group: num_blocks = memory // bytes_per_block
   (`get_kv_cache_config_from_groups`).
4. A request of L tokens takes, from every group, ceil(max_memory_usage_bytes
   ÷ page) blocks: full ceil(L ÷ B); sliding ceil(min(W − 1 + F, L) ÷ B) + 1;
   chunked ceil(min(C + F, L) ÷ B); Mamba 1 — F being the tokens in flight,
   max_num_batched_tokens × concurrent batches (`VllmConfig.max_in_flight_tokens`).
   Maximum concurrency = num_blocks ÷ Σ those blocks, as a float
   (`get_max_concurrency_for_kv_cache_config`); the "KV cache size" it logs
   is int(concurrency × max_model_len) (`get_kv_cache_capacity`).
5. At start-up one block is held back (the pool's null block): vLLM starts
   when bytes_per_block × Σ blocks(max_model_len) ≤ memory − bytes_per_block,
   and otherwise names the longest length that would fit, found by the same
   binary search (`_estimate_max_model_len_from_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

Kind = Literal["full", "sliding", "chunked", "mamba"]
# The notes of `_get_kv_cache_groups_uniform_page_size`: the group size is the
# smallest kind's layer count unless the largest is below 1.5 times it.
_GROUP_SIZE_SLACK = 1.5


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class LayerSpec:
    """One layer's KV-cache spec, per GPU: what vLLM's `KVCacheSpec` records that moves memory."""

    kind: Kind
    block_size: int
    bytes_per_token: int = 0          # attention: K+V (or the MLA latent) of one token; 0 for Mamba
    window: int | None = None         # sliding_window, or attention_chunk_size for "chunked"
    state_bytes: int = 0              # Mamba: the fixed per-sequence state
    page_size_padded: int | None = None
    state_blocks: int = 1             # Mamba: pages per request (2 in mamba_cache_mode "align")

    @property
    def page_bytes(self) -> int:
        """Bytes of one block of this layer (`page_size_bytes`)."""
        if self.page_size_padded is not None:
            return self.page_size_padded
        return self.state_bytes if self.kind == "mamba" else self.block_size * self.bytes_per_token

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        """ceil(max_memory_usage_bytes ÷ page_size_bytes) for a request of max_model_len tokens."""
        if self.kind == "mamba":
            return self.state_blocks
        if self.kind == "sliding":
            assert self.window is not None
            return _cdiv(min(self.window - 1 + in_flight_tokens, max_model_len), self.block_size) + 1
        if self.kind == "chunked":
            assert self.window is not None
            return _cdiv(min(self.window + in_flight_tokens, max_model_len), self.block_size)
        return _cdiv(max_model_len, self.block_size)


@dataclass(frozen=True)
class KvGroup:
    """Layers sharing one block table (`KVCacheGroupSpec`); `spec` is each layer's (unified) spec."""

    spec: LayerSpec
    layers: tuple[int, ...]
    page_bytes: int                   # Σ of its layers' pages: what one pool block holds for it


@dataclass(frozen=True)
class KvGroups:
    """The grouping vLLM makes for one model, and the bytes one pool block costs."""

    groups: tuple[KvGroup, ...]
    bytes_per_block: int
    padding_layers: int = 0           # empty slots in the last group of a kind ("Add N padding layers")
    promoted: bool = False            # local layers allocated as full (hybrid manager off)

    @property
    def block_size(self) -> int:
        """The smallest group block size: the unit of vLLM's block figures."""
        return min(g.spec.block_size for g in self.groups)

    def blocks_per_request(self, tokens: int, in_flight_tokens: int) -> int:
        """Pool blocks one request of `tokens` takes: the sum over the groups."""
        return sum(g.spec.blocks_per_request(tokens, in_flight_tokens) for g in self.groups)

    def num_blocks(self, memory_bytes: int) -> int:
        """Blocks the pool gets from this memory (`available_memory // bytes_per_block`)."""
        return max(0, memory_bytes) // self.bytes_per_block


def hybrid_attention_block_size(block_size: int, attention_bytes_per_token: int, state_bytes: int) -> int:
    """`Platform._align_hybrid_block_size` (vllm/platforms/interface.py): the attention block grows in
    steps of block_size until one attention page holds a Mamba state; the state is padded to that page."""
    return block_size * max(1, _cdiv(state_bytes, block_size * attention_bytes_per_token))


def _promote_local_layers(specs: Sequence[LayerSpec]) -> tuple[list[LayerSpec], bool]:
    """`_promote_local_kv_cache_specs`: with full layers present, sliding/chunked ones become full."""
    kinds = {s.kind for s in specs}
    if "full" not in kinds or not kinds & {"sliding", "chunked"}:
        return list(specs), False
    full_blocks = {s.block_size for s in specs if s.kind == "full"}
    block = next(iter(full_blocks)) if len(full_blocks) == 1 else None
    out = [replace(s, kind="full", window=None, block_size=block or s.block_size)
           if s.kind in ("sliding", "chunked") else s for s in specs]
    return out, True


def _uniform_type(specs: Sequence[LayerSpec]) -> bool:
    """`UniformTypeKVCacheSpecs.is_uniform_type`: one block size, one kind, one window."""
    first = specs[0]
    return all(s.block_size == first.block_size and s.kind == first.kind
               and (first.kind == "full" or s.window == first.window)
               and (first.kind != "mamba" or s.page_bytes == first.page_bytes) for s in specs)


def _unify_pages(specs: Sequence[LayerSpec]) -> list[LayerSpec]:
    """`unify_kv_cache_spec_page_size`: scale block sizes (or pad pages) up to the largest page."""
    largest = max(s.page_bytes for s in specs)
    out = []
    for s in specs:
        if s.page_bytes == largest:
            out.append(s)
        elif s.kind != "mamba" and largest % s.page_bytes == 0:
            out.append(replace(s, block_size=s.block_size * (largest // s.page_bytes)))
        else:
            out.append(replace(s, page_size_padded=largest))
    return out


def group_layers(specs: Sequence[LayerSpec], hybrid_manager: bool = True) -> KvGroups:
    """vLLM's `get_kv_cache_groups` + the block size of `get_kv_cache_config_from_groups`."""
    if not specs:
        raise ValueError("a model without KV-cache layers has no KV-cache groups")
    promoted = False
    if not hybrid_manager:
        specs, promoted = _promote_local_layers(specs)
    everyone = tuple(range(len(specs)))
    if len(set(specs)) == 1 or _uniform_type(specs):
        page = sum(s.page_bytes for s in specs)
        return KvGroups((KvGroup(specs[0], everyone, page),), page, 0, promoted)
    unified = _unify_pages(specs)
    buckets: dict[LayerSpec, list[int]] = {}
    for index, spec in enumerate(unified):
        buckets.setdefault(spec, []).append(index)
    sizes = [len(layers) for layers in buckets.values()]
    group_size = max(sizes) if max(sizes) < min(sizes) * _GROUP_SIZE_SLACK else min(sizes)
    groups: list[KvGroup] = []
    padding = 0
    for spec, layers in buckets.items():
        count = _cdiv(len(layers), group_size)
        padding += count * group_size - len(layers)
        for i in range(count):
            members = tuple(layers[i::count])
            groups.append(KvGroup(spec, members, len(members) * spec.page_bytes))
    return KvGroups(tuple(groups), max(g.page_bytes for g in groups), padding, promoted)


def max_concurrency(num_blocks: int, groups: KvGroups, max_model_len: int, in_flight_tokens: int) -> float:
    """vLLM's "Maximum concurrency for L tokens per request": num_blocks ÷ blocks per request, a float."""
    return num_blocks / groups.blocks_per_request(max_model_len, in_flight_tokens)


def kv_cache_size_tokens(num_blocks: int, groups: KvGroups, max_model_len: int, in_flight_tokens: int) -> int:
    """vLLM's "KV cache size: N tokens" = int(max concurrency × max_model_len), float arithmetic as vLLM."""
    return int(max_concurrency(num_blocks, groups, max_model_len, in_flight_tokens) * max_model_len)


@dataclass(frozen=True)
class StartupFit:
    """`_check_enough_kv_cache_memory` after the null block is held back."""

    fits: bool
    check_bytes: int                  # memory − one block: what vLLM calls the available KV memory
    needed_bytes: int                 # bytes_per_block × blocks of one max_model_len request
    estimated_max_model_len: int      # the longest length that fits (0: not even one token)


def longest_fitting(check_bytes: int, groups: KvGroups, up_to: int, in_flight_tokens: int) -> int:
    """The longest length in 1..up_to whose request fits `check_bytes` (vLLM's binary search); 0 if none."""
    def fits(length: int) -> bool:
        return groups.bytes_per_block * groups.blocks_per_request(length, in_flight_tokens) <= check_bytes

    if check_bytes <= 0 or not fits(1):
        return 0
    best, low, high = 1, 1, up_to
    while low <= high:
        mid = (low + high) // 2
        if fits(mid):
            best, low = mid, mid + 1
        else:
            high = mid - 1
    return best


def startup_fit(memory_bytes: int, groups: KvGroups, max_model_len: int, in_flight_tokens: int) -> StartupFit:
    """Would vLLM start?  The longest length that would is searched up to the pool's full-attention
    length (or max_model_len when larger), so a fitting plan also says how far it could go."""
    check = max(0, memory_bytes - groups.bytes_per_block)
    needed = groups.bytes_per_block * groups.blocks_per_request(max_model_len, in_flight_tokens)
    fits = memory_bytes > groups.bytes_per_block and needed <= check
    up_to = max(max_model_len, groups.num_blocks(memory_bytes) * groups.block_size)
    return StartupFit(fits, check, needed, longest_fitting(check, groups, up_to, in_flight_tokens))
