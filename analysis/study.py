"""Pre-registered studies: one YAML file per claim, one command runs what is missing and reports.

    python -m analysis.study studies/positive_control.yaml            # run missing jobs, then report
    python -m analysis.study --no-run studies/*.yaml                   # reports from the stores only
    python -m analysis.study --gpu studies/dapo_clip_higher.yaml       # the file's GPU arm set

A study file (``studies/<name>.yaml``) is the pre-registration. Keys:

* ``name`` (= the file stem), ``claim`` (one sentence), ``source`` (paper, figure / table),
  ``setup`` (our setup in a few words), ``design`` (why this task, prompt, budget: the pilot's
  figures, written before the study ran);
* ``base``: overrides of ``conf/config.yaml`` shared by every arm; ``arms``: ``{arm: [overrides]}``;
  ``control`` and ``treatment``: the two arms compared (effect = treatment - control, paired by seed);
  or ``control`` and ``comparisons`` (several arms, each against the control at alpha / m: :mod:`analysis.multiarm`);
* ``seeds``, ``steps`` (``train.steps``), ``eval_size`` (``eval.size``, the first N problems of the
  task's fixed eval set);
* ``metric``: ``name`` (an MLflow metric) and ``summary``: ``final`` / ``auc`` (greedy eval accuracy
  from the per-problem verdicts each eval logs, :mod:`analysis.ablation`) or ``last_third`` (the mean
  of a per-step train metric over the last ceil(steps/3) steps); ``scale`` multiplies it for display
  (100: points);
* ``test``: ``kind: difference`` with ``sign`` (+1 / -1, the direction the claim predicts) or
  ``kind: equivalence`` with ``margin`` (in the metric's units, stated up front); ``alpha``;
  ``delta``: the effect size the power statement is about (difference tests);
* optional ``sequential: {first, add, max_seeds, boundary}``: run the first ``first`` seeds, look, and add
  ``add`` seeds per look up to ``max_seeds`` until the rule decides at the look's nominal alpha;
  ``boundary``: ``obrien_fleming`` / ``pocock`` (Lan-DeMets alpha spending) or ``bonferroni``
  (:mod:`analysis.seedtest`); ``seeds`` then lists ``max_seeds`` seeds in the order they are added;
* ``launcher`` (``joblib``, ``slurm``, ``ray_local``: ``conf/hydra/launcher``) and ``jobs``;
* optional ``secondary``: metrics reported per arm but not tested; ``per_step``: metrics shown per step
  (mean over each arm's seeds) under the verdict, not tested; ``not_run``: why the study has
  no runs (shown in the index); ``notes``: text written after the runs, quoted in the report;
  ``pilots``: the earlier studies this one is the next version of (their rows stay in
  ``results/STUDIES.md``; the README's table keeps the current version and names them in a note);
* ``gpu``: the same keys (``base``, ``arms``, ``seeds``, ``steps``, ``eval_size``) for a GPU machine,
  run with ``--gpu`` into ``results/studies/<name>/gpu/``.

What the command does:

* **resume, reuse**: the study's store is ``results/studies/<name>/mlflow.db``; each arm's jobs are
  tagged ``sweep=<name>.<arm>``. A (arm, seed) with a FINISHED run there is not launched again; the
  others are launched as one Hydra multirun per arm (``python -m harness.run -m ... seed=<missing>``),
  which resumes an interrupted job from its checkpoint (``checkpoint.dir`` is per study, arm and
  seed; removed once the run is FINISHED unless ``--keep-checkpoints``).
* **refusal**: the first launch writes ``registration.json`` (everything above except ``design``,
  ``launcher``, ``jobs``, ``setup``; ``sequential`` included). Once the store holds a FINISHED run of
  the study, a file whose registered fields differ is refused (exit 2, naming the fields): a changed
  design is a new study with a new name. A study with no FINISHED run is a new registration and
  must have at least 3 seeds per arm (``sequential.first`` for a sequential one) and, for a train
  metric, a window of at least 2 steps (:func:`check_minimum`); the committed studies that ran
  below that are reported as below it.
* **verdict** (:mod:`analysis.seedtest`): the seed is the unit. Each seed's paired effect is its mean
  over the eval problems (or the window's steps); the paired t interval over those per-seed effects
  (``seeds - 1`` df) decides: a difference is ``reproduced`` when its ``1 - alpha`` interval lies on
  the predicted side of 0, ``contradicted`` when it lies on the other side, else ``inconclusive``;
  an equivalence (TOST) is ``reproduced`` when its ``1 - 2 alpha`` interval lies inside
  ``(-margin, margin)``, ``contradicted`` when it lies entirely outside. Fewer than 2 paired seeds:
  ``inconclusive``. A sequential study applies the same rule at each look with the boundary's
  nominal alpha and stops at the first decided look. The two-level bootstrap of
  :func:`analysis.ablation.bootstrap` (seeds and problems / steps) is reported beside it, not
  tested; for a study whose runs started before 2026-12-04 the report names the verdict that rule
  gave when it differs. The looks' nominal alphas are the t statistic's boundaries
  (:func:`analysis.seedtest.nominal_levels`); a study whose runs started before those decided
  (``T_BOUNDARIES_SINCE``) names the z boundaries' verdict and interval beside its own when they differ.
* **power** of the deciding test at the measured spread ``sd``, exact: the paired t-test's power for
  ``delta`` (noncentral t), the difference it detects with 80% power and the seeds 80% needs; for
  an equivalence, the TOST power at a true difference of 0 (integrated over the sample sd) and the
  seeds 80% needs; the chi-square 95% interval of ``sd`` and the seeds needed at its ends.
* writes ``results/studies/<name>.md`` (verdict, effect and interval, per-seed table, power, plot of
  every seed), ``results/studies/<name>/result.json``, and the index ``results/STUDIES.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml
from mlflow.tracking import MlflowClient

from analysis import seedtest
from analysis.ablation import CPU_DETAIL_KEYS, RunRecord, bootstrap, load_sweep, per_problem
from analysis import multiarm
from analysis.study_precision import check_native_bf16, precision_line
from analysis.seedtest import MIN_SEEDS, VERDICT_NAMES

RESULTS = Path("results")
REGISTERED = ("claim", "source", "base", "arms", "control", "treatment", "seeds", "steps", "eval_size",
              "metric", "test")
OPTIONAL_REGISTERED = ("sequential", "comparisons")  # registered when the file has them (older registrations stay as written)
VERDICTS = ("reproduced", "contradicted", "inconclusive")
EVAL_SUMMARIES = ("final", "auc")
SEQUENTIAL_KEYS = ("first", "add", "max_seeds", "boundary")
# the paired-t rule replaced the two-level bootstrap rule on this date (issue 45); a study whose runs
# started before it shows the verdict the bootstrap rule gave beside the re-issued one
RULE_SINCE = "2026-12-04"
# the sequential looks decided at z boundaries until this date, at the t boundaries since; a
# study whose runs started before it shows the verdict the z boundaries gave when it differs
T_BOUNDARIES_SINCE = "2026-12-06"


class StudyError(ValueError):
    """A study file that cannot be run as written, or a change to a registered study."""


# ----------------------------------------------------------------------------------- the file
def load_study(path: str | Path, gpu: bool = False) -> dict:
    """The study file as a dict, checked; with ``gpu`` its ``gpu`` section replaces the CPU arm set.

    Raises:
        StudyError: a missing key, ``name`` not the file stem, unknown arm names in
            ``control`` / ``treatment``, an unknown test kind or metric summary.
    """
    path = Path(path)
    spec = yaml.safe_load(path.read_text())
    for key in ("name", "claim", "source", "base", "arms", "control", "treatment", "seeds", "steps", "eval_size",
                "metric", "test"):
        if key not in spec and not (key == "treatment" and "comparisons" in spec):
            raise StudyError(f"{path}: missing key {key!r}")
    if spec["name"] != path.stem:
        raise StudyError(f"{path}: name {spec['name']!r} must be the file stem {path.stem!r}")
    if gpu:
        if not spec.get("gpu"):
            raise StudyError(f"{path}: no gpu section")
        spec = {**spec, **spec["gpu"], "name": spec["name"], "variant": "gpu"}
    if "comparisons" in spec:  # several arms against one control (analysis/multiarm.py)
        multiarm.check_comparisons(path, spec, StudyError)
    for role in ("control", "treatment"):
        if role in spec and spec[role] not in spec["arms"]:
            raise StudyError(f"{path}: {role} {spec[role]!r} is not an arm ({sorted(spec['arms'])})")
    test = spec["test"]
    if test.get("kind") not in ("difference", "equivalence"):
        raise StudyError(f"{path}: test.kind must be difference or equivalence, got {test.get('kind')!r}")
    if test["kind"] == "equivalence" and not (test.get("margin") or 0) > 0:
        raise StudyError(f"{path}: an equivalence test needs margin > 0")
    if test["kind"] == "difference" and test.get("sign") not in (1, -1):
        raise StudyError(f"{path}: a difference test needs sign +1 or -1")
    if spec["metric"].get("summary") not in (*EVAL_SUMMARIES, "last_third"):
        raise StudyError(f"{path}: metric.summary must be final, auc or last_third")
    if "sequential" in spec:
        _check_sequential(path, spec)
    for key in ("secondary", "per_step"):
        if key in spec and not (isinstance(spec[key], list) and all(isinstance(m, str) for m in spec[key])):
            raise StudyError(f"{path}: {key} must be a list of metric names, got {spec[key]!r}")
    spec.setdefault("variant", "cpu")
    spec["file"] = path.as_posix()  # for error messages; not registered
    return spec


def _check_sequential(path: Path, spec: dict) -> None:
    seq = spec["sequential"]
    if not isinstance(seq, dict) or sorted(seq) != sorted(SEQUENTIAL_KEYS):
        raise StudyError(f"{path}: sequential must have exactly the keys {', '.join(SEQUENTIAL_KEYS)}, got {seq!r}")
    for k in ("first", "add", "max_seeds"):
        if not isinstance(seq[k], int) or seq[k] < 1:
            raise StudyError(f"{path}: sequential.{k} must be a positive integer, got {seq[k]!r}")
    if seq["max_seeds"] < seq["first"]:
        raise StudyError(f"{path}: sequential.max_seeds {seq['max_seeds']} is below sequential.first {seq['first']}")
    if len(spec["seeds"]) != seq["max_seeds"]:
        raise StudyError(f"{path}: seeds must list sequential.max_seeds = {seq['max_seeds']} seeds, in the order "
                         f"they are added; got {len(spec['seeds'])}")
    if seq["boundary"] not in seedtest.BOUNDARIES:
        raise StudyError(f"{path}: sequential.boundary must be one of {', '.join(seedtest.BOUNDARIES)}, "
                         f"got {seq['boundary']!r}")


def window_steps(spec: dict) -> int | None:
    """Steps in the ``last_third`` window (``ceil(steps / 3)``); None for an eval summary."""
    return math.ceil(spec["steps"] / 3) if spec["metric"]["summary"] == "last_third" else None


def check_minimum(spec: dict) -> None:
    """A new registration's minimum design: at least ``MIN_SEEDS`` seeds per arm (at the first look of
    a sequential study) and, for a train metric, a window of at least 2 steps.

    Raises:
        StudyError: naming the study file and the field.
    """
    f = spec.get("file", spec["name"])
    seq = spec.get("sequential")
    n, field = (seq["first"], "sequential.first") if seq else (len(spec["seeds"]), "seeds")
    if n < MIN_SEEDS:
        raise StudyError(f"{f}: {field} gives {n} seeds per arm; a new study needs at least {MIN_SEEDS} (a test "
                         f"over per-seed effects with {n - 1} degree(s) of freedom cannot hold its error rate)")
    if window_steps(spec) == 1:
        raise StudyError(f"{f}: steps {spec['steps']} gives a last_third window of 1 step; a new study with a "
                         f"train metric needs at least 2 window steps (steps >= 4)")


def study_dir(spec: dict, root: Path = RESULTS) -> Path:
    d = root / "studies" / spec["name"]
    return d / "gpu" if spec.get("variant") == "gpu" else d


def store_uri(spec: dict, root: Path = RESULTS) -> str:
    return f"sqlite:///{study_dir(spec, root) / 'mlflow.db'}"


def registration(spec: dict) -> dict:
    """The pre-registered fields (what a finished study may not change)."""
    return {**{k: spec[k] for k in REGISTERED if k in spec}, **{k: spec[k] for k in OPTIONAL_REGISTERED if k in spec}}


def check_registration(spec: dict, root: Path = RESULTS, has_finished: bool = False) -> None:
    """Write ``registration.json`` on first use; refuse a change once a run has FINISHED. A study with
    no FINISHED run is a new registration: it must meet :func:`check_minimum` (the committed studies
    that ran below that minimum keep their stores and are reported as below it).

    Raises:
        StudyError: the file's registered fields differ from the registration and the store holds a
            FINISHED run of the study (names the fields); a new registration below the minimum.
    """
    if not has_finished:
        check_minimum(spec)
    path = study_dir(spec, root) / "registration.json"
    now = registration(spec)
    if path.exists():
        old = json.loads(path.read_text())
        changed = sorted(k for k in (*REGISTERED, *OPTIONAL_REGISTERED) if json.dumps(old.get(k), sort_keys=True)
                         != json.dumps(now.get(k), sort_keys=True))
        if changed and has_finished:
            raise StudyError(f"study {spec['name']!r} has finished runs and its registered {', '.join(changed)} "
                             f"changed: a changed design is a new study (new file, new name)")
        if not changed:
            return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------------- runs
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
           # every run of a study starts from the same weights: the step-0 eval is generated once (harness.eval_cache)
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
    (:func:`analysis.seedtest.look_sizes`) the missing jobs of its first ``n`` seeds, then the rule
    at the look's nominal alpha (:func:`analyse`); it stops at the first decided look, or when a
    look's jobs did not all FINISH (logged: the next invocation resumes). With ``comparisons`` each
    comparison stops at its own first decided look: later looks run only the control and the arms
    of the comparisons still undecided, and the study stops once every comparison is decided."""
    if "sequential" not in spec:
        run_missing(spec, root, jobs, launcher, keep_checkpoints, log)
        return [len(spec["seeds"])]
    seq, taken = spec["sequential"], []
    open_ = list(spec.get("comparisons", []))
    for n in seedtest.look_sizes(seq["first"], seq["add"], seq["max_seeds"]):
        only = [spec["control"], *open_] if "comparisons" in spec else None
        run_missing(spec, root, jobs, launcher, keep_checkpoints, log, seeds=spec["seeds"][:n], only=only)
        records = load_records(spec, root)
        if {a: s for a, s in missing_jobs(spec, records, spec["seeds"][:n]).items() if only is None or a in only}:
            log(f"look at {n} seeds: some jobs did not FINISH; stopping here (rerun to resume)")
            break
        taken.append(n)
        client = MlflowClient(store_uri(spec, root))
        if "comparisons" in spec:
            results = {a: analyse(multiarm.sub_spec(spec, a), records, client=client) for a in open_}
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


