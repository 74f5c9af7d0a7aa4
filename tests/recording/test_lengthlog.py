"""proxy.recording.lengthlog: whole lines under concurrency, rotation, and degrading instead of raising."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from proxy.recording.lengthlog import LengthLog, backup_name, encode_line
from proxy.recording.record import LengthRecord


def make_record(ident: str, prompt: int = 100) -> LengthRecord:
    return LengthRecord(
        ts=1_700_000_000.0, model=ident, endpoint="chat", max_model_len=8192, prompt_tokens=prompt,
        requested_max_tokens=4000, granted_max_tokens=4000, completion_tokens=12,
        finish_reasons=["stop"], status=200,
    )


def read_lines(*paths: Path) -> list[dict]:
    out = []
    for p in paths:
        with open(p, "rb") as f:
            for raw in f.read().splitlines():
                out.append(json.loads(raw))   # raises on any torn or interleaved line
    return out


def all_log_files(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + "*"), key=str)


def test_records_are_written_as_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "lengths.jsonl"
    recs = [make_record(f"m{i}", prompt=i) for i in range(3)]
    with LengthLog(path) as log:
        for r in recs:
            assert log.enqueue(r)
    assert read_lines(path) == [r.to_dict() for r in recs]
    assert log.stats.written == 3 and log.stats.dropped == 0 and log.stats.write_errors == 0


def test_parent_directory_is_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "lengths.jsonl"
    with LengthLog(path) as log:
        log.enqueue(make_record("m"))
    assert len(read_lines(path)) == 1


def test_close_flushes_everything_queued(tmp_path: Path) -> None:
    path = tmp_path / "lengths.jsonl"
    log = LengthLog(path)
    for i in range(2000):
        log.enqueue(make_record(f"m{i}"))
    log.close()
    assert [r["model"] for r in read_lines(path)] == [f"m{i}" for i in range(2000)]
    assert not log.enqueue(make_record("late"))        # after close: dropped, not raised
    assert log.stats.dropped == 1


def _write_from_threads(path: str, proc: int, threads: int, per_thread: int, max_bytes: int) -> None:
    """Child process body: its own LengthLog, several threads enqueueing at once."""
    log = LengthLog(path, max_bytes=max_bytes, backups=1000, queue_size=threads * per_thread)

    def work(t: int) -> None:
        for i in range(per_thread):
            log.enqueue(make_record(f"p{proc}-t{t}-i{i}", prompt=proc * 1_000_000 + t * 1000 + i))

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    log.close()
    ok = log.stats.written == threads * per_thread and log.stats.dropped == 0 and log.stats.write_errors == 0
    os._exit(0 if ok else 1)


def test_threads_and_processes_append_whole_lines_with_rotation(tmp_path: Path) -> None:
    path = tmp_path / "lengths.jsonl"
    procs, threads, per_thread = 4, 6, 250
    line_len = len(encode_line(make_record("p0-t0-i000", prompt=3_000_000)))
    max_bytes = 40 * 1024
    ctx = multiprocessing.get_context("fork")
    children = [
        ctx.Process(target=_write_from_threads, args=(str(path), p, threads, per_thread, max_bytes))
        for p in range(procs)
    ]
    for c in children:
        c.start()
    for c in children:
        c.join()
    assert [c.exitcode for c in children] == [0] * procs

    files = [p for p in all_log_files(path) if not p.name.endswith(".lock")]
    rows = read_lines(*files)
    expected = {f"p{p}-t{t}-i{i}" for p in range(procs) for t in range(threads) for i in range(per_thread)}
    assert len(rows) == len(expected)                       # exact: nothing lost, nothing doubled
    assert {r["model"] for r in rows} == expected
    assert len(files) > 10                                  # ~ 6000 lines × ~330 B / 40 KiB: rotated
    # A file can only exceed the limit by lines that other processes sized against it concurrently.
    for f in files:
        assert f.stat().st_size <= max_bytes + procs * (line_len + 16)
    # No double rotation: a process that finds the file already rotated by another
    # writes into the new file instead of rotating it again while it is nearly empty.
    for f in files:
        if f != path:
            assert f.stat().st_size > max_bytes - (line_len + 16), f.name


def test_rotation_happens_at_the_size_and_keeps_the_newest_backups(tmp_path: Path) -> None:
    path = tmp_path / "lengths.jsonl"
    line_len = len(encode_line(make_record("m00")))
    per_file = 3
    with LengthLog(path, max_bytes=per_file * line_len + line_len // 2, backups=2) as log:
        for i in range(10):                                 # 10 lines: files of 3, newest holds 1
            log.enqueue(make_record(f"m{i:02d}"))
    names = lambda p: [r["model"] for r in read_lines(p)]  # noqa: E731
    assert names(path) == ["m09"]
    assert names(backup_name(path, 1)) == ["m06", "m07", "m08"]
    assert names(backup_name(path, 2)) == ["m03", "m04", "m05"]
    assert not backup_name(path, 3).exists()                # m00..m02 fell off the end
    assert backup_name(path, 1).stat().st_size == per_file * line_len


def test_reopens_when_the_file_is_moved_away(tmp_path: Path) -> None:
    path = tmp_path / "lengths.jsonl"
    with LengthLog(path) as log:
        log.enqueue(make_record("before"))
        assert log.flush(10)
        os.rename(path, tmp_path / "moved.jsonl")           # e.g. logrotate, or another process
        log.enqueue(make_record("after"))
    assert [r["model"] for r in read_lines(tmp_path / "moved.jsonl")] == ["before"]
    assert [r["model"] for r in read_lines(path)] == ["after"]


def test_unwritable_path_degrades_to_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    caplog.set_level(logging.WARNING, logger="brimful.lengthlog")
    log = LengthLog(blocker / "lengths.jsonl", reopen_interval_s=0)   # retry the open on every record
    for i in range(50):
        assert log.enqueue(make_record(f"m{i}"))            # enqueue itself never fails or raises
    log.close()
    assert log.stats.write_errors == 50 and log.stats.written == 0
    warnings = [r for r in caplog.records if r.name == "brimful.lengthlog"]
    assert len(warnings) == 1
    assert "not writable" in warnings[0].getMessage()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux /dev/full")
def test_full_disk_degrades_to_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="brimful.lengthlog")
    log = LengthLog("/dev/full", max_bytes=10)              # every write fails with ENOSPC
    for i in range(20):
        log.enqueue(make_record(f"m{i}"))
    log.close()
    assert log.stats.write_errors == 20 and log.stats.written == 0
    warnings = [r for r in caplog.records if r.name == "brimful.lengthlog"]
    assert len(warnings) == 1
    assert "No space left" in warnings[0].getMessage()


def test_full_queue_drops_and_counts_without_blocking(tmp_path: Path) -> None:
    # Opening a FIFO for writing blocks until a reader appears: the writer thread
    # is stuck in open(), so the queue fills and enqueue must drop, not wait.
    fifo = tmp_path / "lengths.fifo"
    os.mkfifo(fifo)
    log = LengthLog(fifo, queue_size=2)
    accepted = sum(log.enqueue(make_record(f"m{i}")) for i in range(10))
    assert accepted <= 3                                    # 2 queued + at most 1 taken by the writer
    assert log.stats.dropped == 10 - accepted

    reader = os.open(fifo, os.O_RDONLY)                     # unblocks the writer's open()
    try:
        log.close()
        data = b""
        while chunk := os.read(reader, 65536):
            data += chunk
    finally:
        os.close(reader)
    assert len(data.splitlines()) == accepted == log.stats.written


def test_a_burst_goes_out_in_few_writes_of_whole_lines_split_at_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the writer drained from its queue at once is appended in one write per file."""
    import proxy.recording.lengthlog as lengthlog

    path = tmp_path / "lengths.jsonl"
    lines = [encode_line(make_record(f"m{i:03d}")) for i in range(100)]
    per_file = 40
    writes: list[bytes] = []
    real_write = os.write
    monkeypatch.setattr(lengthlog.os, "write", lambda fd, data: writes.append(data) or real_write(fd, data))
    with LengthLog(path, max_bytes=per_file * len(lines[0]), backups=5) as log:
        log._write_lines(lines)              # the writer thread's step, called directly
        assert log.stats.written == 100
    assert [len(w) // len(lines[0]) for w in writes] == [40, 40, 20]
    assert all(w.endswith(b"\n") for w in writes)
    files = [backup_name(path, 2), backup_name(path, 1), path]
    assert [r["model"] for r in read_lines(*files)] == [f"m{i:03d}" for i in range(100)]
    assert all(f.stat().st_size <= per_file * len(lines[0]) for f in files)


def test_records_wait_for_the_round_and_flush_or_close_do_not(tmp_path: Path) -> None:
    """enqueue() only appends (bounded, the excess dropped and counted); the writer's
    round comes every flush_interval_s, but flush() and close() get one at once."""
    path = tmp_path / "lengths.jsonl"
    log = LengthLog(path, queue_size=3, flush_interval_s=3600)
    assert [log.enqueue(make_record(f"m{i}")) for i in range(5)] == [True, True, True, False, False]
    assert log.stats.dropped == 2
    assert log.flush(timeout=10)                  # does not wait for the hour-long round
    assert [r["model"] for r in read_lines(path)] == ["m0", "m1", "m2"]
    assert log.enqueue(make_record("m3"))
    log.close(timeout=10)
    assert not log._thread.is_alive()
    assert [r["model"] for r in read_lines(path)] == ["m0", "m1", "m2", "m3"]
    assert (log.stats.written, log.stats.dropped) == (4, 2)


def test_encode_line_is_the_json_modules_line() -> None:
    """The fast line (orjson) is byte for byte the json module's, and where orjson would
    write otherwise (NaN, non-ASCII, an integer past 64 bits) the json module writes it."""
    def reference(rec: LengthRecord) -> bytes:
        return (json.dumps(rec.to_dict(), separators=(",", ":"), ensure_ascii=True) + "\n").encode("ascii")

    plain = make_record("m-plain")
    odd = [replace(plain, latency_ms=float("nan")), replace(plain, latency_ms=float("inf")),
           replace(plain, model="модель-ü"), replace(plain, prompt_tokens=2**70),
           replace(plain, latency_ms=1e-05, ttfb_ms=0.125)]
    for rec in [plain, *odd]:
        assert encode_line(rec) == reference(rec) or json.loads(encode_line(rec)) == json.loads(reference(rec))
    assert encode_line(plain) == reference(plain)
    assert encode_line(odd[0]) == reference(odd[0]) and b"NaN" in encode_line(odd[0])
    assert encode_line(odd[2]) == reference(odd[2]) and encode_line(odd[2]).isascii()
    assert encode_line(odd[3]) == reference(odd[3])
