"""What a study's MLflow store holds: the FINISHED runs of each arm, each run's values of the study's
metric, per-step curves, and where and when the runs were measured."""

from __future__ import annotations

import math
import os
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from mlflow.tracking import MlflowClient

from analysis.ablation import CPU_DETAIL_KEYS, RunRecord, load_sweep, per_problem
from analysis.study.precision import precision_line
from analysis.study.spec import EVAL_SUMMARIES, RESULTS, store_uri, study_dir


def load_records(spec: dict, root: Path = RESULTS) -> dict[str, dict[int, RunRecord]]:
    """``{arm: {seed: record}}`` of the FINISHED runs of each arm in the study's store (registered
    seeds only)."""
    uri = store_uri(spec, root)
    out: dict[str, dict[int, RunRecord]] = {}
    if not (study_dir(spec, root) / "mlflow.db").exists():
        return {arm: {} for arm in spec["arms"]}
    for arm in spec["arms"]:
        try:
            recs = load_sweep(uri, f"{spec['name']}.{arm}")
        except ValueError:  # no experiment / no finished run yet
            recs = []
        out[arm] = {r.seed: r for r in recs if r.seed in spec["seeds"]}
    return out


def seed_values(spec: dict, rec: RunRecord, client=None) -> tuple[np.ndarray, list]:
    """The primary metric of one run as ``([units], labels)``: per-problem values (``final`` /
    ``auc``, labels = problem indices) or the window's per-step train values (``last_third``,
    labels = steps; steps where the run logged nothing are left out)."""
    summary = spec["metric"]["summary"]
    if summary in EVAL_SUMMARIES:
        v = per_problem(rec, summary)
        return np.asarray(v, dtype=float), list(range(len(v)))
    hist = metric_history(spec, rec, client)
    first = spec["steps"] - math.ceil(spec["steps"] / 3) + 1
    steps = [s for s in sorted(hist) if first <= s <= spec["steps"]]
    return np.asarray([hist[s] for s in steps], dtype=float), steps


def metric_history(spec: dict, rec: RunRecord, client=None) -> dict[int, float]:
    """``{step: value}`` of the study's metric in one run (eval metrics: accuracy per eval step)."""
    if spec["metric"]["summary"] in EVAL_SUMMARIES:
        return {s: float(rec.correct[i].mean()) for i, s in enumerate(rec.eval_steps)}
    client = client or MlflowClient(store_uri(spec))
    return {m.step: m.value for m in client.get_metric_history(rec.run_id, spec["metric"]["name"])}


def secondary_curves(spec: dict, records: dict, client=None,
                     key: str = "secondary") -> dict[str, dict[str, dict[int, float]]]:
    """Per-step curves of the ``key`` metrics (``secondary`` or ``per_step``): ``{metric: {arm: {step:
    mean over the arm's seeds}}}`` (a step enters an arm's curve when every seed of that arm logged it)."""
    client = client or MlflowClient(store_uri(spec))
    out: dict[str, dict[str, dict[int, float]]] = {}
    for name in spec.get(key) or []:
        for arm in spec["arms"]:
            hists = [{m.step: m.value for m in client.get_metric_history(r.run_id, name)}
                     for _, r in sorted(records.get(arm, {}).items())]
            hists = [h for h in hists if h]
            if not hists:
                continue
            steps = sorted(set.intersection(*(set(h) for h in hists)))
            out.setdefault(name, {})[arm] = {x: float(np.mean([h[x] for h in hists])) for x in steps}
    return out


def run_meta(records: dict, machine: str) -> dict:
    """``machine``, and the first and last start time of the runs (``%Y-%m-%d %H:%M`` UTC, "n/a" without
    runs)."""
    recs = [r for runs in records.values() for r in runs.values()]
    times = sorted(r.params.get("_start_ms", 0) for r in recs)
    fmt = lambda ms: datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M") if ms else "n/a"
    return {"machine": machine, "first": fmt(times[0]) if times else "n/a", "last": fmt(times[-1]) if times else "n/a"}


def annotate(spec: dict, records: dict, root: Path) -> tuple[list[str], str | None]:
    """Start times (for run_meta) and the seconds each run computed (:func:`run_seconds`, for the
    family's cost) into the records; the provenance lines from the run tags, and the
    machine(s) the runs recorded (``provenance.machine.cpu`` / ``.cores`` params; None when no run
    recorded one), so that a report regenerated elsewhere still names where the runs were measured."""
    client = MlflowClient(store_uri(spec, root))
    commits, dirty, machines, bf16 = set(), set(), set(), set()
    for runs in records.values():
        for r in runs.values():
            run = client.get_run(r.run_id)
            bf16.add(run.data.params.get("provenance.machine.cpu_bf16", "not recorded"))
            r.params["_start_ms"] = run.info.start_time or 0
            r.params["_run_s"] = run_seconds(client, run)
            commits.add(run.data.tags.get("git_commit", "?"))
            dirty.add(run.data.tags.get("git_dirty", "?"))
            cpu = run.data.params.get("provenance.machine.cpu")
            if cpu:
                extra = [run.data.params[k] for k in CPU_DETAIL_KEYS if k in run.data.params]
                cores = run.data.params.get("provenance.machine.cores", "?")
                machines.add(f"{cpu} ({', '.join([*extra, f'{cores} cores'])})")
    lines = [f"git commit of the runs: {', '.join(sorted(commits))}; git_dirty: {', '.join(sorted(dirty))}"] \
        if commits else []
    lines += [x for x in [precision_line(spec, sorted(bf16))] if x]
    return lines, " and ".join(sorted(machines)) or None


def run_seconds(client: MlflowClient, run) -> float:
    """The wall-clock seconds a run computed: its trainer's ``time/elapsed_s`` at its last step plus the
    ``time/eval_s`` logged at that step (the final eval runs after the step's elapsed time is taken).

    ``time/elapsed_s`` is carried over from the checkpoint a run resumes from, so the hours between a
    kill and its resume, which MLflow's start-to-end time of the run includes, are not counted; nor is
    the work a killed attempt did after its last checkpoint, nor the process's start-up (a few
    seconds). A run that logged no ``time/elapsed_s`` counts MLflow's end minus start (0 while RUNNING).

    Args:
        client: the study store's client.
        run: an ``mlflow.entities.Run`` of that store.
    Returns:
        seconds (float, >= 0).
    """
    elapsed = client.get_metric_history(run.info.run_id, "time/elapsed_s")
    if not elapsed:
        start = run.info.start_time or 0
        return max((run.info.end_time or start) - start, 0) / 1000
    last = max(elapsed, key=lambda m: (m.step, m.timestamp))
    evals = [m for m in client.get_metric_history(run.info.run_id, "time/eval_s") if m.step == last.step]
    return last.value + (max(evals, key=lambda m: m.timestamp).value if evals else 0.0)


def this_machine() -> str:
    """This machine's CPU model (``/proc/cpuinfo``) and core count, for a study whose runs recorded none."""
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = "unknown CPU"
    return f"{model} ({os.cpu_count()} cores)"