# ----------------------------------------------------------------------------------- analysis
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


def paired_effects(spec: dict, records: dict, client=None) -> tuple[np.ndarray, list[int], dict]:
    """``(d [seeds, units], seeds, per_arm)``: treatment minus control per paired seed over the units
    (problems, or window steps both runs of every seed logged); ``per_arm``: ``{arm: {seed: value}}``."""
    ctl, trt = records.get(spec["control"], {}), records.get(spec["treatment"], {})
    seeds = sorted(set(ctl) & set(trt))
    per_arm = {arm: {s: float(np.mean(seed_values(spec, r, client)[0])) for s, r in records.get(arm, {}).items()}
               for arm in spec["arms"]}
    if not seeds:
        return np.zeros((0, 0)), [], per_arm
    rows_c, rows_t = [], []
    for s in seeds:
        (vc, lc), (vt, lt) = seed_values(spec, ctl[s], client), seed_values(spec, trt[s], client)
        rows_c.append(dict(zip(lc, vc)))
        rows_t.append(dict(zip(lt, vt)))
    common = sorted(set.intersection(*(set(r) for r in rows_c + rows_t)))
    d = np.asarray([[t[u] - c[u] for u in common] for c, t in zip(rows_c, rows_t)], dtype=float)
    return d, seeds, per_arm


