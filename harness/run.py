"""Entry point: ``python -m harness.run [overrides] [-m]``.

Builds everything from the Hydra config, validates it before any compute, and runs the
trainer. User errors (bad config, missing data, unreachable tracking store, bad model path)
print one clear line and exit with status 2, without a traceback.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import hashlib
import json
import logging
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from mlflow.entities import Metric
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoModelForCausalLM

from harness import checkpoint as ckpt
from harness import credentials, distributed, perf, precision, progress, provenance
from harness import alloc
from harness.algo import Algorithm, build_algorithm
from harness.config import register_configs
from harness.critic import Critic
from harness.distributed import train_device, world
from harness.lora import ADAPTER_CONFIG, build_adapters
from harness.models import ModelLoadError, dtype_of, keep_float64, load_causal_lm, load_tokenizer
from harness.rollout import build_backend, eval_decode
from harness.rollout.episode import EpisodeRollout
from harness.tools import build_tool
from harness.tasks import build_task
from harness.tasks.data import DataError
from harness.tracking import (NullTracker, Tracker, TrackingError, _read_record, flatten, resolve_uri,
                              shared_folder_message)
from harness.trainer import Trainer
from harness.validate import ConfigError, validate

log = logging.getLogger("harness")
register_configs()
credentials.install()  # before Hydra's launcher logs the overrides of each job

USER_ERRORS = (ConfigError, FileNotFoundError)


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
    d.get("eval", {}).pop("initial_cache", None)  # where the step-0 eval is kept (harness.eval_cache)
    train_cfg = d.get("train") or {}
    if train_cfg.get("lr_schedule", "constant") == "constant":
        train_cfg.pop("steps", None)
    return hashlib.sha1(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


def build_policy(cfg, tokenizer):
    """The policy model: a random ``model.tiny_config`` architecture or the loaded weights, in
    ``model.dtype``, with ``model.attn_implementation`` and ``model.gradient_checkpointing`` applied
    either way, and the ``lora`` option applied (:meth:`harness.lora.FullFineTuning.apply`).

    Raises:
        ModelLoadError: the weights cannot be loaded, or the adapters cannot be applied to them
            (e.g. ``lora.adapter_path`` trained on another base).
    """
    if cfg.model.tiny_config:
        tiny = dict(cfg.model.tiny_config)
        mc = AutoConfig.for_model(tiny.pop("model_type", "llama"), vocab_size=len(tokenizer),
                                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **tiny)
        model = AutoModelForCausalLM.from_config(mc)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model = keep_float64(model.to(dtype_of(cfg.model.dtype)))
    else:
        model = load_causal_lm(cfg.model.name_or_path, cfg.model.dtype)
    model.set_attn_implementation(cfg.model.attn_implementation)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    try:  # lora=peft: adapters injected (or lora.adapter_path's loaded), the base frozen
        model = build_adapters(cfg.get("lora")).apply(model)
    except ValueError as e:  # a target no module matches; an adapter folder for another base
        raise ModelLoadError(str(e)) from e
    return model.to(train_device(cfg.model.device))


def build_components(cfg, algo: Algorithm | None = None, times: dict | None = None):
    """Task, tokenizer, policy (train mode), critic (a :class:`harness.critic.Critic` when the
    estimator needs values, else None) and rollout backend for ``cfg``; ``algo``: the run's
    :class:`harness.algo.Algorithm` (built from ``cfg`` when None). ``times``: when a dict, it
    receives ``time/model_load_s`` (task, tokenizer, policy and critic) and ``time/engine_build_s``
    (the rollout backend and tool), in seconds.

    Shared by :func:`train` and the benchmarks, so both measure the same objects.

    Raises:
        FileNotFoundError, ConfigError: missing data or model files, unknown backend.
    """
    progress.library_bars(cfg.rollout.progress)  # datasets' and transformers' bars: only on a terminal
    t0 = time.perf_counter()
    task = build_task(cfg.task)
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    policy = build_policy(cfg, tokenizer)
    policy.train()
    critic = None
    if (algo if algo is not None else build_algorithm(cfg)).needs("values"):
        critic = Critic.build(cfg, policy, lambda: build_policy(cfg, tokenizer))
    t1 = time.perf_counter()
    backend = build_backend(cfg.rollout.backend, policy, tokenizer, **cfg.rollout)  # the whole rollout node
    tool = build_tool(cfg.tools)
    if tool is not None:  # tools=<name>: episodes of up to rollout.max_turns turns, the task's shots show a call
        backend = EpisodeRollout(backend, tokenizer, tool, cfg.rollout.max_turns)
        task.use_tool(tool)
    if times is not None:
        times.update({"time/model_load_s": t1 - t0, "time/engine_build_s": time.perf_counter() - t1})
    return task, tokenizer, policy, critic, backend


def _hydra_dirs(cfg) -> tuple[Path, Path]:
    """(output dir, launch dir): Hydra's when running under ``@hydra.main``, else cwd-based."""
    if HydraConfig.initialized():
        out = Path(cfg.output_dir or HydraConfig.get().runtime.output_dir)
        return out, Path(hydra.utils.get_original_cwd())
    return Path(cfg.output_dir or Path.cwd() / "outputs" / config_key(cfg)), Path.cwd()


