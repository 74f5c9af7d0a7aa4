"""Pools: upstreams serving the same model with different `max_model_len`, and which one a request goes to.

A request is decided (counted, clamped or refused) against the longest pool,
because that is what the deployment serves: talking to it directly, a client
would get at most min(its ask, longest − prompt) tokens, and brimful must never
give less.  It then goes to the smallest pool whose window holds its prompt
(a batch's longest) plus that grant; a request that asks for no limit is
granted the whole room of the longest pool, so it goes there.  When the chosen
pool still refuses it for length (its own count drifted, a window smaller than
its card said), the next larger pool is tried, up to the longest, where
brimful's usual one retry applies.
"""

from __future__ import annotations

from collections.abc import Sequence


def choose_pool(windows: Sequence[int], prompt: int | None, granted: int | None) -> int:
    """The index of the smallest window (sorted ascending) holding prompt + granted; the longest otherwise.

    `granted` None (nothing asked, nothing clamped: the whole room) and an unknown prompt go to the longest.
    """
    if not windows:
        raise ValueError("no pools")
    last = len(windows) - 1
    if prompt is None or granted is None:
        return last
    need = prompt + granted
    for i, window in enumerate(windows):
        # a generation needs room for one token after the prompt; pooling inputs (granted 0) fill it whole
        if need <= window and (prompt < window or granted == 0):
            return i
    return last
