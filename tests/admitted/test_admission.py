"""The admission decision, branch by branch (proxy/admitted/admission.py is pure: no server needed)."""

from __future__ import annotations

import math

import pytest

from proxy.admitted.admission import RequestedLimit, decide, lax_int, parse_limit_field
from proxy.admitted.surfaces import CHAT as CHAT_SURFACE
from proxy.admitted.surfaces import COMPLETIONS as COMPLETIONS_SURFACE
from proxy.config import Policy
from proxy.errors import BrimfulError

CHAT = dict(model="tiny-qwen", prompt_param="messages")
CMPL = dict(model="tiny-qwen", prompt_param="prompt", implicit_max_tokens=COMPLETIONS_SURFACE.implicit_max_tokens)


def mt(n: int | None = None, mct: int | None = None) -> RequestedLimit:
    return RequestedLimit.of(("max_completion_tokens", mct), ("max_tokens", n))


# --- the article's example (seed 004, docs/vllm-behaviour.md): 8192 limit, 6000-token prompt, max_tokens 4000


def test_article_example_is_clamped_to_room_minus_margin() -> None:
    d = decide([6000], 8192, mt(4000), Policy(margin_tokens=16), **CHAT)
    assert d.action == "clamped"
    assert d.requested == 4000
    assert d.granted == 8192 - 6000 - 16 == 2176
    assert d.rewrite == {"max_tokens": 2176}
    assert d.error is None


def test_request_that_fits_is_passed_untouched() -> None:
    d = decide([6000], 8192, mt(2000), Policy(), **CHAT)
    assert (d.action, d.granted, d.rewrite) == ("pass", 2000, None)


def test_margin_never_turns_a_fitting_request_into_a_rewrite() -> None:
    # 6000 + 2190 = 8190 <= 8192: fits exactly although it is inside the margin.
    d = decide([6000], 8192, mt(2190), Policy(margin_tokens=16), **CHAT)
    assert (d.action, d.rewrite) == ("pass", None)


def test_exactly_full_context_fits() -> None:
    d = decide([2047], 2048, mt(1), Policy(margin_tokens=16), **CHAT)
    assert (d.action, d.granted) == ("pass", 1)


# --- prompts that cannot be saved


@pytest.mark.parametrize("prompt", [2048, 2049, 2109])
def test_prompt_at_or_over_limit_is_rejected_with_exact_numbers(prompt: int) -> None:
    d = decide([prompt], 2048, mt(4), Policy(), **CHAT)
    assert d.action == "rejected"
    err = d.error
    assert isinstance(err, BrimfulError)
    assert err.status == 400 and err.code == "context_length_exceeded" and err.param == "messages"
    assert f"{prompt} tokens" in err.message and "2048 tokens" in err.message
    assert "at least" not in err.message.split("Remove")[0]
    assert err.details["tokens_to_remove"] == prompt - 2048 + 1
    assert f"Remove at least {prompt - 2047} tokens" in err.message


def test_prompt_equal_to_limit_without_max_tokens_is_rejected_not_max_tokens_zero() -> None:
    d = decide([2048], 2048, mt(), Policy(), **CHAT)
    assert d.action == "rejected"
    assert "max_tokens must be at least 1" not in d.error.message
    assert d.error.details["prompt_tokens"] == 2048


def test_completions_prompt_param_is_prompt() -> None:
    d = decide([5000], 4096, mt(10), Policy(), **CMPL)
    assert d.error.param == "prompt"


def test_below_the_floor_a_limit_vllm_would_refuse_gets_the_prompt_too_long_error() -> None:
    """max_tokens 32000 > max_model_len 18752: vLLM alone answers 400, so a 14-token sliver is no gain."""
    policy = Policy(margin_tokens=16, min_completion_tokens=64)
    d = decide([18738], 18752, mt(32000), policy, **CHAT)
    assert d.action == "rejected"
    assert d.error.code == "context_length_exceeded"
    assert d.error.details["available_completion_tokens"] == 14
    # Following the advice leaves exactly the floor: 18688 + 64 = 18752.
    assert d.error.details["tokens_to_remove"] == 18738 + 64 - 18752
    assert d.error.anthropic_lead() == "prompt is too long: 18738 tokens > 18688 maximum"
    assert decide([18688], 18752, mt(32000), policy, **CHAT).action == "clamped"


