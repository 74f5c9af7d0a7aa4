"""The reference parts of the documentation against the code they describe.

The configuration table names every key `proxy.config` reads and nothing else; the metrics table every
family brimful exports; the header table every `x-brimful-*` header the code sends; each `BRIMFUL_*`
variable is one brimful reads; each inline `brimful …` command parses with brimful's own argument
parser; every file, test and bench option named exists; the README's test tiers are pytest commands
over registered markers; the architecture page shows the layers `tests/test_layout.py` asserts and
every module; every relative link and anchor resolves; the README stays a README (≤ 250 lines, the
two command markers .ci/run reads).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from proxy import config as config_module
from proxy.app import BrimfulApp
from proxy.cli import build_parser
from proxy.config import Config, LengthLogConfig, UpstreamMetricsConfig
from tests.support.docs import BLOCKS, DOCS, ROOT, anchors, prose

# ----------------------------------------------------------------- the README

def test_the_readme_is_a_readme() -> None:
    readme = DOCS["README.md"]
    assert len(readme.splitlines()) <= 250
    for marker in ("<!-- run-command -->", "<!-- /run-command -->", "<!-- test-command -->", "<!-- /test-command -->"):
        assert readme.count(marker) == 1, marker


def test_every_page_is_in_the_index() -> None:
    index = DOCS["docs/README.md"]
    pages = {Path(doc).name for doc in DOCS if doc.startswith("docs/") and doc != "docs/README.md"}
    linked = set(re.findall(r"\]\(([\w.-]+\.md)\)", index))
    assert pages == linked


# ----------------------------------------------------------------- links

LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_relative_links_and_anchors_resolve(doc: str) -> None:
    here = (ROOT / doc).parent
    for target in LINK.findall(prose(DOCS[doc])):
        if re.match(r"^[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = (here / path).resolve() if path else ROOT / doc
        assert file.exists(), f"{doc}: link to {target} (no {file})"
        if anchor:
            assert file.suffix == ".md", f"{doc}: anchor into a non-page {target}"
            headings = anchors(file.read_text(encoding="utf-8"))
            assert anchor in headings, f"{doc}: no heading for #{anchor} in {path or doc}"


# ----------------------------------------------------------------- configuration

CONFIG_PAGE = DOCS["docs/configuration.md"]


def documented_sections() -> dict[str, str]:
    """`[section]` → the keys cell of its row in the configuration table."""
    rows = re.findall(r"^\| `(\[[^`]+\])` \| (.*) \|$", CONFIG_PAGE, re.M)
    return dict(rows)


def top_level_items(cell: str) -> list[str]:
    """The comma-separated items of a cell, commas inside parentheses kept."""
    items, depth, current = [], 0, ""
    for ch in cell:
        depth += ch == "("
        depth -= ch == ")"
        if ch in ",;" and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    return [*items, current]


def named_keys(cell: str) -> set[str]:
    """The keys a cell names: the backticked names that lead each item (`a` + `b` both count)."""
    keys: set[str] = set()
    for item in top_level_items(cell):
        head = item.split("(", 1)[0]
        keys |= set(re.findall(r"`([a-z_]+)`", head))
    return keys


def fields(cls: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


SECTIONS = {
    "[server]": config_module.ServerConfig,
    "[upstream]": config_module.UpstreamConfig,
    "[[upstreams]]": config_module.UpstreamEntry,
    "[policy]": config_module.Policy,
    "[tokenizers]": config_module.TokenizersConfig,
    "[length_log]": config_module.LengthLogConfig,
    "[metrics]": config_module.MetricsConfig,
    "[upstream_metrics]": config_module.UpstreamMetricsConfig,
    "[logging]": config_module.LoggingConfig,
    "[otel]": config_module.OtelConfig,
}


def test_the_configuration_table_names_every_key_and_only_keys() -> None:
    documented = documented_sections()
    assert set(documented) == {*SECTIONS, '[models."name"]'}
    assert {f.name for f in dataclasses.fields(Config)} == {s.strip("[]").split(".")[0] for s in documented}
    for section, cls in SECTIONS.items():
        assert named_keys(documented[section]) == fields(cls), section
    models = documented['[models."name"]']
    assert "any `[policy]` key" in models
    assert named_keys(models) | fields(config_module.Policy) == fields(config_module.ModelConfig)


def env_variables() -> set[str]:
    return {name for text in DOCS.values() for name in re.findall(r"\bBRIMFUL_[A-Z][A-Z_]*[A-Z]\b", text)}


# The test tier's switches (read by tests/ and .ci/run, not by brimful).
TEST_SWITCHES = {"BRIMFUL_REAL_VLLM", "BRIMFUL_REQUIRE_CHROMIUM", "BRIMFUL_REQUIRE_S3"}


def test_every_documented_variable_is_read() -> None:
    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    readable = {f"BRIMFUL_{section}_{key}".upper()
                for section, cls in SECTIONS.items() if not section.startswith("[[")
                for key in fields(cls)
                for section in [section.strip("[]")]}
    assert "upstream" in sections and "BRIMFUL_UPSTREAM_URL" in readable
    for name in env_variables():
        assert name in readable | TEST_SWITCHES, name
    for name in TEST_SWITCHES:
        assert name in (ROOT / ".ci" / "run").read_text(), name
    # …and brimful does read them, as documented (`BRIMFUL_SERVER_API_KEYS=a,b`):
    loaded = config_module.load_config(None, env={"BRIMFUL_SERVER_API_KEYS": "a,b", "BRIMFUL_SERVER_WORKERS": "3",
                                                  "BRIMFUL_POLICY_MARGIN_TOKENS": "7"})
    assert (loaded.server.api_keys, loaded.server.workers, loaded.policy.margin_tokens) == (["a", "b"], 3, 7)


# ----------------------------------------------------------------- metrics and headers

def exported_families(tmp_path: Path) -> set[str]:
    """Every metric family a brimful with everything switched on exports (names as Prometheus shows them)."""
    config = Config(length_log=LengthLogConfig(path=str(tmp_path / "l.jsonl")),
                    upstream_metrics=UpstreamMetricsConfig(enabled=True))
    text = BrimfulApp(config).recorder.metrics.render()[0].decode()
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def table_rows(text: str) -> str:
    return "\n".join(line for line in prose(text).splitlines() if line.startswith("| `"))


def test_the_metrics_table_names_every_family(tmp_path: Path) -> None:
    """docs/sizing.md's metrics table (or a page's own table, for a family a feature adds) names every
    family brimful exports, and nothing brimful does not define."""
    table = DOCS["docs/sizing.md"].split("## Metrics", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`(brimful_[a-z0-9_]+)", table))
    for text in DOCS.values():
        documented |= set(re.findall(r"^\| `(brimful_[a-z0-9_]+)", table_rows(text), re.M))
    exported = exported_families(tmp_path)
    assert exported - documented == set(), "exported but not in docs/sizing.md's metrics table"
    source = "\n".join(p.read_text() for p in (ROOT / "proxy").rglob("*.py"))
    for name in documented - exported:           # registered once a length log is open, say
        assert f'"{name.removesuffix("_total")}"' in source, name


def test_the_header_table_names_every_header_brimful_sends() -> None:
    table = {h for text in DOCS.values() for h in re.findall(r"^\| `(x-[a-z-]+)` \|", table_rows(text), re.M)}
    assert "x-brimful-action" in re.findall(r"^\| `(x-[a-z-]+)` \|", DOCS["docs/surfaces.md"], re.M)
    source = "\n".join(p.read_text() for p in (ROOT / "proxy").rglob("*.py"))
    sent = set(re.findall(r'b"(x-brimful-[a-z-]+)"', source))
    assert sent and sent <= table
    assert table - sent <= {"x-request-id"}
    mentioned = {h for text in DOCS.values() for h in re.findall(r"x-brimful-[a-z]+(?:-[a-z]+)*", text)}
    assert mentioned <= table, mentioned - table


# ----------------------------------------------------------------- commands named in the prose

PLACEHOLDERS = {"FILE": "brimful.toml", "URL": "http://127.0.0.1:8000", "DIR": "/tmp", "N": "2", "L": "4096",
                "-": "-"}


def inline_commands() -> list[str]:
    found = []
    for text in DOCS.values():
        for span in re.findall(r"`(brimful [^`]+)`", prose(text)):
            if "…" not in span and "|" not in span:
                found.append(span)
    return found


def test_inline_commands_parse_with_brimfuls_parser() -> None:
    commands = inline_commands()
    assert len(commands) >= 10
    parser = build_parser()
    for command in commands:
        argv = [PLACEHOLDERS.get(a, a) for a in shlex.split(command)[1:]]
        # what a mention in passing leaves implied: `brimful report --upstream URL` reads a file,
        # `brimful plan --max-model-len L` plans some model
        if argv[0] in ("report", "count", "check-config") and not any(not a.startswith("-") for a in argv[1:]):
            argv.append("lengths.jsonl")
        if argv[0] == "plan" and not {"--preset", "--model-config"} & set(argv):
            argv += ["--preset", "Qwen3-8B"]
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            raise AssertionError(f"`{command}` does not parse") from exc


# ----------------------------------------------------------------- the architecture page

def test_the_architecture_page_shows_the_layers_the_layout_test_asserts() -> None:
    from tests.test_layout import LAYERS

    [shown] = [b for b in BLOCKS if b.doc == "docs/architecture.md" and b.text.startswith("LAYERS")]
    namespace: dict[str, Any] = {}
    exec(compile(shown.text, "docs/architecture.md", "exec"), namespace)
    assert namespace["LAYERS"] == LAYERS
    page = DOCS["docs/architecture.md"]
    for unit in set().union(*LAYERS) - {"__init__"}:
        assert f"`{unit}" in page, unit                     # every unit on the map is described
    packages = {p.name for p in (ROOT / "proxy").iterdir() if (p / "__init__.py").exists()}
    for package in packages:
        for module in (ROOT / "proxy" / package).glob("*.py"):
            if module.stem != "__init__":
                assert f"`{module.stem}`" in page, f"proxy/{package}/{module.name} is not on the map"
    for module in (ROOT / "tokenizer_cache").glob("_*.py"):
        if module.stem != "__init__":
            assert f"`{module.stem}`" in page, f"tokenizer_cache/{module.name} is not on the map"


# ----------------------------------------------------------------- files, tests and bench commands named

def spans() -> list[str]:
    return [span for text in DOCS.values() for span in re.findall(r"`([^`\n]+)`", prose(text))]


REPO_PATH = re.compile(r"(?<![\w./-])((?:proxy|tokenizer_cache|tests|bench|deploy|config|docs)/[\w./-]*)")


def test_every_file_named_exists() -> None:
    named = {m.rstrip("/.") for span in spans() for m in REPO_PATH.findall(span)}
    assert len(named) >= 40
    assert sorted(p for p in named if not (ROOT / p).exists()) == []


def test_every_test_named_exists() -> None:
    names = {span for span in spans() if re.fullmatch(r"test_\w+", span)}
    source = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    assert names and all(f"def {name}(" in source for name in names), names


def test_bench_commands_name_real_options() -> None:
    """`bench/run.sh --rounds 3 --only workers` and the like: every option and mode word is one the
    script reads (the benchmarks are run by hand, their figures in docs/performance.md)."""
    commands = [span for span in spans() if re.match(r"bench/\w+\.(py|sh) ", span)]
    commands += re.findall(r"run with `(--[\w-]+)`", DOCS["docs/performance.md"])
    assert len(commands) >= 8
    for command in commands:
        script = command.split()[0] if command.startswith("bench/") else "bench/run.sh"
        source = (ROOT / script).read_text()
        for forwarded in re.findall(r'"\$here/(\w+\.py)"', source):      # run.sh execs proxy_bench.py
            source += (ROOT / "bench" / forwarded).read_text()
        words = command.split()[1:] if command.startswith("bench/") else [command]
        for word in words:
            for part in word.split("|"):
                if part.startswith("--") or part.isalpha():
                    assert part in source, f"`{command}`: {script} knows no {part}"
                elif not re.fullmatch(r"[\d.]+|[\w,-]+", part):
                    raise AssertionError(f"`{command}`: unexpected {part}")
        if "--only" in words:
            for scenario in words[words.index("--only") + 1].split(","):
                assert scenario in source, f"`{command}`: no scenario {scenario}"


def test_the_test_tiers_are_pytest_commands_over_registered_markers() -> None:
    """The README's tier table: each command is the venv's pytest, its -m expression names only markers
    pyproject.toml registers, `-n` comes with pytest-xdist, and "all" is what the test command runs."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    registered = {m.split(":", 1)[0] for m in project["tool"]["pytest"]["ini_options"]["markers"]}
    rows = dict(re.findall(r"^\| (\w+) \| `([^`]+)` \|", DOCS["README.md"], re.M))
    assert set(rows) == {"fast", "slow", "all"}
    for tier, command in rows.items():
        argv = shlex.split(command)
        assert argv[:3] == [".venv/bin/python", "-m", "pytest"], tier
        if "-m" in argv[3:]:
            expression = argv[argv.index("-m", 3) + 1]
            assert set(re.findall(r"\w+", expression)) - {"not", "and", "or"} <= registered, tier
        if "-n" in argv:
            assert any(d.startswith("pytest-xdist") for d in project["project"]["optional-dependencies"]["test"])
    assert DOCS["README.md"].count(rows["all"]) >= 2          # the tier "all" is the test command's pytest
