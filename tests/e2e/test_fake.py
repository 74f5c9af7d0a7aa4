"""End to end: the official `openai` client → brimful → a fake vLLM on loopback.

The fake (tests/fakevllm.py) answers with vLLM 0.32.0's captured bodies and
error texts, and counts prompts with brimful's own counter on the real Qwen3
tokenizer, so its accept/clamp/reject decisions are the ones a real vLLM makes
on these prompts.  `mode="legacy"` reproduces the older versions that reject
`prompt + max_tokens > max_model_len` instead of clamping.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from proxy.admitted import jsonbody
from proxy.app import BrimfulApp
from tests.support.fakevllm import FakeVLLM, FaultSpec
from tests.support.servers import serve_in_thread
from tests.support.stack import Stack, fake_counter, make_config, running_stack

MML = 2048


@pytest.fixture
def stack_factory(qwen3, qwen3_dir) -> Iterator:
    opened = []

    def build(mode: str = "v0.32", tokenizer: bool = True, fake_kwargs: dict | None = None, **policy) -> Stack:
        ctx = running_stack(qwen3_dir if tokenizer else None, recorder=None, policy=policy, fake_kwargs={
            "max_model_len": MML, "count_prompt": fake_counter(qwen3), "mode": mode, **(fake_kwargs or {})})
        opened.append(ctx)
        return ctx.__enter__()

    yield build
    for item in reversed(opened):
        item.__exit__(None, None, None)


@pytest.fixture
def stack(stack_factory) -> Stack:
    return stack_factory()


def long_messages(qwen3, target: int) -> list[dict]:
    """A conversation of exactly `target` prompt tokens (Qwen3 chat template)."""
    words = ["hello"] * target
    lo, hi = 1, target
    while lo < hi:  # binary search on the number of words
        mid = (lo + hi + 1) // 2
        n = qwen3.count_chat({"messages": [{"role": "user", "content": " ".join(words[:mid])}]})
        if n <= target:
            lo = mid
        else:
            hi = mid - 1
    messages = [{"role": "user", "content": " ".join(words[:lo])}]
    pad = target - qwen3.count_chat({"messages": messages})
    for _ in range(pad):  # top up one token at a time with single-token punctuation
        messages[0]["content"] += " ?"
        if qwen3.count_chat({"messages": messages}) > target:
            messages[0]["content"] = messages[0]["content"][:-2]
            break
    assert qwen3.count_chat({"messages": messages}) == target, "could not build an exact-length prompt"
    return messages


HELLO = [{"role": "user", "content": "Hello!"}]


# --- clamping ---------------------------------------------------------------


def test_max_tokens_above_max_model_len_is_clamped_and_succeeds(stack: Stack) -> None:
    raw = stack.client.chat.completions.with_raw_response.create(
        model="tiny-qwen", messages=HELLO, max_tokens=65535
    )
    completion = raw.parse()
    assert raw.headers["x-brimful-action"] == "clamped"
    assert raw.headers["x-brimful-prompt-tokens"] == "10"          # captures/b01: usage.prompt_tokens 10
    assert raw.headers["x-brimful-max-model-len"] == str(MML)
    assert raw.headers["x-brimful-requested-max-tokens"] == "65535"
    granted = MML - 10
    assert raw.headers["x-brimful-granted-max-tokens"] == str(granted)
    assert completion.usage.prompt_tokens == 10
    assert completion.usage.completion_tokens == granted
    sent = stack.chat_requests()[-1].json
    assert sent["max_tokens"] == granted
    assert sent["messages"] == HELLO


def test_without_brimful_the_same_request_is_rejected(stack: Stack) -> None:
    direct = openai.OpenAI(base_url=stack.fake.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        direct.chat.completions.create(model="tiny-qwen", messages=HELLO, max_tokens=65535)
    assert "cannot be greater than max_model_len" in str(info.value)


def test_legacy_vllm_overflow_is_saved(stack_factory, qwen3) -> None:
    stack = stack_factory(mode="legacy")
    messages = long_messages(qwen3, 1500)
    direct = openai.OpenAI(base_url=stack.fake.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        direct.chat.completions.create(model="tiny-qwen", messages=messages, max_tokens=1000)
    raw = stack.client.chat.completions.with_raw_response.create(
        model="tiny-qwen", messages=messages, max_tokens=1000
    )
    assert raw.parse().usage.completion_tokens == MML - 1500
    assert raw.headers["x-brimful-action"] == "clamped"


def test_both_limit_fields_are_rewritten_together(stack: Stack) -> None:
    raw = stack.client.chat.completions.with_raw_response.create(
        model="tiny-qwen", messages=HELLO, max_tokens=3, max_completion_tokens=99999
    )
    assert raw.parse().usage.completion_tokens == MML - 10
    sent = stack.chat_requests()[-1].json
    assert sent["max_tokens"] == sent["max_completion_tokens"] == MML - 10


def test_fitting_request_is_forwarded_byte_for_byte(stack: Stack) -> None:
    body = (b'{"model":"tiny-qwen","messages":[{"role":"user","content":"Hello!"}],'
            b'  "max_tokens":  5,"x_unknown":[1,2.50]}')
    response = stack.http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200
    assert response.headers["x-brimful-action"] == "pass"
    assert response.headers["x-brimful-granted-max-tokens"] == "5"
    assert stack.chat_requests()[-1].body == body


def test_a_large_clamped_body_keeps_every_byte_but_the_limit(stack: Stack) -> None:
    """Bodies from 4 KiB on are spliced: the client's formatting, escapes, key order and
    duplicate keys reach vLLM as sent, with each occurrence of the limit replaced."""
    content = "Explain KV caches. 한국어 \\u00e9 " * 200
    head = '{ "model" : "tiny-qwen",\n "max_tokens" : 99999, "messages":[{"role":"user","content":"' + content + '"}]'
    body = (head + ', "temperature": 1.0, "max_tokens": 65535 }').encode()
    assert len(body) >= jsonbody.SPLICE_ABOVE_BYTES
    response = stack.http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200 and response.headers["x-brimful-action"] == "clamped"
    granted = response.headers["x-brimful-granted-max-tokens"]
    expected = (head.replace('"max_tokens" : 99999', f'"max_tokens" : {granted}')
                + f', "temperature": 1.0, "max_tokens": {granted} }}').encode()
    assert stack.chat_requests()[-1].body == expected


def test_policy_reject_explains_instead(stack_factory) -> None:
    stack = stack_factory(on_overflow="reject")
    with pytest.raises(openai.BadRequestError) as info:
        stack.client.chat.completions.create(model="tiny-qwen", messages=HELLO, max_tokens=4000)
    err = info.value.body
    assert err["code"] == "context_length_exceeded"
    assert "4000" in err["message"] and str(MML - 10) in err["message"]
    assert stack.chat_requests() == []


# --- rejections brimful makes itself -----------------------------------------


@pytest.mark.parametrize("prompt", [MML, MML + 61])
def test_prompt_too_long_gets_exact_count(stack_factory, qwen3, prompt: int) -> None:
    stack = stack_factory()
    messages = long_messages(qwen3, prompt)
    with pytest.raises(openai.BadRequestError) as info:
        stack.client.chat.completions.create(model="tiny-qwen", messages=messages, max_tokens=1)
    err = info.value.body
    assert err["code"] == "context_length_exceeded"
    assert f"{prompt} tokens" in err["message"]
    assert err["brimful"]["prompt_tokens"] == prompt
    assert err["brimful"]["tokens_to_remove"] == prompt - MML + 1
    assert "must be at least 1, got 0" not in err["message"]
    assert info.value.response.headers["x-brimful-action"] == "rejected"
    assert stack.chat_requests() == []


def test_bad_max_tokens_names_the_field(stack: Stack) -> None:
    response = stack.http.post(
        "/v1/chat/completions", json={"model": "tiny-qwen", "messages": HELLO, "max_tokens": "abc"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "max_tokens"


def test_invalid_json_is_a_400_in_openai_shape(stack: Stack) -> None:
    response = stack.http.post("/v1/chat/completions", content=b'{"model": ',
                               headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert "not valid JSON" in error["message"]


def test_unknown_model_is_404_like_vllm(stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        stack.client.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=4)
    assert info.value.body["message"] == "The model `no-such-model` does not exist. Valid aliases: tiny-qwen."


def test_model_omitted_uses_the_only_served_model(stack: Stack) -> None:
    response = stack.http.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 99999})
    assert response.status_code == 200
    assert response.headers["x-brimful-action"] == "clamped"
    assert response.json()["model"] == "tiny-qwen"


def test_template_error_is_a_400_before_the_upstream(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError):
        stack.client.chat.completions.create(model="tiny-qwen", messages=[], max_tokens=4)
    assert stack.chat_requests() == []


# --- completions --------------------------------------------------------------


def test_a_completions_batch_gets_what_vllm_grants_each_prompt(stack: Stack, qwen3) -> None:
    """Each prompt its own room, as vLLM 0.32 clamps them: the limit is lowered to fit the shortest."""
    prompts = ["Hello, world!", "word " * 1000]
    shortest, longest = qwen3.count_completion({"prompt": prompts})
    raw = stack.client.completions.with_raw_response.create(model="tiny-qwen", prompt=prompts, max_tokens=5000)
    assert raw.headers["x-brimful-granted-max-tokens"] == str(MML - shortest)
    through = sorted(c.index for c in raw.parse().choices)
    assert through == [0, 1]
    direct = openai.OpenAI(base_url=stack.fake.base_url + "/v1", api_key="x", max_retries=0)
    asked = 1500                     # within max_model_len (vLLM alone serves it), past the long one's room
    mine = stack.client.completions.create(model="tiny-qwen", prompt=prompts, max_tokens=asked)
    theirs = direct.completions.create(model="tiny-qwen", prompt=prompts, max_tokens=asked)
    assert mine.usage.completion_tokens == theirs.usage.completion_tokens == asked + (MML - longest)


def test_completions_token_ids_are_counted_as_is(stack: Stack) -> None:
    raw = stack.client.completions.with_raw_response.create(
        model="tiny-qwen", prompt=[9707] * 2000, max_tokens=100
    )
    assert raw.headers["x-brimful-prompt-tokens"] == "2000"
    assert raw.headers["x-brimful-action"] == "clamped"
    assert raw.parse().usage.completion_tokens == MML - 2000


# --- streaming ------------------------------------------------------------------


def test_streamed_overflow_request_streams_to_completion(stack_factory, qwen3) -> None:
    stack = stack_factory()
    messages = long_messages(qwen3, 1990)
    stream = stack.client.chat.completions.create(
        model="tiny-qwen",
        messages=messages,
        max_tokens=500,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert finish == "length"
    assert usage.prompt_tokens == 1990
    assert usage.completion_tokens == MML - 1990


def test_stream_error_before_start_is_plain_json(stack: Stack, qwen3) -> None:
    messages = long_messages(qwen3, MML + 5)
    with stack.http.stream(
        "POST", "/v1/chat/completions",
        json={"model": "tiny-qwen", "messages": messages, "max_tokens": 5, "stream": True},
    ) as response:
        assert response.status_code == 400
        assert response.headers["content-type"].startswith("application/json")
        assert json.loads(response.read())["error"]["code"] == "context_length_exceeded"


def test_upstream_failure_mid_stream_ends_with_error_event(stack: Stack) -> None:
    stack.fake.fail_next.append(FaultSpec(kind="reset_mid_body", after_chunks=2, path="/v1/chat/completions"))
    with stack.http.stream(
        "POST", "/v1/chat/completions",
        json={"model": "tiny-qwen", "messages": HELLO, "max_tokens": 50, "stream": True},
    ) as response:
        text = response.read().decode()
    events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] in ("upstream_connection_error", "upstream_unreachable")


# --- pass-through ---------------------------------------------------------------


def test_models_list_passes_through(stack: Stack) -> None:
    models = stack.client.models.list()
    assert [m.id for m in models.data] == ["tiny-qwen"]
    assert models.data[0].model_extra["max_model_len"] == MML


def test_tokenize_and_query_pass_through_untouched(stack: Stack) -> None:
    body = {"model": "tiny-qwen", "prompt": "Hello, world!"}
    response = stack.http.post("/tokenize?x=1", json=body, headers={"authorization": "Bearer abc", "x-custom": "1"})
    assert response.status_code == 200
    assert response.json()["count"] == stack.fake.validator.count_prompt("completions", body)
    # the one request the client sent (brimful's own parity probes POST /tokenize too)
    [seen] = [r for r in stack.fake.requests if "x-custom" in r.headers]
    assert (seen.path, seen.query) == ("/tokenize", "x=1")
    assert seen.headers["authorization"] == "Bearer abc"
    assert seen.headers["x-custom"] == "1"
    assert "x-brimful-action" not in response.headers


def test_unknown_route_status_is_relayed(stack: Stack) -> None:
    response = stack.http.post("/v1/tokenize", json={"prompt": "x"})
    assert response.status_code == 404
    assert response.json() == {"detail": "Not Found"}


# --- upstream trouble -------------------------------------------------------------


@pytest.mark.parametrize("shown", [False, True], ids=["url_hidden", "url_shown"])
def test_upstream_down_is_502_explained(qwen3_dir, shown: bool) -> None:
    """The upstream's address is internal: clients see it only when the operator opts in."""
    with FakeVLLM() as fake:
        url = fake.base_url
    config = make_config(url, qwen3_dir)
    config.server.show_upstream_url = shown
    app = BrimfulApp(config)
    with serve_in_thread(app) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model="tiny-qwen", messages=HELLO, max_tokens=4)
    assert info.value.status_code == 502
    assert "could not connect to the upstream" in info.value.body["message"]
    assert (url in info.value.body["message"]) is shown
    assert (info.value.body.get("brimful", {}).get("upstream") == url) is shown