def prepare(cfg) -> None:
    """Startup checks and process settings of a run: :func:`harness.validate.validate`, the torch
    seed (``seed``), the intra-op thread count (``train.threads``, 0 = leave as is), glibc's
    allocator thresholds (:func:`harness.alloc.tune_malloc`: where memory comes from, never a
    value) and, under ``torchrun``, joining the process group (:func:`harness.distributed.init`).

    Raises:
        ConfigError: naming the first invalid key.
    """
    validate(cfg)
    w = distributed.init()
    tuned = alloc.tune_malloc()
    log.debug("malloc settings: %s", tuned or "left as they are")
    torch.manual_seed(cfg.seed)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    if cfg.train.precision == "auto":  # measured here (rank 0's choice for every rank), then recorded
        device = distributed.train_device(cfg.model.device)  # measured where the models will train
        choice = w.broadcast_object(precision.choose(device=device) if w.is_main else None)
        log.info("train.precision=auto -> %s (%s)", choice, precision.LAST_PROBE)
        cfg.train.precision = choice


def default_run_name(cfg) -> str:
    """``<estimator>-G<group_size>-<task>-s<seed>`` (e.g. ``grpo-G8-arith-s0``); ``tracking.run_name``
    overrides it (the other choices are in the run's params and tags)."""
    return f"{cfg.advantage.name}-G{cfg.group_size}-{cfg.task.name}-s{cfg.seed}"


def command_line() -> str:
    """The command this process was started with, as a user would type it."""
    head = "python -m harness.run" if sys.argv and sys.argv[0].endswith(("run.py", "harness.run")) else \
        "python " + Path(sys.argv[0]).name if sys.argv else "python"
    return " ".join([head, *(shlex.quote(a) for a in sys.argv[1:])])


def _record_provenance(tracker, cfg, task, policy, rerun_of=None, recorded=None, weights_sha256=None) -> dict:
    """Provenance params, MLflow's standard source tags and the data sets as dataset inputs;
    for a rerun, a warning (and a ``rerun.differs.<key>`` tag) for each provenance difference."""
    prov = provenance.collect(cfg, task, policy, weights_sha256=weights_sha256)
    tracker.log_params(prov)
    tags = {"mlflow.source.git.commit": prov["provenance.git.commit"], "mlflow.source.name": "harness.run",
            "mlflow.source.type": "LOCAL", "mlflow.note.content": command_line(), "mlflow.user": getpass.getuser(),
            "git_commit": prov["provenance.git.commit"], "git_dirty": prov["provenance.git.dirty"]}
    if rerun_of:
        tags["rerun_of"] = rerun_of
        for line in provenance.differences(recorded or {}, prov):
            log.warning("rerun of %s: %s", rerun_of, line)
            key = line.split(":", 1)[0]
            tags[f"rerun.differs.{key}"] = line.split(":", 1)[1].strip()[:5000]
    tracker.set_tags(tags)
    sets = []
    for split, problems, context in (("train", task.train, "train"), ("test", task.eval, "eval")):
        src = task.sources.get(split, {})
        source = src.get("source", f"generated:{cfg.task.name}")
        digest = prov[f"provenance.data.{'train' if context == 'train' else 'eval'}.problems_sha256"]
        if not problems:  # a generated stream (arith train): its definition is the task config
            digest = hashlib.sha256(json.dumps(OmegaConf.to_container(cfg.task), sort_keys=True).encode()).hexdigest()
        sets.append({"name": f"{cfg.task.name}-{split}", "source": source,
                     "source_type": "local" if source.startswith("/") else source.split(":", 1)[0],
                     "digest": digest, "context": context, "rows": len(problems) or "stream"})
    tracker.log_datasets(sets)
    return prov


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


