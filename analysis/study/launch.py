"""Running what a study's design needs: the missing (arm, seed) jobs as one Hydra multirun per arm
(``python -m harness.run -m ...``) into the study's store, and a sequential design's looks, each
decided by :func:`analysis.study.verdicts.analyse` before the next one runs."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from analysis import stats
from analysis.study.precision import check_native_bf16
from analysis.study.spec import RESULTS, StudyError, check_registration, store_uri, study_dir
from analysis.study.store import load_records
from analysis.study.verdicts import analyse


def missing_jobs(spec: dict, records: dict, seeds: list[int] | None = None) -> dict[str, list[int]]:
    """``{arm: [seeds without a FINISHED run]}`` among ``seeds`` (default: every registered seed; arms
    with none missing left out)."""
    seeds = spec["seeds"] if seeds is None else seeds
    out = {arm: [s for s in seeds if s not in records.get(arm, {})] for arm in spec["arms"]}
    return {a: s for a, s in out.items() if s}


def job_command(spec: dict, arm: str, seeds: list[int], root: Path = RESULTS, n_jobs: int = 1,
                launcher: str | None = None) -> list[str]:
    """The Hydra multirun of ``arm``'s ``seeds`` (argv)."""
    launcher = launcher or spec.get("launcher", "joblib")
    cmd = [sys.executable, "-m", "harness.run", "-m", *spec["base"], *spec["arms"][arm],
           f"train.steps={spec['steps']}", f"eval.size={spec['eval_size']}",
           "seed=" + ",".join(str(s) for s in seeds),
           f"tracking.uri={store_uri(spec, root)}", f"tracking.sweep={spec['name']}.{arm}",
           "checkpoint.dir=checkpoints/studies/${tracking.sweep}/s${seed}",
           # every run of a study starts from the same weights: the step-0 eval is generated once
           # (harness.train.eval_cache)
           f"eval.initial_cache=checkpoints/studies/{spec['name']}/eval0", f"hydra/launcher={launcher}",
           "hydra.sweep.subdir=${hydra.job.num}"]  # job folders by number: the overrides make too long a name
    if launcher == "joblib":
        cmd.append(f"hydra.launcher.n_jobs={n_jobs}")
    return cmd


def _look_label(arm: str, result: dict, n: int) -> str:
    """``arm verdict`` for the log line of the look at ``n`` seeds. A resumed study replays its past
    looks with every stored seed, so an arm :func:`analyse` finds decided at a later look is labelled
    with the seed count of the look that decided it."""
    label = f"{arm} {result['verdict']}"
    decided_at = result["looks"][-1]["seeds"] if result["looks"] else n
    if result["verdict"] != "inconclusive" and decided_at != n:
        label += f" (decided at the look at {decided_at} seeds)"
    return label


def run_study(spec: dict, root: Path = RESULTS, jobs: int | None = None, launcher: str | None = None,
              keep_checkpoints: bool = False, log=print) -> list[int]:
    """Run what the design needs; returns the seed counts of the looks run. A fixed design: every
    missing registered job (:func:`run_missing`). A ``sequential`` one: for each look
    (:func:`analysis.stats.look_sizes`) the missing jobs of its first ``n`` seeds, then the rule
    at the look's nominal alpha (:func:`analyse`); it stops at the first decided look, or when a
    look's jobs did not all FINISH (logged: the next invocation resumes). With ``comparisons`` each
    comparison stops at its own first decided look: later looks run only the control and the arms
    of the comparisons still undecided, and the study stops once every comparison is decided."""
    if "sequential" not in spec:
        run_missing(spec, root, jobs, launcher, keep_checkpoints, log)
        return [len(spec["seeds"])]
    seq, taken = spec["sequential"], []
    open_ = list(spec.get("comparisons", []))
    for n in stats.look_sizes(seq["first"], seq["add"], seq["max_seeds"]):
        only = [spec["control"], *open_] if "comparisons" in spec else None
        run_missing(spec, root, jobs, launcher, keep_checkpoints, log, seeds=spec["seeds"][:n], only=only)
        records = load_records(spec, root)
        if {a: s for a, s in missing_jobs(spec, records, spec["seeds"][:n]).items() if only is None or a in only}:
            log(f"look at {n} seeds: some jobs did not FINISH; stopping here (rerun to resume)")
            break
        taken.append(n)
        client = MlflowClient(store_uri(spec, root))
        if "comparisons" in spec:
            results = {a: analyse(stats.sub_spec(spec, a), records, client=client) for a in open_}
            log(f"look at {n} seeds: " + ", ".join(_look_label(a, r, n) for a, r in results.items()))
            open_ = [a for a in open_ if results[a]["verdict"] == "inconclusive"]
            if not open_:
                break
            continue
        res = analyse(spec, records, client=client)
        log(f"look at {n} seeds: {res['verdict']}")
        if res["verdict"] != "inconclusive":
            break
    return taken


def run_missing(spec: dict, root: Path = RESULTS, jobs: int | None = None, launcher: str | None = None,
                keep_checkpoints: bool = False, log=print, seeds: list[int] | None = None,
                only: list[str] | None = None) -> dict[str, list[int]]:
    """Launch the missing (arm, seed) jobs among ``seeds`` (default: all registered) of the arms
    ``only`` (default: every arm); returns what was missing. With the joblib launcher up to
    ``jobs`` jobs run at once: one multirun per arm, arms concurrently (each ``n_jobs`` =
    ``jobs // arms at once``); other launchers get the arms one after another (the cluster
    parallelises). Job failures are logged, not raised: the report counts what FINISHED."""
    records = load_records(spec, root)
    todo = {a: s for a, s in missing_jobs(spec, records, seeds).items() if only is None or a in only}
    check_registration(spec, root, has_finished=any(records.values()))
    if not todo:
        return todo
    check_native_bf16(spec, error=StudyError)  # a bf16-autocast arm on a CPU without native bf16: refused
    launcher = launcher or spec.get("launcher", "joblib")
    jobs = jobs or spec.get("jobs", 1)
    study_dir(spec, root).mkdir(parents=True, exist_ok=True)
    arms = list(todo)
    at_once = max(1, min(jobs, len(arms))) if launcher == "joblib" else 1
    n_jobs = max(1, jobs // at_once)
    running: list[tuple[str, subprocess.Popen]] = []
    for arm in arms:
        while len(running) >= at_once:
            running = _reap(running, log)
            time.sleep(5)
        cmd = job_command(spec, arm, todo[arm], root, n_jobs, launcher)
        log("launch: " + shlex.join(cmd))
        running.append((arm, _launch(cmd)))
        time.sleep(15 if len(arms) > 1 else 0)  # the first job creates the store's experiment
    while running:
        running = _reap(running, log)
        time.sleep(5)
    done = load_records(spec, root)
    if not keep_checkpoints:
        for arm, seeds in done.items():
            for s in seeds:
                shutil.rmtree(Path("checkpoints/studies") / f"{spec['name']}.{arm}" / f"s{s}", ignore_errors=True)
    return todo


def _launch(cmd: list[str]) -> subprocess.Popen:
    """Start one arm's multirun (a child process; the tests replace this)."""
    return subprocess.Popen(cmd)


def _reap(running, log):
    left = []
    for arm, proc in running:
        rc = proc.poll()
        if rc is None:
            left.append((arm, proc))
        elif rc:
            log(f"arm {arm}: multirun exited {rc} (the report counts the FINISHED runs)")
    return left
