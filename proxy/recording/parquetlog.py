"""The length records as rolled Parquet files: one per replica, worker process and time window.

Why it is built this way:

* **The same loss bounds as the JSON log.**  A Parquet file is readable only
  once its footer is written, so a file written row group by row group loses
  everything since it was opened to a `kill -9`.  Instead each window's
  records go first to a journal, `<stem>.open.jsonl`, written exactly as
  `proxy.recording.lengthlog.LengthLog` writes its JSON lines (the same
  queue, rounds of `flush_interval_s`, `fsync` option and drop counting: it
  *is* a `LengthLog`, never rotated).  When the window ends, the journal is
  converted into `<stem>.parquet` (written under a hidden temporary name, then
  renamed: a reader never sees half a file) and deleted.  A `kill -9` leaves
  the journal behind, with what the JSON log would have kept; the next start
  of the same replica converts it.  Until then `brimful report` reads it as
  the JSON lines it is.
* **Off the request path.**  The event loop only queues the encoded line
  (`LengthLog.enqueue`).  The conversion runs on a thread of its own, in
  pyarrow's C++ JSON reader and Parquet writer (which release the GIL), so
  the writer thread keeps draining the queue into the next window's journal
  meanwhile.
* **One writer per file.**  Each worker process has its own files (the pid is
  in the name) and holds an `flock` on its open journal; recovery converts
  only journals whose lock it can take, that is whose writer has died.
* **Names that sort and partition.**  `<replica>-<window start, UTC>-<pid>`:
  `lengths/*.parquet` is a fleet's records, `lengths/web-3-2026*` one
  replica's.  The replica defaults to the host name (a Kubernetes pod's name).
* **A fixed schema** (`SCHEMA`): the record's fields with their JSON names, so
  DuckDB, ClickHouse, Spark and pandas read the files as they are and
  `brimful report` reads them like the JSON lines.  model, endpoint, action
  and error_code are dictionary-encoded (a handful of distinct values).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import queue
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proxy.config import LengthLogConfig
from proxy.recording.lengthlog import LengthLog

if TYPE_CHECKING:
    import pyarrow as pa

logger = logging.getLogger("brimful.lengthlog")

JOURNAL_SUFFIX = ".open.jsonl"
PARQUET_SUFFIX = ".parquet"
PARQUET_MISSING = ("the Parquet length log needs pyarrow: pip install 'brimful[parquet]' "
                   "(or set length_log.format = \"jsonl\")")

# The record's fields (proxy.recording.record.LengthRecord) in order, with their Arrow types.  Token
# counts are int64 (a batch's prompt count is a sum); "dict" is a dictionary-encoded string.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("ts", "float64"), ("model", "dict"), ("endpoint", "dict"), ("stream", "bool"),
    ("request_id", "string"), ("n", "int32"), ("max_model_len", "int64"), ("prompt_tokens", "int64"),
    ("longest_prompt_tokens", "int64"), ("upstream_prompt_tokens", "int64"),
    ("requested_max_tokens", "int64"), ("granted_max_tokens", "int64"), ("completion_tokens", "int64"),
    ("finish_reasons", "list<string>"), ("action", "dict"), ("status", "int32"), ("error_code", "dict"),
    ("length_retries", "int32"), ("latency_ms", "float64"), ("ttfb_ms", "float64"),
    ("trimmed_messages", "int32"), ("trimmed_tokens", "int64"),
)


def _arrow() -> Any:
    try:
        import pyarrow
    except ImportError:   # pragma: no cover - exercised only without the extra
        raise RuntimeError(PARQUET_MISSING) from None
    return pyarrow


def available() -> bool:
    """Whether the Parquet sink can run here (pyarrow importable)."""
    try:
        _arrow()
    except RuntimeError:
        return False
    return True


def schema(*, plain: bool = False) -> pa.Schema:
    """The files' schema; `plain` spells dictionary columns as plain strings (what the JSON reader parses)."""
    pa = _arrow()
    types = {"float64": pa.float64(), "bool": pa.bool_(), "string": pa.string(), "int32": pa.int32(),
             "int64": pa.int64(), "list<string>": pa.list_(pa.string()),
             "dict": pa.string() if plain else pa.dictionary(pa.int32(), pa.string())}
    return pa.schema([pa.field(name, types[kind]) for name, kind in COLUMNS])


