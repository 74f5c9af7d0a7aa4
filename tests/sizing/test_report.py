"""Length report: percentile definition, recommendation, record reading, CLI output."""

from __future__ import annotations

import gzip
import json
import math
import random
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from proxy.commands import report as report_cli
from proxy.recording.record import LengthRecord
from proxy.sizing import capacity as cap
from proxy.sizing import report as rep

ROOT = Path(__file__).resolve().parents[2]


def reference_percentile(values: list[int], p: float) -> float:
    """Independent statement of numpy's 'linear' method (Hyndman & Fan type 7):
    the p-th percentile sits at 1-based position 1 + (n − 1)·p/100."""
    xs = sorted(values)
    pos = 1 + (len(xs) - 1) * p / 100
    k = int(pos)
    frac = pos - k
    if k >= len(xs):
        return float(xs[-1])
    return xs[k - 1] * (1 - frac) + xs[k] * frac


# --- percentiles --------------------------------------------------------------

PS = [0, 1, 5, 10, 25, 33.3, 50, 66.7, 75, 90, 95, 99, 99.5, 99.9, 100]


@pytest.mark.parametrize("seed", range(6))
def test_percentile_functions_match_reference(seed):
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 10, 101, 1000])
    values = [rng.choice([rng.randint(0, 50), rng.randint(0, 100_000)]) for _ in range(n)]
    hist = rep.Histogram(values)
    for p in PS:
        ref = reference_percentile(values, p)
        assert rep.percentile(sorted(values), p) == pytest.approx(ref, abs=1e-9)
        assert hist.percentile(p) == pytest.approx(ref, abs=1e-9)


def test_percentile_matches_numpy_when_available():
    np = pytest.importorskip("numpy")
    rng = random.Random(42)
    values = [int(rng.lognormvariate(7, 1)) for _ in range(5000)]
    hist = rep.Histogram(values)
    for p in PS:
        assert hist.percentile(p) == pytest.approx(float(np.percentile(values, p)), rel=1e-12, abs=1e-9)


def test_percentile_small_known_values():
    assert rep.percentile([1, 2, 3, 4], 50) == 2.5
    assert rep.percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert rep.percentile([7], 99) == 7
    assert rep.Histogram([10, 10, 10, 20]).percentile(75) == 12.5
    assert rep.Histogram([10, 10, 10, 20]).percentile(100) == 20
    with pytest.raises(ValueError):
        rep.percentile([], 50)
    with pytest.raises(ValueError):
        rep.Histogram().percentile(50)
    with pytest.raises(ValueError):
        rep.Histogram([1]).percentile(101)


def test_histogram_summary_count_mean_max_and_merge():
    h = rep.Histogram([5, 1, 5, 9])
    s = h.summary(extra=(99.9,))
    assert s["count"] == 4 and s["mean"] == 5 and s["max"] == 9 and s["p50"] == 5
    assert "p99.9" in s and "p99" in s
    other = rep.Histogram([100])
    h.merge(other)
    assert h.n == 5 and h.max == 100 and h.total == 120
    empty = rep.Histogram().summary()
    assert empty["count"] == 0 and empty["p50"] is None and empty["max"] is None


def test_histogram_count_above():
    h = rep.Histogram([1, 2, 2, 3, 10])
    assert h.count_above(2) == 2
    assert h.count_above(0) == 5
    assert h.count_above(10) == 0


# --- recommendation -------------------------------------------------------------

@pytest.mark.parametrize("value, block, expected", [
    (1000, 16, 1008), (1008, 16, 1008), (1008.01, 16, 1024), (0.5, 16, 16), (4097, 1, 4097), (100, 128, 128),
])
def test_round_up(value, block, expected):
    assert rep.round_up(value, block) == expected


def test_recommendation_is_percentile_rounded_to_blocks_with_clamped_fraction():
    values = list(range(1, 1001))   # p99 = 990.01
    rec = rep.recommend_max_model_len(rep.Histogram(values), 99, 16)
    assert rec.value == pytest.approx(990.01)
    assert rec.max_model_len == 992
    assert rec.clamped_count == 8 and rec.clamped_fraction == 0.008   # 993..1000
    rec100 = rep.recommend_max_model_len(rep.Histogram(values), 100, 16)
    assert rec100.max_model_len == 1008 and rec100.clamped_count == 0
    assert rep.recommend_max_model_len(rep.Histogram(), 99, 16) is None


# --- records --------------------------------------------------------------------

def rec(**kw):
    base = LengthRecord(ts=1_700_000_000.0, model="m", endpoint="chat", prompt_tokens=100,
                        upstream_prompt_tokens=None, completion_tokens=50, finish_reasons=["stop"],
                        action="pass", status=200).to_dict()
    base.update(kw)
    return base


