"""harness/'s import graph: no cycle between modules, and no arrow back up between layers;
analysis/'s: no cycle, its statistics (``analysis.stats``) import nothing else of the repository,
and harness/ never imports analysis/.

The graph is read from the source (``ast``: every ``import`` and ``from ... import``, the lazy
ones inside functions included), so the test imports nothing heavy. The layers, bottom first,
are the ones docs/contributing.md ("Layers") describes: a module may import from its own
package or top-level module and from the layers below, never from its own layer or above.
"""

from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "harness"
ANALYSIS = HARNESS.parent / "analysis"

LAYERS = (
    ("errors", "registry", "progress"),  # imported from every layer; import nothing of the harness
    ("verifiers",),
    ("tools",),
    ("model",),
    ("runtime",),
    ("algo",),
    ("tasks",),
    ("rollout",),
    ("train",),
    ("launch",),
    ("run", "sweep"),  # the entry modules: python -m harness.run / harness.sweep
)
MAX_TOP_LEVEL_MODULES = 8


def modules(root: Path = HARNESS) -> dict[str, Path]:
    """``{dotted name: file}`` of every module of the package at ``root`` (a package by its ``__init__``)."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = list(f.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def imports(name: str, path: Path, known: set[str] | None = None) -> set[str]:
    """The modules of ``known`` that ``name`` imports (``from pkg import mod`` counts ``pkg.mod``, not
    ``pkg``); with ``known`` None every module named, absolute, whatever its package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if known is not None and f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        found |= {t for t in targets if (known is None or t in known) and t != name}
    return found


def graph(root: Path = HARNESS) -> dict[str, set[str]]:
    mods = modules(root)
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def unit(name: str) -> str | None:
    """The top-level module or package a module belongs to (None for the root ``harness``)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def layer_of() -> dict[str, int]:
    return {u: i for i, layer in enumerate(LAYERS) for u in layer}


def cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``g`` as a list of modules, or None."""
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(g[n]):
            if state.get(m) == "open":
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        state[n] = "done"
        stack.pop()
        return None

    for n in sorted(g):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_every_top_level_module_and_package_has_a_layer():
    units = {unit(n) for n in modules()} - {None}
    assert units - set(layer_of()) == set(), "place the new module or package in LAYERS (and docs/contributing.md)"
    assert set(layer_of()) - units == set(), "LAYERS names a module or package that no longer exists"


def test_at_most_eight_top_level_modules():
    top = sorted(f.stem for f in HARNESS.glob("*.py") if f.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_no_import_cycle():
    assert cycle(graph()) is None


def arrows_up(g: dict[str, set[str]]) -> list[str]:
    """The imports of ``g`` from one unit into another of the same or a higher layer."""
    rank = layer_of()
    return sorted(f"{a} -> {b}" for a, targets in g.items() for b in targets
                  if unit(a) and unit(b) and unit(a) != unit(b) and rank[unit(b)] >= rank[unit(a)])


def test_no_arrow_back_up():
    assert arrows_up(graph()) == []


def test_the_checks_find_a_cycle_and_an_arrow_up():
    g = graph()
    assert "harness.train.trainer" in g["harness.launch.run"]  # the real arrows are read
    g["harness.model.kv"] = g["harness.model.kv"] | {"harness.train.update"}  # train/update imports model/kv
    assert arrows_up(g) == ["harness.model.kv -> harness.train.update"]
    assert cycle(g)[0] in ("harness.model.kv", "harness.train.update")


def test_analysis_has_no_import_cycle():
    g = graph(ANALYSIS)
    assert "analysis.study.verdicts" in g["analysis.study.launch"]  # the real arrows are read
    assert cycle(g) is None


def test_analysis_stats_imports_nothing_else_of_the_repository():
    """The statistics every report decides with stand alone: no MLflow store, no harness, no report."""
    stats = {name: path for name, path in modules(ANALYSIS).items() if name.startswith("analysis.stats")}
    assert "analysis.stats.paired" in imports("analysis.stats.boundaries", stats["analysis.stats.boundaries"])
    outside = {f"{name} -> {m}" for name, path in stats.items() for m in imports(name, path)
               if m.split(".")[0] in ("analysis", "harness", "mlflow") and not m.startswith("analysis.stats")}
    assert outside == set()


def test_harness_never_imports_analysis():
    """analysis/ reads what harness/ writes (and imports harness.launch.tracking to do so); never the
    reverse."""
    back = {f"{name} -> {m}" for name, path in modules().items() for m in imports(name, path)
            if m.split(".")[0] == "analysis"}
    assert back == set()


def test_analysis_imports_of_harness_are_tracking_and_the_cpu_probe_only():
    """What analysis/__init__.py says: it reads runs through harness.launch.tracking and the CPU's native
    bf16 flags through harness.runtime.provenance (a study refuses bf16 arms without them), nothing else."""
    into = {m for name, path in modules(ANALYSIS).items() for m in imports(name, path) if m.split(".")[0] == "harness"}
    assert into == {"harness.launch.tracking", "harness.runtime.provenance"}
