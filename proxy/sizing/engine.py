"""`brimful report`'s reading in DuckDB: JSON lines, gzip and Parquet files reduced to the report's histograms.

The pure-Python reader (`proxy.sizing.report.ReportBuilder`) decodes each line
and folds it into a `ModelStats`: about 100k records per second of CPU, the
better part of an hour for a fleet's day.  Here DuckDB does the reading and the
folding: one query reduces every record to the same figures (`record_lengths`,
`demand_figures`, `reason_of`, the validity rules of `_opt_int` and
`_lenient_int`, `need_figures`, `route_key`) and counts them per (model,
figure, value), one GROUP BY per figure over the figures computed once, in one
scan on every core; every set's groups are distinct lengths, never records.  What comes back is the exact value → count
histograms and counters `ModelStats` holds, so the percentiles, the demand
recommendation and the output are the Python code's own (`model_report`),
whichever reader ran: the two are tested to agree record for record.

Inputs: any mix of JSON-lines files (`.gz` too: DuckDB decompresses) and
Parquet files whose columns are the record's fields with their JSON names
(`proxy.recording.parquetlog` writes them; so does DuckDB's `COPY` from the
JSON lines), local globs or URLs DuckDB reads (s3://, https:// with its httpfs
extension).  Missing Parquet columns read as absent fields.  A Parquet column
of another type than the record's (a float token count, a timestamp `ts`)
makes its non-null values malformed, exactly as the Python reader finds them.
"""

from __future__ import annotations

import errno
import glob
import os
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.errors import ErrorCode
from proxy.sizing import demand as dm
from proxy.sizing.lengths import BLOCK_SIZE, IMPLICIT_MAX_TOKENS, MAX_PLAUSIBLE_TOKENS, UNKNOWN_MODEL
from proxy.sizing.pools import NO_ASK

FIELDS = ("ts", "model", "endpoint", "n", "action", "prompt_tokens", "upstream_prompt_tokens", "completion_tokens",
          "longest_prompt_tokens", "granted_max_tokens", "requested_max_tokens", "max_model_len", "status",
          "error_code", "finish_reasons", "latency_ms")
_INT_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
              "UBIGINT", "UHUGEINT")
_NUM_TYPES = (*_INT_TYPES, "FLOAT", "DOUBLE")
_BIGINT_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER")   # fit BIGINT


def available() -> bool:
    try:
        import duckdb  # noqa: F401
    except ImportError:
        return False
    return True


def is_parquet(path: str) -> bool:
    return path.lower().endswith((".parquet", ".parq", ".pq"))


def expand(paths: Sequence[str]) -> list[str]:
    """Local globs expanded and sorted (a pattern matching nothing is an error); URLs and plain paths as given."""
    out: list[str] = []
    for path in paths:
        if "://" not in path and glob.has_magic(path) and not os.path.exists(path):
            matched = sorted(glob.glob(path))
            if not matched:
                raise FileNotFoundError(f"no file matches {path}")
            out.extend(matched)
        else:
            out.append(path)
    return out


