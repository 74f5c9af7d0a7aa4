"""`brimful report`'s reading in DuckDB: JSON lines, gzip and Parquet files reduced to the report's histograms.

The pure-Python reader (`proxy.sizing.report.ReportBuilder`) decodes each line
and folds it into a `ModelStats`: about 100k records per second of CPU, the
better part of an hour for a fleet's day.  Here DuckDB does the reading and the
folding: one query reduces every record to the same figures (`record_lengths`,
`demand_figures`, `reason_of`, the validity rules of `_opt_int` and
`_lenient_int`, `need_figures`, `route_key`) and counts them per (model,
figure, value) in one scan on every core: the figures are computed once and
streamed to a few GROUP BYs, four of which count every record's lengths and,
with it, the histograms that share them for a record of one prompt and one
choice (sequence = total, d_kv = d_seq, need = total); every set's groups are
distinct lengths, never records.  What comes back is the exact value → count
histograms and counters `ModelStats` holds, so the percentiles, the demand
recommendation and the output are the Python code's own (`model_report`),
whichever reader ran: the two are tested to agree record for record.

Inputs: any mix of JSON-lines files (`.gz` too: DuckDB decompresses) and
Parquet files whose columns are the record's fields with their JSON names
(`proxy.recording.parquetlog` writes them; so does DuckDB's `COPY` from the
JSON lines), local globs or URLs DuckDB reads (s3://, https:// with its httpfs
extension).  JSON lines are read by DuckDB's own JSON reader where it reads every
record as the Python reader does (`json_source`), else line by line (`json_lines_source`).  Missing
Parquet columns read as absent fields.  A Parquet column
of another type than the record's (a float token count, a timestamp `ts`)
makes its non-null values malformed, exactly as the Python reader finds them.  Where every row group's
statistics (the footers, read before the scan) put an integer column's values in the range a check asks
for, that check is true of every record and left out (`column_bounds`, `_within`); a file without
statistics, or with one value out of range, keeps it.
"""

from __future__ import annotations

import errno
import glob
import gzip
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
_SIGNED_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT")
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
    """A field of a JSON line, from `json_source`'s inner projection: `j{i}` its JSON text as `json_extract` writes
    it (SQL NULL when the key is absent, 'null' for a null; an integer as its digits, any other number with a
    '.', an exponent or as NaN/Infinity; a string quoted, escaped only where it must be), `i{i}` its value when a
    JSON integer that fits BIGINT, `d{i}` when a JSON number.  The line is parsed once, and each field's type
    read from its text: a second parse of every value (json_type, ->>) cost more than DuckDB's whole reading."""

    bounds = None       # a JSON field's values are known only record by record
    nulls_apart = True  # 'null' is its own text, apart from the SQL NULL of an absent key

    def __init__(self, index: int) -> None:
        self.v, self.i, self.d = (f"{c}{index}" for c in "jid")

    @staticmethod
    def columns(index: int, value: str | None = None) -> str:
        """The inner projection's columns of field `index` (1-based): `value` its JSON (default: of `v`, the
        line's extracted values)."""
        j, c = f"j{index}", f"c{index}"
        # as text (a cast from JSON reads true as 1); an int's text is its digits exactly as BIGINT prints them
        # (TRY_CAST alone would round '1.5' and read '1000.0')
        return (f"{value or f'v[{index}]'}::VARCHAR AS {j}, TRY_CAST({j} AS BIGINT) AS {c}, "
                f"CASE WHEN {c}::VARCHAR = {j} THEN {c} END AS i{index}, TRY_CAST({j} AS DOUBLE) AS d{index}")

    def absent(self) -> str:
        return f"({self.v} IS NULL)"

    def null(self) -> str:
        return f"({self.v} = 'null')"

    def is_int(self) -> str:
        return f"({self.i} IS NOT NULL)"

    def as_int(self) -> str:
        return self.i

    def is_num(self) -> str:
        return f"({self.d} IS NOT NULL)"

    def num(self) -> str:
        return self.d

    def is_str(self) -> str:
        return f"starts_with({self.v}, '\"')"

    def as_str(self) -> str:
        """The string's value: its text unquoted, unescaped by a parse only where it has an escape."""
        return (f"CASE WHEN NOT {self.is_str()} THEN NULL WHEN contains({self.v}, '\\') THEN {self.v}->>'$' "
                f"ELSE {self.v}[2:-2] END")

    def text(self) -> str:
        """Python's str(value) for a string or an integer (what reason_of looks up)."""
        return f"coalesce({self.as_str()}, {self.i}::VARCHAR)"

    def reasons(self) -> tuple[str, str, str]:
        """(well-formed, has reasons, 'length' among them): Python's `rec.get(k) or []` then isinstance list
        (a number's cast only where the field is no list: most records have one)."""
        listed = f"(starts_with({self.v}, '[') AND {self.v} <> '[]')"
        well_formed = (f"CASE WHEN {self.absent()} OR starts_with({self.v}, '[') THEN true "
                       f"ELSE {self.v} IN ('null', 'false', '\"\"', '{{}}') OR {self.d} = 0 END")
        return (well_formed, listed,
                f"({listed} AND contains({self.v}, '\"length\"') "
                f"AND list_contains(json_extract_string({self.v}, '$[*]'), 'length'))")


