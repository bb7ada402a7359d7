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
"""
from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
from mlflow import MlflowClient

from analysis.study import load_study, store_uri

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study")
    a = ap.parse_args(argv)
    print("\n".join(table(split(store_uri(load_study(a.study))))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
