"""A fleet's day of length records as Parquet, and `brimful report` over it: DuckDB against the Python reader.

    python bench/fleet_bench.py --records 100000000 --dir /work/fleet_day     # writes ~2 GB, times, deletes
    python bench/fleet_bench.py --records 1000000 --generate-only --dir /tmp/day   # only write a sample
    python bench/fleet_bench.py --records 100000000 --dir /tmp/day --keep --baseline /work/main --jsonl-records 1000000

The day: `--replicas` replicas' files (`proxy.recording.parquetlog`'s schema and names, one file per replica
and `--files-per-replica` windows), records spread over 24 h, four models with their own prompt and
completion distributions (lognormal), refusals where a prompt reaches the model's limit plus 0.5 % at
random, clamps where the limit asked does not fit, no limit asked on 30 %, n > 1 on 2 % and batched
completions prompts on 5 % of those, generated in chunks with numpy (never the whole day in memory).

Timed, in one run: `brimful report --engine duckdb --format json` over the glob (a subprocess: wall
seconds and its CPU seconds), and the Python reader over the first `--python-sample` records (records/s
of CPU), the ratio between them, and whether both recommend the same on that sample.
A benchmark, not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy.recording import parquetlog as pl  # noqa: E402

DAY0 = 1_798_761_600.0          # 2027-01-01T00:00:00Z
# model: (share, max_model_len, prompt lognormal mu, sigma, completion lognormal mu, sigma)
MODELS = {
    "qwen3-8b": (0.55, 32768, 6.8, 1.1, 5.5, 1.0),
    "llama-3.1-70b": (0.25, 131072, 7.5, 1.3, 6.0, 1.1),
    "gpt-oss-20b": (0.15, 65536, 7.0, 1.2, 6.4, 0.9),
    "embed-small": (0.05, 8192, 5.5, 0.8, 0.0, 0.0),
}
ENDPOINTS = ["chat", "completions", "responses", "messages"]
REQUESTED = np.array([256, 512, 1024, 2048, 4096, 8192])


def _dict(values: list[str], idx: np.ndarray) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(idx.astype(np.int32)), pa.array(values))


def _opt(values: np.ndarray, present: np.ndarray) -> pa.Array:
    return pa.array(values, mask=~present)


def chunk(rng: np.random.Generator, n: int, t0: float, t1: float) -> pa.RecordBatch:
    """`n` records with arrival times in [t0, t1), sorted."""
    names = list(MODELS)
    model = rng.choice(len(names), n, p=[MODELS[m][0] for m in names])
    mml = np.array([MODELS[m][1] for m in names])[model]
    pmu, psg, cmu, csg = (np.array([MODELS[m][k] for m in names])[model] for k in (2, 3, 4, 5))
    embed = model == names.index("embed-small")
    endpoint = np.where(embed, len(ENDPOINTS), rng.choice(len(ENDPOINTS), n, p=[0.7, 0.1, 0.1, 0.1]))
    prompt = np.maximum(1, rng.lognormal(pmu, psg)).astype(np.int64)
    n_choices = np.where((rng.random(n) < 0.02) & ~embed, rng.integers(2, 5, n), 1)
    batched = (endpoint == 1) & (rng.random(n) < 0.05)
    longest = np.where(batched, np.maximum(1, prompt // rng.integers(2, 6, n)), 0)
    asked = (rng.random(n) < 0.7) & ~embed
    requested = REQUESTED[rng.integers(0, len(REQUESTED), n)]
    refused = (prompt >= mml) | (rng.random(n) < 0.005)
    room = np.maximum(mml - np.where(batched, longest, prompt), 0)
    clamped = asked & ~refused & (requested > room)
    granted = np.where(clamped, room, requested)
    wanted = np.maximum(1, rng.lognormal(cmu, csg)).astype(np.int64)
    completion = np.where(embed, 0, np.minimum(wanted, np.where(asked, granted, room)) * n_choices)
    cut = asked & ~embed & (wanted >= granted)
    action = np.where(refused, 2, np.where(clamped, 1, 0))
    has_reasons = ~refused & ~embed
    offsets = np.concatenate([[0], np.cumsum(has_reasons)]).astype(np.int32)
    reasons = pa.ListArray.from_arrays(pa.array(offsets), _dict(["stop", "length"], cut[has_reasons]).cast(pa.string()))
    upstream = ~refused & (rng.random(n) < 0.95)
    columns = {
        "ts": pa.array(np.sort(rng.uniform(t0, t1, n))),
        "model": _dict(names, model), "endpoint": _dict([*ENDPOINTS, "embeddings"], endpoint),
        "stream": pa.array(rng.random(n) < 0.6), "request_id": pa.nulls(n, pa.string()),
        "n": pa.array(n_choices.astype(np.int32)), "max_model_len": pa.array(mml),
        "prompt_tokens": pa.array(prompt), "longest_prompt_tokens": _opt(longest, batched),
        "upstream_prompt_tokens": _opt(prompt, upstream), "requested_max_tokens": _opt(requested, asked),
        "granted_max_tokens": _opt(granted, asked & ~refused), "completion_tokens": _opt(completion, ~refused),
        "finish_reasons": reasons,
        "action": _dict(["pass", "clamped", "rejected"], action),
        "status": pa.array(np.where(refused, 400, 200).astype(np.int32)),
        "error_code": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32), mask=~refused),
                                                     pa.array(["context_length_exceeded"])),
        "length_retries": pa.array(np.zeros(n, np.int32)),
        "latency_ms": pa.array(rng.gamma(2.0, 400.0, n)), "ttfb_ms": _opt(rng.gamma(2.0, 40.0, n), ~refused),
        "trimmed_messages": pa.nulls(n, pa.int32()), "trimmed_tokens": pa.nulls(n, pa.int64()),
    }
    return pa.RecordBatch.from_arrays([columns[name] for name, _ in pl.COLUMNS], schema=pl.schema())


def generate(directory: Path, records: int, replicas: int, files_per_replica: int, seed: int = 27,
             chunk_size: int = 2_000_000) -> list[Path]:
    """The day's files: replica r's window w holds the records of that window's share of the day."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    per_file = records // (replicas * files_per_replica)
    window = 86_400 / files_per_replica
    paths = []
    for w in range(files_per_replica):
        for r in range(replicas):
            start = DAY0 + w * window
            path = directory / (pl.file_stem(f"replica-{r}", start, 1000 + r) + pl.PARQUET_SUFFIX)
            with pq.ParquetWriter(path, pl.schema(), compression="zstd") as writer:
                left = per_file if (w, r) != (files_per_replica - 1, replicas - 1) else \
                    records - per_file * (replicas * files_per_replica - 1)
                while left > 0:
                    size = min(chunk_size, left)
                    writer.write_batch(chunk(rng, size, start, start + window), row_group_size=1 << 20)
                    left -= size
            paths.append(path)
    return paths


