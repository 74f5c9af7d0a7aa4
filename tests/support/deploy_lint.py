"""Static linters for the deployment files (no Docker): compose interpolation and parsers,
hadolint-style Dockerfile rules, PromQL selectors, and the metrics brimful and vLLM export.

Used by tests/deploy/test_files.py; each rule is a small pure function returning problems.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from proxy.app import LOCAL_PATHS
from proxy.cli import build_parser
from proxy.recording.lengthlog import LengthLogStats
from proxy.recording.metrics import Metrics
from proxy.recording.record import LengthRecord

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PROMETHEUS_FILE = ROOT / "config" / "prometheus.yml"
GRAFANA_DIR = ROOT / "config" / "grafana"

HF_CACHE_VOLUME = "hf-cache"


# ===========================================================================
# Compose: interpolation and small parsers (pure)
# ===========================================================================

_VAR = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*))")
_VAR_EXPR = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?", re.S)


@dataclass(frozen=True)
class VarUse:
    name: str
    op: str | None      # ":-", "-", ":?", "?", ":+", "+" or None (no default)


def interpolate(text: str, env: Mapping[str, str], uses: list[VarUse] | None = None) -> str:
    """Compose's variable substitution (`$VAR`, `${VAR}`, `${VAR:-default}`, `$$`, …)."""

    def sub(m: re.Match[str]) -> str:
        if m.group("escaped"):
            return "$"
        expr = m.group("braced") if m.group("braced") is not None else m.group("named")
        parsed = _VAR_EXPR.fullmatch(expr)
        if parsed is None:
            raise ValueError(f"invalid interpolation {m.group(0)!r}")
        name, op, arg = parsed.group("name"), parsed.group("op"), parsed.group("arg") or ""
        if uses is not None:
            uses.append(VarUse(name, op))
        value = env.get(name)
        if op == ":-":
            return value if value else arg
        if op == "-":
            return value if value is not None else arg
        if op == ":+":
            return arg if value else ""
        if op == "+":
            return arg if value is not None else ""
        if op in (":?", "?") and (value is None or (op == ":?" and not value)):
            raise ValueError(f"required variable {name} is not set: {arg}")
        return value or ""

    return _VAR.sub(sub, text)


def interpolate_tree(node: Any, env: Mapping[str, str], uses: list[VarUse] | None = None) -> Any:
    if isinstance(node, str):
        return interpolate(node, env, uses)
    if isinstance(node, list):
        return [interpolate_tree(x, env, uses) for x in node]
    if isinstance(node, dict):
        return {k: interpolate_tree(v, env, uses) for k, v in node.items()}
    return node


@dataclass(frozen=True)
class PortMapping:
    host_ip: str | None
    host: int | None
    container: int


def parse_port(spec: str | int) -> PortMapping:
    """Compose's short port syntax: `[[ip:]host:]container[/proto]`."""
    text = str(spec).split("/", 1)[0]
    parts = text.rsplit(":", 2)
    if len(parts) == 1:
        return PortMapping(None, None, int(parts[0]))
    if len(parts) == 2:
        return PortMapping(None, int(parts[0]), int(parts[1]))
    return PortMapping(parts[0], int(parts[1]), int(parts[2]))


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool

    @property
    def is_bind(self) -> bool:
        return self.source.startswith((".", "/", "~"))


def parse_volume(spec: str | Mapping[str, Any]) -> Mount:
    """Compose's short volume syntax `source:target[:mode]` (or the long form)."""
    if isinstance(spec, Mapping):
        return Mount(str(spec.get("source", "")), str(spec["target"]), bool(spec.get("read_only", False)))
    parts = spec.split(":")
    if len(parts) == 1:
        return Mount("", parts[0], False)
    mode = parts[2] if len(parts) > 2 else ""
    return Mount(parts[0], parts[1], "ro" in mode.split(","))


