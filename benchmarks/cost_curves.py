"""How a step's cost grows with the work: step time and peak memory against G, P and ``max_new_tokens``.

Each point is the real entry point (``python -m harness.run``) in a fresh process on
``preset=arith_cpu`` (the embedded model, hf rollout unless ``--backend``), with one parameter moved
away from the base point P=4, G=8, ``max_new_tokens``=48 (the preset's), the others held:

- G in 2, 4, 8, 16 (P=4);
- P in 1, 4, 16 (G=8);
- ``max_new_tokens`` in 32, 128, 512 (P=4, G=8);
- and G=16 again with ``train.share_prefix=false``, the A/B that shows whether prefix sharing keeps
  the prompt's share of the update flat in G.

A point runs ``--steps`` steps (default 2); the figures are those of the last step (the first pays
the warm-up: allocator, thread pool, first-call overheads), read from its MLflow record:
``time/step_s``, ``time/rollout_s``, ``time/update_s`` (the policy pass, backward and AdamW),
``perf/completion_tokens`` (real completion tokens trained on), ``perf/peak_mem_gib`` (the step's peak
RSS on CPU). ``max_new_tokens`` is a cap: on arith the model mostly stops well before it, so the
cost follows the real tokens, which the table shows beside the cap.

    python -m benchmarks.cost_curves                       # all points, hf, 2 steps each
    python -m benchmarks.cost_curves --only G --steps 1    # one axis

Prints a markdown table, writes the raw figures to ``results/cost_curves.json`` and the plot to
``results/plots/cost_curves.png``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.jobs import run_job  # noqa: E402
from harness.runtime.provenance import cpu_label  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE = {"P": 4, "G": 8, "T": 48}
AXES = {"G": [2, 4, 8, 16], "P": [1, 4, 16], "T": [32, 128, 512]}
KEYS = ["time/step_s", "time/rollout_s", "time/update_s", "time/logprob_s", "time/weight_sync_s",
        "perf/completion_tokens", "perf/rollout_tokens", "perf/peak_mem_gib"]


def points(only: str | None) -> list[dict]:
    """The (P, G, T, share_prefix) points to run, each axis around :data:`BASE`; the base point once."""
    out, seen = [], set()
    for axis, values in AXES.items():
        if only and axis != only:
            continue
        for v in values:
            p = {**BASE, axis: v, "share_prefix": True}
            key = (p["P"], p["G"], p["T"], True)
            if key not in seen:
                seen.add(key)
                out.append({**p, "axis": axis})
    if not only or only == "G":
        out.append({**BASE, "G": 16, "share_prefix": False, "axis": "G"})
    return out


def run_point(p: dict, backend: str, steps: int, extra: list[str], folder: Path) -> dict:
    """One job at point ``p``; its last step's figures."""
    overrides = ["preset=arith_cpu", f"rollout={backend}", f"train.prompts_per_step={p['P']}", f"group_size={p['G']}",
                 f"rollout.max_new_tokens={p['T']}", f"train.share_prefix={str(p['share_prefix']).lower()}",
                 f"train.steps={steps}", "eval.size=2", "eval.every=0", "eval.batch_size=2", "checkpoint.every=0",
                 "rollout.progress=false", *extra]
    wall, client, runs = run_job(overrides, folder)
    rid = runs[0].info.run_id
    hist = {k: {m.step: m.value for m in client.get_metric_history(rid, k)} for k in KEYS}
    last = max(hist["time/step_s"])
    return {**p, "backend": backend, "wall_s": wall, "overrides": overrides, "step": last,
            **{k: hist[k].get(last) for k in KEYS}}


def table(rows: list[dict]) -> list[str]:
    out = ["| axis | P | G | max new tokens | share prefix | completion tokens | step s | rollout s | update s "
           "| update ms / completion token | peak RSS GiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        upd = (r["time/update_s"] or 0) + (r["time/logprob_s"] or 0)
        out.append(f"| {r['axis']} | {r['P']} | {r['G']} | {r['T']} | {'yes' if r['share_prefix'] else 'no'} | "
                   f"{r['perf/completion_tokens']:.0f} | {r['time/step_s']:.1f} | {r['time/rollout_s']:.1f} | "
                   f"{upd:.1f} | {1000 * upd / max(r['perf/completion_tokens'], 1):.1f} | "
                   f"{r['perf/peak_mem_gib']:.2f} |")
    return out


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Step time (rollout and update stacked lines) and peak RSS against each axis."""
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5), sharey="row")
    names = {"G": "group size G (P=4, 48 tokens)", "P": "prompts per step P (G=8, 48 tokens)",
             "T": "max_new_tokens (P=4, G=8)"}
    for j, axis in enumerate(AXES):
        pts = sorted((r for r in rows if (r["axis"] == axis or all(r[a] == BASE[a] for a in BASE)) and r["share_prefix"]),
                     key=lambda r: r[axis])
        xs = [r[axis] for r in pts]
        ax = axes[0, j]
        for key, label in (("time/step_s", "step"), ("time/rollout_s", "rollout"), ("time/update_s", "update")):
            ax.plot(xs, [r[key] for r in pts], marker="o", label=label)
        if axis == "G":
            for r in rows:
                if not r["share_prefix"]:
                    ax.plot([r["G"]], [r["time/update_s"]], marker="x", color="k", linestyle="none",
                            label="update, no prefix sharing")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_title(names[axis], fontsize=9)
        axes[1, j].plot(xs, [r["perf/peak_mem_gib"] for r in pts], marker="o", color="tab:red")
        axes[1, j].set_xscale("log", base=2)
        axes[1, j].set_xticks(xs, [str(x) for x in xs])
    axes[0, 0].set_ylabel("seconds (last step)")
    axes[1, 0].set_ylabel("peak RSS GiB")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="hf", choices=["hf", "vllm"])
    ap.add_argument("--only", choices=list(AXES), help="one axis only")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results" / "cost_curves.json"))
    ap.add_argument("extra", nargs="*", help="overrides for every point (after --)")
    args = ap.parse_args(argv)
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    machine = cpu_label()
    rows = []
    for p in points(args.only):
        with tempfile.TemporaryDirectory(prefix="cost-") as tmp:
            rows.append(run_point(p, args.backend, args.steps, list(args.extra), Path(tmp)))
        print(table(rows)[-1], flush=True)
        # after every point, so a run stopped part-way keeps what it measured
        Path(args.out).write_text(json.dumps({"date": stamp, "machine": machine, "backend": args.backend,
                                              "steps": args.steps, "rows": rows}, indent=1))
    print("\n".join(table(rows)))
    plot(rows, ROOT / "results" / "plots" / "cost_curves.png",
         f"preset=arith_cpu, {args.backend} rollout, last of {args.steps} steps ({machine}, {stamp})")


if __name__ == "__main__":
    main()
