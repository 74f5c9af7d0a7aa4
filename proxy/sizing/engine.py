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
    value = f"CASE WHEN {f.is_int()} AND {f.as_int()} BETWEEN 0 AND {MAX_PLAUSIBLE_TOKENS} THEN {f.as_int()} END"
    return f"({f.absent()} OR {f.null()} OR {value} IS NOT NULL)", value


def _lenient(f: Field) -> str:
    return f"CASE WHEN {f.is_int()} AND {f.as_int()} >= 0 THEN {f.as_int()} END"


def _defaulted_str(f: Field, default: str) -> tuple[str, str]:
    """`rec.get(k, default)` that must be a string: absent gives the default, null is malformed."""
    return (f"({f.absent()} OR {f.is_str()})", f"CASE WHEN {f.absent()} THEN {_q(default)} ELSE {f.as_str()} END")


def normalized(fields: dict[str, Field]) -> str:
    """SELECT list: one row of plain figures per record, `ok` false where the Python reader finds it malformed."""
    f = fields
    up_ok, up = _opt_int(f["upstream_prompt_tokens"])
    pt_ok, pt = _opt_int(f["prompt_tokens"])
    comp_ok, comp = _opt_int(f["completion_tokens"])
    long_ok, long_ = _opt_int(f["longest_prompt_tokens"])
    gr_ok, gr = _opt_int(f["granted_max_tokens"])
    act_ok, act = _defaulted_str(f["action"], "pass")
    ep_ok, ep = _defaulted_str(f["endpoint"], "chat")
    fr_ok, has_fr, fin_len = f["finish_reasons"].reasons()
    n = f["n"]
    n_val = f"CASE WHEN {n.absent()} OR {n.null()} THEN 1 WHEN {n.is_int()} AND {n.as_int()} >= 1 THEN {n.as_int()} END"
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
        f"{gr} AS granted", f"{_lenient(f['granted_max_tokens'])} AS granted_lenient",
        f"{_lenient(f['requested_max_tokens'])} AS requested",
        f"{has_fr} AS has_reasons", f"{fin_len} AS finished_length",
        f"{f['max_model_len'].as_int()} AS mml_seen", f"{_lenient(f['max_model_len'])} AS mml",
        f"{f['status'].as_int()} AS status", f"{f['error_code'].text()} AS error_code",
        f"{_lenient(f['prompt_tokens'])} AS own_prompt",
        f"CASE WHEN {f['latency_ms'].is_num()} AND {f['latency_ms'].num()} >= 0 "
        f"THEN {f['latency_ms'].num()} / 1000.0 END AS latency_s",
    ])


def _served_sequence(granted: str) -> str:
    """`proxy.sizing.lengths.sequence_tokens` over the row's prompt, completion, n, `granted` and longest."""
    return (f"coalesce(longest, prompt) + CASE WHEN (n > 1 OR longest IS NOT NULL) AND {granted} IS NOT NULL "
            f"THEN least(completion, {granted}) ELSE completion END")


def _implicit() -> str:
    cases = " ".join(f"WHEN {_q(ep)} THEN {limit}" for ep, limit in sorted(IMPLICIT_MAX_TOKENS.items()))
    return f"CASE endpoint {cases} END" if cases else "NULL::BIGINT"