def verdict(test: dict, lo: float, hi: float, n_seeds: int) -> str:
    """The pre-registered rule (:func:`analysis.seedtest.decide`) applied to an interval of the effect;
    fewer than 2 seeds: inconclusive."""
    if n_seeds < 2:
        return "inconclusive"
    return VERDICT_NAMES[int(seedtest.decide(test, lo, hi))]


def power_analysis(test: dict, sd: float, n: int) -> dict:
    """Exact power of the deciding test at the measured spread ``sd`` of the per-seed effects with
    ``n`` seeds (:mod:`analysis.seedtest`): ``power``, ``seeds_needed`` for 80%, the chi-square 95%
    interval of the sd (``sd_lo``, ``sd_hi``) and the seeds needed at its ends; for a difference also
    the effect detected with 80% power (``mde``)."""
    out = {"sd": sd, "seeds": n}
    if n < 2 or not sd > 0 or math.isnan(sd):
        return out
    sd_lo, sd_hi = seedtest.sd_interval(sd, n)
    out.update(power=seedtest.deciding_power(test, sd, n), seeds_needed=seedtest.seeds_for_power(test, sd),
               sd_lo=sd_lo, sd_hi=sd_hi, seeds_needed_lo=seedtest.seeds_for_power(test, sd_lo),
               seeds_needed_hi=seedtest.seeds_for_power(test, sd_hi))
    if test["kind"] == "difference":
        out.update(delta=test["delta"], mde=seedtest.min_detectable(sd, n, test.get("alpha", 0.05)))
    else:
        out.update(margin=test["margin"])
    return out


def design_looks(spec: dict, n_run: int, z: bool = False) -> tuple[list[int], list[float]]:
    """``(looks, nominal two-sided alphas)``: the ``sequential`` looks and their boundary's levels (the
    t boundaries that decide; with ``z`` the z boundaries of :func:`analysis.seedtest.z_nominal_levels`,
    for the re-issue note), or one look at the ``n_run`` seeds run with the fixed design's ``1 - level``."""
    test = spec["test"]
    level = seedtest.interval_level(test["kind"], test.get("alpha", 0.05))
    if "sequential" not in spec:
        return [n_run], [1 - level]
    seq = spec["sequential"]
    looks = seedtest.look_sizes(seq["first"], seq["add"], seq["max_seeds"])
    levels = (seedtest.z_nominal_levels if z else seedtest.nominal_levels)(seq["boundary"], looks, 1 - level)
    return looks, [float(x) for x in levels]


def t_table_designs(spec: dict) -> list[tuple[str, tuple, float]]:
    """``(boundary, looks, total)`` of the sequential design a study's verdicts use (one per study:
    a family's comparisons share theirs), for :func:`analysis.seedtest.write_t_table`; [] for a fixed
    design or a Bonferroni boundary."""
    if "sequential" not in spec or spec["sequential"]["boundary"] == "bonferroni":
        return []
    sub = multiarm.sub_spec(spec, spec["comparisons"][0]) if "comparisons" in spec else spec
    seq, test = spec["sequential"], sub["test"]
    looks = tuple(seedtest.look_sizes(seq["first"], seq["add"], seq["max_seeds"]))
    return [(seq["boundary"], looks, 1 - seedtest.interval_level(test["kind"], test.get("alpha", 0.05)))]


def z_boundary_verdict(spec: dict, values: list[float]) -> dict | None:
    """The sequential rule over the per-seed effects ``values`` (registered order) at the z levels
    (:func:`design_looks` with ``z``): ``verdict``, ``seeds``, ``effect``, ``lo``, ``hi`` at its
    stopping look; None when no look was taken."""
    looks, levels = design_looks(spec, len(values), z=True)
    seq = seedtest.sequential(np.asarray([values], dtype=float), spec["test"], looks, levels)
    if not seq["code"].shape[1]:
        return None
    return {"verdict": VERDICT_NAMES[int(seq["verdict"][0])], "seeds": int(seq["seeds_used"][0]),
            **{k: float(seq[f"{k}_final"][0]) for k in ("mean", "lo", "hi")}}


def analyse(spec: dict, records: dict, n_boot: int = 2000, seed: int = 0, client=None) -> dict:
    """Effect, interval, verdict, power and per-seed values of one study: the paired t rule over the
    per-seed effects (each seed's mean over the problems or window steps), at every look of a
    sequential design; the two-level bootstrap interval beside it (``bootstrap``: the rule before
    2026-12-04, secondary)."""
    test = spec["test"]
    d, seeds, per_arm = paired_effects(spec, records, client)
    # one comparison of a family (multiarm.sub_spec) owns its two arms' runs, not the family's
    counted = (spec["control"], spec["treatment"]) if "comparison_of" in spec else tuple(spec["arms"])
    out = {"name": spec["name"], "variant": spec.get("variant", "cpu"), "seeds_run": seeds,
           "seeds_registered": list(spec["seeds"]), "per_arm": per_arm,
           "level": seedtest.interval_level(test["kind"], test.get("alpha", 0.05)),
           "runs_finished": sum(len(records.get(a, {})) for a in counted),
           "runs_registered": len(spec["seeds"]) * len(counted), "window_steps": window_steps(spec)}
    if len(seeds) == 0 or d.size == 0:
        return {**out, "effect": math.nan, "lo": math.nan, "hi": math.nan, "verdict": "inconclusive",
                "per_seed": [], "power": {"seeds": 0}, "looks": []}
    per_seed = d.mean(axis=1)
    draws = bootstrap(d, n_boot, np.random.default_rng(seed))
    q = (1 - out["level"]) / 2
    blo, bhi = (float(x) for x in np.quantile(draws, [q, 1 - q]))
    # the looks use the registered seed order; a sequential look needs its first n registered seeds
    by_seed = dict(zip(seeds, per_seed))
    ordered = [s for s in spec["seeds"] if s in by_seed]
    if "sequential" in spec:  # the unbroken prefix of the registered seeds
        ordered = spec["seeds"][:next((i for i, s in enumerate(spec["seeds"]) if s not in by_seed), len(spec["seeds"]))]
    looks, levels = design_looks(spec, len(ordered))
    seq = seedtest.sequential(np.asarray([[by_seed[s] for s in ordered]]), test, looks, levels)
    taken, k = seq["code"].shape[1], int(seq["stop"][0])
    look_rows = [{"seeds": looks[i], "alpha": levels[i], "effect": float(seq["mean"][0, i]),
                  "lo": float(seq["lo"][0, i]), "hi": float(seq["hi"][0, i]),
                  "decision": VERDICT_NAMES[int(seq["code"][0, i])]} for i in range(min(taken, k + 1))]
    used = ordered[:looks[k]] if taken else ordered
    sd = float(np.std([by_seed[s] for s in used], ddof=1)) if len(used) > 1 else math.nan
    final = ({"effect": float(seq["mean_final"][0]), "lo": float(seq["lo_final"][0]), "hi": float(seq["hi_final"][0]),
              "level": 1 - levels[k], "verdict": VERDICT_NAMES[int(seq["verdict"][0])]} if taken else
             {"effect": math.nan, "lo": math.nan, "hi": math.nan, "level": out["level"], "verdict": "inconclusive"})
    if "sequential" in spec and taken:  # a sequential study registers the runs up to the look it stopped at
        out["runs_registered"] = len(counted) * looks[k]
        out["z_boundaries"] = z_boundary_verdict(spec, [float(by_seed[s]) for s in ordered])
    return {**out, **final, "units": d.shape[1], "seeds_used": len(used),
            "looks": look_rows if "sequential" in spec else [], "per_seed": [float(x) for x in per_seed],
            "bootstrap": {"lo": blo, "hi": bhi, "verdict": verdict(test, blo, bhi, len(seeds))},
            "power": power_analysis(test, sd, len(used))}