class JsonColumn(JsonField):
    """A field as `read_json` gives it (`json_source`): the same text, but a null reads as SQL NULL, like an
    absent key.  Only `action` and `endpoint` tell the two apart (`_defaulted_str`): there an ok record's
    NULL is left NULL, and `run_query` reads such files again line by line."""

    nulls_apart = False


class ParquetField:
    """A Parquet column of DuckDB type `kind` (None: the files lack it, so the field is absent); `bounds`: the
    (least, greatest) value of an integer column by the statistics of every row group that holds it, None when
    one lacks them (`column_bounds`)."""

    nulls_apart = True

    def __init__(self, name: str, kind: str | None, bounds: tuple[int, int] | None = None) -> None:
        self.c = f'"{name}"'
        self.kind = kind
        self.bounds = bounds

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


def _within(f: Field, low: int, high: int = MAX_PLAUSIBLE_TOKENS) -> bool:
    """Every value of the field is an int in low..high by the files' statistics: a check of that is true of
    every record, and not made (~10 % of the reduction's CPU on a fleet's day)."""
    return f.bounds is not None and low <= f.bounds[0] and f.bounds[1] <= high


def _opt_ok(f: Field) -> str:
    """`proxy.sizing.report._opt_int` accepts the field: absent/null, or an int in 0..MAX_PLAUSIBLE_TOKENS."""
    if _within(f, 0):
        return "true"
    return f"coalesce({f.as_int()} BETWEEN 0 AND {MAX_PLAUSIBLE_TOKENS}, {f.absent()} OR {f.null()})"


def _lenient(f: Field) -> str:
    """`_lenient_int`: a non-negative int, else NULL (greatest/nullif: no CASE, the cheapest form in DuckDB)."""
    if _within(f, 0, 2**63 - 1):
        return f.as_int()
    return f"nullif(greatest({f.as_int()}, -1), -1)"


def _clamped(value: str, *fields: Field) -> str:
    """A token count a kept record has as it is (`ok` checked it), a malformed one's brought into as small a
    range (NULL kept, no CASE evaluated): the sums over every record's figures cannot overflow.  Made of
    `fields` all within range by their statistics, it is as it is."""
    if all(_within(f, 0) for f in fields):
        return value
    return f"({value}) % {MAX_PLAUSIBLE_TOKENS + 1}"


def _defaulted_str(f: Field, default: str) -> tuple[str, str]:
    """`rec.get(k, default)` that must be a string: absent gives the default, null is malformed.  Where absent
    and null read alike (`JsonColumn`), either is NULL: the record's reading is undecided (`_undecided`)."""
    if not f.nulls_apart:
        return f"({f.absent()} OR {f.is_str()})", f.as_str()
    return (f"({f.absent()} OR {f.is_str()})", f"CASE WHEN {f.absent()} THEN {_q(default)} ELSE {f.as_str()} END")