def report_finished(cfg, tracker, state: dict, plan: dict, ckpt_dir: Path, on_eval=None) -> float:
    """Say that the job is already done and how to go on; returns its final eval accuracy.

    The run is reopened only when it was not closed FINISHED (a kill in the shutdown window,
    after the final checkpoint): the checkpoint's unsent metrics are sent unless the run holds
    them, and the run is closed FINISHED. ``on_eval`` (a sweep's objective) is called once with
    the final eval's metrics as the run records them.
    """
    run_id = plan["run_id"]
    head = "this job is already finished; nothing was trained or logged"
    if plan["status"] != "FINISHED":
        tracker.start(run_id=run_id)
        tracker.extend([Metric(k, v, ts, st) for k, v, ts, st in state.get("pending_metrics") or []])
        tracker.set_tags({"harness.closed_by_rerun": "the final checkpoint was written; the run was not closed"})
        tracker.end("FINISHED")
        head = (f"this job is already finished; nothing was trained (its MLflow run was still {plan['status']} "
                "after the final checkpoint: the metrics that checkpoint held and the run lacked were sent, and "
                "the run is now closed FINISHED)")
    else:
        tracker.run_id = run_id
    run = tracker.client.get_run(run_id)
    metrics, tags = run.data.metrics, run.data.tags
    if on_eval is not None:
        on_eval(int(plan["step"]), {k: v for k, v in metrics.items() if k.startswith("eval/")})
    nan = float("nan")
    lines = [
        f"== grpo-harness: {head} ==",
        f"MLflow run    : {run_id} (FINISHED, {tracker.uri})",
        f"steps         : {plan['step']} (train.steps={cfg.train.steps}); final checkpoint {plan['path']}"
        f" (checkpoint.keep_final={state.get('keep_final', 'full')})",
        f"eval accuracy : {metrics.get('eval/accuracy', nan):.3f}   format rate {metrics.get('eval/format_rate', nan):.3f}"
        f"   train reward (last step) {metrics.get('train/reward_mean', nan):.3f}",
        f"outputs       : {tags.get('output_dir', '?')}",
        f"checkpoints   : {ckpt_dir}",
        *final_weights_line(ckpt_dir),
        "To go on:",
        "  start again  : the same command with resume=never (the checkpoints and run.json move to "
        f"{ckpt_dir}/superseded/<time>/; a new MLflow run), or another checkpoint.dir",
    ]
    if cfg.train.lr_schedule == "constant" and not ckpt.has_model_states(state):
        lines.append(f"  train longer : not from this folder: checkpoint.keep_final={state.get('keep_final')} kept no "
                     "optimizer state; run the job with resume=never checkpoint.keep_final=full to be able to")
    elif cfg.train.lr_schedule == "constant":
        lines.append(f"  train longer : train.steps=<more than {plan['step']}> continues from the final checkpoint "
                     "in the same MLflow run")
    else:
        lines.append(f"  train longer : with train.lr_schedule={cfg.train.lr_schedule} the lr of every step depends "
                     "on train.steps, so another train.steps is another job (its own folder and run)")
    lines.append(f"  the same job : only {', '.join(ALLOWED_TO_DIFFER)} may differ; any other change is another job")
    print(progress.prefixed(credentials.redact("\n".join(lines))), flush=True)
    return float(metrics.get("eval/accuracy", nan))


