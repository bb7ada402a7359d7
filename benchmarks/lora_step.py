"""Step time, peak memory and checkpoint size: full fine-tuning vs LoRA ranks (``lora=peft``).

Each arm is the real entry point (``python -m harness.run``) on ``preset=arith_cpu`` with the
embedded model, ``--steps`` steps, one job at a time; the figures come from its MLflow record
(``time/step_s``, ``time/update_s``, ``time/weight_sync_s``, ``perf/peak_mem_gib``: the step's peak
RSS on CPU, ``perf/trainable_param_frac``) and the size of its final checkpoint
(``checkpoint.keep_final=full``: the policy state and AdamW's moments; the adapters only with LoRA).

    python -m benchmarks.lora_step                          # hf: full, r=1, 8, 32; 2 steps
    python -m benchmarks.lora_step --backend vllm --ranks 8
    python -m benchmarks.lora_step -- beta=0.04             # extra overrides after --

Prints a markdown table and appends a JSON line per arm to ``results/lora_cpu.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks.jobs import run_job
from harness.runtime.provenance import cpu_label

ROOT = Path(__file__).resolve().parents[1]
KEYS = ["time/step_s", "time/rollout_s", "time/update_s", "time/weight_sync_s", "perf/peak_mem_gib",
        "perf/trainable_param_frac", "train/loss"]


def arm(rank: int, backend: str, steps: int, extra: list[str], folder: Path) -> dict:
    """One job (``rank`` 0: full fine-tuning); its per-step metrics and final checkpoint size."""
    lora = ["lora=none"] if rank == 0 else ["lora=peft", f"lora.r={rank}"]
    overrides = ["preset=arith_cpu", f"rollout={backend}", *lora, f"train.steps={steps}", "eval.size=2",
                 "eval.every=0", "eval.batch_size=2", "checkpoint.every=0", "checkpoint.keep_final=full",
                 "rollout.progress=false", *extra]
    wall, client, runs = run_job(overrides, folder)
    rid = runs[0].info.run_id
    per_step = {k: {m.step: m.value for m in client.get_metric_history(rid, k)} for k in KEYS}
    ckpts = sorted((folder / "ck").rglob("step_*.pt"))
    return {"rank": rank, "backend": backend, "wall_s": wall, "overrides": overrides,
            "steps": per_step, "checkpoint_mib": ckpts[-1].stat().st_size / 2**20 if ckpts else None}


def row(r: dict) -> str:
    s = r["steps"]
    mean = lambda k: sum(s[k].values()) / max(len(s[k]), 1)  # noqa: E731
    name = "full" if r["rank"] == 0 else f"LoRA r={r['rank']}"
    return (f"| {name} | {r['backend']} | {s['perf/trainable_param_frac'][1]:.4f} | "
            + " / ".join(f"{s['time/step_s'][k]:.1f}" for k in sorted(s['time/step_s']))
            + f" | {mean('time/update_s'):.1f} | {mean('time/weight_sync_s'):.2f} | "
            f"{max(s['perf/peak_mem_gib'].values()):.2f} | {r['checkpoint_mib']:.1f} |")


HEADER = ("| arm | backend | trainable frac | step s (each step) | update s (mean) | weight sync s (mean) | "
          "peak RSS GiB (max step) | final checkpoint MiB |\n|---|---|---|---|---|---|---|---|")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="hf", choices=["hf", "vllm"])
    ap.add_argument("--ranks", default="0,1,8,32", help="comma-separated LoRA ranks; 0 = full fine-tuning")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("extra", nargs="*", help="overrides for every arm (after --)")
    args = ap.parse_args(argv)
    out = ROOT / "results" / "lora_cpu.jsonl"
    print(HEADER)
    for rank in (int(x) for x in args.ranks.split(",")):
        with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp:
            r = arm(rank, args.backend, args.steps, list(args.extra), Path(tmp))
        print(row(r), flush=True)
        with out.open("a") as f:
            f.write(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": cpu_label(), **r}) + "\n")


if __name__ == "__main__":
    main()