def normalized(fields: dict[str, Field]) -> str:
    """SELECT list: one row per record, `ok` false where the Python reader finds it malformed, and its fields
    as the reduction reads them (a malformed record's figures are computed too, and never counted)."""
    f = fields
    up, pt, long_ = (f[k].as_int() for k in ("upstream_prompt_tokens", "prompt_tokens", "longest_prompt_tokens"))
    act_ok, act = _defaulted_str(f["action"], "pass")
    ep_ok, ep = _defaulted_str(f["endpoint"], "chat")
    fr_ok, has_fr, fin_len = f["finish_reasons"].reasons()
    n = f["n"]
    n_val = (f"coalesce({n.as_int()}, 1)" if _within(n, 1, 2**63 - 1) else
             f"CASE WHEN {n.as_int()} >= 1 THEN {n.as_int()} WHEN {n.absent()} OR {n.null()} THEN 1 END")
    model = f["model"]
    ok = " AND ".join([
        f["ts"].is_num(), f"({model.absent()} OR {model.null()} OR {model.is_str()})", f"({n_val}) IS NOT NULL",
        _opt_ok(f["upstream_prompt_tokens"]), f"({up} IS NOT NULL OR {_opt_ok(f['prompt_tokens'])})",
        _opt_ok(f["completion_tokens"]), act_ok, fr_ok, _opt_ok(f["longest_prompt_tokens"]), ep_ok,
        f"(NOT (({n_val}) > 1 OR {long_} IS NOT NULL) OR {_opt_ok(f['granted_max_tokens'])})",
    ])
    return ",\n".join([
        f"coalesce({ok}, false) AS ok",
        f"{f['ts'].num()} AS ts",
        # NULL for "unknown" (proxy.sizing.lengths.UNKNOWN_MODEL), counted with it in Python: grouping on the
        # column itself keeps a Parquet file's dictionary, many times faster than computed strings
        f"{model.as_str()} AS model",
        f"{act} AS action", f"{ep} AS endpoint", f"{n_val} AS n",
        # brimful's own count is read only where the upstream reported none (`record_lengths`)
        f"{_clamped(f'coalesce({up}, {pt})', f['upstream_prompt_tokens'], f['prompt_tokens'])} AS prompt",
        f"{_clamped(f['completion_tokens'].as_int(), f['completion_tokens'])} AS completion",
        f"{_clamped(long_, f['longest_prompt_tokens'])} AS longest",
        # the strict granted (`_opt_int`) only counts where n > 1 or longest is set, and there a kept record's
        # is well-formed, hence this lenient one
        f"{_lenient(f['granted_max_tokens'])} AS granted",
        f"{f['requested_max_tokens'].as_int()} AS requested",      # only ever read where > 0
        f"coalesce({has_fr}, false) AS has_reasons", f"coalesce({fin_len}, false) AS finished_length",
        f"{f['max_model_len'].as_int()} AS mml_seen", f"{_lenient(f['max_model_len'])} AS mml",
        f"{f['status'].as_int()} AS status", f"{f['error_code'].text()} AS error_code",
        f"{_lenient(f['prompt_tokens'])} AS own_prompt",
        f"CASE WHEN {f['latency_ms'].num()} >= 0 THEN {f['latency_ms'].num()} / 1000.0 END AS latency_s",
    ])


def _implicit() -> str:
    """The engine's own completion limit of the record's endpoint (`IMPLICIT_MAX_TOKENS`), else NULL."""
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


REASONS: tuple[str, ...] = typing.get_args(dm.Reason)

# The state set: the record's state (0 kept, 1 malformed, 2 filtered) and model with the low-cardinality
# figures, a few hundred groups over every record: ModelStats' actions, endpoints, limits seen, reasons and
# counters are sums over it.  Comparisons only (no sums), so a malformed record's fields cannot overflow.
SMALL = ("action", "endpoint", "mml_seen", "CASE WHEN prompt IS NOT NULL THEN mml END AS d_limit",
         f"({_reason()}) AS reason", "has_reasons", "finished_length", "n > 1 AS parallel",
         # demand_figures' lower bound: no limit asked, and nothing served that reached its own
         f"prompt IS NOT NULL AND NOT coalesce(requested > 0, false) AND (completion IS NOT NULL AND finished_length "
         f"OR completion IS NULL AND {_implicit()} IS NULL) AS d_lower")


