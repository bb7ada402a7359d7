"""A job's identity, its lock and what rank 0 decides to do with it.

A job is a config up to where it is recorded (:func:`config_key`): the same command gives the same
checkpoint folder and MLflow run, so a rerun resumes it, reports it when finished, or trains it
longer (:func:`plan_job`), and two processes never train it at once (:func:`job_lock`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
from pathlib import Path

from omegaconf import OmegaConf

from harness.errors import ConfigError
from harness.launch import credentials
from harness.launch.tracking import _read_record, shared_folder_message
from harness.train import checkpoint as ckpt

log = logging.getLogger("harness")


def config_key(cfg) -> str:
    """A short hash of the config that defines the job: its identity (12 hex characters).

    Excluded: ``tracking``, ``checkpoint``, ``resume``, ``output_dir`` and ``eval.initial_cache``
    (where things are recorded, not what is trained) and, with ``train.lr_schedule=constant``, ``train.steps``:
    then a longer job is the same job trained further (raising ``train.steps`` on a finished job
    continues it), while with ``linear``/``cosine`` the lr of every step depends on
    ``train.steps``, so another value is another job. Rerunning the same command gives the same
    key, hence the same checkpoint folder (``checkpoints/<key>``) and MLflow run.
    """
    d = OmegaConf.to_container(cfg, resolve=True)
    for k in ("tracking", "checkpoint", "resume", "output_dir"):
        d.pop(k, None)
    d.get("eval", {}).pop("initial_cache", None)  # where the step-0 eval is kept (harness.train.eval_cache)
    train_cfg = d.get("train") or {}
    if train_cfg.get("lr_schedule", "constant") == "constant":
        train_cfg.pop("steps", None)
    return hashlib.sha1(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


ALLOWED_TO_DIFFER = ("tracking.*", "checkpoint.*", "resume", "output_dir",
                     "train.steps (with train.lr_schedule=constant)")
"""The keys a rerun may change and still be the same job (:func:`config_key` leaves them out)."""


@contextlib.contextmanager
def job_lock(ckpt_dir: Path):
    """Hold an exclusive lock on ``<ckpt_dir>/.lock`` (holding this process's pid) while the job runs.

    Two processes must never train one job at once: they would write the same checkpoints and
    MLflow run. That happens when the same command is started twice, or in a concurrent
    multirun over ``train.steps`` alone (with a constant lr schedule, one job: see
    :func:`config_key`). The lock is released when the process exits, however it exits.

    Raises:
        ConfigError: another live process holds the lock (naming ``checkpoint.dir`` and its pid).
    """
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    f = open(ckpt_dir / ".lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        raise ConfigError(f"checkpoint.dir={ckpt_dir} is in use by another process (pid {holder}) training the "
                          "same job; jobs that differ only in train.steps (train.lr_schedule=constant) are one job: "
                          "run them one after the other (the longer continues the shorter) or give each its own "
                          "checkpoint.dir") from None
    try:
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        yield
    finally:
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def plan_job(cfg, ckpt_dir: Path, key: str, tracker) -> tuple[dict, dict | None]:
    """Rank 0's decision of what this job does, from ``resume``, the checkpoint folder and the store.

    Returns ``(plan, state)``: ``state`` is the loaded checkpoint (None when training from
    scratch) and ``plan`` a small dict every rank receives:

    * ``{"do": "report", "path", "run_id", "status", "step", "accuracy"}``: the job is finished,
      its final checkpoint (``finished``, at step >= ``train.steps``) names an MLflow run the
      store still holds: nothing is trained, no run created, no metric logged (except the final
      checkpoint's unsent metrics when a kill came before the run was closed).
    * ``{"do": "train", "path": checkpoint or None, "extend_from": step or None}``: train from
      scratch, resume a killed job, or train a finished one longer (``train.steps`` raised).

    ``resume=never`` starts the job again: the folder's checkpoints and ``run.json`` are moved
    aside (:func:`set_aside`) and a new MLflow run is created. A checkpoint whose MLflow run is
    no longer in the store (deleted, or another ``tracking.uri``) is treated the same way: the
    job reruns from scratch, with a warning. ``resume=auto`` is the default behaviour but
    requires a checkpoint; ``resume=<file or folder>`` resumes from it on purpose (another
    config's checkpoint included).

    Raises:
        ConfigError: the folder holds another config's job; ``train.steps`` is below the step an
            unfinished checkpoint reached; training further from a finished marker that holds no
            optimizer state (``checkpoint.keep_final=weights|none``: :func:`train_longer_refused`).
        FileNotFoundError: ``resume=auto`` or ``resume=<path>`` finds no checkpoint.
    """
    mode = str(cfg.resume or "")
    if mode == "never":
        moved = set_aside(ckpt_dir, tracker, "resume=never")
        if moved:
            log.info("resume=never: the job starts again; its previous checkpoints and run record are in %s", moved)
        return {"do": "train", "path": None}, None
    explicit = mode not in ("", "auto")
    path = Path(mode) if explicit else ckpt.latest(ckpt_dir)
    if path is None:
        if mode == "auto":
            ckpt.load(ckpt_dir)  # raises, naming the folder
        return {"do": "train", "path": None}, None
    state = ckpt.load(path)
    path = ckpt.latest(path) if Path(path).is_dir() else Path(path)
    if not explicit and state.get("config_key") not in (None, key):
        raise ConfigError(shared_folder_message(ckpt_dir, state["config_key"], key))
    run = tracker.find_run(state.get("run_id"))
    if run is None and not explicit:
        moved = set_aside(ckpt_dir, tracker, f"MLflow run {state.get('run_id')} is no longer in the store")
        log.warning("checkpoint %s belongs to MLflow run %s, which %s no longer holds (deleted): the job "
                     "starts again in a new run; its old checkpoints and run record are in %s",
                     path, state.get("run_id"), credentials.redact(tracker.uri), moved)
        return {"do": "train", "path": None}, None
    steps = int(cfg.train.steps)
    if state.get("finished") and state["step"] >= steps and run is not None:
        last = run.data.metrics
        return {"do": "report", "path": str(path), "run_id": state.get("run_id"), "step": state["step"],
                "status": run.info.status,
                "accuracy": float(last.get("eval/accuracy", float("nan")))}, state
    if state["step"] >= steps and not state.get("finished"):
        raise ConfigError(f"train.steps={steps} is below the step {state['step']} that the job's checkpoint {path} "
                          f"reached (unfinished): pass train.steps>={state['step']} to finish it, or resume=never "
                          "to start the job again")
    if not ckpt.has_model_states(state):  # a finished marker (checkpoint.keep_final=weights|none)
        raise ConfigError(train_longer_refused(state, path, steps))
    plan = {"do": "train", "path": str(path)}
    if state.get("finished"):  # train longer: the same run continues from the final checkpoint
        plan.update(extend_from=int(state["step"]),
                    extended_before=(run.data.tags.get("harness.extended_from") if run is not None else None))
    return plan, state


def train_longer_refused(state: dict, path: Path, steps: int) -> str:
    """The error for training a finished job further from a marker that holds no optimizer state."""
    kept = state.get("keep_final", "weights")
    return (f"train.steps={steps} would train the finished job further from step {state['step']}, but its final "
            f"checkpoint {path} was kept with checkpoint.keep_final={kept} (no optimizer state to continue from). "
            "Training longer needs checkpoint.keep_final=full from the start: rerun the job with resume=never "
            f"checkpoint.keep_final=full train.steps={steps} (a new MLflow run; the old checkpoints move to "
            "superseded/), or start fresh in another checkpoint.dir")


def set_aside(ckpt_dir: Path, tracker, reason: str) -> Path | None:
    """Move the job's checkpoints and ``run.json`` into ``<ckpt_dir>/superseded/<UTC time>/`` so the
    job starts again in that folder without deleting anything; returns that folder (None when
    there was nothing to move). A run the record names that is still RUNNING (a killed attempt)
    is closed KILLED with the tag ``harness.closed_reason``."""
    files = ckpt.list_checkpoints(ckpt_dir) + [p for p in (ckpt_dir / "run.json", ckpt_dir / ckpt.FINAL_WEIGHTS)
                                               if p.exists()]
    if not files:
        return None
    rec = _read_record(ckpt_dir / "run.json") or {}
    old = tracker.find_run(rec.get("run_id"))
    if old is not None and old.info.status == "RUNNING":
        tracker.close_run(old.info.run_id, "KILLED", {"harness.closed_reason": f"the job started again ({reason})"})
    dest = ckpt_dir / "superseded" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    n = 0
    while dest.exists():
        n += 1
        dest = dest.with_name(f"{dest.name.split('-')[0]}-{n}")
    dest.mkdir(parents=True)
    for f in files:
        os.replace(f, dest / f.name)
    return dest
