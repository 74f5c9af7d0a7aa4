"""proxy.recording.parquetlog: rolled Parquet files read back by DuckDB and pyarrow, with the JSON log's loss bounds."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb")

from proxy.config import ConfigError, load_config  # noqa: E402
from proxy.errors import ErrorCode  # noqa: E402
from proxy.recording import parquetlog as pl  # noqa: E402
from proxy.recording.record import Action, LengthRecord  # noqa: E402


def make_record(i: int) -> LengthRecord:
    return LengthRecord(
        ts=1_700_000_000.0 + i, model=f"m{i % 3}", endpoint="chat" if i % 2 else "completions", stream=bool(i % 2),
        request_id=f"req-{i}", n=1 + i % 2, max_model_len=8192, prompt_tokens=100 + i,
        longest_prompt_tokens=None if i % 2 else 60 + i, upstream_prompt_tokens=None if i % 4 else 100 + i,
        requested_max_tokens=None if i % 5 == 0 else 4000, granted_max_tokens=4000, completion_tokens=12 + i,
        finish_reasons=["stop", "length"] if i % 3 == 0 else [], action=Action.CLAMPED if i % 2 else Action.PASS,
        status=200 if i % 7 else 400, error_code=None if i % 7 else ErrorCode.CONTEXT_LENGTH_EXCEEDED,
        length_retries=i % 2, latency_ms=1.5 * i, ttfb_ms=None if i % 2 else 0.25 * i,
    )


def expected(rec: LengthRecord) -> dict:
    return json.loads(json.dumps(rec.to_dict()))     # what the JSON log holds for it


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def duck_rows(pattern: str) -> list[dict]:
    rel = duckdb.sql(f"SELECT * FROM read_parquet('{pattern}') ORDER BY request_id")
    return [dict(zip(rel.columns, row, strict=True)) for row in rel.fetchall()]


def test_the_schema_holds_every_record_field_under_its_json_name() -> None:
    assert [name for name, _ in pl.COLUMNS] == [f.name for f in dataclasses.fields(LengthRecord)]
    s = pl.schema()
    for name in ("model", "endpoint", "action", "error_code"):
        assert pa.types.is_dictionary(s.field(name).type)
    assert s.field("finish_reasons").type == pa.list_(pa.string())


def test_records_come_back_field_for_field_in_duckdb_and_pyarrow(tmp_path: Path) -> None:
    records = [make_record(i) for i in range(50)]
    log = pl.ParquetLog(tmp_path, replica="web-1", flush_interval_s=0.01, clock=Clock(1_700_000_123.0))
    for rec in records:
        assert log.enqueue(rec)
    log.close()
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == [f"web-1-20231114T221000Z-{os.getpid()}.parquet"]   # window 22:10 of 600 s
    assert log.converted == files and log.stats.written == 50
    got = duck_rows(str(tmp_path / "*.parquet"))
    assert got == sorted((expected(r) for r in records), key=lambda r: r["request_id"])
    table = pq.read_table(files[0])
    assert table.schema.equals(pl.schema(), check_metadata=False)
    assert table.to_pylist() == [expected(r) for r in records]


def test_a_new_window_rolls_into_a_new_file_and_converts_the_last_one_off_the_writer(tmp_path: Path) -> None:
    clock = Clock(1_700_000_000.0)
    log = pl.ParquetLog(tmp_path, replica="r", roll_interval_s=60, flush_interval_s=0.01, clock=clock)
    log.enqueue(make_record(1))
    assert log.flush(5)
    journals = list(tmp_path.glob("*" + pl.JOURNAL_SUFFIX))
    assert len(journals) == 1 and not list(tmp_path.glob("*.parquet"))
    clock.now += 60
    log.enqueue(make_record(2))
    assert log.flush(5)
    log.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    pid = os.getpid()
    assert names == [f"r-20231114T221300Z-{pid}.parquet", f"r-20231114T221400Z-{pid}.parquet"]
    assert [r["request_id"] for r in duck_rows(str(tmp_path / "*.parquet"))] == ["req-1", "req-2"]


def _write_then_die(directory: str, count: int) -> None:
    log = pl.ParquetLog(directory, replica="dead", flush_interval_s=0.01)
    for i in range(count):
        log.enqueue(make_record(i))
    log.flush(10)
    os.kill(os.getpid(), signal.SIGKILL)     # no close(): the journal stays behind as after kill -9


def test_a_killed_writers_journal_is_converted_at_the_next_start_and_a_live_ones_is_not(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=_write_then_die, args=(str(tmp_path), 30))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    orphans = list(tmp_path.glob("dead-*" + pl.JOURNAL_SUFFIX))
    assert len(orphans) == 1 and not list(tmp_path.glob("*.parquet"))
    holder = pl.ParquetLog(tmp_path, replica="alive", flush_interval_s=0.01)
    holder.enqueue(make_record(99))
    assert holder.flush(5)
    try:
        assert pl.recover(tmp_path, "alive") == []            # its writer holds the lock
        restarted = pl.ParquetLog(tmp_path, replica="dead", flush_interval_s=0.01)
        assert [p.name for p in restarted.converted] == [orphans[0].name.replace(pl.JOURNAL_SUFFIX, ".parquet")]
        restarted.close()
        assert len(duck_rows(str(tmp_path / "dead-*.parquet"))) == 30
    finally:
        holder.close()
    assert len(duck_rows(str(tmp_path / "alive-*.parquet"))) == 1


def test_a_torn_last_line_loses_that_line_only(tmp_path: Path) -> None:
    journal = tmp_path / ("x-20231114T221000Z-1" + pl.JOURNAL_SUFFIX)
    lines = [json.dumps(expected(make_record(i))) for i in range(5)]
    journal.write_text("\n".join(lines) + "\n" + lines[0][:17])
    target = pl.convert_journal(journal)
    assert target is not None and not journal.exists()
    assert [r["request_id"] for r in pq.read_table(target).to_pylist()] == [f"req-{i}" for i in range(5)]


def test_a_restarted_container_with_the_same_pid_never_replaces_a_file(tmp_path: Path) -> None:
    stem = "c-20231114T221000Z-1"
    for i in range(3):
        journal = tmp_path / (stem + pl.JOURNAL_SUFFIX)
        journal.write_text(json.dumps(expected(make_record(i))) + "\n")
        pl.convert_journal(journal)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"{stem}.1.parquet", f"{stem}.2.parquet", f"{stem}.parquet"]
    assert len(duck_rows(str(tmp_path / "*.parquet"))) == 3


def test_config_takes_the_format_and_refuses_parquet_on_standard_output(tmp_path: Path) -> None:
    path = tmp_path / "b.toml"
    path.write_text('[length_log]\nformat = "parquet"\npath = "/tmp/x"\nroll_interval = 60\nreplica = "a"\n')
    ll = load_config(path, env={}).length_log
    assert (ll.format, ll.roll_interval, ll.replica) == ("parquet", 60.0, "a")
    path.write_text('[length_log]\nformat = "parquet"\npath = "-"\n')
    with pytest.raises(ConfigError, match="standard output"):
        load_config(path, env={})
    path.write_text('[length_log]\nformat = "csv"\n')
    with pytest.raises(ConfigError, match="format"):
        load_config(path, env={})


def test_replica_names_are_made_safe_for_a_file_name() -> None:
    assert pl.safe_replica("web/3 eu") == "web_3_eu"
    assert pl.safe_replica("..") == "brimful"