def figures() -> list[list[str]]:
    """SELECT lists over `normalized`, each over the one before (every record's; only kept ones are counted, and
    a malformed one's cannot overflow: `_clamped`).  `single` is the
    longest prompt of a batch, else the prompt (`demand_figures`' and `need_figures`' prompt); `plain` a record
    of one prompt and one choice, the common case, for which sequence = total, d_kv = d_seq and the need's
    value is the total (the shared sets count those together); `ask` the limit asked, NULL for none; `served`
    the completion a choice was served (`sequence_tokens`); `asked` the limit `need_figures` bounds by; `dx` =
    d_seq - single (`demand_figures`); `per_choice`, `need_kind` (0 exact, 1 cut, 2 unknown), `need_value` and
    `need_upper` (-1: none) are `need_figures`'."""
    cut = ("CASE WHEN has_reasons THEN finished_length ELSE coalesce(per_choice >= coalesce(granted, asked), false) "
           "OR coalesce(single + per_choice >= mml, false) END")
    return [
        ["coalesce(longest, prompt) AS single", "n = 1 AND longest IS NULL AS plain",
         "nullif(greatest(requested, 0), 0) AS ask", f"{_implicit()} AS implicit"],
        # min(completion, granted) where it applies, in one test (DuckDB's least() ignores NULLs)
        ["CASE WHEN NOT plain AND granted < completion THEN granted ELSE completion END AS served",
         "CASE WHEN NOT plain AND granted > 0 AND granted < completion THEN granted ELSE completion END "
         "AS per_choice", "coalesce(ask, implicit) AS asked"],
        ["coalesce(ask, served, implicit, 1) AS dx",
         f"CASE WHEN completion IS NULL THEN 2 WHEN NOT ({cut}) OR coalesce(per_choice >= asked, false) THEN 0 "
         "ELSE 1 END::UTINYINT AS need_kind",
         "single + coalesce(per_choice, 1) AS need_value",
         "coalesce(single + asked, -1) AS need_upper"],
    ]


@dataclass(frozen=True)
class HistogramSet:
    """One GROUP BY of the kept records with `where` on `key` packed with the model (key × len(models) + the
    model's index): count(*), then one count per FILTER of `feeds`, each a histogram of `ModelStats`
    (`proxy.sizing.report`'s `_DICTS`) counted at key + shift.  One hash table then counts several histograms
    that share the key for most records (the `plain` ones)."""

    key: str
    where: str
    feeds: tuple[tuple[str, int, str], ...]       # (histogram, shift, FILTER condition; "true": all rows)


def shared_sets(min_completion: int) -> tuple[HistogramSet, ...]:
    """The four keys that count every kept record, and with it the histograms they share for plain ones."""
    m = min_completion
    need = "prompt IS NOT NULL AND need_kind = 0"
    return (
        HistogramSet("prompt", "prompt IS NOT NULL", (("prompt", 0, "true"), ("d_refused", m, f"plain AND dx >= {m}"))),
        HistogramSet("completion", "completion IS NOT NULL",
                     (("completion", 0, "true"), ("need_completion", 0, f"plain AND {need}"))),
        HistogramSet("prompt + completion", "prompt IS NOT NULL AND completion IS NOT NULL",
                     (("total", 0, "true"), ("sequence", 0, "plain"), ("need_exact", 0, "plain AND need_kind = 0"))),
        # a plain record demanding less than m (an embedding's dx is 0) is refused below single + dx, the key
        HistogramSet("single + dx", "prompt IS NOT NULL",
                     (("d_seq", 0, "true"), ("d_kv", 0, "plain"), ("d_refused", 0, f"plain AND dx < {m}"))),
    )