def option_value(argv: list[str], flag: str) -> str | None:
    """The value of `--flag VALUE` or `--flag=VALUE` in an argument list."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1:]
    return None


def command_list(service: Mapping[str, Any]) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def healthcheck_urls(service: Mapping[str, Any]) -> list[str]:
    test = service.get("healthcheck", {}).get("test", [])
    text = " ".join(test) if isinstance(test, list) else str(test)
    return re.findall(r"https?://[^\s'\"]+", text)


def env_dict(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment", {}) or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def network_names(name: str, service: Mapping[str, Any]) -> set[str]:
    """Names other containers reach this service by: its own and its network aliases."""
    names = {name}
    networks = service.get("networks") or {}
    if isinstance(networks, Mapping):
        for net in networks.values():
            names.update((net or {}).get("aliases", []))
    return names


def listening_ports(service: Mapping[str, Any]) -> set[int]:
    return {parse_port(p).container for p in service.get("ports", [])} | {int(p) for p in service.get("expose", [])}


def profile_sets(services: Mapping[str, Any]) -> dict[str, set[str]]:
    """For each profile, the services `docker compose --profile P up` starts."""
    always = {n for n, s in services.items() if not s.get("profiles")}
    profiles = sorted({p for s in services.values() for p in s.get("profiles", [])})
    return {p: always | {n for n, s in services.items() if p in s.get("profiles", [])} for p in profiles}


def is_vllm(service: Mapping[str, Any]) -> bool:
    return str(service.get("image", "")).startswith("vllm/")


def is_brimful(service: Mapping[str, Any]) -> bool:
    return "build" in service


def resolve_name(name: str, running: Iterable[str], services: Mapping[str, Any]) -> str:
    """The one running service a network name points at (fails on none or several)."""
    owners = [n for n in running if name in network_names(n, services[n])]
    assert len(owners) == 1, f"network name {name!r} resolves to {owners or 'nothing'} among {sorted(running)}"
    return owners[0]


def parse_cli(argv: list[str]) -> Any:
    """brimful's own argument parser on argv; a rejected flag raises AssertionError with argparse's message."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            return build_parser().parse_args(argv)
        except SystemExit as exc:
            raise AssertionError(f"brimful rejects {argv}: {stderr.getvalue().strip()}") from exc


# ===========================================================================
# Dockerfile: parser and hadolint-style rules (pure; each returns problems)
# ===========================================================================

