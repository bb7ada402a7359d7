"""Where a study run's time goes, from the runs in a study's store (issue 45, item 3).

Each run logs its set-up at step 0 (``time/process_age_s``, ``time/model_load_s``,
``time/engine_build_s``), each eval's ``time/eval_s`` and each step's ``time/step_s``
(:mod:`harness.run`, :mod:`harness.train.trainer`); MLflow holds the run's start (when the run opened,
after the model load) and end. Per run:

* **process start**: the interpreter, imports and Hydra's composition, paid once per multirun
  process (one per arm and look): the first job's ``time/process_age_s``, shared out over the jobs
  that process ran;
* **model load**, **engine build**: as logged;
* **training steps**: the sum of ``time/step_s``;
* **eval (step 0)**, **eval (final)**: ``time/eval_s`` (a step-0 eval replayed from
  ``eval.initial_cache``, tag ``eval.initial_cached=true``, costs its replay);
* **tracking and the rest**: the run's MLflow wall time less its steps and evals (opening the run,
  params, provenance hashing, metric flushes, checkpoint writes).

Runs are grouped by whether their step-0 eval was generated or replayed (before / after the cut).

    python -m benchmarks.study_cost studies/negative_samples.yaml

Prints a markdown table (seconds; mean over the runs of each group).

``--paths`` measures instead of reading a study's store: one look of a study's control arm (the
design card grid's ``grpo_G8``: 8 steps, a final greedy eval of 250 problems, step-0 eval replayed)
under the **old path** (the arm as registered: ``rollout=hf``, fp32) and the new ones
(:func:`new_paths`): ``rollout=lean`` alone (``new_fp32`` where the CPU has native bf16, else
``new``) and, where it has, bf16 autocast training, bf16 rollouts and a bf16 eval (``new``). Each
path runs as the study runs an arm: one joblib multirun of two seeds, two one-thread jobs side by
side; one path after the other. Each path's step-0 eval is generated first (two at once, not
counted) so that the timed runs replay it.

    python -m benchmarks.study_cost --paths     # ~15 min on a 2-core CPU -> results/study_cost.json

Prints each part per path and the ratios, and writes ``results/study_cost.json`` (``ratio``: the old
path's total over the ``new`` one's). Keep the machine quiet; quote its CPU and the date with the figures.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import shutil
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from mlflow import MlflowClient

from analysis.study import job_command, load_study, store_uri, study_dir
from harness.runtime.provenance import cpu_bf16_flags, cpu_label
from harness.launch.run import build_components, prepare
from harness.launch.sweep import compose
from harness.launch.tracking import NullTracker
from harness.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]

STEP_PARTS = ("rollout_s", "update_s", "weight_sync_s", "step_s")  # a training step's parts (time/<part>)
PARTS = ("process start", "model load", "engine build", "training steps", "eval (step 0)", "eval (final)",
         "tracking and the rest")


def run_split(client: MlflowClient, run) -> dict:
    """One run's seconds by part (process start: the whole process age, shared out by :func:`split`)."""
    rid = run.info.run_id

    def hist(key):
        return {m.step: m.value for m in client.get_metric_history(rid, key)}

    steps, evals = hist("time/step_s"), hist("time/eval_s")
    last = max(steps)
    wall = (run.info.end_time - run.info.start_time) / 1e3
    train, e0, ef = sum(steps.values()), evals.get(0, np.nan), evals.get(last, np.nan)
    return {"process age": hist("time/process_age_s").get(0, np.nan), "model load": hist("time/model_load_s").get(0, np.nan),
            "engine build": hist("time/engine_build_s").get(0, np.nan), "training steps": train,
            "eval (step 0)": e0, "eval (final)": ef, "tracking and the rest": wall - train - sum(evals.values()),
            "cached": run.data.tags.get("eval.initial_cached"), "sweep": run.data.tags.get("sweep"),
            "start": run.info.start_time, "steps": last}


def split(uri: str) -> dict[str, list[dict]]:
    """``{"generated" | "replayed": [per-run parts]}`` of the FINISHED runs in the MLflow store ``uri``
    that logged the split (runs of harness versions before 2026-12-05 did not)."""
    client = MlflowClient(uri)
    runs = [r for e in client.search_experiments()
            for r in client.search_runs([e.experiment_id], "attributes.status = 'FINISHED'", max_results=5000)]
    rows = [run_split(client, r) for r in runs]
    rows = [r for r in rows if not np.isnan(r["process age"])]
    # a multirun process runs its jobs one after another: the earliest job's age is the process's start-up
    by_process: dict = defaultdict(list)
    for r in rows:
        by_process[r["sweep"]].append(r)
    for jobs in by_process.values():
        jobs.sort(key=lambda r: r["start"])
        # a new process starts where a job's age is below the previous job's (ages only grow inside one)
        groups, cur = [], [jobs[0]]
        for prev, r in zip(jobs, jobs[1:]):
            if r["process age"] < prev["process age"]:
                groups.append(cur)
                cur = []
            cur.append(r)
        groups.append(cur)
        for g in groups:
            for r in g:
                r["process start"] = g[0]["process age"] / len(g)
    out: dict[str, list[dict]] = {"generated": [], "replayed": []}
    for r in rows:
        out["replayed" if r["cached"] == "true" else "generated"].append(r)
    return out


