"""proxy.recording.metrics: one record → the right Prometheus series, fine buckets, safe labels."""

from __future__ import annotations

from itertools import pairwise

from prometheus_client.parser import text_string_to_metric_families

from proxy.recording.lengthlog import LengthLogStats
from proxy.recording.metrics import CONTEXT_SIZES, DEFAULT_TOKEN_BUCKETS, Metrics, safe_label, token_buckets
from proxy.recording.record import LengthRecord

# vLLM's build_1_2_5_buckets(max_model_len=131072) bounds (vllm/v1/metrics/loggers.py).
VLLM_1_2_5 = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000]


def rec(**kw) -> LengthRecord:
    base = dict(ts=1.0, model="qwen", endpoint="chat", status=200)
    base.update(kw)
    return LengthRecord(**base)


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


# ----------------------------------------------------------------- buckets

def test_default_buckets_resolve_1k_to_128k_finely() -> None:
    inside = [b for b in DEFAULT_TOKEN_BUCKETS if 1024 <= b <= 131072]
    in_vllm = [b for b in VLLM_1_2_5 if 1024 <= b <= 131072]
    assert len(inside) >= 30 and len(in_vllm) == 6
    # histogram_quantile's error is bounded by the bucket width: no step wider than ×1.25.
    steps = [hi / lo for lo, hi in pairwise(inside)]
    assert max(steps) <= 1.25 + 1e-3


def test_default_buckets_are_sorted_unique_and_hold_context_sizes() -> None:
    assert list(DEFAULT_TOKEN_BUCKETS) == sorted(set(DEFAULT_TOKEN_BUCKETS))
    assert set(CONTEXT_SIZES) <= set(DEFAULT_TOKEN_BUCKETS)
    assert DEFAULT_TOKEN_BUCKETS[0] == 1


def test_token_buckets_ladder_parameters() -> None:
    assert token_buckets(start=100, stop=200, ratio=2, extra=()) == (100.0, 200.0)
    assert token_buckets(start=10, stop=40, ratio=2, extra=(7,)) == (7.0, 10.0, 20.0, 40.0)


def test_buckets_are_configurable() -> None:
    m = Metrics(buckets=[100, 10])
    m.observe(rec(prompt_tokens=50))
    assert value(m, "brimful_prompt_tokens_bucket", model="qwen", le="10.0") == 0
    assert value(m, "brimful_prompt_tokens_bucket", model="qwen", le="100.0") == 1
    bounds = {s.labels["le"] for f in text_string_to_metric_families(m.render()[0].decode())
              if f.name == "brimful_prompt_tokens" for s in f.samples if "le" in s.labels}
    assert bounds == {"10.0", "100.0", "+Inf"}


# ----------------------------------------------------------------- observe

def test_clamped_request_updates_every_length_series() -> None:
    m = Metrics()
    m.observe(rec(max_model_len=8192, prompt_tokens=6000, requested_max_tokens=4000, granted_max_tokens=2100,
                  completion_tokens=700, action="clamped", finish_reasons=["stop"]))
    assert value(m, "brimful_requests_total", model="qwen", endpoint="chat", action="clamped", status="200") == 1
    assert value(m, "brimful_prompt_tokens_sum", model="qwen") == 6000
    assert value(m, "brimful_completion_tokens_sum", model="qwen") == 700
    assert value(m, "brimful_total_tokens_sum", model="qwen") == 6700
    assert value(m, "brimful_requested_max_tokens_sum", model="qwen") == 4000
    assert value(m, "brimful_spare_context_tokens_sum", model="qwen") == 8192 - 6000 - 2100
    assert value(m, "brimful_clamped_tokens_total", model="qwen") == 1900
    # 6000 lies in the (5294, 6617] bucket
    assert value(m, "brimful_prompt_tokens_bucket", model="qwen", le="5294.0") == 0
    assert value(m, "brimful_prompt_tokens_bucket", model="qwen", le="6617.0") == 1


