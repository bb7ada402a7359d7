"""A full ``preset=arith_cpu`` training step in fp32 vs ``train.precision=bf16-autocast``, side by side.

Both runs are the real entry point on the same seed (``train.steps`` steps, eval on 1 problem
only: the step is what is measured); the step times come from MLflow (``time/step_s``, steps after
the first averaged). Also runs the startup probe that ``train.precision=auto`` uses and records
its choice, so the report can say whether the probe predicted the measured step.

    python -m benchmarks.precision_step              # 3 steps each, ~3-6 min on 2 cores
    python -m benchmarks.precision_step --steps 2

Writes ``results/precision_cpu.json`` (read by ``python -m analysis.ablation``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def step_time(precision: str, steps: int, folder: Path) -> dict:
    from mlflow.tracking import MlflowClient

    folder.mkdir(parents=True)
    cmd = [sys.executable, "-m", "harness.run", "preset=arith_cpu", f"train.steps={steps}", "eval.size=1",
           "checkpoint.every=0", "rollout.progress=false", f"train.precision={precision}",
           f"checkpoint.dir={folder / 'ck'}", f"tracking.uri=sqlite:///{folder / 'mlflow.db'}"]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("grpo-harness").experiment_id])[0]
    hist = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "time/step_s")}
    later = [v for s, v in hist.items() if s > 1] or list(hist.values())
    loss = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/grad_norm")}
    return {"step_s": sum(later) / len(later), "steps": hist, "grad_norm": loss}


def main(argv=None) -> None:
    from harness.model import precision
    from harness.runtime.provenance import cpu_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args(argv)
    probe = precision.probe()
    auto = precision.choose(probe)
    with tempfile.TemporaryDirectory(prefix="precision-") as tmp:
        fp32 = step_time("fp32", a.steps, Path(tmp) / "fp32")
        bf16 = step_time("bf16-autocast", a.steps, Path(tmp) / "bf16")
    speedup = fp32["step_s"] / bf16["step_s"]
    faster = "bf16-autocast" if speedup > 1 else "fp32"
    verdict = (f"The probe predicted {auto} and the measured step favours {faster}"
               f"{' (agreement)' if faster == auto else ' (disagreement: MIN_SPEEDUP or the probe shape needs review)'}.")
    if faster == "fp32":
        verdict += (" bf16 is slower here, so the learning curve under bf16 was not run: on this machine "
                    "bf16 makes nothing affordable.")
    res = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_model(), "cores": os.cpu_count(), "probe": probe,
           "auto_choice": auto, "fp32_step_s": fp32["step_s"], "bf16_step_s": bf16["step_s"], "speedup": speedup,
           "fp32": fp32, "bf16": bf16, "verdict": verdict,
           "command": f"python -m benchmarks.precision_step --steps {a.steps}"}
    out = ROOT / "results" / "precision_cpu.json"
    out.write_text(json.dumps(res, indent=1))
    print(f"probe: fp32 {probe['fp32_gflops']:.0f} GFLOP/s, bf16 {probe['bf16_gflops']:.0f} GFLOP/s -> auto = {auto}")
    print(f"arith_cpu step: fp32 {fp32['step_s']:.1f} s, bf16-autocast {bf16['step_s']:.1f} s ({speedup:.2f}x)")
    print(verdict)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
