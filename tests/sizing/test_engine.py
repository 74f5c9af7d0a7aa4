"""proxy.sizing.engine: DuckDB's reading gives the Python reader's report, whichever files it reads."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest

duckdb = pytest.importorskip("duckdb")
pytest.importorskip("pyarrow")

from proxy.commands import report as report_cli  # noqa: E402
from proxy.recording import parquetlog as pl  # noqa: E402
from proxy.recording.record import LengthRecord  # noqa: E402
from proxy.sizing import engine  # noqa: E402
from proxy.sizing import report as rep  # noqa: E402

FIELDS = [f for f, _ in pl.COLUMNS]
ROOT = Path(__file__).resolve().parents[2]


def varied(seed: int, n: int) -> list[dict[str, Any]]:
    """Records over every branch of the reduction: batches, n > 1, no usage, refusals, finish reasons, limits."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = rng.choice([None, rng.randint(0, 9000), int(rng.lognormvariate(7, 1))])
        longest = rng.choice([None, None, None, (prompt or 0) // 2])
        own = rng.choice([prompt, prompt, None if prompt is None else prompt + 3])
        out.append(LengthRecord(
            ts=1_700_000_000.0 + i * rng.choice([1, 7]), model=rng.choice(["qwen", "qwen", "llama", None]),
            endpoint=rng.choice(["chat", "completions", "responses", "messages", "embeddings"]),
            stream=rng.random() < 0.5, request_id=f"r{i}", n=rng.choice([1, 1, 1, 2, 4]),
            max_model_len=rng.choice([None, 4096, 8192, 8192]), prompt_tokens=own, longest_prompt_tokens=longest,
            upstream_prompt_tokens=rng.choice([None, prompt]),
            requested_max_tokens=rng.choice([None, 0, 16, 512, 3000]),
            granted_max_tokens=rng.choice([None, 200, 512]), completion_tokens=rng.choice([None, rng.randint(0, 3000)]),
            finish_reasons=rng.choice([[], ["stop"], ["length"], ["stop", "length"]]),
            action=rng.choice(["pass", "pass", "clamped", "rejected", "upstream_error", "uncounted"]),  # type: ignore[arg-type]
            status=rng.choice([200, 200, 400, 413, 502, 503]),
            error_code=rng.choice([None, None, "context_length_exceeded", "invalid_media", "upstream_timeout",
                                   "client_disconnected", "something_new"]),  # type: ignore[arg-type]
            length_retries=rng.choice([0, 1]), latency_ms=rng.random() * 100, ttfb_ms=None,
        ).to_dict())
    return out


MALFORMED = ["not json", '{"ts": "x"}', "[1,2]", "{truncated", '{"ts": 1, "prompt_tokens": -1}',
             '{"ts": 1, "prompt_tokens": 1.5}', '{"ts": 1, "n": 0}', '{"ts": 1, "model": 3}',
             '{"ts": 1, "finish_reasons": "stop"}', '{"ts": 1, "action": null}', '{"ts": true}',
             '{"ts": 1, "upstream_prompt_tokens": 100000000000000000000000000000}', '{"ts": 1, "endpoint": 7}',
             '{"ts": 1, "n": 2, "granted_max_tokens": -5}', "   ", "",
             # well-formed oddities: a falsy finish_reasons, a bad own count behind the upstream's, an int code
             '{"ts": 5, "finish_reasons": 0, "prompt_tokens": "x", "upstream_prompt_tokens": 7}',
             '{"ts": 6, "error_code": 5, "status": 500, "max_model_len": -3, "n": null}',
             # numbers as strings or floats are not ints: no limit seen, no status (DuckDB's casts would take them)
             '{"ts": 7, "max_model_len": "8192", "status": "500", "action": "rejected", "error_code": "5"}',
             '{"ts": 8, "max_model_len": 8192.0, "status": 503.0, "prompt_tokens": 9}']


def write_jsonl(path: Path, records: list[dict[str, Any]], extra: list[str] = ()) -> Path:  # type: ignore[assignment]
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for line in extra:
            f.write(line + "\n")
    return path


def state(builder: rep.ReportBuilder) -> dict[str, Any]:
    """Everything the report is computed from, dict order aside."""
    st = builder.stats
    models = {}
    for name, m in builder.models.items():
        d = m.demand
        models[name] = (m.requests, m.actions, m.endpoints, m.with_finish_reasons, m.finished_length,
                        m.parallel_sampling, m.max_model_len_seen, m.prompt_counts, m.completion_counts,
                        m.total_counts, m.sequence_counts, d.sequence, d.kv, d.refused_below, d.limits,
                        d.lower_bounds, m.reasons, m.need.exact, m.need.completions, m.need.cut, m.need.unknown,
                        {k: [round(v, 6) for v in row] for k, row in m.routes.routes.items()})
    return {"lines": st.lines, "records": st.records, "malformed": st.malformed, "filtered": st.filtered,
            "models": models}


def both(paths: list[str], **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    return (state(rep.build_report(paths, engine_name="duckdb", **kw)),
            state(rep.build_report(paths, engine_name="python", **kw)))


def test_duckdb_reads_json_lines_and_gzip_as_python_does_malformed_lines_included(tmp_path: Path) -> None:
    recs = varied(1, 3000)
    a = write_jsonl(tmp_path / "a.jsonl", recs[:1500], MALFORMED)
    b = write_jsonl(tmp_path / "b.jsonl.gz", recs[1500:], MALFORMED[:5])
    duck, python = both([str(a), str(b)])
    assert duck == python
    assert python["malformed"] == 14 + 5 and python["records"] == 3004


# Each field's JSON type is read from the text json_extract writes (the line is parsed once): floats, exponents
# and booleans are no ints, escaped strings are unescaped, a nested list is no finish reason.
TYPED = ['{"ts": 1, "prompt_tokens": 1e3}', '{"ts": 1, "completion_tokens": 5.0}', '{"ts": 1, "n": true}',
         '{"ts": 1, "finish_reasons": {"a": 1}}', '{"ts": false}', '{"ts": "1"}', chr(11), "\t \f",
         '{"ts": 2, "model": "q\\"w\\u00e9n", "action": "cl\\u0061mped", "endpoint": "chat", "prompt_tokens": 7}',
         '{"ts": 3, "finish_reasons": [["length"]], "completion_tokens": 5, "prompt_tokens": 5}',
         '{"ts": 4, "prompt_tokens": -0, "finish_reasons": -0.0, "status": 4e2, "max_model_len": 1.0}',
         '{"ts": 5, "finish_reasons": {}, "error_code": "a\\\\b", "latency_ms": "5", "prompt_tokens": 3}',
         '{"ts": 6.5e1, "n": 3, "granted_max_tokens": 0, "completion_tokens": 9, "prompt_tokens": 1}',
         '{"ts": NaN, "prompt_tokens": 2}']


def test_json_types_are_read_from_each_fields_text_as_python_reads_them(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "typed.jsonl", varied(5, 200), TYPED)
    duck, python = both([str(path)])
    assert duck == python
    assert (python["malformed"], python["records"]) == (6, 206)
    assert {"q\"wén", "unknown"} <= set(python["models"])


def _lines_reader_refused(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Make the line-by-line reader fail the report if it is asked to read anything; returns its calls."""
    calls: list[list[str]] = []

    def refuse(files: list[str]) -> str:
        calls.append(list(files))
        raise AssertionError("read line by line")

    monkeypatch.setattr(engine, "json_lines_source", refuse)
    return calls


# Lines DuckDB's JSON reader (`engine.json_source`) must read, skip as blank, or find no record in, exactly
# where the Python reader does: a CR before the newline, bytes.isspace() (a vertical tab and a form feed are
# blank to both), NaN and Infinity (Python reads them); then lines that are no record, each one row with no
# field (ignore_errors): two values on a line, an object cut over two lines, a NUL, a line that is no object,
# an object without a record's fields, garbage.
LINE_EDGES = ['{"ts": 7, "endpoint": "chat", "action": "pass"}\r', chr(11), chr(12) + " \t", "\r",
              '{"ts": 8, "endpoint": "chat", "action": "pass", "model": "\\ud83d\\ude00"}',
              '{"ts": NaN, "endpoint": "chat", "action": "pass"}',
              '{"ts": 9, "endpoint": "chat", "action": "pass", "latency_ms": Infinity, "prompt_tokens": 4}',
              '{"ts": 2} {"ts": 3}', '{"ts": 4}{"ts": 5}', "{", '"ts": 6}', '{"ts": 11}\x00', "null", "[]", "{}",
              '{"x": 1}', "not json"]


def test_json_lines_without_a_null_action_or_endpoint_are_read_by_duckdbs_json_reader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the typed lines with an action and an endpoint
    typed = [line if '"action"' in line or not line.startswith("{") else line[:-1] + ', "action": "pass"}'
             for line in TYPED]
    typed = [line if '"endpoint"' in line or not line.startswith("{") else line[:-1] + ', "endpoint": "chat"}'
             for line in typed]
    path = write_jsonl(tmp_path / "a.jsonl", varied(6, 500), [*typed, *LINE_EDGES])
    with path.open("ab") as f:
        f.write(b'{"ts": 12, "model": "\xff", "endpoint": "chat", "action": "pass"}\n')     # not UTF-8
    gz = write_jsonl(tmp_path / "b.jsonl.gz", varied(7, 300), LINE_EDGES)
    python = state(rep.build_report([str(path), str(gz)], engine_name="python"))
    calls = _lines_reader_refused(monkeypatch)
    assert state(rep.build_report([str(path), str(gz)], engine_name="duckdb")) == python
    assert calls == []
    assert python["malformed"] == 6 + 2 * 10 + 1 and python["records"] == 800 + 6 + 2 * 4


@pytest.mark.parametrize("line", ['{"ts": 1, "action": null}', '{"ts": 1, "endpoint": null}',
                                  '{"ts": 1, "model": "a"}', '{"ts": 1, "action": "pass"}'])
def test_an_ok_record_without_action_or_endpoint_is_read_again_line_by_line(tmp_path: Path, line: str) -> None:
    """DuckDB's JSON reader reads a null as an absent key: null is malformed and absent the default, so such a
    file is read again by json_extract of each line, which tells them apart."""
    path = write_jsonl(tmp_path / "a.jsonl", varied(8, 300), [line, line])
    other = write_jsonl(tmp_path / "b.jsonl", varied(9, 300))
    duck, python = both([str(path), str(other)])
    assert duck == python
    assert python["malformed"] == (2 if "null" in line else 0)


def test_a_file_opening_with_a_bom_is_read_line_by_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB's CSV reader skips a UTF-8 BOM, its JSON reader takes the first line for a malformed one."""
    recs = varied(10, 50)
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in recs).encode())
    plain = write_jsonl(tmp_path / "plain.jsonl", recs)
    duck, python = both([str(path), str(plain)])
    assert duck == python and python["records"] == 100
    calls = _lines_reader_refused(monkeypatch)
    with pytest.raises(AssertionError, match="read line by line"):
        rep.build_report([str(path), str(plain)], engine_name="duckdb")
    assert calls == [[str(path)]]


def test_a_line_longer_than_the_csv_readers_limit_is_read(tmp_path: Path) -> None:
    """The CSV reader refuses a line over 2,000,000 bytes; the JSON reader takes it, as Python does."""
    recs = varied(11, 20)
    recs[3] = {**recs[3], "pad": "x" * 2_500_000}
    duck, python = both([str(write_jsonl(tmp_path / "a.jsonl", recs))])
    assert duck == python and python["records"] == 20


@pytest.mark.parametrize("kw", [{"model": "llama"}, {"since": 1_700_005_000.0}, {"model": "unknown"}])
def test_the_model_and_since_filters_agree(tmp_path: Path, kw: dict[str, Any]) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", varied(2, 2000), MALFORMED)
    duck, python = both([str(path)], **kw)
    assert duck == python and python["filtered"] > 0


def test_parquet_from_the_sink_and_from_duckdbs_copy_read_like_the_json_lines(tmp_path: Path) -> None:
    recs = varied(3, 4000)
    jsonl = write_jsonl(tmp_path / "all.jsonl", recs)
    log = pl.ParquetLog(tmp_path / "sink", replica="a", flush_interval_s=0.01)
    for r in recs[:2500]:
        log.enqueue(r)
    log.close()
    [sink_file] = log.converted
    copied = tmp_path / "copied.parquet"         # DuckDB's own types: BIGINT, VARCHAR, VARCHAR[]
    tail = write_jsonl(tmp_path / "tail.jsonl", recs[2500:])
    duckdb.sql(f"COPY (SELECT * FROM read_json('{tail}', format = 'newline_delimited')) TO '{copied}'")
    reference = both([str(jsonl)])[1]
    mixed = [str(sink_file), str(copied)]
    duck, python = both(mixed)
    assert duck == python == reference
    glob_duck = state(rep.build_report([str(tmp_path / "sink" / "*.parquet"), str(tail)], engine_name="duckdb"))
    assert glob_duck == reference


def test_a_parquet_file_lacking_columns_or_with_other_types_agrees_too(tmp_path: Path) -> None:
    path = tmp_path / "foreign.parquet"
    duckdb.sql(f"""COPY (SELECT 1700000000 + i AS ts, 'm' || (i % 2) AS model, (i % 900)::INTEGER AS prompt_tokens,
                   CASE WHEN i % 10 = 0 THEN (i % 37)::DOUBLE END AS completion_tokens,
                   CASE WHEN i % 3 = 0 THEN ['length'] END AS finish_reasons
                   FROM range(500) t(i)) TO '{path}'""")
    duck, python = both([str(path)])
    assert duck == python
    assert (python["records"], python["malformed"]) == (450, 50)    # a float token count is malformed, as in JSON


def test_files_whose_column_types_differ_are_each_read_with_their_own_types(tmp_path: Path) -> None:
    """A column of integers in one file and of floats in another: each file's values keep their own type, as
    the Python reader sees them (one read of both would widen the integers to DOUBLE, all malformed)."""
    ints, floats = tmp_path / "ints.parquet", tmp_path / "floats.parquet"
    duckdb.sql(f"COPY (SELECT * FROM read_json('{write_jsonl(tmp_path / 'a.jsonl', varied(7, 400))}', "
               f"format = 'newline_delimited')) TO '{ints}'")
    duckdb.sql(f"COPY (SELECT * REPLACE (completion_tokens::DOUBLE AS completion_tokens) FROM '{ints}' "
               f"LIMIT 100) TO '{floats}'")
    alone = both([str(ints)])[1]
    duck, python = both([str(ints), str(floats)])
    assert duck == python
    assert python["records"] > alone["records"] and python["malformed"] > alone["malformed"]


def test_parquet_statistics_skip_only_the_checks_every_value_passes(tmp_path: Path) -> None:
    """A column whose footer statistics put every value in range is read without its per-record check (the
    files say it cannot fail); a value out of range, or a row group without statistics, keeps the check: the
    reports agree with the Python reader's either way."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from proxy.sizing import engine

    recs = varied(6, 600)
    good = tmp_path / "good.parquet"
    duckdb.sql(f"COPY (SELECT * FROM read_json('{write_jsonl(tmp_path / 'g.jsonl', recs)}', "
               f"format = 'newline_delimited')) TO '{good}'")
    table = pq.read_table(good)
    bad_recs = table.slice(0, 200).to_pylist()     # good's types: a file's own types are not what is tested
    bad_recs[0]["completion_tokens"], bad_recs[1]["prompt_tokens"], bad_recs[2]["n"] = 2**40, -1, 0
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(bad_recs, schema=table.schema), bad)
    bare = tmp_path / "bare.parquet"
    pq.write_table(table, bare, write_statistics=False)

    con = duckdb.connect()
    assert engine.column_bounds(con, [str(bare)]) == {}
    assert engine.column_bounds(con, [str(good), str(bad)])["completion_tokens"][1] == 2**40
    checked = '"completion_tokens" BETWEEN'
    assert checked not in engine.parquet_source(con, [str(good)])
    assert checked in engine.parquet_source(con, [str(good), str(bad)])
    assert checked in engine.parquet_source(con, [str(bare)])
    for paths in ([good], [good, bad], [bare], [bad]):
        duck, python = both([str(p) for p in paths])
        assert duck == python
    assert both([str(bad)])[1]["malformed"] == 3


def test_the_cli_prints_the_same_report_with_either_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", varied(4, 2000), MALFORMED)
    outputs = {}
    for reader in ("duckdb", "python"):
        for fmt in ("json", "table"):
            assert report_cli.main([str(path), "--engine", reader, "--format", fmt, "--percentile", "95"]) == 0
            outputs[reader, fmt] = capsys.readouterr().out
    assert outputs["duckdb", "json"] == outputs["python", "json"]
    assert outputs["duckdb", "table"] == outputs["python", "table"]
    assert json.loads(outputs["duckdb", "json"])["models"][0]["recommendation"] is not None


def test_a_glob_matching_nothing_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report_cli.main([str(tmp_path / "*.parquet")]) == 2
    assert "no file matches" in capsys.readouterr().err


@pytest.mark.slow
def test_a_million_record_sample_of_the_fleet_day_gets_the_python_readers_recommendation(tmp_path: Path) -> None:
    """bench/fleet_bench.py's day, 1,000,000 records in 4 files: DuckDB and the Python reader build the same
    histograms, hence the same recommendation per model (the bench times the 100-million-record day)."""
    pytest.importorskip("numpy")
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("fleet_bench", ROOT / "bench" / "fleet_bench.py")
    assert spec is not None and spec.loader is not None
    fleet_bench = importlib.util.module_from_spec(spec)
    sys.modules["fleet_bench"] = fleet_bench
    spec.loader.exec_module(fleet_bench)
    fleet_bench.generate(tmp_path, 1_000_000, 2, 2)
    files = [str(tmp_path / "*.parquet")]
    duck = rep.build_report(files, engine_name="duckdb")
    python = rep.build_report(files, engine_name="python")
    assert state(duck) == state(python) and duck.stats.records == 1_000_000
    for name in python.models:
        expected = rep.model_report(python.models[name])
        assert rep.model_report(duck.models[name]) == expected
        assert expected["recommendation"]["max_model_len"] > 0


@pytest.mark.slow
def test_the_fleet_pages_examples_run(tmp_path: Path) -> None:
    """docs/fleet.md's shell blocks, as written (brimful and python on the PATH): the day is generated, both
    readers print the same report (its `cmp` line), the JSON lines join the Parquet files, DuckDB's SQL runs."""
    import os
    import shutil
    import subprocess
    import sys

    from tests.support.docs import block

    keys = ("\npython bench/fleet_bench.py --records 1000000", "TO '/tmp/old.jsonl' (FORMAT json)",
            "FROM read_parquet('/tmp/fleet_day/*.parquet') GROUP BY model")
    script = "\n".join(line for key in keys for line in block(key))
    shutil.rmtree("/tmp/fleet_day", ignore_errors=True)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", "-e", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "same report" in done.stdout
    assert "1,001,000 records from 5 file(s)" in done.stdout
    assert "│ qwen3-8b " in done.stdout
    shutil.rmtree("/tmp/fleet_day", ignore_errors=True)