def test_pass_without_limit_skips_brimful_and_clamp() -> None:
    m = Metrics()
    m.observe(rec(max_model_len=8192, prompt_tokens=10, completion_tokens=5))
    assert value(m, "brimful_spare_context_tokens_count", model="qwen") is None
    assert value(m, "brimful_requested_max_tokens_count", model="qwen") is None
    assert value(m, "brimful_clamped_tokens_total", model="qwen") is None
    assert value(m, "brimful_total_tokens_sum", model="qwen") == 15


def test_upstream_prompt_count_is_used_when_brimful_did_not_count() -> None:
    m = Metrics()
    m.observe(rec(upstream_prompt_tokens=42, completion_tokens=8))
    assert value(m, "brimful_prompt_tokens_sum", model="qwen") == 42
    assert value(m, "brimful_total_tokens_sum", model="qwen") == 50
    assert value(m, "brimful_prompt_token_drift_tokens_count", model="qwen") is None


def test_rejections_count_by_reason() -> None:
    m = Metrics()
    m.observe(rec(prompt_tokens=9000, max_model_len=8192, action="rejected", status=400,
                  error_code="context_length_exceeded"))
    m.observe(rec(action="rejected", status=400, error_code=None))
    assert value(m, "brimful_rejections_total", model="qwen", reason="context_length_exceeded") == 1
    assert value(m, "brimful_rejections_total", model="qwen", reason="unknown") == 1
    assert value(m, "brimful_requests_total", model="qwen", endpoint="chat", action="rejected", status="400") == 2
    assert value(m, "brimful_upstream_length_errors_total", model="qwen") is None


def test_upstream_length_errors_are_counted_only_for_length_codes() -> None:
    m = Metrics()
    m.observe(rec(action="upstream_error", status=400, error_code="context_length_exceeded"))
    m.observe(rec(action="upstream_error", status=502, error_code="upstream_unreachable"))
    assert value(m, "brimful_upstream_length_errors_total", model="qwen") == 1


def test_prompt_token_drift() -> None:
    m = Metrics()
    m.observe(rec(prompt_tokens=100, upstream_prompt_tokens=100))
    m.observe(rec(prompt_tokens=103, upstream_prompt_tokens=100))
    m.observe(rec(prompt_tokens=90, upstream_prompt_tokens=100))
    assert value(m, "brimful_prompt_token_drift_total", model="qwen") == 2      # requests that differ
    # bounds go negative: OpenMetrics allows no _sum/_count then; +Inf holds the count
    assert value(m, "brimful_prompt_token_drift_tokens_bucket", model="qwen", le="+Inf") == 3
    assert value(m, "brimful_prompt_token_drift_tokens_count", model="qwen") is None
    assert value(m, "brimful_prompt_token_drift_tokens_bucket", model="qwen", le="-16.0") == 0
    assert value(m, "brimful_prompt_token_drift_tokens_bucket", model="qwen", le="-8.0") == 1
    assert value(m, "brimful_prompt_token_drift_tokens_bucket", model="qwen", le="0.0") == 2
    assert value(m, "brimful_prompt_token_drift_tokens_bucket", model="qwen", le="2.0") == 2
    assert value(m, "brimful_prompt_token_drift_tokens_bucket", model="qwen", le="4.0") == 3


def test_length_retries() -> None:
    m = Metrics()
    m.count_length_retry("qwen")
    m.count_length_retry("qwen")
    assert value(m, "brimful_length_retries_total", model="qwen") == 2


def test_each_instance_has_its_own_registry() -> None:
    a, b = Metrics(), Metrics()
    a.observe(rec(prompt_tokens=5))
    assert value(a, "brimful_prompt_tokens_count", model="qwen") == 1
    assert value(b, "brimful_prompt_tokens_count", model="qwen") is None


# ----------------------------------------------------------------- labels