# ----------------------------------------------------------------------------------- report
def plot(spec: dict, records: dict, result: dict, path: Path, client=None) -> Path:
    """Left: the primary metric vs step, every seed of every arm (thin), arm means (thick). Right:
    the per-seed paired effect, its mean and interval, and the margin or 0."""
    import matplotlib  # heavy, only for plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy, only for plots
    from analysis.plots import integer_steps  # imports matplotlib: only for plots

    scale = spec["metric"].get("scale", 1)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    for arm in spec["arms"]:
        runs = records.get(arm, {})
        curves = {s: metric_history(spec, r, client) for s, r in sorted(runs.items())}
        color = None
        for s, h in curves.items():
            xs = sorted(h)
            line, = ax.plot(xs, [h[x] * scale for x in xs], lw=0.8, alpha=0.6, ls="--", color=color, marker=".")
            color = line.get_color()
        if curves:
            steps = sorted(set.intersection(*(set(h) for h in curves.values())))
            ax.plot(steps, [np.mean([h[x] for h in curves.values()]) * scale for x in steps], lw=2.2, color=color,
                    label=f"{arm} ({len(curves)} seeds)")
    if spec["metric"]["summary"] == "last_third":
        ax.axvspan(spec["steps"] - math.ceil(spec["steps"] / 3) + 0.5, spec["steps"] + 0.5, alpha=0.08, color="k")
    integer_steps(ax)
    ax.set(xlabel="training step", ylabel=f"{spec['metric']['name']} (x{scale})" if scale != 1 else spec["metric"]["name"],
           title="every seed (dashed), mean over seeds (solid)")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    ps = [x * scale for x in result.get("per_seed", [])]
    bx.scatter(range(len(ps)), ps, color="k", zorder=3, label="per seed")
    for i, s in enumerate(result.get("seeds_run", [])):
        bx.annotate(f"s{s}", (i, ps[i]), textcoords="offset points", xytext=(5, 0), fontsize="x-small")
    if not math.isnan(result.get("effect", math.nan)):
        e, lo, hi = (result[k] * scale for k in ("effect", "lo", "hi"))
        bx.errorbar([len(ps)], [e], yerr=[[e - lo], [hi - e]], fmt="o", color="C3", capsize=4,
                    label=f"mean, {100 * result['level']:.3g}% paired t CI")
    bx.axhline(0, color="k", lw=0.8)
    if spec["test"]["kind"] == "equivalence":
        for m in (-1, 1):
            bx.axhline(m * spec["test"]["margin"] * scale, color="C2", ls=":", label="margin" if m > 0 else None)
    bx.set(title=f"{spec['treatment']} - {spec['control']}", xticks=[])
    bx.legend(fontsize="x-small")
    bx.grid(alpha=0.3)
    fig.suptitle(f"{spec['name']}: {result['verdict']}", fontsize="medium")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})  # no version string: regenerates byte for byte
    plt.close(fig)
    return path


def _num(x: float, scale: float, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x * scale:+.3g}" if signed else f"{x * scale:.3g}"


def effect_text(spec: dict, result: dict) -> str:
    s = spec["metric"].get("scale", 1)
    if math.isnan(result.get("effect", math.nan)):
        return "n/a"
    return f"{_num(result['effect'], s, True)} [{_num(result['lo'], s, True)}, {_num(result['hi'], s, True)}]"


def test_text(spec: dict) -> str:
    t, s = spec["test"], spec["metric"].get("scale", 1)
    diff = f"{spec['treatment']} - {spec['control']}"
    fam = spec.get("comparison_of")  # one comparison of several against the control (analysis/multiarm.py)
    if fam:
        return _test_text(t, s, diff, f"{t['alpha']:.4g} (Bonferroni: family alpha {fam['alpha_family']} over "
                          f"{fam['m']} comparisons with {spec['control']})")
    return _test_text(t, s, diff, t.get("alpha", 0.05))


def _test_text(t: dict, s: float, diff: str, alpha_text) -> str:
    if t["kind"] == "difference":
        return (f"difference, predicted sign {'+' if t['sign'] > 0 else '-'}: {diff} {'> 0' if t['sign'] > 0 else '< 0'}; "
                f"alpha {alpha_text} (two-sided {100 * (1 - t.get('alpha', 0.05)):.4g}% interval); "
                f"power stated for a difference of {_num(t['delta'], s)}")
    return (f"equivalence: |{diff}| < {_num(t['margin'], s)} (TOST, {100 * (1 - 2 * t.get('alpha', 0.05)):.4g}% "
            f"interval inside the margin); alpha {alpha_text}")


def verdict_text(spec: dict, result: dict) -> str:
    if not result["runs_finished"]:
        return f"not run ({spec.get('not_run', 'no finished run in its store yet')})"
    v = result["verdict"]
    p = result["power"]
    if result["runs_finished"] < result["runs_registered"]:
        v += (f" (only {result['runs_finished']} of {result['runs_registered']} registered runs finished: "
              f"analysed as they are)")
    if result["verdict"] == "inconclusive" and result.get("looks") and \
            result["looks"][-1]["seeds"] < spec["sequential"]["max_seeds"]:
        v += (f" after the look at {result['looks'][-1]['seeds']} of up to {spec['sequential']['max_seeds']} seeds "
              f"(the next look adds {spec['sequential']['add']})")
    elif result["verdict"] == "inconclusive" and result.get("looks"):  # max_seeds reached
        sc = spec["metric"].get("scale", 1)
        v += (f" at max_seeds {spec['sequential']['max_seeds']}: the last look's interval excludes effects below "
              f"{_num(result['lo'], sc, True)} and above {_num(result['hi'], sc, True)}")
    elif result["verdict"] == "inconclusive" and p.get("seeds_needed"):
        if p["seeds_needed"] > p["seeds"] or p.get("power", 0) < 0.8:
            v += f" at this budget; a conclusive answer needs about {p['seeds_needed']} seeds per arm at the measured spread"
        else:  # the seeds run were enough for the registered size: the effect is smaller than that
            size = _num(p.get("delta", p.get("margin")), spec["metric"].get("scale", 1))
            v += (f": the seeds run had {p['power']:.0%} power for the registered {size} at the measured spread, "
                  f"and the effect is smaller than that; a smaller effect needs more seeds than {p['seeds_needed']}")
    below = [f"{len(result['seeds_run'])} seeds: below the {MIN_SEEDS}-seed minimum"] \
        if 0 < len(result["seeds_run"]) < MIN_SEEDS else []
    if result.get("window_steps") == 1:
        below.append("a 1-step window: below the 2-step minimum")
    if below:
        v += f" ({'; '.join(below)})"
    if result.get("verdict_before_t"):
        z, sc = result["verdict_before_t"], spec["metric"].get("scale", 1)
        v += (f"; re-issued under the t boundaries: the z boundaries used before {T_BOUNDARIES_SINCE} read "
              f"\"{z['verdict']}\" at {z['seeds']} seeds, {_num(z['mean'], sc, True)} [{_num(z['lo'], sc, True)}, "
              f"{_num(z['hi'], sc, True)}]")
    if result.get("verdict_before"):
        v += (f"; re-issued under the paired-t rule: the two-level bootstrap rule used before {RULE_SINCE} read "
              f"\"{result['verdict_before']}\"")
    return v