def test_below_the_floor_a_limit_vllm_would_clamp_is_served_as_vllm_would() -> None:
    """max_tokens 500 <= max_model_len: vLLM 0.32 grants the 48 tokens of room itself, so brimful does too."""
    policy = Policy(margin_tokens=16, min_completion_tokens=64)
    d = decide([2000], 2048, mt(500), policy, **CHAT)
    assert (d.action, d.granted) == ("clamped", 32)          # the room less the margin
    assert decide([2040], 2048, mt(500), policy, **CHAT).granted == 1


def test_an_engine_that_refuses_any_overflow_gets_the_floor_for_any_overflowing_limit() -> None:
    policy = Policy(min_completion_tokens=64, upstream_clamps_overflow=False)
    assert decide([2000], 2048, mt(500), policy, **CHAT).action == "rejected"
    assert decide([2000], 2048, mt(10), policy, **CHAT).action == "pass"       # fits: untouched
    # /v1/completions' implicit 16 overflows too: an old vLLM would refuse it.
    assert decide([2040], 2048, mt(), policy, **CMPL).action == "rejected"


def test_the_floor_never_refuses_a_request_without_a_limit_or_with_the_operators_default() -> None:
    """vLLM alone grants a chat without a limit the whole room, however small."""
    policy = Policy(min_completion_tokens=64, upstream_clamps_overflow=False)
    assert decide([2040], 2048, mt(), policy, **CHAT).action == "pass"
    with_default = Policy(min_completion_tokens=64, default_max_tokens=4096)
    d = decide([2040], 2048, mt(), with_default, **CHAT)
    assert (d.action, d.granted) == ("clamped", 8)


def test_the_floor_is_per_surface_and_messages_defaults_to_claude_codes_own() -> None:
    policy = Policy()
    assert (policy.floor("messages"), policy.floor("chat"), policy.floor("responses")) == (3000, 1, 1)
    assert decide([17000], 30000, mt(32000), policy, **CHAT, floor=policy.floor("messages")).granted == 13000
    assert decide([28000], 30000, mt(32000), policy, **CHAT, floor=policy.floor("messages")).action == "rejected"
    assert decide([28000], 30000, mt(32000), policy, **CHAT, floor=policy.floor("chat")).granted == 2000
    # 32000 <= 32768: vLLM clamps by itself, so brimful serves what is left, however little.
    assert decide([32000], 32768, mt(32000), policy, **CHAT, floor=policy.floor("messages")).granted == 768
    assert Policy(min_completion_tokens_by_surface={}).floor("messages") == 1


def test_the_floor_is_at_most_an_eighth_of_the_context() -> None:
    """At max_model_len 18,752 the Messages floor is 2,344; at 2,048 it is 256, so a small model still clamps."""
    policy = Policy()
    assert decide([16000], 18752, mt(32000), policy, **CHAT, floor=3000).granted == 2752
    assert decide([16500], 18752, mt(32000), policy, **CHAT, floor=3000).action == "rejected"
    assert decide([1700], 2048, mt(65535), policy, **CHAT, floor=3000).granted == 348


def test_an_inexact_count_never_refuses_for_the_floor() -> None:
    d = decide([18738], 18752, mt(32000), Policy(min_completion_tokens=64), **CHAT, count_exact=False)
    assert d.action == "clamped"


def test_a_prompt_over_the_context_asks_for_room_for_the_floor_only_where_vllm_refuses_slivers() -> None:
    policy = Policy(min_completion_tokens=64)
    over = decide([20000], 18752, mt(32000), policy, **CHAT).error
    assert over.details["tokens_to_remove"] == 20000 + 64 - 18752
    assert over.anthropic_lead() == "prompt is too long: 20000 tokens > 18688 maximum"
    served_as_sliver = decide([20000], 18752, mt(100), policy, **CHAT).error
    assert served_as_sliver.details["tokens_to_remove"] == 20000 + 1 - 18752


