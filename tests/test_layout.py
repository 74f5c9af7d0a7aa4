"""The package map of proxy/ (docs/architecture.md), asserted from the imports.

Each unit is a subpackage of proxy/ or one of the root modules; the units are layered, and an
import may only run down a layer or stay inside its own unit.  So the packages form no cycle, the
offline sizing maths never pulls in the request path, and the picture in the docs cannot go stale.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROXY = ROOT / "proxy"

# lower first; an import from a unit may only reach units of a lower layer, or its own unit
LAYERS: list[set[str]] = [
    {"errors", "logs", "signals", "__init__"},
    {"asgi", "config"},
    {"sizing"},
    {"upstream"},
    {"recording"},
    {"admitted"},
    {"workers"},
    {"serving", "commands"},
    {"app"},
    {"cli"},
]
LAYER_OF = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str:
    """`proxy.admitted.exchange` → `admitted`; `proxy.errors` → `errors`; `proxy` → `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    """Every proxy module a file imports, at any depth of the file (function-level imports too)."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "proxy")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.split(".")[0] == "proxy":
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names
                             if (PROXY.parent / f"{target}.{a.name}".replace(".", "/")).with_suffix(".py").exists())
    return found


def unit_edges() -> set[tuple[str, str, str, str]]:
    """(importing unit, imported unit, importing module, imported module) across units."""
    edges = set()
    for path in PROXY.rglob("*.py"):
        src = module_name(path)
        for target in imported_modules(path):
            a, b = unit_of(src), unit_of(target)
            if a != b and target != "proxy":
                edges.add((a, b, src, target))
    return edges


def test_every_unit_is_on_the_map():
    units = {p.name for p in PROXY.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    units |= {p.stem for p in PROXY.glob("*.py")}
    assert units == set(LAYER_OF), "a package or root module is missing from LAYERS (and docs/architecture.md)"


def test_no_import_runs_up_a_layer_or_sideways():
    wrong = sorted(f"{src} → {dst} ({a} is layer {LAYER_OF[a]}, {b} is layer {LAYER_OF[b]})"
                   for a, b, src, dst in unit_edges() if LAYER_OF[b] >= LAYER_OF[a])
    assert not wrong, "\n".join(wrong)


def test_packages_form_no_cycle():
    graph: dict[str, set[str]] = {}
    for a, b, _, _ in unit_edges():
        graph.setdefault(a, set()).add(b)
    seen: dict[str, int] = {}            # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph.get(node, ())):
            assert seen.get(nxt) != 1, "cycle: " + " → ".join([*path, node, nxt])
            if nxt not in seen:
                visit(nxt, [*path, node])
        seen[node] = 2

    for node in sorted(graph):
        if node not in seen:
            visit(node, [])


def test_sizing_depends_only_on_errors():
    """The offline report and plan import the sizing maths: it must not pull in the request path."""
    assert {b for a, b, _, _ in unit_edges() if a == "sizing"} <= {"errors"}


def test_every_package_says_what_it_owns():
    for init in PROXY.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and len(doc.splitlines()) >= 3, f"{init.parent.name}/__init__.py: say what it owns"
