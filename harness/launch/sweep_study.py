"""A sweep's Optuna study: its storage (heartbeats, retries of dead workers' trials), sampler and
pruner, opening it when workers race, and what a worker does next (:mod:`harness.launch.sweep`)."""

from __future__ import annotations

import logging
import random
import time
import warnings
from pathlib import Path

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from harness.launch.sweep_spec import Sweep

log = logging.getLogger("harness.sweep")


def make_storage(url: str, heartbeat: dict):
    """RDBStorage with heartbeats; stale RUNNING trials are failed and retried (``max_retry``)."""
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


SEED_STRIDE = 100_003  # sampler seed = seed * SEED_STRIDE + trials already in the study


def build_sampler(spec: dict, params: list, seed_offset: int, seed: int | None = None):
    kw = {k: v for k, v in spec.items() if k != "type"}
    if seed is not None:
        kw["seed"] = seed
    if kw.get("seed") is not None:
        # seed and offset combined so that workers with seeds s != s' never share a sampler seed
        # (s + offset would: worker 1 after 2 trials = worker 2 after 1 trial)
        kw["seed"] = int(kw["seed"]) * SEED_STRIDE + seed_offset
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if spec["type"] == "random":
            return optuna.samplers.RandomSampler(**kw)
        if spec["type"] == "grid":
            return optuna.samplers.GridSampler({p.name: p.choices for p in params}, **kw)
        return optuna.samplers.TPESampler(**kw)


def build_pruner(spec: dict):
    if spec["type"] == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(**{k: v for k, v in spec.items() if k != "type"})


def open_study(sweep: Sweep, attempts: int = 4):
    """Create or load the sweep's study. Workers that start together on a new database race to
    create Optuna's tables and the study (a unique-key violation for the losers): each failure
    is retried after a short, growing pause.

    Raises:
        Exception: the storage's own error once ``attempts`` tries failed.
    """
    for attempt in range(attempts):
        try:
            study = optuna.create_study(storage=make_storage(sweep.storage, sweep.heartbeat),
                                        study_name=sweep.study_name, direction=sweep.direction, load_if_exists=True)
            # optuna-dashboard (and study.trials_dataframe) label the objective by this name,
            # "Objective 0" without it
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names([sweep.metric])
            return study
        except Exception as e:
            if attempt == attempts - 1:
                raise
            log.info("opening the study failed (%s: %s); retrying", type(e).__name__, str(e).splitlines()[0][:200])
            time.sleep(0.5 * (attempt + 1) + random.random())


def retry(study, trial_number: int) -> None:
    """Queue a WAITING copy of a FAIL trial (same params, same original number)."""
    frozen = study._storage.get_trial(study._storage.get_trial_id_from_study_id_trial_number(
        study._study_id, trial_number))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        RetryHeartbeatStaleTrialCallback(inherit_intermediate_values=True)(study, frozen)


def next_action(study, n_trials: int) -> str:
    """What a worker does next on a shared study: ``"done"`` once ``n_trials`` trials are
    COMPLETE or PRUNED; ``"run"`` a trial when one is WAITING (a retry) or when the finished and
    RUNNING trials together are fewer than ``n_trials``; else ``"wait"`` (the remaining trials
    are running on other workers; if one of them dies, its heartbeat goes stale and
    :func:`optuna.storages.fail_stale_trials`, called here first, queues its retry).

    So concurrent workers neither stop while a trial may still need a retry nor start trials the
    study does not need; two workers that check in the same instant can still both start the
    last trial (Optuna has no atomic reservation), which adds one trial, never loses one.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    c = trial_counts(study)
    finished = c["complete"] + c["pruned"]
    if finished >= n_trials:
        return "done"
    if c["waiting"] or finished + c["running"] < n_trials:
        return "run"
    return "wait"


def trial_counts(study) -> dict:
    """``{state: number of trials}`` for every TrialState (lower-case names)."""
    out = {s.name.lower(): 0 for s in TrialState}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name.lower()] += 1
    return out


def dashboard_url(url: str) -> str:
    """``url`` with a relative sqlite path made absolute (to paste into optuna-dashboard)."""
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and url != "sqlite:///:memory:":
        return "sqlite:///" + str(Path.cwd() / url[len("sqlite:///"):])
    return url