def test_upstream_error_is_explained_with_exact_numbers(stack: Stack) -> None:
    # A drift brimful did not foresee: the upstream still rejects for length.
    stack.fake.fail_next.append(FaultSpec(
        kind="respond", status=400, path="/v1/chat/completions",
        body={"error": {"message": "This model's maximum context length is 2048 tokens. However, your "
              "prompt contains at least 2049 input tokens, which exceeds this limit even without any output "
              "tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=2049)",
              "type": "BadRequestError", "param": "input_tokens", "code": 400}}))
    with pytest.raises(openai.BadRequestError) as info:
        stack.client.chat.completions.create(model="tiny-qwen", messages=HELLO, max_tokens=4)
    assert info.value.body["code"] == "context_length_exceeded"
    assert "at least" in info.value.body["brimful"]["upstream_message"]


def test_lora_card_inherits_base_max_model_len(stack_factory) -> None:
    stack = stack_factory(fake_kwargs={"extra_models": [{"id": "my-lora", "root": "/adapters/x"}]})
    raw = stack.client.chat.completions.with_raw_response.create(model="my-lora", messages=HELLO, max_tokens=99999)
    assert raw.headers["x-brimful-max-model-len"] == str(MML)
    assert raw.headers["x-brimful-action"] == "clamped"