def _level_text(level: float) -> str:
    return f"{100 * level:.4g}%"


def _bootstrap_lines(spec: dict, result: dict) -> list[str]:
    b = result.get("bootstrap")
    if not b:
        return []
    s = spec["metric"].get("scale", 1)
    units = "problems" if spec["metric"]["summary"] in EVAL_SUMMARIES else "window steps"
    return [f"Secondary (not the verdict): the two-level bootstrap over seeds and {units} gives "
            f"[{_num(b['lo'], s, True)}, {_num(b['hi'], s, True)}]; the rule before {RULE_SINCE} decided on it and "
            f"read **{b['verdict']}**. It treats the {units} as units beside the seeds and is miscalibrated at a few "
            f"seeds (issue 45's simulations: 7-25% false \"reproduced\" at 2 seeds where 2.5% is nominal).", ""]


def _look_lines(spec: dict, result: dict) -> list[str]:
    """The sequential design's looks: seeds, nominal alpha, interval, decision."""
    if "sequential" not in spec:
        return []
    seq, sc = spec["sequential"], spec["metric"].get("scale", 1)
    looks, levels = design_looks(spec, 0)
    out = [f"Sequential design: first {seq['first']} seeds, then {seq['add']} more per look up to {seq['max_seeds']}; "
           f"boundary `{seq['boundary']}` ({BOUNDARY_TEXT[seq['boundary']]}). Each look's nominal alpha is the "
           f"two-sided level of the paired t interval at the look's t boundary (the boundary of the t statistic "
           f"with seeds - 1 df, simulated under the null: `analysis.seedtest.nominal_levels`).", "",
           "| look | seeds | nominal alpha (two-sided) | effect [interval] | decision |", "|---|---|---|---|---|"]
    done = {r["seeds"]: r for r in result.get("looks", [])}
    for i, (n, a) in enumerate(zip(looks, levels)):
        r = done.get(n)
        cells = ([f"{_num(r['effect'], sc, True)} [{_num(r['lo'], sc, True)}, {_num(r['hi'], sc, True)}]", r["decision"]]
                 if r else ["-", "not reached" if result.get("looks") and result["verdict"] != "inconclusive"
                            else "not run yet"])
        out.append(f"| {i + 1} | {n} | {a:.4g} | " + " | ".join(cells) + " |")
    return [*out, ""]


BOUNDARY_TEXT = {
    "obrien_fleming": "Lan-DeMets alpha spending, O'Brien-Fleming type 2 - 2 Phi(z_{1-a/2} / sqrt(t))",
    "pocock": "Lan-DeMets alpha spending, Pocock type a ln(1 + (e - 1) t)",
    "bonferroni": "alpha / looks at every look"}


def power_lines(spec: dict, p: dict) -> list[str]:
    """The report's power paragraph: the deciding test's exact power at the measured spread, the seeds
    80% needs, and the same count at the ends of the spread's chi-square 95% interval."""
    s = spec["metric"].get("scale", 1)
    if p.get("power") is None:
        return ["Not computable: fewer than 2 paired seeds, or no spread between them."]
    need = lambda k: f"{p[k]}" if p[k] < 10_000 else ">= 10,000"
    lines = [f"Spread of the per-seed effects: sd {_num(p['sd'], s)} over {p['seeds']} seeds (it includes the "
             f"eval-problem or step noise that pairing does not cancel); its 95% interval (chi-square, "
             f"{p['seeds'] - 1} df) is [{_num(p['sd_lo'], s)}, {_num(p['sd_hi'], s)}]."]
    if spec["test"]["kind"] == "difference":
        lines.append(f"At this spread the two-sided paired t-test with {p['seeds']} seeds has power {p['power']:.2f} "
                     f"(noncentral t) for a difference of {_num(p['delta'], s)}, detects {_num(p['mde'], s)} with 80% "
                     f"power (exact), and needs **{need('seeds_needed')} seeds** per arm for 80% power at "
                     f"{_num(p['delta'], s)}; at the ends of the sd's interval, {need('seeds_needed_lo')} to "
                     f"{need('seeds_needed_hi')} seeds.")
    else:
        lines.append(f"At this spread TOST with {p['seeds']} seeds has power {p['power']:.2f} (exact: integrated "
                     f"over the sample sd) to show equivalence within {_num(p['margin'], s)} when the true "
                     f"difference is 0; 80% power needs **{need('seeds_needed')} seeds** per arm; at the ends of the "
                     f"sd's interval, {need('seeds_needed_lo')} to {need('seeds_needed_hi')} seeds.")
    return lines


def _window_text(spec: dict) -> str:
    m = spec["metric"]
    if m["summary"] == "last_third":
        first = spec["steps"] - math.ceil(spec["steps"] / 3) + 1
        return f"mean of `{m['name']}` over steps {first}-{spec['steps']} (the last third)"
    return {"final": "greedy eval accuracy at the last step", "auc": "area under the greedy eval accuracy curve"}[
        m["summary"]] + f" on {spec['eval_size']} problems"


def _provenance(records: dict) -> list[str]:
    recs = [r for runs in records.values() for r in runs.values()]
    if not recs:
        return []
    return [f"git commits of the runs: {', '.join(sorted({r.params.get('git_commit', '') or '?' for r in recs}))}"]


def write_report(spec: dict, result: dict, records: dict, path: Path, study_file: Path, meta: dict,
                 client=None) -> Path:
    """``results/studies/<name>.md``."""
    s = spec["metric"].get("scale", 1)
    plots = []
    if result["runs_finished"]:
        png = plot(spec, records, result, path.parent / "plots" / f"{path.stem}.png", client)
        plots = [f"![{spec['name']}](plots/{png.name})"]
        sec = plot_secondary(spec, records, path.parent / "plots" / f"{path.stem}_secondary.png", client)
        if sec is not None:
            plots.append(f"![{spec['name']} secondary metrics](plots/{sec.name})")
    p = result["power"]
    lines = [f"# Study `{spec['name']}`{' (GPU arm set)' if spec.get('variant') == 'gpu' else ''}", "",
             f"**Claim.** {spec['claim']}", "", f"**Source.** {spec['source']}", "",
             f"**Verdict: {verdict_text(spec, result)}.**", "",
             f"Effect ({spec['treatment']} - {spec['control']}, {_window_text(spec)}; x{s}): "
             f"**{effect_text(spec, result)}** ({_level_text(result['level'])} paired t interval over "
             f"{result.get('seeds_used', len(result['seeds_run']))} per-seed effects, "
             f"{max(0, result.get('seeds_used', len(result['seeds_run'])) - 1)} df; each seed's effect is its mean over "
             f"the {'eval problems' if spec['metric']['summary'] in EVAL_SUMMARIES else 'window steps'}), "
             f"{len(result['seeds_run'])} paired seeds.", *_per_step_lines(spec, records, client), "",
             *_bootstrap_lines(spec, result), *_look_lines(spec, result),
             "Regenerate this report (from the committed store; runs only what is missing):", "", "```bash",
             f"python -m analysis.study {'--gpu ' if spec.get('variant') == 'gpu' else ''}{study_file.as_posix()}",
             "```", "", "## Pre-registered design", "",
             f"- test: {test_text(spec)}", f"- metric: {_window_text(spec)}",
             f"- seeds {list(spec['seeds'])}, {spec['steps']} steps, eval set: first {spec['eval_size']} problems",
             f"- base overrides: `{' '.join(spec['base'])}`"]
    lines += [f"- arm `{a}`: `{' '.join(o) or '(base only)'}`" for a, o in spec["arms"].items()]
    lines += ["", "Why this design (written before the study ran):", "", spec.get("design", "").strip(), "",
              "## Per seed", "", f"| arm | {' | '.join(f's{x}' for x in spec['seeds'])} |",
              "|---|" + "---|" * len(spec["seeds"])]
    for arm in spec["arms"]:
        vals = result["per_arm"].get(arm, {})
        lines.append(f"| {arm} | " + " | ".join(_num(vals[x], s) if x in vals else "not run" for x in spec["seeds"])
                     + " |")
    eff = dict(zip(result["seeds_run"], result["per_seed"]))
    lines.append("| effect | " + " | ".join(_num(eff[x], s, True) if x in eff else "-" for x in spec["seeds"]) + " |")
    lines += ["", "## Power (of the deciding test, exact)", "", *power_lines(spec, p)]
    if spec.get("notes"):
        lines += ["", "## Notes written after the runs (not part of the registration)", "", spec["notes"].strip()]
    lines += _secondary_lines(spec, records, client)
    lines += ["", "## Plot", "", *plots, "", "## Provenance", "",
              f"- machine: {meta['machine']}; runs started between {meta['first']} and {meta['last']} (UTC)",
              *[f"- {x}" for x in meta.get("provenance", [])], ""]
    path.write_text("\n".join(lines))
    return path


