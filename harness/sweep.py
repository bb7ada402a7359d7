"""Optuna sweeps over harness runs: ``python -m harness.sweep sweeps/<name>.yaml [overrides] [options]``.

A thin native Optuna driver (the hydra-optuna-sweeper plugin pins optuna<3). Each trial
composes the Hydra config from ``conf/`` (fixed overrides of the sweep file, then the
command-line overrides, then the sampled ``key=value`` pairs), tags the MLflow run with
``tracking.sweep=<study>`` / ``tracking.run_name=<study>-trial<N>`` and calls
:func:`harness.run.train`, reporting the sweep metric after every eval so the pruner can
stop bad trials (a pruned run ends KILLED in MLflow, with a checkpoint).

Sweep file keys (see ``sweeps/*.yaml``)::

    study_name: arith-grpo          # required
    storage: sqlite:///optuna.db    # any SQLAlchemy URL (postgresql://... to share across machines)
    direction: maximize             # or minimize
    metric: eval/accuracy           # objective = this eval metric at the final eval
    n_trials: 20                    # required; COMPLETE + PRUNED trials of the study count toward it
    sampler: {type: tpe, seed: 0}   # tpe | random | grid (all params categorical), + their kwargs
    pruner: {type: median, n_startup_trials: 3, n_warmup_steps: 5}   # median | none
    heartbeat: {interval: 60, grace_period: 120, max_retry: 1}
    overrides: [task=arith, advantage=grpo, train.steps=20]
    params:
      train.lr: {type: float, low: 1.0e-6, high: 1.0e-4, log: true}
      group_size: {type: categorical, choices: [4, 8, 16]}
      advantage: {type: categorical, choices: [grpo, rloo]}    # a config group works too

Resume and crashed workers:

* Rerunning the same command loads the study (``load_if_exists``) and runs only
  ``n_trials - (#COMPLETE + #PRUNED)`` trials; several workers (machines) may share one
  storage, and each stops once the study holds ``n_trials`` finished trials.
* Every worker writes a heartbeat for its running trial (``RDBStorage(heartbeat_interval,
  grace_period)``). A trial whose worker died (SIGKILL, lost machine) stays RUNNING; once its
  heartbeat is older than ``grace_period`` the next invocation (and every worker before each
  new trial) marks it FAIL and queues a retry with the same parameters (at most ``max_retry``
  times). A trial stopped with Ctrl-C / SIGTERM is marked FAIL and re-queued at once.
* Each trial checkpoints into ``<checkpoint.dir or ./checkpoints>/sweeps/<study>/trial<N>-<config
  key>``; a retry uses the original trial's number there, so on the same machine it resumes
  the dead trial's checkpoint and MLflow run. The MLflow run name keeps the original number.
* The sampler is seeded with ``seed + number of trials already in the study``, so a resumed
  sweep does not repeat the parameters of its first invocation. Workers started together on one
  study should get different ``--seed`` values.

Exit status: 0 done; 1 no trial completed and some failed in this invocation; 2 a bad sweep
file or config (one line naming the file and key); 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import signal
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("harness.sweep")

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
DEFAULT_STORAGE = "sqlite:///optuna.db"
DEFAULT_METRIC = "eval/accuracy"
TOP_KEYS = {"study_name", "storage", "direction", "metric", "n_trials", "sampler", "pruner", "heartbeat",
            "overrides", "params"}
PARAM_KEYS = {"float": {"type", "low", "high", "log", "step"}, "int": {"type", "low", "high", "log", "step"},
              "categorical": {"type", "choices"}}
SAMPLER_KEYS = {"tpe": {"type", "seed", "n_startup_trials", "n_ei_candidates", "multivariate", "group",
                        "constant_liar"},
                "random": {"type", "seed"},
                "grid": {"type", "seed"}}  # every combination of categorical params, each once
PRUNER_KEYS = {"median": {"type", "n_startup_trials", "n_warmup_steps", "interval_steps", "n_min_trials"},
               "none": {"type"}}
HEARTBEAT_KEYS = {"interval", "grace_period", "max_retry"}


class SweepError(ValueError):
    """A bad sweep file or sweep-wide config error; the message names the file and key."""


class TrialFailed(RuntimeError):
    """One trial failed (diverged, out of memory, ...); the sweep goes on with the next one."""


# --------------------------------------------------------------------------- sweep file


@dataclass
class Param:
    """One search dimension; ``name`` is a Hydra override key (``train.lr``, ``advantage``)."""

    name: str
    type: str
    low: Any = None
    high: Any = None
    log: bool = False
    step: Any = None
    choices: list = field(default_factory=list)

    def suggest(self, trial):
        if self.type == "float":
            return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)
        if self.type == "int":
            return trial.suggest_int(self.name, self.low, self.high, log=self.log, step=self.step or 1)
        return trial.suggest_categorical(self.name, self.choices)

    def probe_values(self) -> list:
        """Values composed before the sweep starts (catches unknown keys / group options early)."""
        return list(self.choices) if self.type == "categorical" else [self.low, self.high]


@dataclass
class Sweep:
    path: str
    study_name: str
    n_trials: int
    params: list
    storage: str = DEFAULT_STORAGE
    direction: str = "maximize"
    metric: str = DEFAULT_METRIC
    sampler: dict = field(default_factory=lambda: {"type": "tpe", "seed": 0})
    pruner: dict = field(default_factory=lambda: {"type": "none"})
    heartbeat: dict = field(default_factory=dict)
    overrides: list = field(default_factory=list)

    def err(self, key: str, msg: str) -> SweepError:
        return SweepError(f"{self.path}: {key}: {msg}")


def _check_keys(path: str, where: str, d: dict, allowed: set) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise SweepError(f"{path}: {where}{unknown[0]}: unknown key (expected one of {sorted(allowed)})")


def _number(path: str, key: str, v, kind: type) -> Any:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) if kind is float else (
        isinstance(v, int) and not isinstance(v, bool))
    if not ok:
        raise SweepError(f"{path}: {key}: expected {'a number' if kind is float else 'an integer'}, got {v!r}")
    return kind(v)


def _section(path: str, key: str, raw, allowed_by_type: dict, default_type: str | None) -> dict:
    if raw is None or isinstance(raw, str):  # `pruner: none`, `sampler: tpe`
        raw = {"type": raw or "none"}
    if not isinstance(raw, dict):
        raise SweepError(f"{path}: {key}: expected a mapping with a 'type', got {raw!r}")
    raw = dict(raw)
    kind = str(raw.get("type", default_type))
    if kind not in allowed_by_type:
        raise SweepError(f"{path}: {key}.type: unknown {key} {kind!r} (expected one of {sorted(allowed_by_type)})")
    raw["type"] = kind
    _check_keys(path, f"{key}.", raw, allowed_by_type[kind])
    return raw


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file.

    Raises:
        SweepError: one line naming the file and the offending key.
    """
    import yaml

    p = str(path)
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise SweepError(f"{p}: no such sweep file") from None
    except yaml.YAMLError as e:
        raise SweepError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise SweepError(f"{p}: expected a mapping of sweep keys (study_name, n_trials, params, ...)")
    _check_keys(p, "", raw, TOP_KEYS)
    for key in ("study_name", "n_trials", "params"):
        if raw.get(key) is None:
            raise SweepError(f"{p}: {key}: missing required key")
    if not isinstance(raw["study_name"], str) or not re.fullmatch(r"[\w.\-]+", raw["study_name"]):
        raise SweepError(f"{p}: study_name: expected letters, digits, '_', '-' or '.', got {raw['study_name']!r}")
    n_trials = _number(p, "n_trials", raw["n_trials"], int)
    direction = raw.get("direction", "maximize")
    if direction not in ("maximize", "minimize"):
        raise SweepError(f"{p}: direction: expected maximize or minimize, got {direction!r}")
    overrides = raw.get("overrides") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
        raise SweepError(f"{p}: overrides: expected a list of Hydra 'key=value' strings, got {overrides!r}")
    if not isinstance(raw["params"], dict) or not raw["params"]:
        raise SweepError(f"{p}: params: expected a non-empty mapping of override key -> search space")
    params = []
    for name, spec in raw["params"].items():
        key = f"params.{name}"
        if not isinstance(spec, dict):
            raise SweepError(f"{p}: {key}: expected a mapping like {{type: float, low: .., high: ..}}")
        kind = spec.get("type")
        if kind is None:
            raise SweepError(f"{p}: {key}.type: missing required key (float, int or categorical)")
        if kind not in PARAM_KEYS:
            raise SweepError(f"{p}: {key}.type: unknown type {kind!r} (expected float, int or categorical)")
        _check_keys(p, f"{key}.", spec, PARAM_KEYS[kind])
        if kind == "categorical":
            choices = spec.get("choices")
            if not isinstance(choices, list) or not choices:
                raise SweepError(f"{p}: {key}.choices: expected a non-empty list")
            if not all(c is None or isinstance(c, (bool, int, float, str)) for c in choices):
                raise SweepError(f"{p}: {key}.choices: only null, bool, int, float and str values are allowed")
            params.append(Param(str(name), kind, choices=choices))
            continue
        num = float if kind == "float" else int
        for bound in ("low", "high"):
            if bound not in spec:
                raise SweepError(f"{p}: {key}.{bound}: missing required key for type {kind}")
        low, high = _number(p, f"{key}.low", spec["low"], num), _number(p, f"{key}.high", spec["high"], num)
        if low > high:
            raise SweepError(f"{p}: {key}.low: {low} is above high={high}")
        log_ = bool(spec.get("log", False))
        if log_ and low <= 0:
            raise SweepError(f"{p}: {key}.low: log scale needs low > 0, got {low}")
        step = _number(p, f"{key}.step", spec["step"], num) if spec.get("step") is not None else None
        if step is not None and log_:
            raise SweepError(f"{p}: {key}.step: cannot be combined with log: true")
        params.append(Param(str(name), kind, low=low, high=high, log=log_, step=step))
    hb = raw.get("heartbeat") or {}
    if not isinstance(hb, dict):
        raise SweepError(f"{p}: heartbeat: expected a mapping {{interval, grace_period, max_retry}}")
    _check_keys(p, "heartbeat.", hb, HEARTBEAT_KEYS)
    for k, v in hb.items():
        if not (v is None and k == "max_retry") and _number(p, f"heartbeat.{k}", v, int) < (0 if k == "max_retry" else 1):
            raise SweepError(f"{p}: heartbeat.{k}: expected a positive integer, got {v!r}")
    metric = raw.get("metric", DEFAULT_METRIC)
    if not isinstance(metric, str) or not metric:
        raise SweepError(f"{p}: metric: expected a metric name like eval/accuracy, got {metric!r}")
    sampler = _section(p, "sampler", raw.get("sampler", {"type": "tpe"}), SAMPLER_KEYS, "tpe")
    if sampler["type"] == "grid":
        for prm in params:
            if prm.type != "categorical":
                raise SweepError(f"{p}: params.{prm.name}.type: the grid sampler needs categorical params")
    return Sweep(
        path=p, study_name=raw["study_name"], n_trials=n_trials, params=params,
        storage=str(raw.get("storage") or DEFAULT_STORAGE), direction=direction, metric=metric,
        sampler=sampler,
        pruner=_section(p, "pruner", raw.get("pruner", "none"), PRUNER_KEYS, "median"),
        heartbeat=hb, overrides=list(overrides),
    )


