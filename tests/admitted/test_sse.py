"""proxy.admitted.sse: the scanner that removes the usage chunk brimful asked for (issue 25 item 6)."""

from __future__ import annotations

from proxy.admitted.sse import MAX_HELD_EVENT, EventStreamScanner
from proxy.admitted.surfaces import CHAT

DELTA = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}],"usage":null}\n\n'
USAGE = (b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,'
         b'"total_tokens":10}}\n\n')


def test_a_long_line_is_relayed_as_it_arrives_not_held() -> None:
    scanner = EventStreamScanner(CHAT)
    assert scanner.drop_usage_events(DELTA) == DELTA
    piece = b"x" * (1024 * 1024)
    first = scanner.drop_usage_events(b'data: {"choices":[{"delta":{"content":"' + piece)
    assert len(first) > len(piece)                         # past MAX_HELD_EVENT: relayed at once
    for _ in range(50):                                    # 50 MiB on one line, no newline
        assert scanner.drop_usage_events(piece) == piece   # each chunk out as it came, nothing held
        assert len(scanner._event_tail) <= MAX_HELD_EVENT
    end = scanner.drop_usage_events(b'"}}]}\n')            # the event ends across two chunks
    assert end == b'"}}]}\n'
    assert scanner.drop_usage_events(b"\n" + USAGE + b"data: [DONE]\n\n") == b"\ndata: [DONE]\n\n"
    assert scanner.usage.prompt_tokens == 7 and scanner.usage.completion_tokens == 3   # dropped, read
    assert scanner.done and scanner.leftover() == b""


def test_short_events_are_still_cut_at_their_end_and_the_usage_chunk_dropped() -> None:
    scanner = EventStreamScanner(CHAT)
    stream = DELTA * 3 + USAGE + b"data: [DONE]\n\n"
    relayed = b"".join(scanner.drop_usage_events(stream[i:i + 7]) for i in range(0, len(stream), 7))
    assert relayed + scanner.leftover() == DELTA * 3 + b"data: [DONE]\n\n"
    assert scanner.usage.prompt_tokens == 7 and scanner.done


def test_a_long_event_that_is_not_a_line_is_relayed_too() -> None:
    scanner = EventStreamScanner(CHAT)
    lines = b"".join(b": comment %d\n" % i for i in range(20_000))    # 300 KB of one event's lines
    out = scanner.drop_usage_events(lines)
    assert len(out) >= len(lines) - MAX_HELD_EVENT and out == lines[:len(out)]
    rest = scanner.drop_usage_events(b"\n" + DELTA)
    assert out + rest == lines + b"\n" + DELTA