def train(cfg, on_eval=None, on_step=None, rerun_of: str | None = None, recorded: dict | None = None) -> float:
    """Run one job; returns the final eval accuracy (the sweep objective).

    A job that already finished (its final checkpoint in the folder, its MLflow run still in
    the store) is not trained again: it is reported, and ``on_eval`` is called once with its
    final eval's metrics (:func:`plan_job`, :func:`report_finished`). Rank 0 holds
    :func:`job_lock` on the checkpoint folder while the job runs.

    Args:
        cfg: a composed :class:`harness.config.Config`.
        on_eval: optional ``fn(step, metrics)`` called after each eval (Optuna reporting and
            pruning: an exception raised there, e.g. ``optuna.TrialPruned``, ends the run as
            KILLED with a checkpoint and propagates).
        on_step: optional ``fn(record)`` called with each step's
            :class:`harness.trainer.StepRecord` (rewards, advantages, metrics).
        rerun_of, recorded: set by :mod:`harness.rerun`: the MLflow run id this run repeats and
            that run's params (its provenance is compared with this process's).
    """
    with contextlib.ExitStack() as held:  # rank 0's lock on the job's folder, released when the job ends
        return _train(cfg, held, on_eval, on_step, rerun_of, recorded)


def _train(cfg, held: contextlib.ExitStack, on_eval, on_step, rerun_of, recorded) -> float:
    """:func:`train`'s body; ``held`` keeps :func:`job_lock` until the job ends."""
    prepare(cfg)
    w = world()
    output_dir, launch_dir = _hydra_dirs(cfg)
    key = config_key(cfg)
    ckpt_dir = Path(cfg.checkpoint.dir or launch_dir / "checkpoints" / key)
    # Tracking first: an unreachable store is an error before any compute, and the store says
    # whether a finished checkpoint's run is still there. Rank 0 decides; every rank follows.
    tracker = NullTracker()
    plan, found = None, None
    if w.is_main:
        try:
            uri = resolve_uri(cfg.tracking.uri)
            credentials.warn_inline("tracking.uri", uri)
            if uri.startswith("sqlite:///") and not Path(uri[10:]).is_absolute():
                uri = "sqlite:///" + str(launch_dir / uri[10:])
            tracker = Tracker(uri, cfg.tracking.experiment)
            held.enter_context(job_lock(ckpt_dir))
            plan, found = plan_job(cfg, ckpt_dir, key, tracker)
        except BaseException as e:  # the other ranks must not wait for a decision that never comes
            w.broadcast_object({"error": f"{type(e).__name__} on rank 0"})
            raise
    plan = w.broadcast_object(plan)
    if "error" in plan:
        raise ConfigError(f"stopped: {plan['error']} (its message is in rank 0's output)")
    if plan["do"] == "report":
        acc = plan.get("accuracy", float("nan"))
        if w.is_main:
            acc = report_finished(cfg, tracker, found, plan, ckpt_dir, on_eval)
        return acc
    state = None
    if plan["path"] is not None:
        state = found if w.is_main else ckpt.load(plan["path"])
        if w.is_main:
            log.info("resuming from %s (step %d)", plan["path"], state["step"])
    # the process's age before its first model: interpreter, imports, composition (a multirun's later jobs: its earlier jobs too)
    setup_times = {"time/process_age_s": perf.process_age_s()}
    algo = build_algorithm(cfg)  # once, after prepare() has resolved train.precision=auto
    task, tokenizer, policy, critic, backend = build_components(cfg, algo, times=setup_times)
    weights_sha256 = None
    if w.is_main and cfg.train.sharding != "none":  # hashed whole, before the Trainer shards it
        weights_sha256 = provenance.state_dict_sha256(policy)
    trainer = Trainer(cfg, task, tokenizer, policy, backend, tracker, critic=critic, checkpoint_dir=ckpt_dir,
                      on_eval=on_eval, on_step=on_step, config_key=key, algorithm=algo)
    how = None
    if w.is_main:
        how = tracker.open(ckpt_dir / "run.json", cfg.tracking.run_name or default_run_name(cfg),
                           resume_id=state["run_id"] if state else None, config_key=key)
        tracker.set_tags({"harness.train_steps": cfg.train.steps})  # MLflow params cannot change: see extend
        if plan.get("extend_from") is not None:
            log.info("training longer: train.steps %d -> %d in MLflow run %s", plan["extend_from"], cfg.train.steps,
                     tracker.run_id)
            tracker.set_tags({"harness.extended_from": ",".join(filter(None, (plan.get("extended_before"),
                                                                              str(plan["extend_from"]))))})
    how = w.broadcast_object(how)
    if how == "resumed":
        trainer.load_state_dict(state)
    else:  # a new run, or one adopted from a killed attempt: what it already holds is not sent again
        resolved = OmegaConf.to_container(cfg, resolve=True)
        tracker.log_params(flatten(resolved))
        tracker.set_tags({
            "estimator": cfg.advantage.name, "group_size": cfg.group_size, "task": cfg.task.name,
            "model": cfg.model.name_or_path if not cfg.model.tiny_config else "tiny-random",
            "seed": cfg.seed, "config_key": key,
            "output_dir": str(output_dir), "world_size": w.world_size,
            "process_group": w.backend or "none",  # torchrun joins one even of one rank (harness.distributed.init)
            "device": str(next(policy.parameters()).device),  # where the models trained (model.device)
            "eval.decode": eval_decode(cfg.rollout, policy),  # what decoded the evals: backend and dtype
            **({f"precision.auto.{k}": v for k, v in precision.LAST_PROBE.items()} if precision.LAST_PROBE else {}),
            **{f"malloc.{k}": v for k, v in alloc.APPLIED.items()},  # allocator thresholds set at startup
            **({"sweep": cfg.tracking.sweep} if cfg.tracking.sweep else {}),
        })
        tracker.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config/resolved.yaml")
        if w.is_main:
            _record_provenance(tracker, cfg, task, policy, rerun_of, recorded, weights_sha256)
        tracker.log_metrics({"data/skipped_rows": task.skipped_rows, "data/unparseable_golds": task.unparseable_golds,
                             **{k: v for k, v in setup_times.items() if v is not None}}, step=0)
    if cfg.tracking.system_metrics:
        tracker.start_system_metrics(cfg.tracking.system_metrics_interval_s)
    status = "FAILED"
    try:
        history = trainer.fit()
        status = "FINISHED"
    except BaseException as e:  # interrupted or pruned: keep what was computed
        # (data-parallel: no checkpoint here, it needs every rank and another may be gone)
        if (isinstance(e, KeyboardInterrupt) or type(e).__name__ == "TrialPruned") and not w.distributed:
            trainer.save_checkpoint()
            tracker.flush()
            status = "KILLED"
        raise
    finally:
        tracker.end(status)
        if hasattr(backend, "close"):  # a vLLM engine, before the process group goes (run.main)
            backend.close()
    if not w.is_main:
        return float(history[max(history)].get("eval/accuracy", float("nan"))) if history else float("nan")
    return summarize(history, tracker, output_dir, ckpt_dir)