def rest_sets(min_completion: int) -> tuple[tuple[str, str, str], ...]:
    """(histogram, value, condition): what the shared sets leave out, counted over the few records that are not
    plain."""
    m = min_completion
    d_kv = ("CASE WHEN ask IS NOT NULL THEN prompt + n::HUGEINT * ask WHEN completion IS NOT NULL "
            "THEN prompt + completion ELSE prompt + n::HUGEINT * coalesce(implicit, 1) END")
    return (
        ("sequence", "single + served", "NOT plain AND completion IS NOT NULL"),
        ("need_exact", "need_value", "NOT plain AND need_kind = 0"),
        ("need_completion", "per_choice", "NOT plain AND need_kind = 0"),
        ("d_kv", d_kv, "NOT plain"),
        ("d_refused", f"single + least(dx, {m})", "NOT plain"),
    )


# The grouping sets by their `g`: the state set (SMALL), the routes' sums, the need's cut and unknown requests
# (`NeedTally.cut` and `.unknown`), the rest sets (h<i>: rest_sets()[i]'s map), then the shared sets, g = SHARED +
# their index.
STATE, ROUTE, NEED, REST, SHARED = range(5)


def model_code(models: Sequence[str | None] | None) -> str:
    """SQL: the model's index in `models` (NULL, the unknown model, included); without `models` the model itself
    (the sets then group by it beside the value)."""
    if models is None:
        return "model"
    cases = " ".join(f"WHEN {_q(m)} THEN {i}" for i, m in enumerate(models) if m is not None)
    unknown = models.index(None) if None in models else "NULL"
    return f"CASE WHEN model IS NULL THEN {unknown} " + (f"ELSE CASE model {cases} END END" if cases else "END")


def aggregate_sql(source: str, keep: str, min_completion: int, models: Sequence[str | None] | None) -> str:
    """One scan of `source` into `f`, every record's state, SMALL figures and figures, which DuckDB computes
    once and streams to each grouping set (one CTE: a second one fed from it would be stored whole): the state
    set over every record, the routes, the need's cut and unknown, the rest and the shared sets over the kept
    ones.  Each set's groups are few (distinct lengths, not records)."""
    m = min_completion
    # packed, the key holds the model: mc beside it would be a second column to hash for nothing
    keyed = "mc, {} AS k" if models is None else f"({{}}) * {len(models)} + mc AS k"
    state = f"CASE WHEN NOT ok THEN 1 WHEN NOT ({keep}) THEN 2 ELSE 0 END::UTINYINT AS state"
    small = [c.rsplit(" AS ", 1)[-1] for c in SMALL]
    layers = f"(SELECT {state}, {model_code(models)} AS mc, *, {', '.join(SMALL)} FROM ({source}))"
    for cols in figures():
        layers = f"(SELECT *, {', '.join(cols)} FROM {layers})"
    kept = "FROM f WHERE state = 0 AND prompt IS NOT NULL"
    rest = rest_sets(m)
    hists = ", ".join(f"histogram(CASE WHEN {cond} THEN {value} END) AS h{i}"
                      for i, (_, value, cond) in enumerate(rest))
    parts = [
        f"SELECT {STATE} AS g, state, model, {', '.join(small)}, count(*) AS c0 FROM f GROUP BY ALL",
        f"SELECT {ROUTE} AS g, mc, CASE WHEN ask IS NOT NULL THEN (single + ask + {BLOCK_SIZE - 1}) // "
        f"{BLOCK_SIZE} * {BLOCK_SIZE} ELSE {NO_ASK} END AS route, count(*) AS c0, "
        "sum(need_value) FILTER (need_kind < 2) AS known_need, count(*) FILTER (need_kind = 2) AS unknowns, "
        "sum(single) FILTER (need_kind = 2) AS unknown_need, sum(latency_s) AS lat, count(latency_s) AS nlat "
        f"{kept} GROUP BY ALL",
        f"SELECT {NEED} AS g, mc, need_kind, single, need_value, need_upper, count(*) AS c0 {kept} AND need_kind > 0 "
        "GROUP BY ALL",
        # the rest's histograms: value → count maps per model, one GROUP BY over the few records (an unnest of
        # each record's values would make DuckDB store `f` whole)
        f"SELECT {REST} AS g, mc, {hists} {kept} AND NOT plain GROUP BY ALL",
    ]
    for i, h in enumerate(shared_sets(m)):
        counts = ", ".join(f"count(*) FILTER ({cond}) AS c{j}" if cond != "true" else f"count(*) AS c{j}"
                           for j, (_, _, cond) in enumerate(h.feeds))
        parts.append(f"SELECT {SHARED + i} AS g, {keyed.format(h.key)}, {counts} "
                     f"FROM f WHERE state = 0 AND {h.where} GROUP BY ALL")
    return f"""
WITH f AS MATERIALIZED (SELECT * FROM {layers})
{chr(10).join(('UNION ALL BY NAME ' if i else '') + p for i, p in enumerate(parts))}"""