def test_record_lengths_prefers_upstream_prompt():
    r = rep.record_lengths(rec(prompt_tokens=100, upstream_prompt_tokens=103))
    assert (r.prompt, r.completion, r.total, r.sequence) == (103, 50, 153, 153)
    assert r.finished_length is False


def test_record_lengths_parallel_sampling_counts_prompt_once():
    # n=4: completion_tokens sums the choices; KV footprint = prompt + all outputs,
    # the longest single sequence is at most prompt + min(all outputs, per-choice cap)
    r = rep.record_lengths(rec(n=4, completion_tokens=400, granted_max_tokens=150, finish_reasons=["length", "stop"]))
    assert r.total == 500
    assert r.sequence == 250
    assert r.finished_length is True
    r2 = rep.record_lengths(rec(n=4, completion_tokens=400, granted_max_tokens=None))
    assert r2.sequence == 500


def test_a_batch_is_as_long_as_its_longest_prompt():
    """An embeddings (or completions) batch: the KV holds every prompt, max_model_len bounds each one."""
    r = rep.record_lengths(rec(endpoint="embeddings", prompt_tokens=32000, upstream_prompt_tokens=32000,
                               longest_prompt_tokens=500, completion_tokens=0))
    assert (r.prompt, r.total, r.sequence, r.endpoint) == (32000, 32000, 500, "embeddings")
    batch = rep.record_lengths(rec(endpoint="completions", prompt_tokens=300, longest_prompt_tokens=200,
                                   completion_tokens=60, granted_max_tokens=30))
    assert batch.sequence == 230       # the longest prompt + at most its own cap


def test_report_names_each_surfaces_requests(capsys, tmp_path):
    records = [rec(endpoint=e, ts=NOW + i) for i, e in enumerate(["chat", "responses", "responses", "messages"])]
    write_jsonl(tmp_path / "x.jsonl", records)
    result = report_json(capsys, str(tmp_path / "x.jsonl"))
    assert result["models"][0]["endpoints"] == {"responses": 2, "chat": 1, "messages": 1}
    assert report_cli.main([str(tmp_path / "x.jsonl")]) == 0
    assert "  endpoints: responses 2, chat 1, messages 1\n" in capsys.readouterr().out


def test_record_lengths_without_usage():
    r = rep.record_lengths(rec(completion_tokens=None, action="rejected", status=400, finish_reasons=[]))
    assert r.prompt == 100 and r.total is None and r.sequence is None and r.finished_length is None
    assert rep.record_lengths(rec(model=None)).model == rep.UNKNOWN_MODEL


@pytest.mark.parametrize("bad", [
    [1, 2], "x", {"model": "m"}, rec(ts="yesterday"), rec(prompt_tokens=-1), rec(prompt_tokens=1.5),
    rec(completion_tokens="9"), rec(n=0), rec(model=3), rec(finish_reasons="stop"), rec(action=None),
    rec(upstream_prompt_tokens=True), rec(upstream_prompt_tokens=10**30), rec(completion_tokens=2**31),
    rec(endpoint=7),
])
def test_record_lengths_rejects_malformed(bad):
    with pytest.raises(rep.MalformedRecord):
        rep.record_lengths(bad)


# --- --since ----------------------------------------------------------------------

NOW = 1_800_000_000.0


@pytest.mark.parametrize("text, expected", [
    ("24h", NOW - 86400), ("30m", NOW - 1800), ("7d", NOW - 7 * 86400), ("90s", NOW - 90), ("1.5h", NOW - 5400),
    ("1700000000", 1_700_000_000.0),
    ("2026-01-02T03:04:05Z", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()),
    ("2026-01-02T03:04:05", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()),
    ("2026-01-02T12:04:05+09:00", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()),
    ("2026-01-02", datetime(2026, 1, 2, tzinfo=UTC).timestamp()),
])
def test_parse_since(text, expected):
    assert rep.parse_since(text, NOW) == expected


def test_parse_since_error():
    with pytest.raises(ValueError, match="--since"):
        rep.parse_since("last tuesday", NOW)


# --- files and the CLI -------------------------------------------------------------