def venv_command(name: str) -> str:
    """How to call ``name`` (``python``, ``mlflow``) of this interpreter's environment from a fresh
    shell: its path (relative to the working directory when under it, e.g. ``.venv/bin/mlflow``),
    or the bare name when it is what the shell's PATH finds anyway or the environment lacks it."""
    exe = Path(sys.executable)
    path = exe if name == "python" else exe.parent / name
    if not path.exists() or shutil.which(name) == str(path):
        return name
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def next_commands(uri: str) -> list[str]:
    """The summary's last lines: how to look at this run, and how to compare it with others, as
    commands that work in a new shell (the virtual environment's own ``mlflow`` and ``python``)."""
    where = f"--tracking-uri {uri}"
    return [f"look at it    : {venv_command('mlflow')} ui --backend-store-uri {uri}   (then open http://127.0.0.1:5000)",
            f"compare runs  : {venv_command('python')} -m analysis.report {where} "
            "[--sweep ID --a estimator=grpo --b estimator=rloo]   (-> reports/)"]


def final_weights_line(ckpt_dir: Path) -> list[str]:
    """The summary line naming a finished run's final weights folder (none when it was not kept)."""
    final = Path(ckpt_dir) / ckpt.FINAL_WEIGHTS
    if not final.is_dir():
        return []
    if (final / ADAPTER_CONFIG).is_file():
        return [f"final weights : {final}   (a peft adapter folder: lora=peft lora.adapter_path={final} starts a run "
                "from it on its base model; peft.PeftModel.from_pretrained(base, folder) loads it)"]
    return [f"final weights : {final}   (a model folder: model.name_or_path={final} loads it)"]


