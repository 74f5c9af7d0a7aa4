"""The reference parts of the documentation against the code they describe.

The configuration table names every key `proxy.config` reads and nothing else; the metrics table every
family brimful exports; the header table every `x-brimful-*` header the code sends; each `BRIMFUL_*`
variable is one brimful reads; each inline `brimful …` command parses with brimful's own argument
parser; the architecture page shows the layers `tests/test_layout.py` asserts; every relative link and
anchor resolves; the README stays a README (≤ 250 lines, the two command markers .ci/run reads).
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
TEST_SWITCHES = {"BRIMFUL_REAL_VLLM", "BRIMFUL_REQUIRE_CHROMIUM"}


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
