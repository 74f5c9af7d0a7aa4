"""Named GPUs and how much memory the planner assumes each one has.

Sizes are the marketing figure ("80 GB") read as **GiB** (2^30 bytes), because
that is what the source article does: its H100 arithmetic is
`80 × 0.92 = 73.6 GiB` usable, then `73.6 − 15.26 − 4 ≈ 54.34 GiB` of KV, and
`54.34 GiB ÷ 144 KiB ≈ 395,717 tokens` only comes out with 80 × 2^30 bytes
(80 × 10^9 bytes would give ≈ 49.3 GiB of KV and ≈ 358,900 tokens).  Its A10
line (`24 × 0.92 − 14.2 − 4 ≈ 3.9 GiB`) follows the same reading.  So
`--gpu H100-80GB` reproduces the article's figures.

The memory the driver actually reports is a little different from the nominal
size (the board reserves some, ECC takes some, and vLLM measures free memory
at start-up), so for a tight plan pass the real total with `--gpu-memory`
(e.g. the `memory.total` that `nvidia-smi` prints, in MiB) and compare the
plan with vLLM's start-up log line `GPU KV cache size: N tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: int
    note: str = ""

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


def _gpu(name: str, gib: int, note: str = "") -> Gpu:
    return Gpu(name=name, memory_bytes=gib * GIB, note=note)


# Nominal sizes, read as GiB (see the module docstring for why).
GPUS: dict[str, Gpu] = {
    g.name: g
    for g in (
        _gpu("H100-80GB", 80, "SXM or PCIe"),
        _gpu("H100NVL-94GB", 94),
        _gpu("H200-141GB", 141),
        _gpu("B200-180GB", 180),
        _gpu("A100-80GB", 80),
        _gpu("A100-40GB", 40),
        _gpu("L40S-48GB", 48),
        _gpu("L40-48GB", 48),
        _gpu("A6000-48GB", 48, "RTX A6000"),
        _gpu("A10-24GB", 24),
        _gpu("A10G-24GB", 24, "AWS g5"),
        _gpu("L4-24GB", 24),
        _gpu("RTX4090-24GB", 24),
        _gpu("RTX3090-24GB", 24),
        _gpu("V100-32GB", 32),
        _gpu("V100-16GB", 16),
        _gpu("T4-16GB", 16),
        _gpu("MI300X-192GB", 192, "AMD"),
    )
}


def _normalise(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch.isalnum())


def lookup_gpu(name: str) -> Gpu:
    """Find a GPU by name, ignoring case, spaces, dashes and underscores.

    `h100`, `H100 80GB` and `h100-80gb` all find `H100-80GB`; a bare family
    name (the part before the dash) is accepted only when it names exactly one
    entry (`A100` is ambiguous: 40 or 80 GB).
    """
    key = _normalise(name)
    exact = [g for g in GPUS.values() if _normalise(g.name) == key]
    if exact:
        return exact[0]
    prefixed = [g for g in GPUS.values() if _normalise(g.name.split("-")[0]) == key]
    if len(prefixed) == 1:
        return prefixed[0]
    known = ", ".join(GPUS)
    if prefixed:
        names = ", ".join(g.name for g in prefixed)
        raise KeyError(f"GPU name {name!r} is ambiguous: {names}")
    raise KeyError(f"unknown GPU {name!r}; known: {known} (or pass --gpu-memory)")