@dataclass(frozen=True)
class Instruction:
    keyword: str
    value: str
    line: int


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined; comment lines (also inside a continuation) dropped."""
    out: list[Instruction] = []
    buf: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf.append(stripped[:-1].strip())
            continue
        buf.append(stripped)
        joined = " ".join(part for part in buf if part)
        buf = []
        keyword, _, rest = joined.partition(" ")
        out.append(Instruction(keyword.upper(), rest.strip(), start))
    return out


def exec_form(value: str) -> list[str] | None:
    """The JSON (exec) form of CMD/ENTRYPOINT/RUN, or None for the shell form."""
    if not value.startswith("["):
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return None
    return [str(x) for x in parsed] if isinstance(parsed, list) else None


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    result: list[list[Instruction]] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def stage_names(instructions: list[Instruction]) -> set[str]:
    names = set()
    for ins in instructions:
        if ins.keyword == "FROM":
            m = re.search(r"\s+AS\s+(\S+)\s*$", ins.value, re.I)
            if m:
                names.add(m.group(1).lower())
    return names


def from_image(ins: Instruction) -> str:
    words = [w for w in ins.value.split() if not w.startswith("--")]
    return words[0]


def rule_pinned_base_images(instructions: list[Instruction], **_: Any) -> list[str]:
    """DL3006/DL3007: every FROM names a tag (or digest), never `latest`."""
    problems, local = [], set()
    for ins in instructions:
        if ins.keyword != "FROM":
            continue
        image = from_image(ins)
        if image.lower() in local or image == "scratch" or "@sha256:" in image:
            pass
        else:
            tag = image.rsplit("/", 1)[-1].partition(":")[2]
            if not tag:
                problems.append(f"line {ins.line}: FROM {image} has no tag")
            elif tag == "latest":
                problems.append(f"line {ins.line}: FROM {image} is pinned to latest")
        m = re.search(r"\s+AS\s+(\S+)\s*$", ins.value, re.I)
        if m:
            local.add(m.group(1).lower())
    return problems


def rule_non_root_user(instructions: list[Instruction], **_: Any) -> list[str]:
    """DL3002: the final stage switches to a non-root USER before CMD/ENTRYPOINT."""
    final = stages(instructions)[-1]
    user: str | None = None
    for ins in final:
        if ins.keyword == "USER":
            user = ins.value.split(":", 1)[0].strip()
        if ins.keyword in ("CMD", "ENTRYPOINT") and user in (None, "root", "0"):
            return [f"line {ins.line}: {ins.keyword} runs as {user or 'root (no USER)'}"]
    if user in (None, "root", "0"):
        return ["the final stage runs as root"]
    return []


def rule_exec_form(instructions: list[Instruction], **_: Any) -> list[str]:
    """DL3025: CMD and ENTRYPOINT in JSON form, so signals reach brimful (graceful drain)."""
    return [f"line {i.line}: {i.keyword} is in shell form" for i in stages(instructions)[-1]
            if i.keyword in ("CMD", "ENTRYPOINT") and exec_form(i.value) is None]


def healthcheck_command(ins: Instruction) -> str:
    m = re.match(r"^(?:--\S+\s+)*CMD\s+(.*)$", ins.value, re.S)
    if not m:
        return ""
    argv = exec_form(m.group(1))
    return " ".join(argv) if argv is not None else m.group(1)


def listen_port(instructions: list[Instruction]) -> int | None:
    final = stages(instructions)[-1]
    cmd = next((exec_form(i.value) for i in reversed(final) if i.keyword == "CMD"), None) or []
    port = option_value(cmd, "--port")
    return int(port) if port else None


def rule_healthcheck(instructions: list[Instruction], **_: Any) -> list[str]:
    """A HEALTHCHECK on brimful's own endpoint and port.

    /health (and /v1/…) are relayed to vLLM: checking them would mark brimful
    unhealthy whenever vLLM restarts.  /live, /metrics, /stats … are brimful's own
    (`proxy.app.LOCAL_PATHS`).
    """
    checks = [i for i in stages(instructions)[-1] if i.keyword == "HEALTHCHECK"]
    if not checks:
        return ["no HEALTHCHECK in the final stage"]
    command = healthcheck_command(checks[-1])
    urls = re.findall(r"https?://[^\s'\"]+", command)
    if not urls:
        return [f"line {checks[-1].line}: HEALTHCHECK requests no URL"]
    problems = []
    port = listen_port(instructions)
    for url in urls:
        parts = urlsplit(url)
        if parts.path not in LOCAL_PATHS:
            problems.append(f"HEALTHCHECK checks {parts.path}, which is not brimful's own endpoint")
        if port is not None and parts.port != port:
            problems.append(f"HEALTHCHECK checks port {parts.port} but CMD listens on {port}")
    return problems


def rule_pip_no_cache(instructions: list[Instruction], **_: Any) -> list[str]:
    """DL3042: `pip install` with --no-cache-dir (a pip cache only bloats the layer)."""
    problems = []
    for ins in instructions:
        if ins.keyword != "RUN":
            continue
        for segment in re.split(r"&&|;|\|\|", ins.value):
            if re.search(r"\bpip3?\s+install\b", segment) and "--no-cache-dir" not in segment:
                problems.append(f"line {ins.line}: pip install without --no-cache-dir")
    return problems


def ignore_patterns(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore lines as (negated, regex) in file order."""
    patterns = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line[1:] if negated else line
        pattern = pattern.strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex += "(?:.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                regex += ".*"
                i += 2
            elif pattern[i] == "*":
                regex += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                regex += "[^/]"
                i += 1
            else:
                regex += re.escape(pattern[i])
                i += 1
        patterns.append((negated, re.compile(regex + r"\Z")))
    return patterns


