"""A study file: its keys checked, its registration written once and then held, where its store lives.

The keys are listed in :mod:`analysis.study`. The registration (``registration.json`` beside the
store) is what a study with a FINISHED run may not change; a new registration must meet the
minimum design (:func:`check_minimum`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from analysis import stats

RESULTS = Path("results")
REGISTERED = ("claim", "source", "base", "arms", "control", "treatment", "seeds", "steps", "eval_size",
              "metric", "test")
OPTIONAL_REGISTERED = ("sequential", "comparisons")  # registered when the file has them (older registrations stay as written)
VERDICTS = ("reproduced", "contradicted", "inconclusive")
EVAL_SUMMARIES = ("final", "auc")
SEQUENTIAL_KEYS = ("first", "add", "max_seeds", "boundary")
# when the verdict rule changed, and why (paired_t_rule: the paired t replaced the two-level bootstrap;
# t_boundaries: the looks' t boundaries replaced the z boundaries); a study whose runs started before a
# change names the verdict the earlier rule gave beside its own when they differ
RULE_CHANGES_FILE = Path(__file__).resolve().parents[2] / "studies" / "verdict_rules.json"
RULE_CHANGES = json.loads(RULE_CHANGES_FILE.read_text())


class StudyError(ValueError):
    """A study file that cannot be run as written, or a change to a registered study."""


def load_study(path: str | Path, gpu: bool = False) -> dict:
    """The study file as a dict, checked; with ``gpu`` its ``gpu`` section replaces the CPU arm set.

    Raises:
        StudyError: a missing key, ``name`` not the file stem, unknown arm names in
            ``control`` / ``treatment`` / ``comparisons``, an unknown test kind or metric summary, a
            malformed ``sequential`` block.
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
    if "comparisons" in spec:  # several arms against one control (analysis/stats/family.py)
        _check_comparisons(path, spec)
    for role in ("control", "treatment"):
        if role in spec and spec[role] not in spec["arms"]:
            raise StudyError(f"{path}: {role} {spec[role]!r} is not an arm ({sorted(spec['arms'])})")
    _check_test(path, spec)
    if "sequential" in spec:
        _check_sequential(path, spec)
    for key in ("secondary", "per_step"):
        if key in spec and not (isinstance(spec[key], list) and all(isinstance(m, str) for m in spec[key])):
            raise StudyError(f"{path}: {key} must be a list of metric names, got {spec[key]!r}")
    spec.setdefault("variant", "cpu")
    spec["file"] = path.as_posix()  # for error messages; not registered
    return spec


def _check_test(path: Path, spec: dict) -> None:
    test = spec["test"]
    if test.get("kind") not in ("difference", "equivalence"):
        raise StudyError(f"{path}: test.kind must be difference or equivalence, got {test.get('kind')!r}")
    if test["kind"] == "equivalence" and not (test.get("margin") or 0) > 0:
        raise StudyError(f"{path}: an equivalence test needs margin > 0")
    if test["kind"] == "difference" and test.get("sign") not in (1, -1):
        raise StudyError(f"{path}: a difference test needs sign +1 or -1")
    if spec["metric"].get("summary") not in (*EVAL_SUMMARIES, "last_third"):
        raise StudyError(f"{path}: metric.summary must be final, auc or last_third")


def _check_comparisons(path: Path, spec: dict) -> None:
    """A study's ``comparisons`` block: a list of at least 2 distinct arm names other than ``control``,
    and no ``treatment`` beside it."""
    comps = spec["comparisons"]
    if "treatment" in spec:
        raise StudyError(f"{path}: give either treatment (one comparison) or comparisons (several), not both")
    if not isinstance(comps, list) or len(comps) < 2 or len(set(comps)) != len(comps):
        raise StudyError(f"{path}: comparisons must be a list of at least 2 distinct arm names, got {comps!r}")
    for c in comps:
        if c not in spec["arms"] or c == spec["control"]:
            raise StudyError(f"{path}: comparison {c!r} must be an arm other than the control "
                             f"{spec['control']!r} ({sorted(spec['arms'])})")


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
    if seq["boundary"] not in stats.BOUNDARIES:
        raise StudyError(f"{path}: sequential.boundary must be one of {', '.join(stats.BOUNDARIES)}, "
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
    if n < stats.MIN_SEEDS:
        raise StudyError(f"{f}: {field} gives {n} seeds per arm; a new study needs at least {stats.MIN_SEEDS} (a "
                         f"test over per-seed effects with {n - 1} degree(s) of freedom cannot hold its error rate)")
    if window_steps(spec) == 1:
        raise StudyError(f"{f}: steps {spec['steps']} gives a last_third window of 1 step; a new study with a "
                         f"train metric needs at least 2 window steps (steps >= 4)")


def study_dir(spec: dict, root: Path = RESULTS) -> Path:
    """``<root>/studies/<name>`` (``.../gpu`` for the GPU arm set): the store, registration and result."""
    d = root / "studies" / spec["name"]
    return d / "gpu" if spec.get("variant") == "gpu" else d


def store_uri(spec: dict, root: Path = RESULTS) -> str:
    """The study's MLflow store: ``sqlite:///<study_dir>/mlflow.db``."""
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
