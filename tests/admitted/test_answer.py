"""proxy.admitted.answer: a JSON answer scanned chunk by chunk, whatever the chunk boundaries."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.admitted.answer import TAIL_BYTES, AnswerScanner

ANSWER = {
    "id": "chatcmpl-1", "object": "chat.completion",
    "choices": [
        {"index": 0, "message": {"role": "assistant",
                                 "content": 'say "finish_reason": "stop" {[\\ and \\" ]}'},
         "finish_reason": "length"},
        {"index": 1, "message": {"role": "assistant", "content": "x" * 3000}, "finish_reason": "stop"},
    ],
    "usage": {"prompt_tokens": 12, "total_tokens": 40, "completion_tokens": 28,
              "prompt_tokens_details": {"cached_tokens": 0}},
    "kv_transfer_params": None,
}


def scan(data: bytes, cuts: list[int]) -> AnswerScanner:
    scanner = AnswerScanner()
    start = 0
    for cut in [*sorted({c % (len(data) + 1) for c in cuts}), len(data)]:
        scanner.feed(data[start:cut])
        start = cut
    return scanner


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0), max_size=12), st.sampled_from([None, 2]))
def test_any_split_finds_the_same_facts(cuts: list[int], indent: int | None) -> None:
    data = json.dumps(ANSWER, indent=indent).encode()
    scanner = scan(data, cuts)
    assert scanner.complete
    assert scanner.usage() == ANSWER["usage"]
    assert scanner.finish_reasons == ["length", "stop"]    # the quoted one inside content is not a key


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=1), st.lists(st.integers(min_value=0), max_size=6))
def test_an_answer_cut_short_is_not_complete(cut: int, cuts: list[int]) -> None:
    data = json.dumps(ANSWER).encode()
    short = data[: cut % len(data)]
    assert not scan(short, cuts).complete


def test_what_is_not_one_json_value() -> None:
    for body in (b'{"id": "x", "choices": [', b"", b"   ", b"hello", b'{"a": 1} {"b": 2}', b'{"a": 1}}',
                 b'"just a string"', b'{"a": "unterminated}'):
        assert not scan(body, []).complete, body
    for body in (b'{"a": 1}', b' [1, {"b": []}]\n', b'{"s": "\\\\"}', b'{"s": "\\""}'):
        assert scan(body, []).complete, body


def test_a_backslash_at_a_chunk_boundary() -> None:
    data = b'{"s": "a\\\\", "t": "b\\"}"}'
    for cut in range(len(data)):
        scanner = AnswerScanner()
        scanner.feed(data[:cut])
        scanner.feed(data[cut:])
        assert scanner.complete, cut


def test_usage_is_read_from_a_bounded_tail() -> None:
    scanner = AnswerScanner()
    scanner.feed(b'{"choices": [{"message": {"content": "')
    for _ in range(100):
        scanner.feed(b"y" * 100_000)                      # 10 MB of content
    scanner.feed(b'"}, "finish_reason": "length"}], "usage": {"prompt_tokens": 3, "completion_tokens": 9}}')
    assert scanner.complete and scanner.finish_reasons == ["length"]
    assert scanner.usage() == {"prompt_tokens": 3, "completion_tokens": 9}
    assert len(scanner._tail) <= TAIL_BYTES