def is_ignored(path: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories wins."""
    parts = Path(path).parts
    prefixes = ["/".join(parts[:depth]) for depth in range(1, len(parts) + 1)]
    ignored = False
    for negated, regex in patterns:
        if any(regex.match(prefix) for prefix in prefixes):
            ignored = not negated
    return ignored


def rule_copy_sources(instructions: list[Instruction], *, context: Path, dockerignore: str, **_: Any) -> list[str]:
    """Every COPY/ADD source exists in the build context and is not excluded by .dockerignore."""
    problems = []
    patterns = ignore_patterns(dockerignore)
    for ins in instructions:
        if ins.keyword not in ("COPY", "ADD"):
            continue
        argv = exec_form(ins.value) or shlex.split(ins.value)
        if any(a.startswith("--from") for a in argv):
            continue
        sources = [a for a in argv if not a.startswith("--")][:-1]
        for source in sources:
            matches = [p for p in context.glob(source)] if any(c in source for c in "*?[") else [context / source]
            if not any(p.exists() for p in matches):
                problems.append(f"line {ins.line}: COPY source {source} does not exist")
            elif is_ignored(source, patterns):
                problems.append(f"line {ins.line}: COPY source {source} is excluded by .dockerignore")
    return problems


def rule_cli_accepts_cmd(instructions: list[Instruction], *, scripts: Mapping[str, str], **_: Any) -> list[str]:
    """ENTRYPOINT is brimful's console script and `brimful serve --help` accepts every CMD flag."""
    final = stages(instructions)[-1]
    entry = next((exec_form(i.value) for i in reversed(final) if i.keyword == "ENTRYPOINT"), None)
    cmd = next((exec_form(i.value) for i in reversed(final) if i.keyword == "CMD"), None)
    if not entry or entry[0] not in scripts:
        return [f"ENTRYPOINT {entry} is not one of the project's scripts {sorted(scripts)}"]
    try:
        parse_cli([*entry[1:], *(cmd or [])])
    except AssertionError as exc:
        return [str(exc)]
    return []


DOCKERFILE_RULES: tuple[Callable[..., list[str]], ...] = (
    rule_pinned_base_images, rule_non_root_user, rule_exec_form, rule_healthcheck,
    rule_pip_no_cache, rule_copy_sources, rule_cli_accepts_cmd,
)


def project_scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def dockerfile_problems(text: str, *, context: Path = ROOT, dockerignore: str | None = None) -> list[str]:
    instructions = parse_dockerfile(text)
    if not instructions or instructions[0].keyword not in ("FROM", "ARG"):
        return ["the Dockerfile does not start with FROM"]
    ignore = DOCKERIGNORE.read_text() if dockerignore is None else dockerignore
    problems: list[str] = []
    for rule in DOCKERFILE_RULES:
        problems += rule(instructions, context=context, dockerignore=ignore, scripts=project_scripts())
    return problems


# ===========================================================================
# PromQL: which metrics and labels an expression reads (pure)
# ===========================================================================

PROMQL_AGGREGATIONS = frozenset({
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
})
PROMQL_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                             "group_left", "group_right", "atan2", "inf", "nan"})
PROMQL_LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
GRAFANA_BUILTINS = frozenset({"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"})


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]   # (label, op, value)


def promql_tokens(expr: str) -> list[tuple[str, str]]:
    tokens, i = [], 0
    while i < len(expr):
        c = expr[i]
        if c.isspace():
            i += 1
        elif c in "\"'`":
            j = i + 1
            while j < len(expr) and expr[j] != c:
                j += 2 if expr[j] == "\\" else 1
            tokens.append(("str", expr[i + 1:j]))
            i = j + 1
        elif c == "{":
            j, depth = i + 1, 1
            quote = None
            while j < len(expr) and depth:
                ch = expr[j]
                if quote:
                    if ch == "\\":
                        j += 1
                    elif ch == quote:
                        quote = None
                elif ch in "\"'`":
                    quote = ch
                elif ch == "}":
                    depth -= 1
                j += 1
            tokens.append(("matchers", expr[i + 1:j - 1]))
            i = j
        elif c == "[":
            j = expr.index("]", i)
            tokens.append(("range", expr[i + 1:j]))
            i = j + 1
        elif c == "$":
            m = re.match(r"\$(?:\{([^}]+)\}|(\w+))", expr[i:])
            assert m, f"bad variable in {expr!r}"
            tokens.append(("var", m.group(1) or m.group(2)))
            i += m.end()
        elif c.isalpha() or c in "_:":
            m = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", expr[i:])
            tokens.append(("ident", m.group(0)))
            i += m.end()
        elif c.isdigit() or c == ".":
            # A duration (5m, 1h30m) or a number: never a metric name.
            m = re.match(r"\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*|[0-9.]+(?:e[+-]?\d+)?", expr[i:], re.I)
            tokens.append(("num", m.group(0)))
            i += m.end()
        else:
            tokens.append(("op", c))
            i += 1
    return tokens