# ---------------------------------------------------------------------------
# the sources


def json_source(files: Sequence[str]) -> str:
    """Every non-blank line of JSON-lines files (gzip too), as `normalized` rows, read by DuckDB's own JSON
    reader (half the CPU of `json_lines_source`: 1.1 against 2.25 s per million 480-byte records on one thread).
    One row per line that is not blank (bytes.isspace(): DuckDB skips the same lines); a line it cannot read
    (ignore_errors) has every field NULL, hence no `ts`: malformed, as the Python reader finds every such line
    (tests/sizing/test_engine.py).  Fields are `JsonColumn`s: a null reads as absent, which `action` and
    `endpoint` alone tell apart; where that could change a record, `run_query` reads the JSON lines again by
    `json_lines_source` (`_undecided`)."""
    names = ", ".join(f"{_q(name)}: 'JSON'" for name in FIELDS)
    fields: dict[str, Field] = {name: JsonColumn(i + 1) for i, name in enumerate(FIELDS)}
    columns = ", ".join(JsonField.columns(i + 1, f'"{name}"') for i, name in enumerate(FIELDS))
    return f"""
SELECT {normalized(fields)} FROM (
 SELECT {columns}
 FROM read_json({_list(files)}, columns = {{{names}}}, format = 'newline_delimited', ignore_errors = true,
                compression = 'auto'))"""


def json_lines_source(files: Sequence[str]) -> str:
    """`json_source` line by line, where it cannot decide: each line parsed once, by `json_extract` of every
    field (TRY: an invalid line gives no fields, hence no `ts`, and is malformed, as is any line not an object,
    whose fields are all absent), a null kept apart from an absent key."""
    paths = ", ".join(f"'$.{name}'" for name in FIELDS)
    fields: dict[str, Field] = {name: JsonField(i + 1) for i, name in enumerate(FIELDS)}
    # bytes.isspace(), tested only where the line does not open an object: ltrim copies every line it is given,
    # 0.38 s of CPU per million 480-byte lines, and starts_with in front of it leaves 0.09 s (trim() is worse)
    blank = "' \t\r\n' || chr(11) || chr(12)"
    columns = ", ".join(JsonField.columns(i + 1) for i in range(len(FIELDS)))
    return f"""
SELECT {normalized(fields)} FROM (
 SELECT {columns} FROM (
  SELECT TRY(json_extract(line, [{paths}])) AS v
  FROM read_csv({_list(files)}, columns = {{'line': 'VARCHAR'}}, header = false, delim = chr(1), quote = '',
                escape = '', auto_detect = false, strict_mode = false, compression = 'auto', nullstr = chr(2))
  WHERE starts_with(line, '{{') OR ltrim(line, {blank}) <> ''))"""


def column_bounds(con: Any, files: Sequence[str]) -> dict[str, tuple[int, int]]:
    """(least, greatest) of each top-level column whose every row group has integer statistics (footers only,
    no data read): a row group without them, or all null, leaves its column out."""
    rows = con.sql(
        "SELECT path_in_schema, min(TRY_CAST(stats_min_value AS HUGEINT)), max(TRY_CAST(stats_max_value AS HUGEINT)), "
        "count(*) = count(TRY_CAST(stats_min_value AS HUGEINT)) AND count(*) = count(TRY_CAST(stats_max_value AS "
        f"HUGEINT)) FROM parquet_metadata({_list(files)}) GROUP BY ALL").fetchall()
    return {name: (int(low), int(high)) for name, low, high, every in rows if every}


