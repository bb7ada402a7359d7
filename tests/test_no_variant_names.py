"""No variant is named outside the registries: the trainer, the run entry point and the
validation compute what a variant *declares* (``needs``, params, prescribed aggregation).

Every registered name (estimators, policy losses, aggregations, KL forms and controllers, group
filters, tasks, rollout backends) is looked for in comparisons (``== "name"``, ``!= "name"``,
``in ("name", ...)``) in every module of ``harness/`` outside ``harness/algo/`` (where the
variants themselves live) and ``harness/verifiers/`` (its own registry of verifier kinds).

And no import circle among the project's modules, counting the imports inside functions.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "harness"


def _registered_names() -> set[str]:
    from harness.algo import (GROUP_FILTERS, KL_CONTROLLERS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES,
                              TOKEN_ESTIMATORS)
    from harness.rollout import BACKENDS
    from harness.tasks import TASKS

    names = set(BACKENDS) | set(TASKS)
    for reg in (TOKEN_ESTIMATORS, POLICY_LOSSES, LOSS_AGGREGATIONS, KL_ESTIMATORS, KL_CONTROLLERS, GROUP_FILTERS):
        names |= set(reg.names())
    return names - {"none"}  # also the word for "off" (kl.placement=none, pruner none)


def test_no_comparison_against_a_variant_name_outside_the_registries():
    names = _registered_names()
    alternatives = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    pattern = re.compile(rf"""(==|!=)\s*["']({alternatives})["']|\bin\s*[\(\[\{{][^)\]}}]*["']({alternatives})["']""")
    hits = []
    for path in sorted(ROOT.rglob("*.py")):
        if {"algo", "verifiers"} & set(path.relative_to(ROOT).parts):  # the variants; verifier kinds
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code):
                hits.append(f"{path.relative_to(ROOT.parent)}:{lineno}: {line.strip()}")
    assert not hits, "variant names compared outside the registries:\n" + "\n".join(hits)


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The pattern catches the forms it forbids (so the test above can fail)."""
    names = _registered_names()
    alternatives = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    pattern = re.compile(rf"""(==|!=)\s*["']({alternatives})["']|\bin\s*[\(\[\{{][^)\]}}]*["']({alternatives})["']""")
    for bad in ('if cfg.advantage.name == "ppo":', "x != 'process'", 'if name in ("grpo", "rloo"):',
                'if cfg.policy_loss.name in {"gspo"}:'):
        assert pattern.search(bad), bad
    assert not pattern.search('if "values" in spec.needs:')


# ---------------------------------------------------------------------------- import circles

PACKAGES = (ROOT, ROOT.parent / "analysis")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _project_imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports anywhere in its body (module level or inside a
    function): ``import a.b``, ``from a import b`` (b a module or a name of a) and relative forms."""
    me = _module_name(path)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            for a in node.names:
                target = f"{base}.{a.name}"
                out.add(target if target in modules else base)
    return (out & modules) - {me}


def _import_graph() -> dict[str, set[str]]:
    paths = [p for pkg in PACKAGES for p in sorted(pkg.rglob("*.py"))]
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _project_imports(p, modules) for p in paths}


def _a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (a list of modules, first = last), or None (iterative DFS)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for start in graph:
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_cycle_finder_sees_a_circle_hidden_in_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _a_cycle(graph) == ["a", "b", "c", "a"]
    assert _a_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_circle_in_harness_or_analysis():
    """Issue 26: the dependency graph a reader sees, in-function imports included, has no circle
    (``harness.verifiers.math`` -> ``harness.verifiers.batch`` -> ``harness.verifiers.math`` was one)."""
    graph = _import_graph()
    assert "harness.verifiers.batch" in graph["harness.verifiers"]  # the graph is real, not empty
    assert _a_cycle(graph) is None, f"import circle: {' -> '.join(_a_cycle(graph))}"