def test_counting_through_upstream_tokenize_when_no_local_tokenizer(stack_factory) -> None:
    stack = stack_factory(tokenizer=False)
    raw = stack.client.chat.completions.with_raw_response.create(model="tiny-qwen", messages=HELLO, max_tokens=99999)
    assert raw.headers["x-brimful-prompt-tokens"] == "10"
    assert any(r.path == "/tokenize" for r in stack.fake.requests)


# --- request ids ------------------------------------------------------------------


def test_request_id_is_propagated_and_echoed(stack: Stack) -> None:
    response = stack.http.post(
        "/v1/chat/completions",
        json={"model": "tiny-qwen", "messages": HELLO, "max_tokens": 2},
        headers={"x-request-id": "client-abc-123"},
    )
    assert response.headers["x-request-id"] == "client-abc-123"
    assert stack.chat_requests()[-1].headers["x-request-id"] == "client-abc-123"


def test_request_id_generated_when_absent_or_unsafe(stack: Stack) -> None:
    for sent in (None, "has space", "x" * 200):
        headers = {"x-request-id": sent} if sent else {}
        response = stack.http.get("/v1/models", headers=headers)
        rid = response.headers["x-request-id"]
        assert rid != sent and len(rid) == 32
        assert [r.path for r in stack.fake.requests if r.headers.get("x-request-id") == rid] == ["/v1/models"]


def test_a_bug_still_answers_in_openai_shape(stack: Stack, monkeypatch) -> None:
    def boom(*args, **kwargs):
        raise KeyError("simulated bug")

    monkeypatch.setattr(stack.app.counter, "count", boom)
    with pytest.raises(openai.InternalServerError) as info:
        stack.client.chat.completions.create(model="tiny-qwen", messages=HELLO, max_tokens=2)
    assert info.value.status_code == 500
    assert info.value.body["code"] == "internal_error"
    assert info.value.response.headers["x-request-id"] in info.value.body["message"]