def table(groups: dict[str, list[dict]]) -> list[str]:
    """Markdown: one column per group (mean seconds over its runs, share of the total)."""
    names = [g for g in groups if groups[g]]
    lines = ["| part | " + " | ".join(f"step-0 eval {g} ({len(groups[g])} runs)" for g in names) + " |",
             "|---|" + "---:|" * len(names)]
    totals = {g: sum(float(np.mean([r[p] for r in groups[g]])) for p in PARTS) for g in names}
    for p in PARTS:
        cells = []
        for g in names:
            v = float(np.mean([r[p] for r in groups[g]]))
            cells.append(f"{v:.0f} s ({v / totals[g]:.0%})")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    lines.append("| **total** | " + " | ".join(f"**{totals[g]:.0f} s**" for g in names) + " |")
    return lines


# ------------------------------------------------------------------ --paths: measured side by side
# the bf16 path's overrides, eval in fp32 (studies/precision_bf16.yaml's bf16_train arm)
BF16_PATH = ["rollout=lean", "rollout.dtype=bfloat16", "train.precision=bf16-autocast", "model.attn_implementation=eager"]


def new_paths(bf16_flags: list[str]) -> dict[str, list[str]]:
    """The new paths' overrides: ``rollout=lean`` alone (``new`` on a CPU without native bf16, else
    ``new_fp32``: the decode's own gain); where the CPU has native bf16, ``new`` is :data:`BF16_PATH`
    (bf16 autocast training, bf16 rollouts, and a speed knob, same maths: the eager attention, whose
    matmuls run bf16's forward + backward faster than sdpa's CPU kernel) with the eval in bf16."""
    if not bf16_flags:
        return {"new": ["rollout=lean"]}
    return {"new_fp32": ["rollout=lean"], "new": [*BF16_PATH, "rollout.eval_dtype=bfloat16"]}


def path_spec(spec: dict, arm: str, name: str, extra: list[str], **design) -> dict:
    """``spec`` reduced to ``arm`` with ``extra`` overrides added, under the name ``<study>-<name>`` (its
    own store, sweep tag and step-0 cache, :func:`analysis.study.job_command`); ``design``: ``steps`` /
    ``eval_size`` replacing the study's where not None (a smoke run)."""
    return {**spec, "name": f"{spec['name']}-{name}", "arms": {arm: [*spec["arms"][arm], *extra]},
            **{k: v for k, v in design.items() if v is not None}}


def warm(spec: dict, arm: str, work: str) -> float:
    """Generate the step-0 eval of ``spec``'s ``arm`` into the ``eval.initial_cache`` folder its jobs
    replay from (under ``work``; in this process, at the run's thread count); returns its seconds."""
    cmd = job_command(spec, arm, spec["seeds"][:1], Path(work) / "results")
    keep = ("-m", "seed=", "tracking.", "checkpoint.dir=", "hydra")
    overrides = [o for o in cmd[3:] if not o.startswith(keep)]
    cfg = compose([*overrides, f"eval.initial_cache={work}/checkpoints/studies/{spec['name']}/eval0"])
    prepare(cfg)
    task, tokenizer, policy, critic, backend = build_components(cfg)
    t0 = time.perf_counter()
    Trainer(cfg, task, tokenizer, policy, backend, NullTracker(), critic=critic).run_eval(0)
    return time.perf_counter() - t0


def run_pair(spec: dict, arm: str, seeds: list[int], work: Path) -> float:
    """``arm``'s ``seeds`` as the study runs them: one multirun, ``len(seeds)`` jobs at once (joblib), from
    ``work``; its wall seconds. Raises RuntimeError naming its log when it fails."""
    cmd = job_command(spec, arm, seeds, work / "results", n_jobs=len(seeds), launcher="joblib")
    study_dir(spec, work / "results").mkdir(parents=True, exist_ok=True)
    log = work / f"{spec['name']}.log"
    t0 = time.perf_counter()
    with open(log, "w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=work).returncode
    if rc:
        raise RuntimeError(f"{spec['name']}: the multirun exited {rc}; see {log}")
    return time.perf_counter() - t0


def path_parts(uri: str, wall: float) -> dict:
    """A path's FINISHED runs in ``uri`` split by part (:func:`run_split`; each job ran in its own
    worker process, so its process start is its own), their mean, its total and the multirun's wall."""
    client = MlflowClient(uri)
    runs = [r for e in client.search_experiments()
            for r in client.search_runs([e.experiment_id], "attributes.status = 'FINISHED'")]
    rows = [run_split(client, r) for r in runs]
    for r in rows:
        r["process start"] = r["process age"]
    mean = {p: float(np.mean([r[p] for r in rows])) for p in PARTS}
    step = {k: float(np.mean([m.value for r in runs for m in client.get_metric_history(r.info.run_id, f"time/{k}")]))
            for k in STEP_PARTS}
    return {"runs": [{p: float(r[p]) for p in PARTS} for r in rows], "mean": mean, "total": sum(mean.values()),
            "step_mean_s": step,
            "multirun_wall_s": wall, "eval_decode": sorted({r.data.tags.get("eval.decode", "?") for r in runs}),
            "replayed": sorted({r.data.tags.get("eval.initial_cached", "?") for r in runs})}


def paths_table(res: dict) -> list[str]:
    """Markdown: each part's mean seconds per path, and the old path's over each new one's."""
    names = [n for n in res["paths"] if n != "old"]
    lines = ["| part | old | " + " | ".join(names) + " | " + " | ".join(f"old / {n}" for n in names) + " |",
             "|---|" + "---:|" * (1 + 2 * len(names))]
    for p in [*PARTS, "total"]:
        sec = {n: res[n]["total"] if p == "total" else res[n]["mean"][p] for n in res["paths"]}
        ratios = [f"{sec['old'] / sec[n]:.2f}x" if sec[n] > 0.5 else "-" for n in names]
        lines.append(f"| {p} | " + " | ".join(f"{sec[n]:.1f} s" for n in res["paths"]) + " | " + " | ".join(ratios) + " |")
    lines += ["", "a training step (mean): " + "; ".join(
        f"{n} " + ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in res[n]["step_mean_s"].items()) for n in res["paths"])]
    return lines