def parquet_source(con: Any, files: Sequence[str]) -> str:
    """The files grouped by their columns' types, each group read as its own types: one read of files whose
    column types differ would make each column one type across them (union_by_name widens an integer column
    to DOUBLE where another file has it so), and a file's integers would read as floats, malformed."""
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for path in files:
        columns = con.sql(f"DESCRIBE SELECT * FROM read_parquet({_q(path)})").fetchall()
        groups.setdefault(tuple(sorted((str(c[0]), str(c[1])) for c in columns)), []).append(path)
    return " UNION ALL ".join(f"({_parquet_group(con, paths, dict(kinds))})" for kinds, paths in groups.items())


def _parquet_group(con: Any, files: Sequence[str], kinds: dict[str, str]) -> str:
    bounds = column_bounds(con, files)
    # signed integers only: the statistics of a text or float column say nothing of the checks
    fields: dict[str, Field] = {
        name: ParquetField(name, kinds.get(name), bounds.get(name) if kinds.get(name) in _SIGNED_TYPES else None)
        for name in FIELDS}
    return f"SELECT {normalized(fields)} FROM read_parquet({_list(files)}, union_by_name = true)"


@dataclass
class Aggregates:
    """The grouping sets' rows of `aggregate_sql` and their column names."""

    rows: list[tuple[Any, ...]]
    columns: list[str]
    # a histogram's key is value × len(models) + the model's index here; None: the value, the model in `mc`
    models: list[str | None] | None
    min_completion: int


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
    # Parquet alone: the models first, to pack the histogram keys (a scan of one dictionary column).  JSON lines
    # would be parsed twice for them: there the sets group by the model itself
    models = None if jsonl else [row[0] for row in con.sql(
        f"SELECT DISTINCT model FROM ({parquet_source(con, parquet)}) ORDER BY ALL").fetchall()]
    plain = [p for p in jsonl if _opens_plain(p)]
    rest = [p for p in jsonl if p not in plain]
    # DuckDB's JSON reader where it reads every record as the Python reader does; line by line where it cannot
    # tell (a BOM, a remote file) or did not (`_undecided`: then every JSON-lines file again)
    readings = [(plain, rest)] + ([([], jsonl)] if plain else [])
    tail = [parquet_source(con, parquet)] if parquet else []
    for i, (by_json, by_line) in enumerate(readings):
        parts = ([json_source(by_json)] if by_json else []) + ([json_lines_source(by_line)] if by_line else [])
        source = " UNION ALL ".join(f"({p})" for p in parts + tail)
        rel = con.sql(aggregate_sql(source, _filter(model, since), min_completion, models))
        agg = Aggregates(rel.fetchall(), list(rel.columns), models, min_completion)
        if i == len(readings) - 1 or not _undecided(agg):
            return agg
    raise AssertionError("unreachable: the last reading is returned")


def _opens_plain(path: str) -> bool:
    """Whether `json_source` may read this JSON-lines file: a local one (plain or gzip) that does not open with a
    UTF-8 BOM, which the CSV reader skips and the JSON reader takes for a malformed first line."""
    if "://" in path or path.endswith(".zst"):
        return False
    try:
        with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
            return f.read(3) != b"\xef\xbb\xbf"
    except (OSError, EOFError):
        return False


def _undecided(agg: Aggregates) -> bool:
    """Whether `json_source` counted a record as ok or filtered without `action` or `endpoint`: a null there is
    malformed to the Python reader, nothing the default, and `read_json` gives NULL for both."""
    at = {name: agg.columns.index(name) for name in ("g", "state", "action", "endpoint")}
    return any(row[at["g"]] == STATE and row[at["state"]] != 1 and None in (row[at["action"]], row[at["endpoint"]])
               for row in agg.rows)