def figures(min_completion: int) -> str:
    """SELECT list over `normalized`: the histogram values of `ModelStats.add` and `add_demand`."""
    implicit = _implicit()
    single = "coalesce(longest, prompt)"
    d_seq = (f"CASE WHEN prompt IS NULL THEN NULL WHEN requested > 0 THEN {single} + requested "
             f"WHEN completion IS NOT NULL THEN {_served_sequence('granted_lenient')} "
             f"WHEN {implicit} IS NOT NULL THEN {single} + {implicit} ELSE {single} + 1 END")
    # HUGEINT: n × a limit overflows BIGINT where Python's ints do not
    d_kv = (f"CASE WHEN prompt IS NULL THEN NULL WHEN requested > 0 THEN prompt + n::HUGEINT * requested "
            f"WHEN completion IS NOT NULL THEN prompt + completion "
            f"WHEN {implicit} IS NOT NULL THEN prompt + n::HUGEINT * {implicit} ELSE prompt + n::HUGEINT END")
    d_lower = (f"CASE WHEN prompt IS NULL THEN NULL WHEN requested > 0 THEN false "
               f"WHEN completion IS NOT NULL THEN coalesce(finished_length, false) "
               f"WHEN {implicit} IS NOT NULL THEN false ELSE true END")
    failed = "(action IN ('rejected', 'upstream_error') OR status >= 400)"
    # reason_of, as the reason's index in REASONS: a small integer groups faster than a computed string
    code = {name: i for i, name in enumerate(REASONS)}
    mapped = "CASE error_code " + " ".join(
        f"WHEN {_q(error)} THEN {code[reason]}" for error, reason in sorted(dm.ERROR_CODE_REASONS.items())
        if reason != "other") + f" ELSE {code['other']} END"
    reason = (f"CASE WHEN error_code IS NULL AND NOT coalesce({failed}, false) THEN NULL "
              f"WHEN error_code IS NULL THEN {code['other']} "
              f"WHEN error_code = {_q(ErrorCode.CONTEXT_LENGTH_EXCEEDED)} AND own_prompt >= mml "
              f"THEN {code['prompt_too_long']} ELSE {mapped} END::UTINYINT")
    return ",\n".join([
        "model", "action", "endpoint", "n > 1 AS parallel", "coalesce(has_reasons, false) AS has_reasons",
        "coalesce(finished_length, false) AS finished_length", "mml_seen", "prompt", "completion",
        "CASE WHEN completion IS NOT NULL THEN prompt + completion END AS total",
        f"CASE WHEN prompt IS NOT NULL AND completion IS NOT NULL THEN {_served_sequence('granted')} END "
        "AS sequence",
        f"({d_seq}) AS d_seq", f"({d_kv}) AS d_kv", f"coalesce({d_lower}, false) AS d_lower",
        f"CASE WHEN prompt IS NOT NULL THEN {single} + least(({d_seq}) - {single}, {min_completion}) END "
        "AS d_refused",
        "CASE WHEN prompt IS NOT NULL THEN mml END AS d_limit",
        f"({reason}) AS reason",
        *_need_figures(implicit),
        "latency_s",
    ])


def _need_figures(implicit: str) -> list[str]:
    """`proxy.sizing.need.need_figures` and `pools.route_key` in SQL, as `ModelStats.add_demand` feeds them:
    the need's kind (0 exact, 1 cut, 2 unknown), its prompt, value and upper bound (-1: none), the route key."""
    single = "coalesce(longest, prompt)"
    asked = f"CASE WHEN requested > 0 THEN requested ELSE {implicit} END"
    per_choice = ("CASE WHEN n = 1 AND longest IS NULL THEN completion "
                  "ELSE least(completion, coalesce(nullif(granted_lenient, 0), completion)) END")
    value = f"({single} + {per_choice})"
    limit = f"coalesce(granted_lenient, {asked})"
    cut = (f"CASE WHEN coalesce(has_reasons, false) THEN coalesce(finished_length, false) "
           f"ELSE coalesce({per_choice} >= {limit}, false) OR coalesce({value} >= mml, false) END")
    kind = (f"CASE WHEN completion IS NULL THEN 2 WHEN NOT ({cut}) OR coalesce({per_choice} >= {asked}, false) "
            f"THEN 0 ELSE 1 END::UTINYINT")
    return [
        f"{kind} AS need_kind", f"{single} AS need_prompt",
        f"CASE WHEN completion IS NULL THEN {single} + 1 ELSE {value} END AS need_value",
        f"coalesce({single} + {asked}, -1) AS need_upper",
        f"CASE WHEN requested > 0 THEN ({single} + requested + {BLOCK_SIZE - 1}) // {BLOCK_SIZE} * {BLOCK_SIZE} "
        f"ELSE {NO_ASK} END AS need_route",
    ]


REASONS: tuple[str, ...] = typing.get_args(dm.Reason)

# Low-cardinality figures, counted together in one grouping set (a few hundred groups per model): ModelStats'
# actions, endpoints, limits seen, reasons and counters are sums over it.
SMALL = ("action", "endpoint", "mml_seen", "d_limit", "reason", "has_reasons", "finished_length", "parallel",
         "d_lower")
# Token counts, one grouping set each over a packed (model, value): the exact histograms.  The last two are
# the need estimate's exact needs and their completions (`NeedTally.exact`, `.completions`).
HISTOGRAMS = ("prompt", "completion", "total", "sequence", "d_seq", "d_kv", "d_refused", "need_exact",
              "need_completion")