def test_safe_label() -> None:
    assert safe_label("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    assert safe_label("evil\nname\r\x00") == "evil_name__"
    assert safe_label("x" * 500) == "x" * 128
    assert safe_label(None) == "unknown" and safe_label("") == "unknown"


def test_model_label_cardinality_is_capped() -> None:
    m = Metrics(max_models=2)
    for name in ("a", "b", "c", "d"):
        m.observe(rec(model=name, prompt_tokens=1))
    assert value(m, "brimful_prompt_tokens_count", model="a") == 1
    assert value(m, "brimful_prompt_tokens_count", model="b") == 1
    assert value(m, "brimful_prompt_tokens_count", model="c") is None
    assert value(m, "brimful_prompt_tokens_count", model="other") == 2


def test_render_is_valid_exposition_with_hostile_model_name() -> None:
    m = Metrics()
    m.observe(rec(model='a"b\nc\\d', prompt_tokens=7, completion_tokens=1))
    body, content_type = m.render()
    assert content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    models = {s.labels["model"] for s in families["brimful_prompt_tokens"].samples}
    assert models == {'a"b_c\\d'}


def test_lengthlog_counters_are_exported() -> None:
    m = Metrics()
    stats = LengthLogStats()
    m.attach_lengthlog(stats)
    stats.written, stats.dropped, stats.write_errors = 5, 2, 1      # read at scrape time
    assert value(m, "brimful_length_records_total", outcome="written") == 5
    assert value(m, "brimful_length_records_total", outcome="dropped") == 2
    assert value(m, "brimful_length_records_total", outcome="write_error") == 1


def test_render_negotiates_openmetrics() -> None:
    m = Metrics()
    m.observe(rec(prompt_tokens=7))
    body, content_type = m.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


def test_astronomical_values_keep_count_and_sum_in_step() -> None:
    """A client may send max_tokens = 10**400: observing it must neither raise nor split count from sum."""
    m = Metrics()
    m.observe(rec(requested_max_tokens=10**400, granted_max_tokens=100, prompt_tokens=10, max_model_len=2048,
                  action="clamped"))
    m.observe(rec(requested_max_tokens=-(10**400), prompt_tokens=10))
    assert value(m, "brimful_requested_max_tokens_count", model="qwen") == 2
    total = value(m, "brimful_requested_max_tokens_sum", model="qwen")
    assert total is not None and total == total and abs(total) < float("inf")
    removed = value(m, "brimful_clamped_tokens_total", model="qwen")
    assert removed is not None and 0 < removed < float("inf")
    assert value(m, "brimful_requests_total", model="qwen", endpoint="chat", action="clamped", status="200") == 1


def test_piece_and_prefix_tables_are_exported() -> None:
    """The prefix table beside the piece cache has its own lookups and size, read at scrape time."""
    from tokenizer_cache import PieceCountCache

    cache = PieceCountCache(64)
    m = Metrics()
    m.attach_piece_cache(cache.stats)
    cache.prefixes.put_many([(b"k" * 16, (10, 3)), (b"j" * 16, (20, 5))])
    assert cache.prefixes.longest([b"j" * 16], [20]) == (0, 5)
    assert cache.prefixes.longest([b"x" * 16, b"k" * 16], [5, 11]) == (-1, 0)     # wrong offset: no hit
    assert value(m, "brimful_prefix_cache_lookups_total", result="hit") == 1
    assert value(m, "brimful_prefix_cache_lookups_total", result="miss") == 1
    assert value(m, "brimful_prefix_cache_entries") == 2
    assert value(m, "brimful_piece_cache_entries") == 0


def test_the_render_memo_is_exported() -> None:
    """Iterations skipped and rendered, traces kept and dropped: whether the agents' conversations
    fit the memo shows at scrape time."""
    from tokenizer_cache import PieceCountCache
    from tokenizer_cache._piece_cache import Trace

    cache = PieceCountCache(64)                         # room for 64 // 8 = 8 traces
    m = Metrics()
    m.attach_piece_cache(cache.stats)
    cache.traces.add([(bytes([i]) * 32, Trace((("i", b"d"),), b"k")) for i in range(10)], skipped=7)
    assert value(m, "brimful_render_memo_lookups_total", result="hit") == 7
    assert value(m, "brimful_render_memo_lookups_total", result="miss") == 10
    assert value(m, "brimful_render_memo_entries") == 8
    assert value(m, "brimful_render_memo_evictions_total") == 2
