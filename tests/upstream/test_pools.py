"""Which pool a request goes to (proxy.upstream.pools.choose_pool): pure, by hand."""

from __future__ import annotations

import pytest

from proxy.upstream.pools import choose_pool

WINDOWS = [2048, 8192, 32768]


@pytest.mark.parametrize("prompt, granted, expected", [
    (1000, 1048, 0),        # exactly the short window
    (1000, 1049, 1),
    (2047, 1, 0),
    (2048, 0, 0),           # a pooling input may fill the window
    (2048, 1, 1),           # a generation needs a token after the prompt
    (9000, 100, 2),
    (40000, 10, 2),         # none fits: the longest, where admission already refused it
    (1000, None, 2),        # nothing asked: the whole room of the longest
    (None, 10, 2),          # not counted: the longest judges
])
def test_smallest_window_that_holds_prompt_plus_grant(prompt, granted, expected):
    assert choose_pool(WINDOWS, prompt, granted) == expected


def test_no_pools_is_an_error():
    with pytest.raises(ValueError):
        choose_pool([], 1, 1)