# The grouping sets after the SMALL one and the histograms', by the one column of KEYS each groups by (with the
# model's index): the need's cut and unknown requests (`NeedTally.cut`, `.unknown`) and the routes' sums.
CUT = ("cut_prompt", "cut_value", "cut_upper")
UNKNOWN = ("unknown_prompt", "unknown_upper")
KEYS = ("state", *HISTOGRAMS, CUT[0], UNKNOWN[0], "route")


def model_code(models: Sequence[str | None]) -> str:
    """SQL: the model's index in `models` (NULL, the unknown model, included)."""
    cases = " ".join(f"WHEN {_q(m)} THEN {i}" for i, m in enumerate(models) if m is not None)
    unknown = models.index(None) if None in models else "NULL"
    return f"CASE WHEN model IS NULL THEN {unknown} " + (f"ELSE CASE model {cases} END END" if cases else "END")


def aggregate_sql(source: str, keep: str, min_completion: int, models: Sequence[str | None]) -> str:
    """One scan, then grouping sets (`_sets_sql`): the SMALL set with the record's `state` (0 kept, 1 malformed,
    2 filtered), one set per histogram over a single packed key, value × len(models) + the model's index `mc`,
    NULL for a record not kept (one integer hashes several times faster than (state, model string, value)), and
    the CUT, UNKNOWN and route sets over the model's index.  Every set's groups are few (distinct lengths, not
    records).  `g` is GROUPING(KEYS): one zero bit, the set's key."""
    small = ", ".join(SMALL)
    sets = [f"state, model, {small}", *HISTOGRAMS, f"mc, {', '.join(CUT)}", f"mc, {', '.join(UNKNOWN)}", "mc, route"]
    width = len(models)
    # HUGEINT: d_kv (prompt + n × a limit) times the model count may pass BIGINT; Python's ints do not overflow
    value = {"need_exact": "need_value", "need_completion": "need_value - need_prompt"}
    need = "state = 0 AND prompt IS NOT NULL"
    packed = ", ".join(f"CASE WHEN {need + ' AND need_kind = 0' if h in value else 'state = 0'} THEN "
                       f"({value.get(h, h)})::{'HUGEINT' if h == 'd_kv' else 'BIGINT'} * {width} + mc END AS {h}"
                       for h in HISTOGRAMS)
    kinds = [(CUT, ("need_prompt", "need_value", "need_upper"), 1), (UNKNOWN, ("need_prompt", "need_upper"), 2)]
    tallies = ", ".join(f"CASE WHEN {need} AND need_kind = {kind} THEN {expr} END AS {col}"
                        for cols, exprs, kind in kinds for col, expr in zip(cols, exprs, strict=True))
    routes = (f"CASE WHEN {need} THEN need_route END AS route, "
              f"CASE WHEN {need} AND need_kind < 2 THEN need_value END AS known_need, "
              f"CASE WHEN {need} AND need_kind = 2 THEN need_prompt END AS unknown_need, "
              f"CASE WHEN {need} THEN latency_s END AS latency_s")
    return f"""
WITH k AS (SELECT CASE WHEN NOT ok THEN 1 WHEN NOT ({keep}) THEN 2 ELSE 0 END::UTINYINT AS state, *
           FROM ({source})),
f0 AS (SELECT state, {model_code(models)} AS mc, {figures(min_completion)} FROM k),
f AS MATERIALIZED (SELECT state, model, mc, {small}, {packed}, {tallies}, {routes} FROM f0)
{_sets_sql(sets)}"""


def _sets_sql(sets: list[str]) -> str:
    """The grouping sets, each its own GROUP BY over the CTE `f` (which DuckDB materializes once, as it does for
    GROUPING SETS): a set counts only its rows (those with its key) and only the routes' set sums, where one
    GROUPING SETS query computes every aggregate in every set.  `g` is what GROUPING(KEYS) would be."""
    width = len(KEYS)
    parts = []
    for i, (key, cols) in enumerate(zip(KEYS, sets, strict=True)):
        aggregates = "count(*) AS c"
        if key == "route":
            aggregates += (", sum(known_need) AS known_need, count(unknown_need) AS unknowns, "
                           "sum(unknown_need) AS unknown_need, sum(latency_s) AS lat, count(latency_s) AS nlat")
        where = "" if key == "state" else f" WHERE {key} IS NOT NULL"
        grouping = ((1 << width) - 1) ^ (1 << (width - 1 - i))
        parts.append(f"SELECT {grouping} AS g, {cols.strip('()')}, {aggregates} FROM f{where} GROUP BY ALL")
    return "\nUNION ALL BY NAME\n".join(parts)


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
    return Aggregates(rel.fetchall(), list(rel.columns), models)
