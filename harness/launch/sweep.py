"""Optuna sweeps over harness runs: ``python -m harness.sweep sweeps/<name>.yaml [overrides] [options]``.

A thin native Optuna driver (the hydra-optuna-sweeper plugin pins optuna<3). Each trial
composes the Hydra config from ``conf/`` (fixed overrides of the sweep file, then the
command-line overrides, then the sampled ``key=value`` pairs), tags the MLflow run with
``tracking.sweep=<study>`` / ``tracking.run_name=<study>-trial<N>`` and calls
:func:`harness.launch.run.train`, reporting the sweep metric after every eval so the pruner can
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
  When the dead trial's job had finished (the worker stopped after training, before Optuna
  recorded the trial), the retry trains nothing: :func:`harness.launch.run.train` reports that run and
  passes its final eval metrics to the objective (``tests/test_sweep.py``).
* The sampler is seeded with ``seed * 100003 + number of trials already in the study``, so a
  resumed sweep does not repeat the parameters of its first invocation. Workers started together
  on one study should get different ``--seed`` values (``--workers N`` gives worker i seed+i).
* Concurrent workers on one study (``--workers N --launcher ...``, or the command started on N
  machines against one PostgreSQL storage) finish exactly ``n_trials`` trials: a worker starts a
  trial only while finished + running trials are fewer, and otherwise waits for the running
  ones (a dead worker's trial is retried by a live one once its heartbeat is stale).

Workers started by an engine (``pip install -e ".[cluster]"``)::

    python -m harness.sweep FILE --storage postgresql://user@host/db --workers 8 --launcher submitit_slurm \
        --launcher-param slurm_partition=gpu --launcher-param gpus_per_node=1
    python -m harness.sweep FILE --storage postgresql://user@host/db --workers 8 --launcher ray --ray-address auto

Passwords: in ``PGPASSWORD`` / ``~/.pgpass``, not in ``--storage``; a URL's password is masked
in everything printed, logged or stored (:mod:`harness.launch.credentials`).

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
import time
import warnings
from pathlib import Path

import optuna
import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.errors import HydraException
from mlflow.tracking import MlflowClient
from omegaconf.errors import OmegaConfBaseException
from optuna import TrialPruned
from optuna.trial import TrialState

from harness import progress
from harness.launch.config import register_configs
from harness.launch.credentials import install as _redact_logs
from harness.launch.credentials import redact, redact_obj, warn_inline
from harness.model.models import ModelLoadError
from harness.launch.job import config_key
from harness.launch.run import USER_ERRORS, train
from harness.launch.sweep_spec import CONF_DIR, Sweep, SweepError, TrialFailed, load_sweep
from harness.launch.sweep_study import (build_pruner, build_sampler, dashboard_url, next_action, open_study, retry,
                                        trial_counts)
from harness.tasks.data import DataError
from harness.launch.tracking import TrackingError, resolve_uri
from harness.launch.validate import validate

log = logging.getLogger("harness.sweep")


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
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def _config_errors() -> tuple:
    """Errors that would hit every trial alike: stop the sweep with a one-line message."""
    return (SweepError, HydraException, OmegaConfBaseException, DataError, ModelLoadError, TrackingError,
            *USER_ERRORS)


def preflight(sweep: Sweep, base: list[str]) -> None:
    """Compose and validate the config for every categorical choice and numeric bound.

    Raises:
        SweepError: naming the sweep file and the parameter (or ``overrides``) that fails.
    """
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


# ---------------------------------------------------------------------------- MLflow


def _mlflow_uri(cfg) -> str:
    """The tracking URI ``train`` uses (relative sqlite paths are under the launch dir)."""
    uri = resolve_uri(cfg.tracking.uri)
    if uri.startswith("sqlite:///") and not Path(uri[10:]).is_absolute():
        uri = "sqlite:///" + str(Path.cwd() / uri[10:])
    return uri


def find_run_id(cfg) -> str | None:
    """The newest MLflow run tagged ``sweep=<study>`` named ``cfg.tracking.run_name``."""
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
        trial.set_user_attr("overrides", redact_obj(overrides))
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
            with progress.job_prefix(f"trial {orig}"):
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


def summary(study, sweep: Sweep, storage_url: str) -> str:
    c = trial_counts(study)
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
    lines.append(f"optuna-dashboard {redact(storage_url)}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ main


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse echoes the bad arguments: mask any password in them
        super().error(redact(message))


def parse_args(argv):
    ap = _Parser(prog="python -m harness.sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_file", help="sweep yaml (sweeps/<name>.yaml)")
    ap.add_argument("overrides", nargs="*", help="Hydra key=value overrides applied to every trial")
    ap.add_argument("--n-trials", type=int, help="total finished (complete + pruned) trials wanted")
    ap.add_argument("--storage", help="Optuna storage URL (overrides the sweep file)")
    ap.add_argument("--study-name", help="study name (overrides the sweep file)")
    ap.add_argument("--seed", type=int, help="sampler seed (give concurrent workers different seeds)")
    ap.add_argument("--workers", type=int, default=1,
                    help="start N workers on the study through --launcher (worker i gets sampler seed seed+i)")
    ap.add_argument("--launcher", choices=LAUNCHERS, default=None,
                    help="where the workers run: submitit_local (subprocesses here), submitit_slurm (one SLURM "
                         "job each), ray (Ray tasks; --ray-address, default a local instance on loopback)")
    ap.add_argument("--launcher-param", action="append", default=[], metavar="KEY=VALUE",
                    help="submitit's executor.update_parameters (timeout_min=240, slurm_partition=gpu, "
                         "gpus_per_node=1, ...) or ray.remote options (num_cpus=1, num_gpus=1); repeatable")
    ap.add_argument("--ray-address", default=None, help="an existing Ray cluster (auto, ray://host:10001)")
    return ap.parse_intermixed_args(argv)  # overrides may come before or after the options


LAUNCHERS = ("submitit_local", "submitit_slurm", "ray")


def _worker(argv: list[str]) -> int:
    """One sweep worker (what each submitit job / Ray task runs)."""
    return main(argv)


def _param_value(v: str):
    return yaml.safe_load(v)


def launch_workers(args, argv: list[str], storage: str, seed: int) -> int:
    """Start ``args.workers`` workers of one study through submitit or Ray and wait for them.

    Each worker is ``python -m harness.sweep <same arguments> --seed <seed + i>`` (a relative
    sqlite storage made absolute): the engines do the scheduling, the study in ``storage``
    (which every worker must reach: a PostgreSQL server across machines) shares the trials.
    Returns the highest exit status of the workers. The arguments are stored in submitit's job
    files, so a password belongs in ``PGPASSWORD`` / ``~/.pgpass``, not in ``--storage``.

    Raises:
        SweepError: a bad ``--launcher-param`` or a launcher whose package is missing.
    """
    params = {}
    for kv in args.launcher_param:
        if "=" not in kv:
            raise SweepError(f"--launcher-param {kv!r}: expected KEY=VALUE")
        k, v = kv.split("=", 1)
        params[k] = _param_value(v)
    extra = ["--storage", storage] if storage.startswith("sqlite:") else []  # relative path made absolute
    argvs = [[*argv, *extra, "--seed", str(seed + i)] for i in range(args.workers)]
    if args.launcher == "ray":
        try:
            import ray  # optional: the [cluster] extra (--launcher ray)
        except ImportError:
            raise SweepError("--launcher ray: Ray is not installed (pip install -e \".[cluster]\")") from None
        if args.ray_address:
            ray.init(address=args.ray_address)
        else:  # a local instance for this sweep, loopback only
            ray.init(include_dashboard=False, _node_ip_address="127.0.0.1")
        try:
            task = ray.remote(**({"num_cpus": 1} | params))(_worker)
            statuses = ray.get([task.remote(a) for a in argvs])
        finally:
            ray.shutdown()
    else:
        try:
            import submitit  # optional: the [cluster] extra (--launcher submitit_*)
        except ImportError:
            raise SweepError(f"--launcher {args.launcher}: submitit is not installed "
                             "(pip install -e \".[cluster]\")") from None
        folder = Path.cwd() / ".submitit" / "sweeps" / "%j"
        executor = submitit.AutoExecutor(folder=folder, cluster=args.launcher.split("_", 1)[1])
        executor.update_parameters(**({"timeout_min": 24 * 60} | params))
        jobs = executor.map_array(_worker, argvs)
        log.info("submitted %d sweep workers: %s (logs in %s)", len(jobs), " ".join(j.job_id for j in jobs),
                 folder.parent)
        statuses = []
        for j in jobs:
            try:
                statuses.append(int(j.result()))
            except Exception as e:  # a worker that died: its trial is retried by the others / next run
                log.error("sweep worker %s failed: %s", j.job_id, redact(str(e).splitlines()[-1] if str(e) else e))
                statuses.append(1)
    log.info("sweep workers finished with exit statuses %s", statuses)
    return max(statuses)


def main(argv: list[str] | None = None) -> int:
    """Run (or continue) a sweep; returns the exit status."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    _redact_logs()
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
        warn_inline("storage", sweep.storage)
        if args.workers > 1 and args.launcher is None:
            raise SweepError(f"--workers {args.workers}: needs --launcher ({' | '.join(LAUNCHERS)}); or start "
                             "the command N times yourself")
        preflight(sweep, base)
        if args.launcher:
            try:  # tables and study exist before the workers race to open them
                open_study(sweep)
            except Exception as e:
                raise SweepError(f"{sweep.path}: storage: cannot open {sweep.storage!r} "
                                 f"({type(e).__name__}: {' '.join(str(e).split())[:300]})") from None
            raw = list(sys.argv[1:] if argv is None else argv)
            status = launch_workers(args, _strip_launcher_args(raw), dashboard_url(sweep.storage),
                                    args.seed if args.seed is not None else int(sweep.sampler.get("seed") or 0))
            study = open_study(sweep)
            print(summary(study, sweep, dashboard_url(sweep.storage)), flush=True)
            return status
    except SweepError as e:
        print(redact(f"error: {e}"), file=sys.stderr, flush=True)
        return 2
    return run_sweep(sweep, base, seed=args.seed)