def safe_replica(name: str) -> str:
    """A replica name usable in a file name: letters, digits, '.', '_' and '-' (others become '_')."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name.strip()).strip(".")
    return cleaned or "brimful"


def default_replica() -> str:
    return safe_replica(socket.gethostname())


def window_start(now: float, roll_interval_s: float) -> float:
    return (now // roll_interval_s) * roll_interval_s


def file_stem(replica: str, window: float, pid: int) -> str:
    stamp = datetime.fromtimestamp(window, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{replica}-{stamp}-{pid}"


# ---------------------------------------------------------------------------
# journal → Parquet


def _table_from_lines(path: Path) -> pa.Table:
    """A torn journal (a power loss cut its last line): its whole lines, one by one in Python."""
    pa = _arrow()
    rows = []
    names = [name for name, _ in COLUMNS]
    with open(path, "rb") as f:
        for raw in f:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if isinstance(rec, dict):
                rows.append({name: rec.get(name) for name in names})
    return pa.Table.from_pylist(rows, schema=schema(plain=True))


def _read_journal(path: Path) -> Iterator[pa.RecordBatch]:
    """The journal's records as Arrow batches of the plain schema (pyarrow's JSON reader: C++, no GIL)."""
    from pyarrow import json as pj
    options = pj.ParseOptions(explicit_schema=schema(plain=True), unexpected_field_behavior="ignore")
    try:
        table = pj.read_json(path, read_options=pj.ReadOptions(block_size=16 << 20), parse_options=options)
    except Exception:   # pyarrow raises ArrowInvalid (a ValueError) for a torn line; never lose the rest
        table = _table_from_lines(path)
    yield from table.to_batches(max_chunksize=1 << 20)


def convert_journal(journal: Path, *, fsync: bool = False) -> Path | None:
    """Write `journal`'s records to the Parquet file beside it and delete it; the Parquet path (None: empty)."""
    pa = _arrow()
    import pyarrow.parquet as pq
    target = journal.with_name(journal.name[: -len(JOURNAL_SUFFIX)] + PARQUET_SUFFIX)
    tmp = journal.with_name("." + target.name + ".tmp")
    final = schema()
    rows = 0
    with pq.ParquetWriter(tmp, final, compression="zstd") as writer:
        for batch in _read_journal(journal):
            columns = [col.dictionary_encode() if pa.types.is_dictionary(field.type) else col
                       for col, field in zip(batch.columns, final, strict=True)]
            writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=final))
            rows += batch.num_rows
    if rows == 0:
        tmp.unlink()
        journal.unlink()
        return None
    if fsync:
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    target = _publish(tmp, target)
    if fsync:
        _fsync_dir(target.parent)
    journal.unlink()
    return target