def _q(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _list(paths: Iterable[str]) -> str:
    return "[" + ", ".join(_q(p) for p in paths) + "]"


# ---------------------------------------------------------------------------
# one field of a record, as SQL: JSON text or a typed Parquet column


class JsonField:
    """A field of a JSON line, from `json_source`'s inner projection, each computed once per line: `j{i}` its
    JSON text (SQL NULL when the key is absent), `t{i}` its JSON type, `s{i}` its text (->>), `i{i}` its value
    when a JSON integer that fits BIGINT, `d{i}` when a JSON number.  (Re-parsing the value in every test of
    the reduction made it many times slower than DuckDB's own reading of the file.)"""

    def __init__(self, index: int) -> None:
        self.v, self.t, self.s, self.i, self.d = (f"{c}{index}" for c in "jtsid")

    @staticmethod
    def columns(index: int) -> str:
        """The inner projection's columns of field `index` (1-based) of `v`, the line's extracted values."""
        j, t, s = f"j{index}", f"t{index}", f"s{index}"
        return (f"v[{index}] AS {j}, json_type(v[{index}]) AS {t}, v[{index}]->>'$' AS {s}, "
                f"CASE WHEN {t} IN ('BIGINT', 'UBIGINT') THEN TRY_CAST({s} AS BIGINT) END AS i{index}, "
                f"CASE WHEN {t} IN ('BIGINT', 'UBIGINT', 'DOUBLE') THEN TRY_CAST({s} AS DOUBLE) END AS d{index}")

    def absent(self) -> str:
        return f"({self.v} IS NULL)"

    def null(self) -> str:
        return f"({self.t} = 'NULL')"

    def is_int(self) -> str:
        return f"({self.i} IS NOT NULL)"

    def as_int(self) -> str:
        return self.i

    def is_num(self) -> str:
        return f"({self.t} IN ('BIGINT', 'UBIGINT', 'DOUBLE'))"

    def num(self) -> str:
        return self.d

    def is_str(self) -> str:
        return f"({self.t} = 'VARCHAR')"

    def as_str(self) -> str:
        return f"CASE WHEN {self.is_str()} THEN {self.s} END"

    def text(self) -> str:
        """Python's str(value) for a string or an integer (what reason_of looks up)."""
        return f"CASE WHEN {self.is_str()} THEN {self.s} WHEN {self.is_int()} THEN {self.i}::VARCHAR END"

    def reasons(self) -> tuple[str, str, str]:
        """(well-formed, has reasons, 'length' among them): Python's `rec.get(k) or []` then isinstance list."""
        falsy = (f"({self.absent()} OR {self.null()} OR {self.v} IN ('false', '0', '\"\"', '[]', '{{}}') "
                 f"OR ({self.t} = 'DOUBLE' AND {self.num()} = 0))")
        listed = f"({self.t} = 'ARRAY' AND {self.v} <> '[]')"
        return (f"({falsy} OR {listed})", listed,
                f"({listed} AND list_contains(json_extract_string({self.v}, '$[*]'), 'length'))")


class ParquetField:
    """A Parquet column of DuckDB type `kind` (None: the files lack it, so the field is absent)."""

    def __init__(self, name: str, kind: str | None) -> None:
        self.c = f'"{name}"'
        self.kind = kind

    def absent(self) -> str:
        return "true" if self.kind is None else "false"

    def null(self) -> str:
        return "false" if self.kind is None else f"({self.c} IS NULL)"

    def _typed(self, types: Sequence[str], expr: str) -> str:
        return expr if self.kind in types else "NULL"

    def is_int(self) -> str:
        return f"({self.c} IS NOT NULL)" if self.kind in _BIGINT_TYPES else f"({self.as_int()} IS NOT NULL)"

    def as_int(self) -> str:
        """The column as BIGINT: as it is, or widened (no TRY_CAST per value: that is most of the reduction's
        CPU), TRY_CAST only where values may not fit (UBIGINT, HUGEINT: they are malformed then)."""
        if self.kind == "BIGINT":
            return self.c
        if self.kind in _BIGINT_TYPES:
            return f"{self.c}::BIGINT"
        return self._typed(_INT_TYPES, f"TRY_CAST({self.c} AS BIGINT)")

    def is_num(self) -> str:
        return f"({self.num()} IS NOT NULL)"

    def num(self) -> str:
        return self.c if self.kind == "DOUBLE" else self._typed(_NUM_TYPES, f"{self.c}::DOUBLE")

    def is_str(self) -> str:
        return f"({self.as_str()} IS NOT NULL)"

    def as_str(self) -> str:
        return self._typed(("VARCHAR",), self.c)

    def text(self) -> str:
        return f"coalesce({self.as_str()}, {self.as_int()}::VARCHAR)"

    def reasons(self) -> tuple[str, str, str]:
        if self.kind is None:
            return "true", "false", "false"
        if not self.kind.endswith("[]"):
            empty = f"({self.c} IS NULL" + (f" OR {self.c} = ''" if self.kind == "VARCHAR" else "") + ")"
            return empty, "false", "false"
        listed = f"(len({self.c}) > 0)"
        return "true", f"coalesce({listed}, false)", f"coalesce(list_contains({self.c}, 'length'), false)"


Field = JsonField | ParquetField


# ---------------------------------------------------------------------------
# the record → figures reduction, in SQL


def _opt_int(f: Field) -> tuple[str, str]:
    """`proxy.sizing.report._opt_int`: (well-formed, value): absent/null, or an int in 0..MAX_PLAUSIBLE_TOKENS."""
    in_range = f"({f.as_int()} BETWEEN 0 AND {MAX_PLAUSIBLE_TOKENS})"
    return f"coalesce({in_range}, {f.absent()} OR {f.null()})", f"CASE WHEN {in_range} THEN {f.as_int()} END"


def _lenient(f: Field) -> str:
    return f"CASE WHEN {f.as_int()} >= 0 THEN {f.as_int()} END"


def _defaulted_str(f: Field, default: str) -> tuple[str, str]:
    """`rec.get(k, default)` that must be a string: absent gives the default, null is malformed."""
    return (f"({f.absent()} OR {f.is_str()})", f"CASE WHEN {f.absent()} THEN {_q(default)} ELSE {f.as_str()} END")


def normalized(fields: dict[str, Field]) -> str:
    """SELECT list: one row of plain figures per record, `ok` false where the Python reader finds it malformed.
    A figure of a kept record is its field's value; of a malformed one, anything that cannot overflow."""
    f = fields
    up_ok, up = _opt_int(f["upstream_prompt_tokens"])
    pt_ok, pt = _opt_int(f["prompt_tokens"])
    comp_ok, comp = _opt_int(f["completion_tokens"])
    long_ok, long_ = _opt_int(f["longest_prompt_tokens"])
    gr_ok, _ = _opt_int(f["granted_max_tokens"])
    act_ok, act = _defaulted_str(f["action"], "pass")
    ep_ok, ep = _defaulted_str(f["endpoint"], "chat")
    fr_ok, has_fr, fin_len = f["finish_reasons"].reasons()
    n = f["n"]
    n_val = f"CASE WHEN {n.as_int()} >= 1 THEN {n.as_int()} WHEN {n.absent()} OR {n.null()} THEN 1 END"
    model = f["model"]
    ok = " AND ".join([
        f["ts"].is_num(), f"({model.absent()} OR {model.null()} OR {model.is_str()})", f"({n_val}) IS NOT NULL",
        up_ok, f"({up} IS NOT NULL OR {pt_ok})", comp_ok, act_ok, fr_ok, long_ok, ep_ok,
        f"(NOT (({n_val}) > 1 OR ({long_}) IS NOT NULL) OR {gr_ok})",
    ])
    return ",\n".join([
        f"coalesce({ok}, false) AS ok",
        f"{f['ts'].num()} AS ts",
        # NULL for "unknown" (proxy.sizing.lengths.UNKNOWN_MODEL), counted with it in Python: grouping on the
        # column itself keeps a Parquet file's dictionary, many times faster than computed strings
        f"{model.as_str()} AS model",
        f"{act} AS action", f"{ep} AS endpoint", f"{n_val} AS n",
        f"coalesce({up}, {pt}) AS prompt", f"{comp} AS completion", f"{long_} AS longest",
        # the strict granted (`_opt_int`) only counts where n > 1 or longest is set, and there a kept record's
        # is well-formed, hence this lenient one
        f"{_lenient(f['granted_max_tokens'])} AS granted",
        f"{_lenient(f['requested_max_tokens'])} AS requested",
        f"coalesce({has_fr}, false) AS has_reasons", f"coalesce({fin_len}, false) AS finished_length",
        f"{f['max_model_len'].as_int()} AS mml_seen", f"{_lenient(f['max_model_len'])} AS mml",
        f"{f['status'].as_int()} AS status", f"{f['error_code'].text()} AS error_code",
        f"{_lenient(f['prompt_tokens'])} AS own_prompt",
        f"CASE WHEN {f['latency_ms'].num()} >= 0 THEN {f['latency_ms'].num()} / 1000.0 END AS latency_s",
    ])


def _implicit() -> str:
    cases = " ".join(f"WHEN {_q(ep)} THEN {limit}" for ep, limit in sorted(IMPLICIT_MAX_TOKENS.items()))
    return f"CASE endpoint {cases} END" if cases else "NULL::BIGINT"


def _reason() -> str:
    """`proxy.sizing.demand.reason_of`, as the reason's index in REASONS (a small integer groups faster)."""
    failed = "(action IN ('rejected', 'upstream_error') OR status >= 400)"
    code = {name: i for i, name in enumerate(REASONS)}
    mapped = "CASE error_code " + " ".join(
        f"WHEN {_q(error)} THEN {code[reason]}" for error, reason in sorted(dm.ERROR_CODE_REASONS.items())
        if reason != "other") + f" ELSE {code['other']} END"
    return (f"CASE WHEN error_code IS NULL AND NOT coalesce({failed}, false) THEN NULL "
            f"WHEN error_code IS NULL THEN {code['other']} "
            f"WHEN error_code = {_q(ErrorCode.CONTEXT_LENGTH_EXCEEDED)} AND own_prompt >= mml "
            f"THEN {code['prompt_too_long']} ELSE {mapped} END::UTINYINT")


def figures() -> list[list[str]]:
    """SELECT lists over `normalized`, every record, each over the one before: what more than one grouping set
    reads.  `single` is the longest prompt of a batch, else the prompt (`demand_figures`' and `need_figures`'
    prompt); `plain` a record of one prompt and one choice, the common case, for which sequence = total, d_kv =
    d_seq and the need's value is the total (the grouping sets count those together); `served` the completion a
    choice was served (`sequence_tokens`); `asked` the limit asked (`need_figures`); `dx` = d_seq - single
    (`demand_figures`); `per_choice`, `need_kind` (0 exact, 1 cut, 2 unknown), `need_value` and `need_upper`
    (-1: none) are `need_figures`'."""
    implicit = _implicit()
    cut = ("CASE WHEN has_reasons THEN finished_length ELSE coalesce(per_choice >= coalesce(granted, asked), false) "
           "OR coalesce(single + per_choice >= mml, false) END")
    return [
        ["coalesce(longest, prompt) AS single", "n = 1 AND longest IS NULL AS plain",
         f"CASE WHEN requested > 0 THEN requested ELSE {implicit} END AS asked"],
        # min(completion, granted) where it applies, in one test (DuckDB's least() ignores NULLs)
        ["CASE WHEN NOT plain AND granted < completion THEN granted ELSE completion END AS served",
         "CASE WHEN NOT plain AND granted > 0 AND granted < completion THEN granted ELSE completion END "
         "AS per_choice"],
        [f"CASE WHEN requested > 0 THEN requested ELSE coalesce(served, {implicit}, 1) END AS dx",
         f"CASE WHEN prompt IS NULL OR requested > 0 THEN false WHEN completion IS NOT NULL THEN finished_length "
         f"ELSE {implicit} IS NULL END AS d_lower",
         f"({_reason()}) AS reason",
         f"CASE WHEN completion IS NULL THEN 2 WHEN NOT ({cut}) OR coalesce(per_choice >= asked, false) THEN 0 "
         "ELSE 1 END::UTINYINT AS need_kind",
         "single + coalesce(per_choice, 1) AS need_value",
         "coalesce(single + asked, -1) AS need_upper"],
    ]


REASONS: tuple[str, ...] = typing.get_args(dm.Reason)

# The low-cardinality figures, grouped together with the record's state (0 kept, 1 malformed, 2 filtered) and
# model, a few hundred groups: ModelStats' actions, endpoints, limits seen, reasons and counters are sums over it.
SMALL = ("action", "endpoint", "mml_seen", "CASE WHEN prompt IS NOT NULL THEN mml END AS d_limit", "reason",
         "has_reasons", "finished_length", "n > 1 AS parallel", "d_lower")


@dataclass(frozen=True)
class HistogramSet:
    """One GROUP BY of the kept records with `where` on `key` packed with the model (key × len(models) + the
    model's index): count(*), then one count per FILTER of `feeds`, each a histogram of `ModelStats`
    (`proxy.sizing.report`'s `_DICTS`) counted at key + shift.  One hash table then counts several histograms
    that share the key for most records (the `plain` ones)."""

    key: str
    where: str
    feeds: tuple[tuple[str, int, str], ...]       # (histogram, shift, FILTER condition; "true": all rows)
    rest: bool = False        # over `r`, the few kept records the shared keys do not count for every histogram


def histogram_sets(min_completion: int) -> tuple[HistogramSet, ...]:
    """Every histogram of `ModelStats.add` and `add_demand`, each record counted once in each: the four shared
    keys, and the remaining records of the histograms they stand in for."""
    m = min_completion
    need = "prompt IS NOT NULL AND need_kind = 0"
    both = "prompt IS NOT NULL AND completion IS NOT NULL"
    d_kv = ("CASE WHEN requested > 0 THEN prompt + n::HUGEINT * requested WHEN completion IS NOT NULL "
            f"THEN prompt + completion ELSE prompt + n::HUGEINT * coalesce({_implicit()}, 1) END")
    return (
        HistogramSet("prompt", "prompt IS NOT NULL", (("prompt", 0, "true"), ("d_refused", m, f"plain AND dx >= {m}"))),
        HistogramSet("completion", "completion IS NOT NULL",
                     (("completion", 0, "true"), ("need_completion", 0, f"plain AND {need}"))),
        HistogramSet("prompt + completion", both,
                     (("total", 0, "true"), ("sequence", 0, "plain"), ("need_exact", 0, "plain AND need_kind = 0"))),
        HistogramSet("single + dx", "prompt IS NOT NULL", (("d_seq", 0, "true"), ("d_kv", 0, "plain"))),
        HistogramSet("single + served", f"NOT plain AND {both}", (("sequence", 0, "true"),), True),
        HistogramSet("need_value", f"NOT plain AND {need}", (("need_exact", 0, "true"),), True),
        HistogramSet("per_choice", f"NOT plain AND {need}", (("need_completion", 0, "true"),), True),
        HistogramSet(d_kv, "NOT plain AND prompt IS NOT NULL", (("d_kv", 0, "true"),), True),
        HistogramSet(f"single + least(dx, {m})", f"prompt IS NOT NULL AND NOT (plain AND dx >= {m})",
                     (("d_refused", 0, "true"),), True),
    )


# The grouping sets that are not histograms, by their `g`: the state set (SMALL), the need's cut and unknown
# requests (`NeedTally.cut`, `.unknown`) and the routes' sums; the histogram sets follow, g = 3 + their index.
STATE, CUT, ROUTE = range(3)


def model_code(models: Sequence[str | None]) -> str:
    """SQL: the model's index in `models` (NULL, the unknown model, included)."""
    cases = " ".join(f"WHEN {_q(m)} THEN {i}" for i, m in enumerate(models) if m is not None)
    unknown = models.index(None) if None in models else "NULL"
    return f"CASE WHEN model IS NULL THEN {unknown} " + (f"ELSE CASE model {cases} END END" if cases else "END")


def aggregate_sql(source: str, keep: str, min_completion: int, models: Sequence[str | None]) -> str:
    """One scan of `source` into `f` (every record's state and figures, which DuckDB computes once and streams
    to each set), then the grouping sets, each its own GROUP BY counting only its rows: the state set over every
    record, the others over the kept ones.  Each set's groups are few (distinct lengths, not records)."""
    state = f"CASE WHEN NOT ok THEN 1 WHEN NOT ({keep}) THEN 2 ELSE 0 END::UTINYINT AS state"
    width = len(models)
    kept = "FROM f WHERE state = 0 AND prompt IS NOT NULL"
    layers = ",\n".join(f"f{i + 1} AS (SELECT *, {', '.join(cols)} FROM f{i})" for i, cols in enumerate(figures()))
    parts = [
        f"SELECT {STATE} AS g, state, model, {', '.join(SMALL)}, count(*) AS c0 FROM f GROUP BY ALL",
        f"SELECT {CUT} AS g, mc, need_kind AS kind, single AS prompt, need_value AS value, need_upper AS upper, "
        "count(*) AS c0 FROM r WHERE need_kind > 0 GROUP BY ALL",
        f"SELECT {ROUTE} AS g, mc, CASE WHEN requested > 0 THEN (single + requested + {BLOCK_SIZE - 1}) // "
        f"{BLOCK_SIZE} * {BLOCK_SIZE} ELSE {NO_ASK} END AS route, count(*) AS c0, "
        "sum(need_value) FILTER (need_kind < 2) AS known_need, count(*) FILTER (need_kind = 2) AS unknowns, "
        "sum(single) FILTER (need_kind = 2) AS unknown_need, sum(latency_s) AS lat, count(latency_s) AS nlat "
        f"{kept} GROUP BY ALL",
    ]
    for h in histogram_sets(min_completion):
        counts = ", ".join(f"count(*) FILTER ({cond}) AS c{j}" if cond != "true" else f"count(*) AS c{j}"
                           for j, (_, _, cond) in enumerate(h.feeds))
        rows = "r WHERE" if h.rest else "f WHERE state = 0 AND"
        parts.append(f"SELECT {len(parts)} AS g, ({h.key}) * {width} + mc AS k, {counts} "
                     f"FROM {rows} {h.where} GROUP BY ALL")
    m = min_completion
    return f"""
WITH f0 AS (SELECT {state}, {model_code(models)} AS mc, * FROM ({source})),
{layers},
f AS MATERIALIZED (SELECT * FROM f{len(figures())}),
r AS MATERIALIZED (SELECT * {kept} AND (NOT plain OR dx < {m} OR need_kind > 0))
{chr(10).join(('UNION ALL BY NAME ' if i else '') + p for i, p in enumerate(parts))}"""


# ---------------------------------------------------------------------------
# the sources


def json_source(files: Sequence[str], names: Sequence[str] = FIELDS) -> str:
    """Every non-blank line of JSON-lines files (gzip too), as `normalized` rows plus `kept` flags (`names`:
    only those fields, for the models' pre-pass)."""
    paths = ", ".join(f"'$.{name}'" for name in names)
    fields: dict[str, Field] = {name: JsonField(i + 1) for i, name in enumerate(names)}
    blank = "' \t\r\n' || chr(11) || chr(12)"
    columns = ", ".join(JsonField.columns(i + 1) for i in range(len(names)))
    select = normalized(fields) if names == FIELDS else f"{fields['model'].as_str()} AS model"
    return f"""
SELECT {select} FROM (
 SELECT {columns} FROM (
  SELECT CASE WHEN json_valid(line) AND json_type(line) = 'OBJECT' THEN json_extract(line, [{paths}]) END AS v
  FROM read_csv({_list(files)}, columns = {{'line': 'VARCHAR'}}, header = false, delim = chr(1), quote = '',
                escape = '', auto_detect = false, strict_mode = false, compression = 'auto', nullstr = chr(2))
  WHERE trim(line, {blank}) <> ''))"""


def parquet_source(con: Any, files: Sequence[str]) -> str:
    read = f"read_parquet({_list(files)}, union_by_name = true)"
    kinds = {row[0]: row[1] for row in con.sql(f"DESCRIBE SELECT * FROM {read}").fetchall()}
    fields: dict[str, Field] = {name: ParquetField(name, kinds.get(name)) for name in FIELDS}
    return f"SELECT {normalized(fields)} FROM {read}"


@dataclass
class Aggregates:
    """The grouping sets' rows of `aggregate_sql` and their column names."""

    rows: list[tuple[Any, ...]]
    columns: list[str]
    models: list[str | None]        # a histogram key is value × len(models) + the model's index here
    histograms: tuple[HistogramSet, ...]      # the histogram sets, g = ROUTE + 1 + their index


def _filter(model: str | None, since: float | None) -> str:
    cond = ["true"]
    if model is not None:
        cond.append(f"coalesce(model, {_q(UNKNOWN_MODEL)}) = {_q(model)}")
    if since is not None:
        cond.append(f"ts >= {since!r}")
    return " AND ".join(cond)


def run_query(files: Sequence[str], *, model: str | None = None, since: float | None = None,
              min_completion: int = 1, threads: int | None = None) -> Aggregates:
    """Read `files` in DuckDB, one scan: the grouping sets' rows (see `aggregate_sql`)."""
    import duckdb

    for path in files:
        if "://" not in path and not os.path.isfile(path):   # the error the Python reader's open() gives
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    con = duckdb.connect(config={"threads": threads} if threads else {})
    try:
        return _aggregate(con, files, model, since, min_completion)
    except duckdb.Error as exc:        # a corrupt or unreadable file: the CLI's clean error, not a traceback
        raise OSError(f"DuckDB could not read the files: {exc}") from exc
    finally:
        con.close()


def _aggregate(con: Any, files: Sequence[str], model: str | None, since: float | None,
               min_completion: int) -> Aggregates:
    """The sources, one query."""
    parquet = [p for p in files if is_parquet(p)]
    jsonl = [p for p in files if not is_parquet(p)]
    parts = ([json_source(jsonl)] if jsonl else []) + ([parquet_source(con, parquet)] if parquet else [])
    source = " UNION ALL ".join(f"({p})" for p in parts)
    # the models first, to pack the histogram keys: for Parquet a scan of one dictionary column, for JSON lines
    # the model field alone (a superset of the kept records' models: a code unused is harmless)
    pre = " UNION ALL ".join(f"({p})" for p in ([json_source(jsonl, ("model",))] if jsonl else [])
                             + ([f"SELECT model FROM ({parquet_source(con, parquet)})"] if parquet else []))
    models = [row[0] for row in con.sql(f"SELECT DISTINCT model FROM ({pre}) ORDER BY ALL").fetchall()]
    rel = con.sql(aggregate_sql(source, _filter(model, since), min_completion, models))
    return Aggregates(rel.fetchall(), list(rel.columns), models, histogram_sets(min_completion))