def measure_paths(a) -> dict:
    """The ``--paths`` mode (module docstring)."""
    spec = load_study(a.study)
    arm = a.arm or spec["control"]
    seeds = a.seeds or spec["seeds"][:2]
    flags = cpu_bf16_flags()
    paths = {"old": [], **({"new": a.new.split()} if a.new is not None else new_paths(flags))}
    design = {"steps": a.steps, "eval_size": a.eval_size}
    specs = {n: path_spec(spec, arm, n, [*a.extra, *o], **design) for n, o in paths.items()}
    work = Path(tempfile.mkdtemp(prefix="study_cost-", dir=a.work))
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        step0 = dict(zip(specs, pool.map(warm, specs.values(), [arm] * len(specs), [str(work)] * len(specs))))
    print(f"step-0 evals generated (not counted; two at once): {step0}", flush=True)
    res: dict = {"paths": list(paths)}
    for name, sp in specs.items():
        wall = run_pair(sp, arm, seeds, work)
        res[name] = {"overrides": sp["arms"][arm], "step0_generated_s": step0[name],
                     **path_parts(store_uri(sp, work / "results"), wall)}
        print(f"{name}: {res[name]['total']:.1f} s a run (the multirun of {len(seeds)} jobs: {wall:.1f} s)", flush=True)
    for name in paths:
        if name != "old":
            res[f"ratio_{name}"] = res["old"]["total"] / res[name]["total"]
            res[f"ratio_final_eval_{name}"] = res["old"]["mean"]["eval (final)"] / res[name]["mean"]["eval (final)"]
    res.update(ratio=res["ratio_new"], study=spec["name"], arm=arm, seeds=seeds,
               layout=f"{len(seeds)} one-thread jobs side by side per path (one joblib multirun, as the study runs "
               "them), one path after another; step-0 eval generated first, replayed by the timed runs",
               machine={"cpu": cpu_label(), "cores": os.cpu_count(), "cpu_bf16": flags or ["none"],
                        "torch": torch.__version__}, date=time.strftime("%Y-%m-%d"))
    shutil.rmtree(work, ignore_errors=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study", nargs="?", default=None,
                    help="a study file (default with --paths: studies/design_card_grid.yaml)")
    ap.add_argument("--paths", action="store_true", help="measure the old and the new path side by side")
    ap.add_argument("--arm", default=None, help="--paths: the arm (default: the study's control)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="--paths: one job each, at once "
                    "(default: the study's first two)")
    ap.add_argument("--new", default=None, help="--paths: the new path's overrides, space-separated "
                    "(default: new_paths: two on a CPU with native bf16, one without)")
    ap.add_argument("--extra", nargs="*", default=[], help="--paths: overrides added to both paths (a smoke run)")
    ap.add_argument("--steps", type=int, default=None, help="--paths: train.steps (default: the study's)")
    ap.add_argument("--eval-size", type=int, default=None, help="--paths: eval.size (default: the study's)")
    ap.add_argument("--work", default=None, help="--paths: the folder its temporary run folder goes in "
                    "(removed at the end; default: the system's temp dir)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "study_cost.json")
    a = ap.parse_args(argv)
    if not a.paths:
        if a.study is None:
            ap.error("expected a study file (or --paths)")
        print("\n".join(table(split(store_uri(load_study(a.study))))))
        return 0
    a.study = a.study or str(ROOT / "studies" / "design_card_grid.yaml")
    res = measure_paths(a)
    print("\n".join(paths_table(res)))
    print(f"ratio (old / new, a run's total): {res['ratio']:.2f}x; final eval alone {res['ratio_final_eval_new']:.2f}x")
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