def _publish(tmp: Path, target: Path) -> Path:
    """Give `tmp` the name `target` (or `<stem>.1.parquet`, ... when taken: a restarted container has the
    same pid in the same window), never replacing a file: a hard link is atomic and fails when the name exists."""
    stem = target.name[: -len(PARQUET_SUFFIX)]
    for i in range(1000):
        name = target if i == 0 else target.with_name(f"{stem}.{i}{PARQUET_SUFFIX}")
        try:
            os.link(tmp, name)
        except FileExistsError:
            continue
        tmp.unlink()
        return name
    raise FileExistsError(f"no free name for {target}")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _orphan_lock(path: Path) -> Iterator[bool]:
    """True while holding the journal's lock: its writer is gone (alive, it holds the lock)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def recover(directory: Path, replica: str, *, fsync: bool = False) -> list[Path]:
    """Convert the journals of `replica` that no live writer holds (left by a kill -9): the files written."""
    written = []
    for journal in sorted(directory.glob(f"{replica}-*{JOURNAL_SUFFIX}")):
        with _orphan_lock(journal) as orphan:
            if not orphan:
                continue
            try:
                target = convert_journal(journal, fsync=fsync)
            except OSError as exc:
                logger.warning("length log journal %s could not be converted (%s: %s); it is kept",
                               journal, type(exc).__name__, exc)
                continue
        if target is not None:
            written.append(target)
    return written


# ---------------------------------------------------------------------------
# the sink


class ParquetLog(LengthLog):
    """A `LengthLog` whose file is the current window's journal, converted to Parquet when the window ends."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        replica: str | None = None,
        roll_interval_s: float = 600.0,
        queue_size: int = 10_000,
        warn_interval_s: float = 300.0,
        flush_interval_s: float = 0.1,
        fsync: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        _arrow()   # fail at start-up, not at the first roll
        if roll_interval_s <= 0:
            raise ValueError("roll_interval_s must be above 0")
        self.directory = Path(directory)
        self.replica = safe_replica(replica) if replica else default_replica()
        self.roll_interval_s = roll_interval_s
        self.clock = clock
        self.converted: list[Path] = []    # the Parquet files written by this process, oldest first
        self.directory.mkdir(parents=True, exist_ok=True)
        self.converted.extend(recover(self.directory, self.replica, fsync=fsync))
        self._window = window_start(clock(), roll_interval_s)
        self._finished: queue.Queue[Path | None] = queue.Queue()
        self._converter = threading.Thread(target=self._convert_loop, name="brimful-parquet", daemon=True)
        self._converter.start()
        super().__init__(self._journal_for(self._window), max_bytes=0, backups=0, queue_size=queue_size,
                         warn_interval_s=warn_interval_s, flush_interval_s=flush_interval_s, fsync=fsync)

    def _journal_for(self, window: float) -> Path:
        return self.directory / (file_stem(self.replica, window, os.getpid()) + JOURNAL_SUFFIX)

    # -- writer thread ------------------------------------------------------

    def _write_lines(self, lines: list[bytes]) -> None:
        """Roll first when the window changed, so a round's records land in the window it was written in."""
        window = window_start(self.clock(), self.roll_interval_s)
        if window != self._window:
            self._roll(window)
        super()._write_lines(lines)

    def _roll(self, window: float) -> None:
        finished = self.path
        self._close_fd()
        self._window = window
        self.path = self._journal_for(window)
        if finished.exists():
            self._finished.put(finished)

    def _open(self) -> None:
        super()._open()
        assert self._fd is not None
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # ours alone: the pid is in the name

    # -- converter thread ---------------------------------------------------

    def _convert_loop(self) -> None:
        while True:
            journal = self._finished.get()
            if journal is None:
                return
            self._convert(journal)

    def _convert(self, journal: Path) -> None:
        try:
            target = convert_journal(journal, fsync=self.fsync)
        except Exception as exc:   # pyarrow's own errors too: the journal stays, recovery retries it
            self._warn(exc, f"journal {journal.name} could not be converted to Parquet (kept)")
            return
        if target is not None:
            self.converted.append(target)

    def close(self, timeout: float | None = 10.0) -> None:
        """Write what is queued, convert the current window's journal, then stop both threads."""
        if self._closed:
            return
        super().close(timeout)
        if self.path.exists():
            self._finished.put(self.path)
        self._finished.put(None)
        self._converter.join(timeout)


def open_length_log(config: LengthLogConfig) -> LengthLog:
    """The record sink `[length_log]` asks for (the caller checked that `path` is set)."""
    assert config.path
    if config.format == "parquet":
        return ParquetLog(config.path, replica=config.replica or None, roll_interval_s=config.roll_interval,
                          flush_interval_s=config.flush_interval, fsync=config.fsync)
    return LengthLog(config.path, max_bytes=config.max_bytes, backups=config.backups,
                     flush_interval_s=config.flush_interval, fsync=config.fsync)