def test_small_room_but_fitting_request_still_passes() -> None:
    policy = Policy(margin_tokens=16, min_completion_tokens=64)
    d = decide([2000], 2048, mt(10), policy, **CHAT)
    assert (d.action, d.rewrite) == ("pass", None)


def test_a_margin_shortens_a_completion_but_never_refuses_one() -> None:
    # 8 tokens of room, a 16-token margin: vLLM alone would serve 8 tokens, so brimful serves.
    d = decide([2040], 2048, mt(100), Policy(margin_tokens=16), **CHAT)
    assert (d.action, d.granted) == ("clamped", 1)


# --- limits above max_model_len (vLLM 0.32 still rejects these)


def test_max_tokens_above_max_model_len_is_clamped() -> None:
    d = decide([10], 2048, mt(65535), Policy(margin_tokens=16), **CHAT)
    assert (d.action, d.granted) == ("clamped", 2048 - 10 - 16)


def test_max_completion_tokens_above_limit_is_clamped_in_its_own_field() -> None:
    d = decide([10], 2048, mt(mct=4096), Policy(margin_tokens=0), **CHAT)
    assert d.rewrite == {"max_completion_tokens": 2038}


def test_both_fields_rewritten_consistently_when_effective_one_overflows() -> None:
    # captures/c08: max_tokens 3, max_completion_tokens 99999 → vLLM 400; brimful clamps both.
    d = decide([10], 2048, mt(3, 99999), Policy(margin_tokens=0), **CHAT)
    assert d.requested == 99999
    assert d.rewrite == {"max_completion_tokens": 2038, "max_tokens": 2038}


def test_both_fields_effective_one_fits_passes_untouched() -> None:
    # captures/c07: max_tokens 99999 is not even validated when max_completion_tokens is set.
    d = decide([10], 2048, mt(99999, 3), Policy(), **CHAT)
    assert (d.action, d.requested, d.rewrite) == ("pass", 3, None)


# --- policy variants


def test_policy_reject_explains_instead_of_clamping() -> None:
    d = decide([6000], 8192, mt(4000), Policy(on_overflow="reject", margin_tokens=16), **CHAT)
    assert d.action == "rejected"
    assert d.error.param == "max_tokens"
    # The advice is the exact room: set max_tokens to 2192 and the request passes.
    assert "2192" in d.error.message and "6000" in d.error.message and "4000" in d.error.message
    assert decide([6000], 8192, mt(2192), Policy(on_overflow="reject", margin_tokens=16), **CHAT).action == "pass"


def test_margin_fraction_of_prompt() -> None:
    policy = Policy(margin_tokens=4, margin_fraction=0.01)
    d = decide([1000], 2048, mt(5000), policy, **CHAT)
    assert d.margin == 4 + 10
    assert d.granted == 2048 - 1000 - 14


def test_margin_fraction_rounds_up() -> None:
    assert Policy(margin_tokens=0, margin_fraction=0.01).margin(101) == math.ceil(1.01) == 2


def test_absent_limit_on_chat_is_left_alone() -> None:
    d = decide([100], 2048, mt(), Policy(), **CHAT)
    assert (d.action, d.requested, d.granted, d.rewrite) == ("pass", None, None, None)


def test_operator_default_fills_absent_limit() -> None:
    d = decide([100], 2048, mt(), Policy(default_max_tokens=512), **CHAT)
    assert (d.action, d.granted, d.rewrite) == ("pass", 512, {"max_tokens": 512})


def test_operator_default_larger_than_room_is_clamped() -> None:
    d = decide([2000], 2048, mt(), Policy(default_max_tokens=512, margin_tokens=8), **CHAT)
    assert (d.action, d.granted) == ("clamped", 40)


def test_ceiling_lowers_a_fitting_request() -> None:
    d = decide([100], 8192, mt(4000), Policy(max_tokens_ceiling=1024), **CHAT)
    assert (d.action, d.granted, d.rewrite) == ("clamped", 1024, {"max_tokens": 1024})