def write_jsonl(path: Path, records, extra_lines=()):
    with path.open("w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for line in extra_lines:
            f.write(line + "\n")


def synthetic(seed: int, n: int, model: str = "qwen3-8b", ts: float = 1_700_000_000.0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = int(rng.lognormvariate(6.5, 0.9))
        c = rng.randint(1, 1500)
        action = rng.choices(["pass", "clamped", "rejected"], [90, 8, 2])[0]
        r = rec(model=model, ts=ts + i, prompt_tokens=p, upstream_prompt_tokens=p,
                completion_tokens=None if action == "rejected" else c, action=action,
                finish_reasons=[] if action == "rejected" else [rng.choice(["stop", "stop", "length"])],
                max_model_len=8192)
        out.append(r)
    return out


def report_json(capsys, *argv: str) -> dict:
    assert report_cli.main([*argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_report_percentiles_match_reference_across_merged_files(capsys, tmp_path):
    a = synthetic(1, 700)
    b = synthetic(2, 500, ts=1_700_100_000.0)
    other = synthetic(3, 50, model="llama")
    write_jsonl(tmp_path / "a.jsonl", a + other[:20], ["not json", '{"ts": "x"}', "", "[1,2]"])
    write_jsonl(tmp_path / "b.jsonl", b + other[20:], ["{truncated"])
    out = report_json(capsys, str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--percentile", "95")
    assert out["malformed"] == 4 and out["records"] == 1250 and out["lines"] == 1254
    models = {m["model"]: m for m in out["models"]}
    assert list(models) == ["qwen3-8b", "llama"]      # busiest first
    m = models["qwen3-8b"]
    records = a + b
    done = [r for r in records if r["completion_tokens"] is not None]
    prompts = [r["upstream_prompt_tokens"] for r in records]
    completions = [r["completion_tokens"] for r in done]
    totals = [r["upstream_prompt_tokens"] + r["completion_tokens"] for r in done]
    assert m["requests"] == 1200 and m["completed"] == len(done)
    for key, values in (("prompt_tokens", prompts), ("completion_tokens", completions), ("total_tokens", totals)):
        s = m[key]
        assert s["count"] == len(values) and s["max"] == max(values)
        assert s["mean"] == pytest.approx(sum(values) / len(values))
        for p in (50, 90, 95, 99):
            assert s[f"p{p}"] == pytest.approx(reference_percentile(values, p), abs=1e-9), (key, p)
    assert m["sequence_tokens"] == m["total_tokens"]   # n = 1 everywhere
    assert m["clamped_share"] == pytest.approx(sum(r["action"] == "clamped" for r in records) / 1200)
    assert m["rejected_share"] == pytest.approx(sum(r["action"] == "rejected" for r in records) / 1200)
    assert m["length_finish_share"] == pytest.approx(
        sum("length" in r["finish_reasons"] for r in done) / len(done))
    served = m["served_recommendation"]
    expected_mml = math.ceil(reference_percentile(totals, 95) / 16) * 16
    assert served["percentile"] == 95 and served["max_model_len"] == expected_mml
    assert served["would_clamp"] == sum(t > expected_mml for t in totals)
    assert m["max_model_len_current"] == 8192
    # demand: nothing was asked, so what was generated; a refused prompt p asked for at least p + 1
    demanded = [r["upstream_prompt_tokens"] + (r["completion_tokens"] if r["completion_tokens"] is not None else 1)
                for r in records]
    for p in (50, 90, 95, 99):
        assert m["demand_tokens"][f"p{p}"] == pytest.approx(reference_percentile(demanded, p), abs=1e-9)
    asked95 = m["asked_recommendation"]
    assert asked95["percentile"] == 95 and asked95["limited_by"] == "demand"
    assert asked95["max_model_len"] == math.ceil(reference_percentile(demanded, 95) / 16) * 16
    refused = sum(r["action"] == "rejected" for r in records)
    # these synthetic rejections carry no error code: counted, under "other"
    assert m["demand_lower_bounds"] >= refused and m["rejections"] == {"other": refused}
    # the recommendation is the need's estimate: the report's reading equals proxy.sizing.need's, record by record
    from proxy.sizing import need as nd
    tally = nd.NeedTally(nd.record_need(r) for r in records)
    q = tally.model().quantile(95)
    rec95 = m["recommendation"]
    assert rec95["percentile"] == 95 and rec95["limited_by"] == "need" and rec95["need"] == q.to_dict()
    assert rec95["max_model_len"] == math.ceil(q.value / 16) * 16
    cut_by_length = sum("length" in r["finish_reasons"] for r in done)
    assert (rec95["cut"], rec95["imputed"], rec95["exact"]) == (cut_by_length, refused, len(done) - cut_by_length)
    assert rec95["current"]["max_model_len"] == 8192
    assert rec95["current"]["refused"] == sum(r["upstream_prompt_tokens"] >= 8192 for r in records)


def test_report_model_and_since_filters(capsys, tmp_path):
    records = synthetic(5, 100) + synthetic(6, 30, model="llama")
    write_jsonl(tmp_path / "x.jsonl", records)
    out = report_json(capsys, str(tmp_path / "x.jsonl"), "--model", "llama")
    assert [m["model"] for m in out["models"]] == ["llama"] and out["filtered"] == 100
    out = report_json(capsys, str(tmp_path / "x.jsonl"), "--since", str(1_700_000_000 + 90))
    assert out["records"] == sum(r["ts"] >= 1_700_000_090 for r in records)


def test_report_reads_gzip(capsys, tmp_path):
    path = tmp_path / "x.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for r in synthetic(7, 20):
            f.write(json.dumps(r) + "\n")
    assert report_json(capsys, str(path))["records"] == 20


def test_report_capacity_section(capsys, tmp_path):
    # every request exactly 1,500 tokens: the article's Qwen3-8B / H100 figures come back
    records = [rec(prompt_tokens=1000, completion_tokens=500, ts=1_700_000_000.0 + i) for i in range(10)]
    write_jsonl(tmp_path / "x.jsonl", records)
    out = report_json(capsys, str(tmp_path / "x.jsonl"), "--preset", "Qwen3-8B", "--gpu", "H100-80GB",
                      "--target-concurrency", "500")
    c = out["models"][0]["capacity"]
    assert out["models"][0]["recommendation"]["max_model_len"] == 1504
    assert c["kv_tokens"] == 395_717
    assert c["concurrent_at_mean"] == c["concurrent_at_p95"] == 263
    assert c["gpus_at_mean"] == 2 and c["recommended_max_model_len_fits"] is True


def test_report_recommendation_is_capped_by_the_model_and_the_kv_cache(capsys, tmp_path):
    write_jsonl(tmp_path / "x.jsonl", [rec(prompt_tokens=120_000, completion_tokens=1000)])
    argv = [str(tmp_path / "x.jsonl"), "--preset", "Qwen2.5-7B"]
    # the model's own context: Qwen2.5-7B's max_position_embeddings 32,768, without any GPU
    m = report_json(capsys, *argv)["models"][0]
    assert (m["recommendation"]["wanted"], m["recommendation"]["max_model_len"]) == (121_008, 32_768)
    assert m["recommendation"]["limited_by"] == "model_context"
    assert m["model_context"]["key"] == "max_position_embeddings" and "capacity" not in m
    # Qwen3-8B (40,960 of context) on an A10: 24 GiB × 0.92 − 15.26 GiB of weights − 4 GiB → 2.82 GiB of KV at
    # 144 KiB per token: the plan's KV blocks bind first
    argv = [str(tmp_path / "x.jsonl"), "--preset", "Qwen3-8B", "--gpu", "A10-24GB"]
    m = report_json(capsys, *argv)["models"][0]
    preset = cap.PRESETS["Qwen3-8B"]
    kv = cap.kv_memory(24 * cap.GIB, 0.92, preset.params * 2, 4 * cap.GIB).kv_memory_bytes
    blocks = kv // (144 * 1024 * 16) - 1      # vLLM holds one block back (the null block)
    assert blocks * 16 < 40_960
    assert (m["recommendation"]["max_model_len"], m["recommendation"]["limited_by"]) == (blocks * 16, "kv_cache")
    assert m["kv_bound_source"] == "the plan's KV cache"
    assert m["capacity"]["recommended_max_model_len_fits"] is True
    assert report_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"recommended max_model_len: {blocks * 16:,} (estimated p99 of need = 121,000 tokens" in out
    assert "capped at the longest the KV cache holds (the plan's KV cache)" in out


def test_report_without_files_or_upstream_is_an_error(capsys):
    assert report_cli.main([]) == 2
    assert "give length record files, --upstream URL, or both" in capsys.readouterr().err


def test_report_gpu_options_without_model_are_an_error(capsys, tmp_path):
    write_jsonl(tmp_path / "x.jsonl", synthetic(4, 5))
    assert report_cli.main([str(tmp_path / "x.jsonl"), "--gpu", "H100-80GB"]) == 2
    assert "--model-config" in capsys.readouterr().err


def test_report_table_output(capsys, tmp_path):
    write_jsonl(tmp_path / "x.jsonl", synthetic(8, 200), ["garbage"])
    assert report_cli.main([str(tmp_path / "x.jsonl"), "--percentile", "99.9"]) == 0
    out = capsys.readouterr().out
    assert "200 records from 1 file(s)" in out and "1 malformed and skipped" in out
    assert "model qwen3-8b: 200 requests" in out
    assert "p99.9" in out and "recommended max_model_len:" in out
    for label in ("prompt", "completion", "total", "sequence", "demanded", "needed"):
        assert f"\n  {label}" in out


def test_report_empty_and_missing_file(capsys, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    assert report_cli.main([str(tmp_path / "empty.jsonl")]) == 0
    assert "no records to report" in capsys.readouterr().out
    assert report_cli.main([str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


def test_progress_only_on_a_terminal():
    class Fake:
        def __init__(self, tty):
            self.tty, self.text = tty, ""

        def isatty(self):
            return self.tty

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    quiet, loud = Fake(False), Fake(True)
    rep.Progress(quiet)("f", 100_000)
    rep.Progress(loud)("f", 100_000)
    assert quiet.text == "" and "f: 100,000 lines" in loud.text


def test_module_entry_point_subprocess(tmp_path):
    write_jsonl(tmp_path / "x.jsonl", synthetic(9, 10))
    proc = subprocess.run([sys.executable, "-m", "proxy.commands.report", str(tmp_path / "x.jsonl"),
                           "--format", "json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["records"] == 10
    assert proc.stderr == ""     # not a terminal: no progress output


def test_reads_what_lengthlog_writes(capsys, tmp_path):
    lengthlog = pytest.importorskip("proxy.recording.lengthlog")
    path = tmp_path / "lengths.jsonl"
    path.write_bytes(b"".join(lengthlog.encode_line(LengthRecord(
        ts=1_700_000_000.0 + i, model="m", endpoint="chat", prompt_tokens=10 * i, completion_tokens=5,
        finish_reasons=["stop"], status=200)) for i in range(1, 5)))
    out = report_json(capsys, str(path))
    assert out["malformed"] == 0 and out["models"][0]["total_tokens"]["max"] == 45


@pytest.mark.parametrize("prompt,completion,mml,n,kept", [
    (100, 50, 2048, 1, (100, 50)),
    (-5, 50, 2048, 1, (None, 50)),
    (10**30, 10**30, 2048, 1, (None, None)),
    (2049, 10, 2048, 1, (None, 10)),                # a served prompt fits the context
    (10, 4000, 2048, 2, (10, 4000)),                # two choices may each use most of it
    (10, 4097, 2048, 2, (10, None)),
    (10**6, 10**6, None, 1, (10**6, 10**6)),        # no limit known: only absurd counts go
    (2**31, -1, None, 1, (None, None)),
])
def test_plausible_usage(prompt, completion, mml, n, kept):
    from proxy.sizing.lengths import plausible_usage

    assert plausible_usage(prompt, completion, mml, n) == kept


@pytest.mark.parametrize("prompt,completion,prompts,kept", [
    (2049, None, 2, (2049, None)),                  # two inputs, each within the context, summed
    (4096, 8192, 2, (4096, 8192)),
    (4097, 8193, 2, (None, None)),
])
def test_plausible_usage_of_a_batch(prompt, completion, prompts, kept):
    from proxy.sizing.lengths import plausible_usage

    assert plausible_usage(prompt, completion, 2048, 2, prompts) == kept


def test_report_demand_is_proxy_demands(tmp_path):
    """The report's fast path gives the demand proxy.sizing.demand.record_demand gives, record by record."""
    from proxy.sizing import demand as dm
    rng = random.Random(11)
    records = [rec(prompt_tokens=rng.randint(1, 5000), n=rng.choice([1, 1, 3]),
                   endpoint=rng.choice(["chat", "completions"]),
                   requested_max_tokens=rng.choice([None, 0, 16, 900]), granted_max_tokens=rng.choice([None, 300]),
                   completion_tokens=rng.choice([None, 10, 700]), max_model_len=4096,
                   finish_reasons=rng.choice([[], ["stop"], ["length", "stop"]]),
                   action=rng.choice(["pass", "clamped", "rejected"]), status=rng.choice([200, 400]),
                   error_code=rng.choice([None, "context_length_exceeded", "invalid_media"]))
               for _ in range(500)]
    builder = rep.ReportBuilder()
    for r in records:
        builder.add_line(json.dumps(r))
    [stats] = builder.models.values()
    expected = dm.DemandTally(dm.demands(records))
    assert (stats.demand.sequence, stats.demand.kv, stats.demand.refused_below, stats.demand.lower_bounds) == (
        expected.sequence, expected.kv, expected.refused_below, expected.lower_bounds)
    assert stats.reasons == dm.rejection_breakdown(records)
    from proxy.sizing import need as nd
    need = nd.NeedTally(f for f in map(nd.record_need, records) if f is not None)
    assert (stats.need.exact, stats.need.completions, stats.need.cut, stats.need.unknown) == (
        need.exact, need.completions, need.cut, need.unknown)
