"""Where one training step's time goes: a ``preset=arith_cpu`` step under ``torch.profiler``, by
phase (rollout, old / reference log-probs, update, ...) and, inside each phase, by kind of work.

The trainer names its phases (:func:`harness.progress.phase`); this script wraps each phase in a
``torch.profiler.record_function`` and attributes every profiled op's *self* CPU time to the
phase it ran in and to a kind, from the op's name:

* ``matmul``: ``aten::mm / addmm / bmm / baddbmm`` and vLLM's ``onednn_mm`` (the linear layers
  and the LM head, forward and backward);
* ``attention``: scaled-dot-product attention kernels, forward and backward;
* ``log-softmax / gather``: the chunked LM head's log-softmax, logsumexp and gather (the
  log-probs of the sampled tokens) and their backward;
* ``sampling``: softmax / multinomial / top-k / sort / cumsum of generation;
* ``optimizer``: ``_foreach_*`` and the AdamW step's ops;
* ``copies``: copy, cat, index, index_put, contiguous, to, pad, clone, fill, vLLM's KV-cache writes;
* ``elementwise``: the rest of aten (norms, activations, adds, masks, reductions);
* ``python / other``: the phase's wall time not spent inside any profiled op (the Python that
  drives the ops, the tokenizer, the verifier's workers, waits).

One warm-up step runs first (untimed). ``--backend vllm`` profiles the vLLM rollout: its engine
runs in this process (vLLM's CPU build), so its ops are profiled too; weight sync is a phase of
its own.

    python -m benchmarks.profile_step                 # hf rollout
    python -m benchmarks.profile_step --backend vllm  # needs make install-vllm

Writes ``results/profile_step_<backend>.json`` and prints the table. Figures depend on the
machine and its load: keep it quiet, and quote the machine and date with them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.trl_compare import _NoTracker
from harness import progress
from harness.runtime.provenance import cpu_label
from harness.launch.run import build_components
from harness.launch.sweep import compose
from harness.train.trainer import Trainer
from harness.launch.validate import validate

ROOT = Path(__file__).resolve().parents[1]
PHASE = "phase:"

KINDS = (
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation", "onednn_mm")),
    ("attention", ("scaled_dot_product", "_flash_attention", "_efficient_attention", "attention")),
    ("log-softmax / gather", ("log_softmax", "logsumexp", "aten::gather", "_log_softmax")),
    ("sampling", ("aten::multinomial", "aten::topk", "aten::sort", "aten::cumsum", "aten::softmax",
                  "aten::_softmax", "aten::argmax", "aten::exponential_", "gumbel")),
    ("optimizer", ("_foreach_", "adam", "aten::lerp", "aten::addcdiv", "aten::addcmul", "aten::sqrt")),
    ("copies", ("aten::copy_", "aten::cat", "aten::index", "aten::contiguous", "aten::to", "aten::_to_copy",
                "aten::pad", "aten::constant_pad_nd", "aten::clone", "aten::fill_", "aten::zero_",
                "aten::empty", "aten::stack", "aten::slice", "aten::select", "aten::view", "aten::expand",
                "reshape_and_cache", "_index_put_impl_")),
)


def kind_of(name: str) -> str:
    """The kind of an op name (first match in :data:`KINDS`; ``elementwise`` for the rest of aten)."""
    low = name.lower()
    for kind, needles in KINDS:
        if any(n.lower() in low for n in needles):
            return kind
    return "elementwise" if name.startswith("aten::") else "other ops"


def _phase_of(ev) -> str | None:
    p = ev.cpu_parent
    while p is not None:
        if p.name.startswith(PHASE):
            return p.name[len(PHASE):]
        p = p.cpu_parent
    return None


def breakdown(prof, walls: dict) -> dict:
    """``{phase: {"wall_s", kind: seconds, "python / other": seconds}}`` from the profile's events
    (self CPU time of every op inside the phase's record_function) and the phases' wall times."""
    out: dict = defaultdict(lambda: defaultdict(float))
    ops: dict = defaultdict(lambda: defaultdict(float))
    for ev in prof.events():
        if ev.name.startswith(PHASE):
            continue
        ph = _phase_of(ev)
        if ph is None:
            continue
        out[ph][kind_of(ev.name)] += ev.self_cpu_time_total / 1e6
        ops[ph][ev.name] += ev.self_cpu_time_total / 1e6
    table = {}
    for ph, wall in walls.items():
        if wall < 1e-3:  # a phase entered but skipped at this config
            continue
        kinds = dict(out.get(ph, {}))
        kinds["python / other"] = max(0.0, wall - sum(kinds.values()))
        top = sorted(ops.get(ph, {}).items(), key=lambda kv: -kv[1])[:12]
        table[ph] = {"wall_s": wall, **kinds, "top_ops_s": {n: round(t, 3) for n, t in top}}
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=None, help="default results/profile_step_<backend>.json")
    ap.add_argument("overrides", nargs="*", help="extra config overrides")
    a = ap.parse_args(argv)
    cfg = compose(["preset=arith_cpu", f"rollout={a.backend}", f"train.threads={a.threads}", "rollout.progress=false",
                   "eval.every=0", *a.overrides])
    validate(cfg)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.train.threads)
    task, tokenizer, policy, critic, backend = build_components(cfg)
    trainer = Trainer(cfg, task, tokenizer, policy, backend, _NoTracker(), critic=critic, checkpoint_dir=None)
    trainer.train_step()  # warm-up: allocator, caches, vLLM's first compile
    walls: dict = defaultdict(float)
    plain_phase = progress.phase

    @contextlib.contextmanager
    def timed_phase(name):
        t0 = time.perf_counter()
        with plain_phase(name), record_function(PHASE + name):
            yield
        walls[name] += time.perf_counter() - t0

    progress.phase = timed_phase
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            m = trainer.train_step()
            step_s = time.perf_counter() - t0
    finally:
        progress.phase = plain_phase
    table = breakdown(prof, dict(walls))
    outside = step_s - sum(v["wall_s"] for v in table.values())
    result = {"backend": a.backend, "step_s": step_s, "outside_phases_s": outside, "phases": table,
              "metrics": {k: float(v) for k, v in m.items() if k.startswith(("time/", "perf/"))},
              "machine": {"cpu": cpu_label(), "cores": os.cpu_count(),
                          "threads": a.threads, "torch": torch.__version__},
              "date": time.strftime("%Y-%m-%d"), "overrides": a.overrides,
              "note": "profiled step (profiler overhead included); phases nest: 'update' excludes the "
                      "log-prob passes, which are phases of their own"}
    kinds = sorted({k for v in table.values() for k in v if k not in ("wall_s", "top_ops_s")})
    print(f"step {step_s:.1f} s under the profiler ({a.backend}); outside the named phases {outside:.1f} s "
          "(weight sync, rewards, metrics)")
    print("| phase | wall s | " + " | ".join(kinds) + " |")
    print("|---|---:|" + "---:|" * len(kinds))
    for ph, v in sorted(table.items(), key=lambda kv: -kv[1]["wall_s"]):
        print(f"| {ph} | {v['wall_s']:.2f} | " + " | ".join(f"{v.get(k, 0.0):.2f}" for k in kinds) + " |")
    for ph, v in table.items():
        print(f"{ph}: top ops " + ", ".join(f"{n} {t:.2f}" for n, t in list(v["top_ops_s"].items())[:8]))
    out = a.out or ROOT / "results" / f"profile_step_{a.backend}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