def parse_matchers(text: str) -> tuple[tuple[str, str, str], ...]:
    found = re.findall(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"', text)
    return tuple((label, op, value) for label, op, value in found)


def promql_selectors(expr: str) -> tuple[list[Selector], set[str]]:
    """The metric selectors in an expression, and the labels its by/without/on/… lists name."""
    tokens = promql_tokens(expr)
    selectors: list[Selector] = []
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ("", "")
        if kind == "ident" and text in PROMQL_LABEL_LISTS and nxt == ("op", "("):
            j = i + 2
            while j < len(tokens) and tokens[j] != ("op", ")"):
                if tokens[j][0] == "ident":
                    grouping.add(tokens[j][1])
                j += 1
            i = j + 1
            continue
        if kind == "ident" and text not in PROMQL_KEYWORDS and text not in PROMQL_AGGREGATIONS and nxt != ("op", "("):
            matchers = parse_matchers(nxt[1]) if nxt[0] == "matchers" else ()
            selectors.append(Selector(text, matchers))
        i += 1
    return selectors, grouping


def grafana_variables(expr: str) -> set[str]:
    return {a or b for a, b in re.findall(r"\$(?:\{(\w+)[^}]*\}|(\w+))", expr)}


# ===========================================================================
# Known metrics: brimful's (rendered live) and vLLM's
# ===========================================================================

def brimful_exposition() -> dict[str, set[str]]:
    """Every sample name brimful's /metrics exposes, with its label names.

    Built from a real `Metrics` after records that touch every metric (pass,
    clamp, rejection, upstream length error, drift, retry, pool route and fallback, 401, unknown limit,
    parity, length log), so a renamed metric in proxy/recording/metrics.py breaks the dashboard test here.
    """
    metrics = Metrics()
    metrics.attach_lengthlog(LengthLogStats())
    metrics.observe(LengthRecord(ts=0.0, model="m", endpoint="chat", max_model_len=8192, prompt_tokens=1000,
                                 upstream_prompt_tokens=1002, requested_max_tokens=9000, granted_max_tokens=7176,
                                 completion_tokens=500, finish_reasons=["stop"], action="clamped", status=200))
    metrics.observe(LengthRecord(ts=0.0, model="m", endpoint="chat", max_model_len=8192, prompt_tokens=9000,
                                 action="rejected", status=400, error_code="context_length_exceeded"))
    metrics.observe(LengthRecord(ts=0.0, model="m", endpoint="completions", max_model_len=8192, prompt_tokens=100,
                                 action="upstream_error", status=400, error_code="context_length_exceeded"))
    metrics.count_length_retry("m")
    metrics.count_pool_route("m", "default", 2048)
    metrics.count_pool_fallback("m", "default", "long")
    metrics.count_unauthorized("chat")
    metrics.set_limit_unknown("m", "default", False)
    metrics.set_tokenizer_parity("m", True)
    metrics.set_count_mode("m", "local")
    body, _ = metrics.render()
    names: dict[str, set[str]] = {}
    for line in body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s", line)
        assert m, line
        labels = set(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', m.group(2) or ""))
        names.setdefault(m.group(1), set()).update(labels)
    return names


# vLLM's metric names, types and labels, from vllm/v1/metrics/loggers.py of
# vLLM 0.32.0 (labelnames = ["model_name", "engine"]).  gpu_cache_usage_perc is
# the older name of kv_cache_usage_perc (the dashboard reads either).
_VLLM_LABELS = frozenset({"model_name", "engine"})
VLLM_METRICS: dict[str, str] = {
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_params_max_tokens": "histogram",
}


def vllm_exposition() -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for name, kind in VLLM_METRICS.items():
        if kind == "gauge":
            names[name] = set(_VLLM_LABELS)
        elif kind == "counter":
            names[f"{name}_total"] = set(_VLLM_LABELS) | ({"finished_reason"} if name.endswith("success") else set())
        else:
            names[f"{name}_bucket"] = set(_VLLM_LABELS) | {"le"}
            names[f"{name}_sum"] = set(_VLLM_LABELS)
            names[f"{name}_count"] = set(_VLLM_LABELS)
    return names


# ===========================================================================
# Fixtures: the files, parsed once
# ===========================================================================