# ------------------------------------------------------------------------- overrides


def format_value(v) -> str:
    """A sampled value as a Hydra override value (floats keep full precision)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else str(v)
    s = str(v)
    if re.fullmatch(r"[\w\-./:+@]+", s):
        return s
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _override_key(o: str) -> str:
    return o.split("=", 1)[0].lstrip("+~")


def merge_overrides(*lists) -> list[str]:
    """Concatenate override lists; a later ``key=`` replaces an earlier one (in its place)."""
    merged: dict[str, str] = {}
    for lst in lists:
        for o in lst:
            k = _override_key(o)
            merged.pop(k, None)
            merged[k] = o
    return list(merged.values())


def compose(overrides: list[str]):
    """Compose ``conf/config.yaml`` with ``overrides`` (Hydra compose API, no app)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from harness.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def _config_errors() -> tuple:
    """Errors that would hit every trial alike: stop the sweep with a one-line message."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from harness.models import ModelLoadError
    from harness.run import USER_ERRORS
    from harness.tasks.data import DataError
    from harness.tracking import TrackingError

    return (SweepError, HydraException, OmegaConfBaseException, DataError, ModelLoadError, TrackingError,
            *USER_ERRORS)


def preflight(sweep: Sweep, base: list[str]) -> None:
    """Compose and validate the config for every categorical choice and numeric bound.

    Raises:
        SweepError: naming the sweep file and the parameter (or ``overrides``) that fails.
    """
    from harness.validate import validate

    def check(where: str, ovr: list[str]) -> None:
        try:
            validate(compose(ovr))
        except _config_errors() as e:
            msg = " ".join(str(e).split()).split(" Config search path:")[0]
            raise sweep.err(where, f"{msg} (overrides: {' '.join(ovr)})") from None

    check("overrides", base)
    for p in sweep.params:
        for v in p.probe_values():
            check(f"params.{p.name}", merge_overrides(base, [f"{p.name}={format_value(v)}"]))
    check("params", merge_overrides(base, [f"{p.name}={format_value(p.probe_values()[0])}" for p in sweep.params]))


# --------------------------------------------------------------------------- storage


def make_storage(url: str, heartbeat: dict):
    """RDBStorage with heartbeats; stale RUNNING trials are failed and retried (``max_retry``)."""
    from optuna.exceptions import ExperimentalWarning
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        interval = int(heartbeat.get("interval", 60))
        return RDBStorage(
            url, engine_kwargs=kwargs, heartbeat_interval=interval,
            grace_period=int(heartbeat.get("grace_period", 2 * interval)),
            heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(
                max_retry=heartbeat.get("max_retry", 1), inherit_intermediate_values=True),
        )


def build_sampler(spec: dict, params: list, seed_offset: int, seed: int | None = None):
    import optuna

    kw = {k: v for k, v in spec.items() if k != "type"}
    if seed is not None:
        kw["seed"] = seed
    if kw.get("seed") is not None:
        kw["seed"] = int(kw["seed"]) + seed_offset
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if spec["type"] == "random":
            return optuna.samplers.RandomSampler(**kw)
        if spec["type"] == "grid":
            return optuna.samplers.GridSampler({p.name: p.choices for p in params}, **kw)
        return optuna.samplers.TPESampler(**kw)


def build_pruner(spec: dict):
    import optuna

    if spec["type"] == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(**{k: v for k, v in spec.items() if k != "type"})


def _retry(study, trial_number: int) -> None:
    """Queue a WAITING copy of a FAIL trial (same params, same original number)."""
    from optuna.exceptions import ExperimentalWarning
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    frozen = study._storage.get_trial(study._storage.get_trial_id_from_study_id_trial_number(
        study._study_id, trial_number))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        RetryHeartbeatStaleTrialCallback(inherit_intermediate_values=True)(study, frozen)


# ---------------------------------------------------------------------------- MLflow


def _mlflow_uri(cfg) -> str:
    """The tracking URI ``train`` uses (relative sqlite paths are under the launch dir)."""
    from harness.tracking import resolve_uri

    uri = resolve_uri(cfg.tracking.uri)
    if uri.startswith("sqlite:///") and not Path(uri[10:]).is_absolute():
        uri = "sqlite:///" + str(Path.cwd() / uri[10:])
    return uri


def find_run_id(cfg) -> str | None:
    """The newest MLflow run tagged ``sweep=<study>`` named ``cfg.tracking.run_name``."""
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(_mlflow_uri(cfg))
        exp = client.get_experiment_by_name(cfg.tracking.experiment)
        if exp is None:
            return None
        runs = client.search_runs(
            [exp.experiment_id],
            filter_string=f"tags.sweep = '{cfg.tracking.sweep}' and attributes.run_name = '{cfg.tracking.run_name}'",
            order_by=["attributes.start_time DESC"], max_results=1)
        return runs[0].info.run_id if runs else None
    except Exception as e:  # tracking trouble never fails a trial that trained fine
        log.warning("could not look up the MLflow run of %s: %s", cfg.tracking.run_name, e)
        return None


# ---------------------------------------------------------------------------- trials


class Objective:
    """``train`` one composed config per trial; reports ``metric`` after each eval."""

    def __init__(self, sweep: Sweep, base: list[str]):
        self.sweep, self.base = sweep, base
        self.current: int | None = None  # number of the trial in progress

    def __call__(self, trial) -> float:
        from optuna import TrialPruned

        from harness.run import config_key, train

        sweep = self.sweep
        self.current = trial.number
        # A retry keeps the original trial's number for its run name and checkpoint folder
        # (RetryHeartbeatStaleTrialCallback stores it as the system attr "failed_trial").
        orig = trial.study._storage.get_trial(trial._trial_id).system_attrs.get("failed_trial", trial.number)
        sampled = [f"{p.name}={format_value(p.suggest(trial))}" for p in sweep.params]
        run_name = f"{sweep.study_name}-trial{orig}"
        overrides = merge_overrides(self.base, sampled, [
            f"tracking.sweep={sweep.study_name}", f"tracking.run_name={run_name}"])
        cfg = compose(overrides)
        base_dir = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else Path.cwd() / "checkpoints"
        cfg.checkpoint.dir = str(base_dir / "sweeps" / sweep.study_name / f"trial{orig}-{config_key(cfg)}")
        trial.set_user_attr("overrides", overrides)
        trial.set_user_attr("checkpoint_dir", cfg.checkpoint.dir)
        log.info("trial %d%s: %s", trial.number, f" (retry of {orig})" if orig != trial.number else "",
                 " ".join(sampled))
        last: dict = {}

        def on_eval(step: int, metrics: dict) -> None:
            if not last:  # first eval: the MLflow run exists, record it (kept even if the worker dies)
                run_id = find_run_id(cfg)
                if run_id:
                    trial.set_user_attr("mlflow_run_id", run_id)
            if sweep.metric not in metrics:
                raise sweep.err("metric", f"{sweep.metric!r} is not an eval metric; evals report {sorted(metrics)}")
            value = float(metrics[sweep.metric])
            last.update(step=step, value=value)
            trial.report(value, step)
            if trial.should_prune():
                raise TrialPruned(f"{sweep.metric}={value:.4g} at step {step}")

        try:
            train(cfg, on_eval=on_eval)
        except (TrialPruned, KeyboardInterrupt, *_config_errors()):
            raise
        except Exception as e:
            log.exception("trial %d failed", trial.number)
            raise TrialFailed(f"{type(e).__name__}: {e}") from e
        finally:
            run_id = find_run_id(cfg)
            if run_id:
                trial.set_user_attr("mlflow_run_id", run_id)
        if not last:
            raise TrialFailed("no eval was run")
        return last["value"]


def _counts(study) -> dict:
    from optuna.trial import TrialState

    out = {s.name.lower(): 0 for s in TrialState}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name.lower()] += 1
    return out


def dashboard_url(url: str) -> str:
    """``url`` with a relative sqlite path made absolute (to paste into optuna-dashboard)."""
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and url != "sqlite:///:memory:":
        return "sqlite:///" + str(Path.cwd() / url[len("sqlite:///"):])
    return url


def summary(study, sweep: Sweep, storage_url: str) -> str:
    c = _counts(study)
    lines = [f"== sweep {study.study_name} ({sweep.direction} {sweep.metric}) ==",
             f"trials        : {c['complete']} complete, {c['pruned']} pruned, {c['fail']} failed"
             + (f", {c['running']} running" if c["running"] else "")
             + (f", {c['waiting']} waiting" if c["waiting"] else "")]
    if c["complete"]:
        best = study.best_trial
        lines += [f"best value    : {best.value:.4f} (trial {best.number})",
                  "best params   : " + " ".join(f"{k}={format_value(v)}" for k, v in best.params.items()),
                  f"best run      : {best.user_attrs.get('mlflow_run_id', 'unknown')}"]
    else:
        lines.append("best value    : none (no complete trial yet)")
    lines.append(f"optuna-dashboard {storage_url}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ main


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m harness.sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_file", help="sweep yaml (sweeps/<name>.yaml)")
    ap.add_argument("overrides", nargs="*", help="Hydra key=value overrides applied to every trial")
    ap.add_argument("--n-trials", type=int, help="total finished (complete + pruned) trials wanted")
    ap.add_argument("--storage", help="Optuna storage URL (overrides the sweep file)")
    ap.add_argument("--study-name", help="study name (overrides the sweep file)")
    ap.add_argument("--seed", type=int, help="sampler seed (give concurrent workers different seeds)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run (or continue) a sweep; returns the exit status."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s")
    bad = [o for o in args.overrides if "=" not in o]
    try:
        if bad:
            raise SweepError(f"{args.sweep_file}: command line: {bad[0]!r} is not a key=value override")
        sweep = load_sweep(args.sweep_file)
        if args.study_name:
            sweep.study_name = args.study_name
        if args.storage:
            sweep.storage = args.storage
        if args.n_trials is not None:
            sweep.n_trials = args.n_trials
        base = merge_overrides(sweep.overrides, args.overrides)
        clash = sorted({_override_key(o) for o in args.overrides} & {p.name for p in sweep.params})
        if clash:
            raise SweepError(f"{args.sweep_file}: params.{clash[0]}: also set on the command line; "
                             "remove one of the two")
        preflight(sweep, base)
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    return run_sweep(sweep, base, seed=args.seed)


def run_sweep(sweep: Sweep, base: list[str], seed: int | None = None) -> int:
    import optuna
    from optuna.study import MaxTrialsCallback
    from optuna.trial import TrialState

    try:
        storage = make_storage(sweep.storage, sweep.heartbeat)
        study = optuna.create_study(storage=storage, study_name=sweep.study_name, direction=sweep.direction,
                                    load_if_exists=True)
    except Exception as e:
        print(f"error: {sweep.path}: storage: cannot open {sweep.storage!r} "
              f"({type(e).__name__}: {' '.join(str(e).split())[:300]})", file=sys.stderr, flush=True)
        return 2
    with warnings.catch_warnings():  # trials of dead workers -> FAIL (+ a queued retry)
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    study.set_user_attr("metric", sweep.metric)
    study.set_user_attr("overrides", base)
    study.sampler = build_sampler(sweep.sampler, sweep.params, len(study.get_trials(deepcopy=False)), seed)
    study.pruner = build_pruner(sweep.pruner)
    finished = (TrialState.COMPLETE, TrialState.PRUNED)
    c = _counts(study)
    todo = sweep.n_trials - c["complete"] - c["pruned"]
    print(f"study {sweep.study_name} in {sweep.storage}: {c['complete']} complete, {c['pruned']} pruned, "
          f"{c['fail']} failed; running {max(todo, 0)} of {sweep.n_trials} trials", flush=True)
    objective = Objective(sweep, base)
    before = {t.number for t in study.get_trials(deepcopy=False)}
    status = 0
    old_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):  # preemption: checkpoint, mark FAIL, queue a retry
        raise KeyboardInterrupt("SIGTERM")

    try:
        signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread
        old_term = None
    try:
        if todo > 0:
            study.optimize(objective, n_trials=todo, catch=(TrialFailed,), gc_after_trial=True,
                           callbacks=[MaxTrialsCallback(sweep.n_trials, states=finished)])
    except KeyboardInterrupt:
        current = objective.current
        if current is not None and study.trials[current].state == TrialState.FAIL:
            _retry(study, current)
            print(f"interrupted: trial {objective.current} queued to rerun (from its checkpoint) "
                  "on the next invocation", file=sys.stderr, flush=True)
        status = 130
    except _config_errors() as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
        status = 2
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    print(summary(study, sweep, dashboard_url(sweep.storage)), flush=True)
    if status == 0:
        new = [t for t in study.get_trials(deepcopy=False) if t.number not in before]
        if new and not any(t.state in finished for t in new) and _counts(study)["complete"] == 0:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
