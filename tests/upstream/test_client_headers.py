"""What of an upstream answer's headers a client may see: no URL that names the upstream."""

from __future__ import annotations

import pytest

from proxy.upstream.client import client_headers, local_reference

UP = "http://10.0.0.7:8000"


@pytest.mark.parametrize("location,expected", [
    ("http://10.0.0.7:8000/v1/chat/completions", "/v1/chat/completions"),      # vLLM's slash redirect
    ("http://10.0.0.7:8000/v1/models?x=1#f", "/v1/models?x=1#f"),
    ("HTTP://10.0.0.7:8000/a", "/a"),
    ("//10.0.0.7:8000/a", "/a"),                                                 # scheme-relative
    ("http://10.0.0.7:8000//evil.example/x", "/evil.example/x"),                 # never "//host": another host
    ("http://10.0.0.7:8000", "/"),
])
def test_a_location_naming_the_upstream_becomes_a_reference_to_brimful(location: str, expected: str) -> None:
    assert local_reference(location.encode(), UP) == expected.encode()


@pytest.mark.parametrize("location", ["/v1/chat/completions", "https://10.0.0.7:8000/a", "http://10.0.0.7:8001/a",
                                      "http://example.com/a", "http://10.0.0.7:x/a", "", "mailto:a@b"])
def test_other_locations_are_left_as_sent(location: str) -> None:
    assert local_reference(location.encode(), UP) is None


def test_the_upstream_prefix_is_taken_off_and_default_ports_match() -> None:
    assert local_reference(b"http://vllm.internal/serving/v1/chat/completions",
                           "http://vllm.internal:80/serving") == b"/v1/chat/completions"


def test_only_url_headers_are_rewritten() -> None:
    headers = [(b"location", b"http://10.0.0.7:8000/v1/x"), (b"x-other", b"http://10.0.0.7:8000/v1/x"),
               (b"content-location", b"http://10.0.0.7:8000/y")]
    assert client_headers(headers, UP) == [(b"location", b"/v1/x"), (b"x-other", b"http://10.0.0.7:8000/v1/x"),
                                           (b"content-location", b"/y")]