def _strip_launcher_args(argv: list[str]) -> list[str]:
    """``argv`` without the options that start workers (and ``--seed``, set per worker)."""
    out, skip = [], False
    takes_value = ("--workers", "--launcher", "--launcher-param", "--ray-address", "--seed")
    for a in argv:
        if skip:
            skip = False
            continue
        if a in takes_value:
            skip = True
            continue
        if a.split("=", 1)[0] in takes_value:
            continue
        out.append(a)
    return out


def run_sweep(sweep: Sweep, base: list[str], seed: int | None = None) -> int:
    try:
        study = open_study(sweep)
    except Exception as e:
        print(redact(f"error: {sweep.path}: storage: cannot open {sweep.storage!r} "
                     f"({type(e).__name__}: {' '.join(str(e).split())[:300]})"), file=sys.stderr, flush=True)
        return 2
    with warnings.catch_warnings():  # trials of dead workers -> FAIL (+ a queued retry)
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    study.set_user_attr("metric", sweep.metric)
    study.set_user_attr("overrides", redact_obj(base))
    study.sampler = build_sampler(sweep.sampler, sweep.params, len(study.get_trials(deepcopy=False)), seed)
    study.pruner = build_pruner(sweep.pruner)
    finished = (TrialState.COMPLETE, TrialState.PRUNED)
    c = trial_counts(study)
    todo = sweep.n_trials - c["complete"] - c["pruned"]
    print(f"study {sweep.study_name} in {redact(sweep.storage)}: {c['complete']} complete, {c['pruned']} pruned, "
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
        started = 0
        while started < todo:
            action = next_action(study, sweep.n_trials)
            if action == "done":
                break
            if action == "wait":  # the last trials run on other workers: wait for them or their heartbeat to stop
                time.sleep(min(5.0, float(sweep.heartbeat.get("interval", 60))))
                continue
            started += 1
            study.optimize(objective, n_trials=1, catch=(TrialFailed,), gc_after_trial=True)
    except KeyboardInterrupt:
        current = objective.current
        if current is not None and study.trials[current].state == TrialState.FAIL:
            retry(study, current)
            print(f"interrupted: trial {objective.current} queued to rerun (from its checkpoint) "
                  "on the next invocation", file=sys.stderr, flush=True)
        status = 130
    except _config_errors() as e:
        print(redact(f"error: {' '.join(str(e).split())}"), file=sys.stderr, flush=True)
        status = 2
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    print(summary(study, sweep, dashboard_url(sweep.storage)), flush=True)
    if status == 0:
        new = [t for t in study.get_trials(deepcopy=False) if t.number not in before]
        if new and not any(t.state in finished for t in new) and trial_counts(study)["complete"] == 0:
            status = 1
    return status
