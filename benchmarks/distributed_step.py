"""Step time and tokens/s of one run on 1 process vs N data-parallel ranks (``torchrun``), and N
ranks with the policy sharded (``train.sharding=fsdp2``), side by side.

Both runs are the real entry point on the same config and seed, so they train on the same
global batch (the 2-rank run is exact: ``tests/test_distributed.py``); the figures come from
their MLflow records (``time/step_s``, ``time/rollout_s``, ``time/update_s``,
``perf/tokens_per_s``), steps after the first (warm-up) averaged. Threads: the 1-process run
uses every core (``train.threads=0``), each of the N ranks ``cores / N`` (torchrun's
``OMP_NUM_THREADS``), so both use the whole machine.

    python -m benchmarks.distributed_step                       # preset=arith_cpu, 4 steps, 1 vs 2 ranks (+fsdp2)
    python -m benchmarks.distributed_step --ranks 2 --steps 4 -- eval.size=20   # extra overrides after --

Prints a markdown table and appends a JSON line to ``results/distributed_cpu.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from harness.runtime.provenance import cpu_label

ROOT = Path(__file__).resolve().parents[1]
KEYS = ["time/step_s", "time/rollout_s", "time/update_s", "perf/tokens_per_s", "perf/completion_tokens",
        "perf/peak_mem_gib", "perf/param_shard_frac"]


def run(ranks: int, overrides: list[str], folder: Path, sharding: str = "none") -> dict:
    """One job in ``folder``; returns wall seconds and the per-step metrics of its MLflow run."""
    from benchmarks.jobs import run_job

    launcher = None if ranks == 1 else [str(Path(sys.executable).parent / "torchrun"), "--standalone",
                                        f"--nproc_per_node={ranks}"]
    wall, client, runs = run_job([*overrides, f"train.sharding={sharding}"], folder, launcher,
                                 env={"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // ranks))})
    rid = runs[0].info.run_id
    steps = {k: {m.step: m.value for m in client.get_metric_history(rid, k)} for k in KEYS + ["train/loss"]}
    return {"ranks": ranks, "sharding": sharding, "wall_s": wall, "runs": len(runs), "steps": steps}


def summary(res: dict) -> dict:
    out = {"ranks": res["ranks"], "sharding": res["sharding"], "wall_s": res["wall_s"], "mlflow_runs": res["runs"]}
    for k in KEYS:
        vals = [v for s, v in sorted(res["steps"][k].items()) if s > 1] or list(res["steps"][k].values())
        out[k] = sum(vals) / max(len(vals), 1)
    out["loss"] = [res["steps"]["train/loss"][s] for s in sorted(res["steps"]["train/loss"])]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--preset", default="arith_cpu")
    ap.add_argument("--no-fsdp2", action="store_true", help="skip the third run (N ranks, train.sharding=fsdp2)")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    overrides = [f"preset={a.preset}", f"train.steps={a.steps}", "rollout.progress=false", *a.overrides]
    rows = []
    with tempfile.TemporaryDirectory(prefix="dist-bench-") as tmp:
        jobs = [(1, "none"), (a.ranks, "none")] + ([] if a.no_fsdp2 else [(a.ranks, "fsdp2")])
        for ranks, sharding in jobs:
            rows.append(summary(run(ranks, overrides, Path(tmp) / f"r{ranks}-{sharding}", sharding)))
    one = rows[0]
    print(f"{cpu_label()}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d')}, overrides: {' '.join(overrides)}")
    print("| ranks | train.sharding | threads/rank | wall s | step s | rollout s | update s | tokens/s "
          "| peak mem GiB (max rank) | policy params per rank |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['ranks']} | {r['sharding']} | {max(1, (os.cpu_count() or 1) // r['ranks'])} | {r['wall_s']:.0f} | "
              f"{r['time/step_s']:.1f} | {r['time/rollout_s']:.1f} | {r['time/update_s']:.1f} | "
              f"{r['perf/tokens_per_s']:.1f} | {r['perf/peak_mem_gib']:.2f} | {r['perf/param_shard_frac']:.2f} |")
    for r in rows[1:]:
        print(f"step time {r['ranks']} ranks ({r['sharding']}) / 1 process: {r['time/step_s'] / one['time/step_s']:.2f}x; "
              f"max |loss difference| over steps: {max(abs(x - y) for x, y in zip(one['loss'], r['loss'])):.2e}; "
              f"MLflow runs: {r['mlflow_runs']}")
    out = ROOT / "results" / "distributed_cpu.jsonl"
    with out.open("a") as f:
        f.write(json.dumps({"date": time.strftime("%Y-%m-%d"), "overrides": overrides, "cores": os.cpu_count(),
                            "rows": rows}) + "\n")


if __name__ == "__main__":
    main()