def test_ceiling_applies_to_absent_limit_on_chat() -> None:
    d = decide([100], 8192, mt(), Policy(max_tokens_ceiling=1024), **CHAT)
    assert (d.granted, d.rewrite) == (1024, {"max_tokens": 1024})


def test_ceiling_above_room_does_not_rewrite_absent_limit() -> None:
    d = decide([8000], 8192, mt(), Policy(max_tokens_ceiling=1024), **CHAT)
    assert d.rewrite is None


# --- completions: implicit 16 and batches


def test_completions_without_limit_fitting_is_untouched() -> None:
    d = decide([100], 2048, mt(), Policy(), **CMPL)
    assert (d.action, d.granted, d.rewrite) == ("pass", None, None)


def test_completions_implicit_16_overflowing_is_clamped() -> None:
    d = decide([2040], 2048, mt(), Policy(margin_tokens=2), **CMPL)
    assert (d.action, d.requested, d.granted, d.rewrite) == ("clamped", None, 6, {"max_tokens": 6})


def test_a_batch_limit_fits_the_shortest_prompt_where_vllm_clamps_each_prompt_itself() -> None:
    """vLLM 0.32 grants each prompt of a batch min(max_tokens, its own room) (completion/serving.py,
    get_max_tokens per prompt); an older engine refuses any prompt that overflows."""
    passed = decide([10, 1500, 300], 2048, mt(1000), Policy(margin_tokens=0), **CMPL)
    assert (passed.action, passed.granted, passed.rewrite) == ("pass", 1000, None)
    lowered = decide([10, 1500, 300], 2048, mt(5000), Policy(margin_tokens=0), **CMPL)
    assert (lowered.action, lowered.granted) == ("clamped", 2048 - 10)
    older = decide([10, 1500, 300], 2048, mt(1000), Policy(margin_tokens=0, upstream_clamps_overflow=False), **CMPL)
    assert older.granted == 548


def test_batch_with_one_prompt_over_is_rejected() -> None:
    d = decide([10, 3000], 2048, mt(10), Policy(), **CMPL)
    assert d.action == "rejected" and d.error.details["prompt_tokens"] == 3000


# --- reading the fields like vLLM's pydantic model


@pytest.mark.parametrize(
    "value,expected",
    [(5, 5), (2.0, 2), ("10", 10), (" 7 ", 7), (True, 1), (None, None), (10**9, 10**9)],
)
def test_accepted_limit_values(value, expected) -> None:
    assert parse_limit_field("max_tokens", value) == expected


@pytest.mark.parametrize(
    "value", [1.5, "abc", "1.5", "", 0, -1, False, float("nan"), float("inf"), [], {}, "１２"]
)
def test_rejected_limit_values_name_the_field(value) -> None:
    with pytest.raises(BrimfulError) as info:
        parse_limit_field("max_completion_tokens", value)
    assert info.value.status == 400
    assert info.value.param == "max_completion_tokens"
    assert "max_completion_tokens" in info.value.message


@pytest.mark.parametrize("value", ["+-5", "--5", "-+5", "++5", "1" * 5000, "1e3", "10.", "_1", "1__0", 1e20])
def test_odd_numeric_strings_are_a_400_not_a_500(value) -> None:
    with pytest.raises(BrimfulError) as info:      # int() used to raise ValueError past the check
        parse_limit_field("max_tokens", value)
    assert info.value.status == 400 and info.value.param == "max_tokens"


@pytest.mark.parametrize("value,expected", [("1_000", 1000), ("10.0", 10), ("0010", 10), ("+5", 5),
                                            ("\xa012", 12), ("1_0.00", 10), ("0" * 5000 + "7", 7)])
def test_limit_strings_pydantic_accepts_are_accepted(value, expected) -> None:
    assert parse_limit_field("max_tokens", value) == expected