def _per_step_lines(spec: dict, records: dict, client=None) -> list[str]:
    """The study file's ``per_step`` metrics (not tested) as a table per step, shown under the verdict."""
    if not spec.get("per_step") or not any(records.values()):
        return []
    return secondary_curve_lines(spec, records, client, key="per_step", title="Shown beside the verdict (`per_step`, "
                                 "not tested): per step, mean over each arm's seeds.")


def _secondary_lines(spec: dict, records: dict, client=None) -> list[str]:
    """``secondary`` metrics of the study file (not part of the test): per arm, the mean over seeds
    of each run's mean over its logged steps, per seed in brackets."""
    names = spec.get("secondary") or []
    if not names or not any(records.values()):
        return []
    client = client or MlflowClient(store_uri(spec))
    out = ["", "## Secondary metrics (not tested)", "", "Mean over all logged steps of each run; per seed in brackets.",
           "", "| metric | " + " | ".join(spec["arms"]) + " |", "|---|" + "---|" * len(spec["arms"])]
    for name in names:
        cells = []
        for arm in spec["arms"]:
            per = {s: np.mean([m.value for m in client.get_metric_history(r.run_id, name)] or [math.nan])
                   for s, r in sorted(records.get(arm, {}).items())}
            cells.append(f"{np.mean(list(per.values())):.4g} [" + ", ".join(f"{v:.4g}" for v in per.values()) + "]"
                         if per else "n/a")
        out.append(f"| `{name}` | " + " | ".join(cells) + " |")
    out += secondary_curve_lines(spec, records, client)
    return out


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


def secondary_curve_lines(spec: dict, records: dict, client=None, max_columns: int = 10, key: str = "secondary",
                          title: str | None = None) -> list[str]:
    """A markdown table of :func:`secondary_curves` of the ``key`` metrics: a row per (metric, arm), a column per
    logged step (at most ``max_columns``, evenly spaced, always the first and last), under ``title`` (default:
    the secondary metrics' line naming their plot)."""
    curves = secondary_curves(spec, records, client, key)
    steps = sorted({x for arms in curves.values() for c in arms.values() for x in c})
    if not steps:
        return []
    if len(steps) > max_columns:
        idx = np.unique(np.linspace(0, len(steps) - 1, max_columns).round().astype(int))
        steps = [steps[i] for i in idx]
    title = title or "Per step, mean over seeds (plot: `plots/" + spec["name"] + "_secondary.png`):"
    out = ["", title, "",
           "| metric | arm | " + " | ".join(f"step {x}" for x in steps) + " |", "|---|---|" + "---|" * len(steps)]
    for name, arms in curves.items():
        for arm, c in arms.items():
            out.append(f"| `{name}` | {arm} | " + " | ".join(f"{c[x]:.4g}" if x in c else "" for x in steps) + " |")
    return out


def plot_secondary(spec: dict, records: dict, path: Path, client=None) -> Path | None:
    """One panel per ``secondary`` metric: its per-step mean over seeds, a line per arm; None when nothing
    was logged."""
    curves = secondary_curves(spec, records, client)
    if not curves:
        return None
    import matplotlib  # heavy, only for plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy, only for plots
    from analysis.plots import integer_steps  # imports matplotlib: only for plots

    n = len(curves)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows), squeeze=False)
    for ax, (name, arms) in zip(axes.flat, curves.items()):
        for arm, c in arms.items():
            xs = sorted(c)
            ax.plot(xs, [c[x] for x in xs], marker=".", label=arm)
        ax.set_title(name, fontsize="small")
        ax.set_xlabel("step", fontsize="small")
        integer_steps(ax)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize="x-small")
    fig.suptitle(f"{spec['name']}: secondary metrics, mean over seeds", fontsize="medium")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


def plot_family(spec: dict, records: dict, results: dict, path: Path, client=None) -> Path | None:
    """A study with ``comparisons`` on one figure: a panel per arm (the control first) with the primary
    metric vs step, every seed a thin line and the arm's mean a thick one, the control's mean dashed in
    every panel, and the comparison's verdict in the title; a second thin line style for ``train/accuracy``
    when the runs logged it (sampled, every step). None when no run finished."""
    if not any(records.values()):
        return None
    import matplotlib  # heavy, only for plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy, only for plots
    from analysis.plots import integer_steps  # imports matplotlib: only for plots

    client = client or MlflowClient(store_uri(spec))
    scale = spec["metric"].get("scale", 1)
    arms = [spec["control"], *spec["comparisons"]]
    cols = min(4, len(arms))
    rows = math.ceil(len(arms) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.9 * rows), squeeze=False, sharey=True)

    def mean_curve(curves):
        steps = sorted(set.intersection(*(set(h) for h in curves))) if curves else []
        return steps, [np.mean([h[x] for h in curves]) * scale for x in steps]

    control = [metric_history(spec, r, client) for _, r in sorted(records.get(spec["control"], {}).items())]
    for i, (ax, arm) in enumerate(zip(axes.flat, arms)):
        color = f"C{i}"
        evals = [metric_history(spec, r, client) for _, r in sorted(records.get(arm, {}).items())]
        train = [{m.step: m.value for m in client.get_metric_history(r.run_id, "train/accuracy")}
                 for _, r in sorted(records.get(arm, {}).items())]
        for h in train:
            ax.plot(sorted(h), [h[x] * scale for x in sorted(h)], lw=0.5, alpha=0.35, color=color, ls=":")
        for h in evals:
            ax.plot(sorted(h), [h[x] * scale for x in sorted(h)], lw=0.7, alpha=0.6, color=color, marker=".")
        if evals:
            ax.plot(*mean_curve(evals), lw=2.2, color=color, label=f"{arm} ({len(evals)} seeds)")
        if arm != spec["control"] and control:
            ax.plot(*mean_curve(control), lw=1.2, color="k", ls="--", label=f"{spec['control']} mean")
        verdict = (results.get(arm) or {}).get("verdict") if arm != spec["control"] else "control"
        ax.set_title(f"{arm}: {verdict}" if evals else f"{arm}: not run", fontsize="small")
        ax.set_xlabel("training step", fontsize="small")
        integer_steps(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="xx-small", loc="lower right")
    for ax in list(axes.flat)[len(arms):]:
        ax.axis("off")
    name = spec["metric"]["name"]
    axes[0][0].set_ylabel(f"{name} (x{scale})" if scale != 1 else name, fontsize="small")
    fig.suptitle(f"{spec['name']}: {name}, every seed (thin: greedy eval with dots, train/accuracy dotted), "
                 f"arm mean (thick)", fontsize="medium")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})  # no version string: regenerates byte for byte
    plt.close(fig)
    return path


def run_meta(records: dict, machine: str) -> dict:
    recs = [r for runs in records.values() for r in runs.values()]
    times = sorted(r.params.get("_start_ms", 0) for r in recs)
    fmt = lambda ms: datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M") if ms else "n/a"
    return {"machine": machine, "first": fmt(times[0]) if times else "n/a", "last": fmt(times[-1]) if times else "n/a"}