def summarize(history: dict, tracker, output_dir: Path, ckpt_dir: Path) -> float:
    """Print before/after accuracy, reward trend and where the outputs are; return final accuracy."""
    steps = sorted(history)
    evals = [(s, history[s]) for s in steps if "eval/accuracy" in history[s]]
    first, last = evals[0][1] if evals else {}, evals[-1][1] if evals else {}
    rewards = [history[s]["train/reward_mean"] for s in steps if "train/reward_mean" in history[s]]
    half = max(1, len(rewards) // 2)
    lines = [
        "== grpo-harness summary ==",
        f"eval accuracy : {first.get('eval/accuracy', float('nan')):.3f} -> {last.get('eval/accuracy', float('nan')):.3f}",
        f"format rate   : {first.get('eval/format_rate', float('nan')):.3f} -> {last.get('eval/format_rate', float('nan')):.3f}",
    ]
    if rewards:
        lines.append(f"train reward  : first half mean {sum(rewards[:half]) / half:.3f}, "
                     f"second half mean {sum(rewards[half:]) / max(1, len(rewards) - half):.3f}")
    lines += [f"MLflow run    : {tracker.run_id} ({tracker.uri})", f"outputs       : {output_dir}",
              f"checkpoints   : {ckpt_dir}", *final_weights_line(ckpt_dir), *next_commands(tracker.uri)]
    print(progress.prefixed(credentials.redact("\n".join(lines))), flush=True)
    return float(last.get("eval/accuracy", float("nan")))


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg) -> float:
    scrub_hydra_records()
    name = multirun_job_name(cfg)
    try:
        with progress.job_prefix(name) if name else contextlib.nullcontext():  # parallel jobs' lines told apart
            return train(cfg)
    except (*USER_ERRORS, DataError, ModelLoadError, TrackingError) as e:
        print(f"error: {credentials.redact(str(e))}", file=sys.stderr, flush=True)
        sys.exit(2)
    finally:
        distributed.shutdown()


def multirun_job_name(cfg) -> str | None:
    """``#<job number> <run name>`` of a Hydra multirun job (its log lines carry it), None otherwise."""
    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if hc.mode is None or hc.mode.name != "MULTIRUN":
        return None
    return f"#{hc.job.num} {cfg.tracking.run_name or default_run_name(cfg)}"


def scrub_hydra_records() -> None:
    """Mask credentials in the files Hydra wrote for this job (``.hydra/{config,hydra,overrides}.yaml``
    in the job's folder, ``multirun.yaml`` in the sweep folder): they hold the command line's
    overrides in clear (see :mod:`harness.credentials`)."""
    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    files = list((out / (hc.output_subdir or ".hydra")).glob("*.yaml")) if hc.output_subdir else []
    if hc.mode is not None and hc.mode.name == "MULTIRUN":
        files.append(Path(hc.sweep.dir) / "multirun.yaml")
    for f in files:
        credentials.scrub_file(f)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