def test_lax_int_reads_every_value_as_pydantic_does() -> None:
    """Differential: vLLM 0.32's request models validate with pydantic-core 2.50 (the same
    version this venv has, via the SDKs); every string of a fuzzed alphabet reads alike."""
    pydantic = pytest.importorskip("pydantic")
    import random

    reference = pydantic.TypeAdapter(int)

    def theirs(value: object) -> int | None:
        try:
            return int(reference.validate_python(value))
        except pydantic.ValidationError:
            return None

    def ours(value: object) -> int | None:
        try:
            return lax_int(value)
        except ValueError:
            return None

    rng = random.Random(25)
    alphabet = "0123456789_+-. \t\x1c\xa0e\u0663"
    cases: list[object] = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7))) for _ in range(4000)]
    cases += ["1" * 4300, "1" * 4301, "+" + "1" * 4301, "-" + "1" * 4300, "1" * 4300 + ".0", 1e20, 2.0 ** 63,
              -(2.0 ** 63), 2.0 ** 62, float("nan"), float("inf"), True, 10 ** 30, -0.0, "0-4", "00-_9"]
    assert [c for c in cases if theirs(c) != ours(c)] == []


def test_completions_ignores_max_completion_tokens_field() -> None:
    limit = COMPLETIONS_SURFACE.read_limit({"max_completion_tokens": 5, "max_tokens": 7})
    assert (limit.value, limit.field) == (7, "max_tokens")


def test_chat_prefers_max_completion_tokens() -> None:
    limit = CHAT_SURFACE.read_limit({"max_completion_tokens": 5, "max_tokens": 7})
    assert (limit.value, limit.field, limit.present_fields()) == (
        5,
        "max_completion_tokens",
        ["max_completion_tokens", "max_tokens"],
    )


# --- never worse than vLLM alone (issue: refused or granted less than vLLM would)


@pytest.mark.parametrize("prompt", range(2033, 2048))
def test_the_last_tokens_of_room_are_served_with_the_default_policy(prompt: int) -> None:
    # vLLM 0.32 answers these with the room (1-15 tokens); brimful must not refuse them.
    d = decide([prompt], 2048, mt(16), Policy(), **CHAT)
    assert (d.action, d.granted) == ("clamped", 2048 - prompt)


def test_the_default_policy_grants_what_vllm_would() -> None:
    # vLLM 0.32 clamps a 1,509-token prompt with max_tokens 1000 on a 2,048 model to 539.
    assert decide([1509], 2048, mt(1000), Policy(), **CHAT).granted == 539
    assert decide([1509], 2048, mt(), Policy(), **CMPL).granted is None      # 16 fits: vLLM's own default
    assert decide([2040], 2048, mt(), Policy(), **CMPL).granted == 8          # vLLM 0.32: min(16, room)


@pytest.mark.parametrize("prompt, asked", [(2509, 16), (2048, 1), (2100, None), (2049, 65535)])
def test_the_advice_for_a_prompt_too_long_makes_it_pass(prompt: int, asked: int | None) -> None:
    d = decide([prompt], 2048, mt(asked), Policy(), **CHAT)
    assert d.action == "rejected"
    cut = d.error.details["tokens_to_remove"]
    assert f"Remove at least {cut} tokens" in d.error.message
    again = decide([prompt - cut], 2048, mt(asked), Policy(), **CHAT)
    assert again.action in ("pass", "clamped") and again.error is None
    assert decide([prompt - cut + 1], 2048, mt(asked), Policy(), **CHAT).action == "rejected"


def test_an_unverified_count_refuses_nothing_itself() -> None:
    # brimful's count says 2100 > 2048, but it may be off: the upstream judges.
    d = decide([2100], 2048, mt(100), Policy(), **CHAT, count_exact=False, drift_margin=40)
    assert (d.action, d.rewrite, d.error) == ("pass", None, None)
    # A limit above max_model_len is refused by vLLM whatever the prompt: lowered to it.
    d = decide([2100], 2048, mt(65535), Policy(), **CHAT, count_exact=False, drift_margin=40)
    assert (d.action, d.granted) == ("clamped", 2048)


def test_an_unverified_count_holds_back_the_drift_seen() -> None:
    d = decide([1000], 2048, mt(65535), Policy(), **CHAT, count_exact=False, drift_margin=40)
    assert (d.action, d.granted, d.margin) == ("clamped", 2048 - 1000 - 40, 40)
    assert decide([1000], 2048, mt(65535), Policy(), **CHAT, drift_margin=40).granted == 1048