def _annotate(spec: dict, records: dict, root: Path) -> tuple[list[str], str | None]:
    """Start times into the records (for run_meta); the provenance lines from the run tags, and the
    machine(s) the runs recorded (``provenance.machine.cpu`` / ``.cores`` params; None when no run
    recorded one), so that a report regenerated elsewhere still names where the runs were measured."""
    client = MlflowClient(store_uri(spec, root))
    commits, dirty, machines, bf16 = set(), set(), set(), set()
    for runs in records.values():
        for r in runs.values():
            run = client.get_run(r.run_id)
            bf16.add(run.data.params.get("provenance.machine.cpu_bf16", "not recorded"))
            r.params["_start_ms"] = run.info.start_time or 0
            r.params["_end_ms"] = run.info.end_time or r.params["_start_ms"]
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


def index(root: Path = RESULTS, studies: Path = Path("studies")) -> Path:
    """``results/STUDIES.md``: one row per study file (its result.json when it ran)."""
    rows = ["# Studies", "",
            "Pre-registered studies (`studies/<name>.yaml`), each run and reported by "
            "`python -m analysis.study studies/<name>.yaml` (see `analysis/study.py`); regenerate every report "
            "from the committed stores with `python -m analysis.study --no-run studies/*.yaml`.", "",
            "| study | claim | source | our setup | effect (CI) | verdict | power | report | regenerate |",
            "|---|---|---|---|---|---|---|---|---|"]
    short = ["| study | claim | budget | effect (CI) | verdict |", "|---|---|---|---|---|"]
    files = [(f, load_study(f)) for f in sorted(studies.glob("*.yaml"))]
    # a study named in another file's ``pilots`` was superseded by that file's second version: its
    # row stays here, the README keeps the current versions (it stays <= 150 lines)
    superseded = {p: study["name"] for _, study in files for p in study.get("pilots", [])}
    # the README's first row group: the studies with ``comparisons`` (the design card's grid), one row per arm
    families = [(f, s) for f, s in files if "comparisons" in s]
    not_run = []  # studies with no finished run: named in the README's note, rows here
    for f, study in families + [(f, s) for f, s in files if "comparisons" not in s]:
        res_path = study_dir(study, root) / "result.json"
        res = json.loads(res_path.read_text()) if res_path.exists() else None
        keep = short if study["name"] not in superseded else []
        finished = (res or {}).get("cost", {}).get("runs") if "comparisons" in study else (res or {}).get("runs_finished")
        if not finished and study["name"] not in superseded:
            not_run.append(study["name"])
            keep = []
        if "comparisons" in study:  # the family's own row first: its claim once, what was decided, its cost
            _family_row(study, res, f, rows, keep)
        for spec, sub_res, page in _index_entries(study, res):
            _index_rows(spec, sub_res, page, f, rows, keep)
    notes = []
    for _, study in families:
        figure = family_figure(study, root)
        if figure.exists():
            rel = figure.relative_to(root).as_posix()
            notes.append(f"`{study['name']}`, every arm vs step: [{rel}](results/{rel}).")
    if superseded:
        pilots = ", ".join(f"`{p}` ({v})" for p, v in sorted(superseded.items()))
        notes.append(f"Pilots superseded by a second version, with their rows in "
                     f"[results/STUDIES.md](results/STUDIES.md): {pilots}.")
    if not_run:
        notes.append("Registered, not run yet (rows in [results/STUDIES.md](results/STUDIES.md)): "
                     + ", ".join(f"`{n}`" for n in not_run) + ".")
    if notes:
        short += ["", " ".join(notes)]
    out = root / "STUDIES.md"
    out.write_text("\n".join(rows) + "\n")
    readme = Path("README.md")
    if root == RESULTS and readme.exists():
        update_readme(readme, short)
    return out


def _index_entries(spec: dict, res: dict | None) -> list[tuple[dict, dict | None, str]]:
    """``(spec, result or None, report page stem)`` per row: one for a two-arm study, one per
    comparison (its :func:`analysis.multiarm.sub_spec`) for a study with ``comparisons``; ``res``: the
    study's result.json."""
    if "comparisons" not in spec:
        return [(spec, res, spec["name"])]
    return [(multiarm.sub_spec(spec, a), (res or {}).get("comparisons", {}).get(a), f"{spec['name']}--{a}")
            for a in spec["comparisons"]]


def _family_row(spec: dict, res: dict | None, f: Path, rows: list[str], short: list[str]) -> None:
    """A family's header row in the full table ``rows`` and the README's ``short`` one: its claim once,
    "k of n comparisons decided" (naming the decided ones), the seeds its comparisons used and its cost
    (runs, run-hours: the sum of the runs' MLflow durations); its comparisons' rows follow."""
    n, seq = len(spec["comparisons"]), spec.get("sequential")
    ran = {a: r for a, r in (res or {}).get("comparisons", {}).items() if r.get("runs_finished")}
    label = f"{spec['name']}: {n} comparisons with {spec['control']}"
    design = f"{seq['first']}-{seq['max_seeds']}, sequential" if seq else "fixed"
    if ran:
        decided = [f"{a} {r['verdict']}" for a, r in ran.items() if r["verdict"] != "inconclusive"]
        verdict = f"{len(decided)} of {n} comparisons decided" + (f": {', '.join(decided)}" if decided else "")
        used = sorted({r["seeds_used"] for r in ran.values()})
        cost = res.get("cost", {})
        seeds = f"{used[0]}-{used[-1]} seeds used ({design})" if len(used) > 1 else f"{used[0]} seeds used ({design})"
        cost_text = f"; {cost['runs']} runs, {cost['run_hours']:.1f} run-hours" if cost else ""
        measured = next((r["measured"] for r in ran.values() if r.get("measured")), "")
    else:
        verdict, seeds, cost_text, measured = f"not run ({spec.get('not_run', 'no finished run yet')})", \
            f"{len(spec['seeds'])} seeds ({design})", "", ""
    figure = (res or {}).get("figure")
    setup = spec.get("setup", "") + (f" (measured on {measured})" if measured else "")
    cells = [f"`{label}`", spec["claim"], spec["source"], setup, "-", verdict + cost_text, "-",
             f"[{figure}]({figure})" if figure else "-", f"`python -m analysis.study {f.as_posix()}`"]
    rows.append(_md_row(cells))
    link = f"[{label}](results/{figure})" if figure else f"`{label}`"
    budget = f"{seeds} x {spec['steps']} steps, {spec['eval_size']} eval problems{cost_text}"
    short.append(_md_row((link, spec["claim"], budget, "-", verdict)))


