"""Device hygiene that a CPU-only CI can check (issue 46): the two mistakes that pass every CPU test
and fail, or crawl, on a GPU.

* A tensor factory (``torch.zeros``, ``ones``, ``arange``, ``tensor``, ``randn``...) called without
  ``device=`` makes a CPU tensor; meeting a CUDA tensor it raises "Expected all tensors to be on the
  same device". Each such call in ``harness/`` must pass a device, derive one (chained ``.to(...)``;
  ``*_like`` and ``.new_*`` are not factories here), or say why the CPU is meant with a ``# cpu: <why>``
  comment on one of its lines or on a comment line right above it (or on the ``def`` lines of its function, for a whole function that works
  on host data, e.g. :func:`harness.algo.algorithm.dry_run`).
* A host sync (``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``float(...)``, ``int(...)``,
  ``bool(...)``, a copy ``.to(...)`` elsewhere than the model's device ``dev``) inside the
  per-micro-batch loops of the update (:func:`harness.train.update.policy_pass`,
  :func:`harness.train.update.batched_forward`) stalls the GPU once per micro-batch. Each one must carry a
  ``# sync: <why>`` comment (on its line or the comment line above). The scan is lexical: calls made by functions the loop calls are not
  followed (e.g. the clip-cov policy loss's ``float(mask.sum())``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FACTORIES = {"zeros", "ones", "empty", "full", "arange", "linspace", "logspace", "eye", "tensor", "as_tensor",
             "rand", "randn", "randint", "randperm", "normal", "bernoulli", "empty_strided"}
SYNC_METHODS = {"item", "tolist", "cpu", "numpy"}
SYNC_BUILTINS = {"float", "int", "bool"}
LOOPS = {"harness/train/update.py": ("policy_pass", "batched_forward")}


def _parents(tree):
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _commented(lines, node, tag: str) -> bool:
    """A ``# <tag>:`` comment on one of ``node``'s lines or on a comment line right above it."""
    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
    return any(f"# {tag}:" in lines[i - 1] for i in range(node.lineno, node.end_lineno + 1)) or \
        (above.startswith("#") and f"# {tag}:" in above)


def device_free_factories(root: Path = ROOT / "harness") -> list[str]:
    """``path:line: source`` of every ``torch.<factory>(...)`` under ``root`` with no ``device=``, no
    chained ``.to(...)`` and no ``# cpu:`` comment (on its lines or its function's ``def`` line)."""
    out = []
    for f in sorted(root.rglob("*.py")):
        src = f.read_text()
        lines, tree = src.splitlines(), ast.parse(src)
        parent = _parents(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in FACTORIES and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "torch"):
                continue
            if any(k.arg == "device" for k in node.keywords) or _commented(lines, node, "cpu"):
                continue
            up = parent.get(node)
            if isinstance(up, ast.Attribute) and up.attr == "to":  # torch.randn(...).to(device)
                continue
            fn = up
            while fn is not None and not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                fn = parent.get(fn)
            if fn is not None and any("# cpu:" in line for line in lines[fn.lineno - 1: fn.body[0].lineno - 1]):
                continue
            out.append(f"{f.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return out


def _to_another_device(call: ast.Call) -> bool:
    """``x.to(<y>.device ...)`` or ``x.to(device=<y>.device)`` or ``x.to("cpu")``: a copy between devices
    (``x.to(dev)``, the micro-batch going to the model, and dtype casts are not syncs)."""
    target = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "device"), None)
    return (isinstance(target, ast.Attribute) and target.attr == "device") or \
        (isinstance(target, ast.Constant) and target.value == "cpu")


def loop_syncs(path: str, functions) -> list[tuple[str, bool]]:
    """``(path:line: source, justified)`` for each host sync lexically inside a ``for`` loop of
    ``functions`` in ``path``."""
    src = (ROOT / path).read_text()
    lines, tree = src.splitlines(), ast.parse(src)
    found = []
    defs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in functions]
    assert {d.name for d in defs} == set(functions), f"{path}: expected functions {functions}"
    for fn in defs:
        loops = [n for n in ast.walk(fn) if isinstance(n, ast.For)]
        assert loops, f"{path}:{fn.name}: no micro-batch loop found"
        seen = set()
        for loop in loops:
            for node in (n for stmt in loop.body for n in ast.walk(stmt)):
                if not isinstance(node, ast.Call) or id(node) in seen:
                    continue
                seen.add(id(node))
                f = node.func
                sync = (isinstance(f, ast.Attribute) and f.attr in SYNC_METHODS) or \
                    (isinstance(f, ast.Name) and f.id in SYNC_BUILTINS) or \
                    (isinstance(f, ast.Attribute) and f.attr == "to" and _to_another_device(node))
                if sync:
                    found.append((f"{path}:{node.lineno}: {lines[node.lineno - 1].strip()}",
                                  _commented(lines, node, "sync")))
    return found


def test_every_tensor_factory_in_harness_names_its_device_or_says_why_cpu():
    bad = device_free_factories()
    assert not bad, ("tensor factories without device= (pass the device of the tensor they meet, or add "
                     "'# cpu: <why>'):\n" + "\n".join(bad))


def test_the_scan_sees_a_device_free_factory(tmp_path):
    pkg = tmp_path / "harness"
    pkg.mkdir()
    (pkg / "m.py").write_text("import torch\n"
                              "def f(x):\n"
                              "    a = torch.zeros(3)\n"
                              "    b = torch.zeros(3, device=x.device)\n"
                              "    c = torch.randn(3).to(x.device)\n"
                              "    d = torch.ones(2)  # cpu: host counts\n"
                              "    return torch.tensor([1.0],\n"
                              "                        dtype=x.dtype)\n"
                              "def g():  # cpu: a synthetic host batch\n"
                              "    return torch.arange(4)\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert [s.split(": ")[0] for s in device_free_factories(pkg)] == ["harness/m.py:3", "harness/m.py:7"]
    finally:
        ROOT = saved


def test_every_host_sync_in_the_micro_batch_loops_is_justified():
    found = [s for path, fns in LOOPS.items() for s in loop_syncs(path, fns)]
    bad = [where for where, ok in found if not ok]
    assert not bad, "host syncs in the update's micro-batch loops without '# sync: <why>':\n" + "\n".join(bad)
    # the counted set, so that a new one (even justified) is a deliberate change to this list
    assert len(found) == EXPECTED_SYNCS, "\n".join(w for w, _ in found)


EXPECTED_SYNCS = 2  # the log-probs kept for StepRecord (first pass); batched_forward's results