def timed_report(pattern: str, engine: str, tree: Path = ROOT) -> tuple[float, float, dict[str, Any]]:
    """(wall s, CPU s, the JSON report) of `brimful report --engine ENGINE --format json PATTERN`, run from the
    checkout `tree` (another revision's: the baseline)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "proxy.commands.report", pattern, "--engine", engine,
                          "--format", "json"], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                         check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(out)


def recommendations(report: dict[str, Any]) -> dict[str, int | None]:
    return {m["model"]: (m["recommendation"] or {}).get("max_model_len") for m in report["models"]}


def json_lines(sample: str, path: Path, records: int) -> tuple[float, float]:
    """The sample's first `records` as JSON lines (DuckDB's COPY), and DuckDB's own reading of them: read_json
    of every column with a trivial aggregate, in this process (wall s, CPU s): the report's baseline."""
    import duckdb

    duckdb.sql(f"COPY (SELECT * FROM read_parquet('{sample}') LIMIT {records}) TO '{path}' (FORMAT json)")
    con = duckdb.connect()
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    con.sql(f"SELECT count(*), max(COLUMNS(*)) FROM read_json('{path}', format = 'newline_delimited')").fetchall()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter() - start, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000_000)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--files-per-replica", type=int, default=4)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/brimful_fleet_day"))
    ap.add_argument("--python-sample", type=int, default=1_000_000,
                    help="records the Python reader is timed on (the first file's, written apart)")
    ap.add_argument("--baseline", type=Path, help="another checkout (e.g. a worktree of main): its report is "
                    "timed on the day and on the sample beside this one's")
    ap.add_argument("--jsonl-records", type=int, default=0,
                    help="also write this many of the sample's records as JSON lines and time the report over "
                    "them against DuckDB's own read_json of the file")
    ap.add_argument("--skip-day", action="store_true", help="only the sample's timings (the day is not reported)")
    ap.add_argument("--keep", action="store_true", help="keep the files (default: delete them at the end)")
    ap.add_argument("--generate-only", action="store_true", help="write the files and stop (implies --keep)")
    args = ap.parse_args()
    try:
        t = time.perf_counter()
        paths = sorted(args.dir.glob("*.parquet"))
        if len(paths) == args.replicas * args.files_per_replica and \
                sum(pq.ParquetFile(p).metadata.num_rows for p in paths) == args.records:
            print(f"reusing the {args.records:,} records in {args.dir} (a day written before, with --keep)")
        else:
            paths = generate(args.dir, args.records, args.replicas, args.files_per_replica)
        size = sum(p.stat().st_size for p in paths)
        print(f"{args.records:,} records in {len(paths)} files, {size / 1e9:.2f} GB "
              f"({size / args.records:.1f} B/record), {time.perf_counter() - t:.0f} s")
        if args.generate_only:
            return 0
        if not args.skip_day:
            load = os.getloadavg()[0]
            wall, cpu, day = timed_report(str(args.dir / "*.parquet"), "duckdb")
            # the wall time is the figure the issue names; on a shared machine it says little without the load
            print(f"duckdb report over the day: {wall:.1f} s wall, {cpu:.1f} s CPU, {day['records']:,} records "
                  f"({args.records / cpu / 1e6:.2f} M records per CPU s; load average {load:.1f} before, "
                  f"{os.getloadavg()[0]:.1f} after); recommendations {recommendations(day)}")
            if args.baseline:
                bwall, bcpu, bday = timed_report(str(args.dir / "*.parquet"), "duckdb", args.baseline.resolve())
                print(f"the day by {args.baseline}: {bwall:.1f} s wall, {bcpu:.1f} s CPU; same report: {bday == day}")
        sample_dir = args.dir / "sample"
        if not sample_dir.is_dir():
            generate(sample_dir, args.python_sample, 1, 1)
        sample = str(sample_dir / "*.parquet")
        dwall, dcpu, dsample = timed_report(sample, "duckdb")
        if args.baseline:
            bwall, bcpu, bsample = timed_report(sample, "duckdb", args.baseline.resolve())
            print(f"{args.python_sample:,}-record sample, duckdb: this tree {dwall:.1f} s wall / {dcpu:.1f} s CPU, "
                  f"{args.baseline} {bwall:.1f} s wall / {bcpu:.1f} s CPU: {bcpu / dcpu:.1f}x the CPU; "
                  f"same report: {bsample == dsample}")
        if args.jsonl_records:
            jwall, jcpu = json_lines(sample, args.dir / "sample.jsonl", args.jsonl_records)
            rwall, rcpu, jreport = timed_report(str(args.dir / "sample.jsonl"), "duckdb")
            print(f"{args.jsonl_records:,} JSON lines: DuckDB's read_json {jwall:.1f} s wall / {jcpu:.1f} s CPU, "
                  f"the report {rwall:.1f} s wall / {rcpu:.1f} s CPU: {rcpu / jcpu:.1f}x the engine's reading")
            if args.jsonl_records == args.python_sample:
                # the same records as the Parquet sample: what reading them as JSON lines adds, beside what the
                # engine's own reading of the file costs
                print(f"  reading them as JSON lines adds {rcpu - dcpu:.1f} s of CPU to the Parquet sample's report: "
                      f"{(rcpu - dcpu) / jcpu:.1f}x read_json; same report as from Parquet: "
                      f"{dict(jreport, files=None) == dict(dsample, files=None)}")
            if args.baseline:
                bwall, bcpu, _ = timed_report(str(args.dir / "sample.jsonl"), "duckdb", args.baseline.resolve())
                print(f"  the JSON lines by {args.baseline}: {bwall:.1f} s wall / {bcpu:.1f} s CPU "
                      f"(this tree {bcpu / rcpu:.2f}x less)")
        pwall, pcpu, psample = timed_report(sample, "python")
        print(f"{args.python_sample:,}-record sample: duckdb {dwall:.1f} s wall / {dcpu:.1f} s CPU, python "
              f"{pwall:.1f} s wall / {pcpu:.1f} s CPU ({args.python_sample / pcpu / 1e3:.0f}k records/s of CPU); "
              f"python ÷ duckdb wall {pwall / dwall:.1f}x; same report: {dsample == psample}; "
              f"recommendations {recommendations(psample)}")
        if not args.skip_day:
            print(f"the day by the Python reader at that rate: ~{args.records / (args.python_sample / pcpu) / 60:.0f} "
                  f"min of CPU, against {wall:.1f} s")
    finally:
        if not (args.keep or args.generate_only):
            shutil.rmtree(args.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    sys.exit(main())