def _md_row(cells) -> str:
    """One markdown table row (``|`` inside a cell escaped)."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _row_claim(spec: dict) -> str:
    """The claim of a row: the study's, or for one comparison of a family its own (the family's claim is in
    the family's row and the comparison's report)."""
    if "comparison_of" not in spec:
        return spec["claim"]
    test, scale = spec["test"], spec["metric"].get("scale", 1)
    return (f"{spec['treatment']} reaches {spec['control']}'s {spec['metric']['name']} within "
            f"{test['margin'] * scale:g} points" if test["kind"] == "equivalence"
            else f"{spec['treatment']} differs from {spec['control']} in {spec['metric']['name']}")


def _index_rows(spec: dict, res: dict | None, page: str, f: Path, rows: list[str], short: list[str]) -> None:
    """Append ``spec``'s row to the full table ``rows`` and the README's ``short`` table."""
    label = spec["name"] if page == spec["name"] else f"{spec['name']}: {spec['treatment']} - {spec['control']}"
    if res is not None:
        p = res["power"]
        cap = lambda k: str(p[k]) if p[k] < 10_000 else ">= 10,000"
        power = (f"{p['power']:.2f}; {p['seeds_needed']} seeds for 80% ({cap('seeds_needed_lo')} to "
                 f"{cap('seeds_needed_hi')} over the sd's 95% interval)" if p.get("power") is not None else "n/a")
        eff, ver = res["effect_text"], res["verdict_text"]
        setup = spec.get("setup", "") + (f" (measured on {res['measured']})" if res.get("measured") else "")
        report = f"[{page}.md](studies/{page}.md)"
    else:
        eff, ver, power, report = "n/a", f"not run ({spec.get('not_run', 'no finished run yet')})", "n/a", "-"
        setup = spec.get("setup", "")
    cells = [f"`{label}`", _row_claim(spec), spec["source"], setup, eff, ver, power, report,
             f"`python -m analysis.study {f.as_posix()}`"]
    rows.append(_md_row(cells))
    link = f"[{label}](results/studies/{page}.md)" if res is not None and res.get("runs_finished") else f"`{label}`"
    seeds = (f"{spec['sequential']['first']}-{spec['sequential']['max_seeds']} seeds (sequential)"
             if "sequential" in spec else f"{len(spec['seeds'])} seeds")
    if "sequential" in spec and res is not None and res.get("runs_finished") and "seeds_used" in res:
        seeds = f"{res['seeds_used']} seeds used ({spec['sequential']['first']}-{spec['sequential']['max_seeds']}, sequential)"
    budget = f"{seeds} x {spec['steps']} steps, {spec['eval_size']} eval problems"
    short.append(_md_row((link, _row_claim(spec), budget, eff, ver)))


README_MARKS = ("<!-- studies-table: copied from results/STUDIES.md -->", "<!-- /studies-table -->")


def update_readme(readme: Path, rows: list[str]) -> bool:
    """Put ``rows`` (a short markdown table) between the README's studies-table markers; False when
    the markers are not there (the README is left as it is)."""
    text = readme.read_text()
    start, end = README_MARKS
    if start not in text or end not in text:
        return False
    head, rest = text.split(start, 1)
    readme.write_text(head + start + "\n" + "\n".join(rows) + "\n" + end + rest.split(end, 1)[1])
    return True


def report(spec: dict, study_file: Path, root: Path = RESULTS, machine: str | None = None) -> dict:
    """Analyse the store and write the report, result.json and the index. A study with ``comparisons``
    writes one report per comparison (``<name>--<arm>.md``, :func:`analysis.multiarm.sub_spec`) and a
    result.json holding ``{"comparisons": {arm: result}}``."""
    if "comparisons" in spec:
        return _report_family(spec, study_file, root, machine)
    records = load_records(spec, root)
    provenance, recorded = _annotate(spec, records, root) if any(records.values()) else ([], None)
    # no client on a study never run: opening the uri would create an empty store
    client = MlflowClient(store_uri(spec, root)) if any(records.values()) else None
    result = analyse(spec, records, client=client)
    meta = {**run_meta(records, machine or recorded or _machine()), "provenance": provenance}
    boot = result.get("bootstrap", {}).get("verdict")
    if boot and boot != result["verdict"] and meta["first"] < RULE_SINCE:  # issued under the old rule
        result["verdict_before"] = boot
    _mark_reissued(result, meta)
    suffix = "-gpu" if spec.get("variant") == "gpu" else ""
    path = root / "studies" / f"{spec['name']}{suffix}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_report(spec, result, records, path, study_file, meta, client)
    result["measured"] = f"{meta['machine']}, {meta['first'][:10]}" if result["runs_finished"] else ""
    result["effect_text"] = effect_text(spec, result)
    result["verdict_text"] = verdict_text(spec, result)
    d = study_dir(spec, root)
    d.mkdir(parents=True, exist_ok=True)
    (d / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True, default=float) + "\n")
    return result


def _mark_reissued(result: dict, meta: dict) -> None:
    """``result["verdict_before_t"]``: the z boundaries' verdict (:func:`z_boundary_verdict`) when it
    differs from the t boundaries' and the study's runs started before those decided
    (``T_BOUNDARIES_SINCE``): the report names the verdict it was issued with."""
    z = result.get("z_boundaries")
    if z and z["verdict"] != result["verdict"] and meta["first"] < T_BOUNDARIES_SINCE:
        result["verdict_before_t"] = z


def family_figure(spec: dict, root: Path) -> Path:
    """Where :func:`plot_family` writes the figure of a study with ``comparisons``:
    ``<root>/plots/<name>_arms.png`` (the README links it once it exists)."""
    return root / "plots" / f"{spec['name']}_arms.png"


def _report_family(spec: dict, study_file: Path, root: Path, machine: str | None) -> dict:
    records = load_records(spec, root)
    provenance, recorded = _annotate(spec, records, root) if any(records.values()) else ([], None)
    client = MlflowClient(store_uri(spec, root)) if any(records.values()) else None
    meta = {**run_meta(records, machine or recorded or _machine()), "provenance": provenance}
    out = {}
    for arm in spec["comparisons"]:
        sub = multiarm.sub_spec(spec, arm)
        result = analyse(sub, records, client=client)
        _mark_reissued(result, meta)
        path = root / "studies" / f"{spec['name']}--{arm}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_report(sub, result, records, path, study_file, meta, client)
        result["measured"] = f"{meta['machine']}, {meta['first'][:10]}" if result["runs_finished"] else ""
        result["effect_text"], result["verdict_text"] = effect_text(sub, result), verdict_text(sub, result)
        out[arm] = result
    d = study_dir(spec, root)
    d.mkdir(parents=True, exist_ok=True)
    runs = [r for arm_runs in records.values() for r in arm_runs.values()]
    family = {"comparisons": out, "correction": "bonferroni", "m": len(out),
              "cost": {"runs": len(runs), "run_hours": sum(r.params["_end_ms"] - r.params["_start_ms"] for r in runs)
                       / 3.6e6} if runs else {}}
    figure = plot_family(spec, records, out, family_figure(spec, root), client)
    if figure is not None:
        family["figure"] = figure.relative_to(root).as_posix()
    (d / "result.json").write_text(json.dumps(family, indent=1, sort_keys=True, default=float) + "\n")
    return family


def _machine() -> str:
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = "unknown CPU"
    return f"{model} ({os.cpu_count()} cores)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("studies", nargs="+", type=Path, help="studies/<name>.yaml files")
    ap.add_argument("--no-run", action="store_true", help="report from the stores; launch nothing")
    ap.add_argument("--gpu", action="store_true", help="the study file's gpu arm set")
    ap.add_argument("--jobs", type=int, default=None, help="jobs at once (joblib); default: the file's `jobs`")
    ap.add_argument("--launcher", default=None, help="hydra/launcher: joblib, slurm, ray_local")
    ap.add_argument("--keep-checkpoints", action="store_true")
    ap.add_argument("--machine", default=None, help="the machine named in the report (default: the one the runs "
                    "recorded, else /proc/cpuinfo)")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--t-table", action="store_true", help="derive the t boundaries of the studies' sequential "
                    "designs into analysis/t_boundaries.json (with the designs already there); nothing else")
    args = ap.parse_args(argv)
    if args.t_table:
        designs = [d for f in args.studies for d in t_table_designs(load_study(f))]
        print(f"wrote {seedtest.write_t_table(designs)}: {len(designs)} study design(s) and the table's others")
        return 0
    for f in args.studies:
        try:
            spec = load_study(f, gpu=args.gpu)
            if args.no_run:
                check_registration(spec, args.results, has_finished=any(load_records(spec, args.results).values()))
            else:
                run_study(spec, args.results, args.jobs, args.launcher, args.keep_checkpoints)
            res = report(spec, f, args.results, args.machine)
        except StudyError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for label, r in ((f"{spec['name']}: {a} - {spec['control']}", r) for a, r in res["comparisons"].items()) \
                if "comparisons" in res else [(spec["name"], res)]:
            print(f"{label}: {r['verdict_text']}; effect {r['effect_text']}")
    index(args.results, args.studies[0].parent)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
