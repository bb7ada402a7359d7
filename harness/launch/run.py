"""One training job: ``python -m harness.run [overrides] [-m]`` (the entry module :mod:`harness.run`).

Builds everything from the Hydra config, validates it before any compute, and runs the
trainer. :func:`train` reads as its steps: lock and plan the job (:mod:`harness.launch.job`),
build, open the tracking run, fit, close with the status, summarise
(:mod:`harness.launch.summary`). User errors (bad config, missing data, unreachable tracking
store, bad model path) print one clear line and exit with status 2, without a traceback.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import logging
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoModelForCausalLM

from harness import progress
from harness.algo import Algorithm, build_algorithm
from harness.launch import credentials
from harness.launch.config import register_configs
from harness.launch.job import config_key, job_lock, plan_job
from harness.launch.summary import report_finished, summarize
from harness.launch.tracking import NullTracker, Tracker, TrackingError, flatten, resolve_uri
from harness.launch.validate import ConfigError, validate
from harness.model import precision
from harness.model.lora import build_adapters
from harness.model.models import ModelLoadError, dtype_of, keep_float64, load_causal_lm, load_tokenizer
from harness.rollout import build_backend, eval_decode
from harness.rollout.episode import EpisodeRollout
from harness.runtime import alloc, perf, provenance
from harness.tasks import build_task
from harness.tasks.data import DataError
from harness.tools import build_tool
from harness.train import checkpoint as ckpt
from harness.train import distributed
from harness.train.critic import Critic
from harness.train.distributed import World, train_device, world
from harness.train.trainer import Trainer

log = logging.getLogger("harness")
register_configs()
credentials.install()  # before Hydra's launcher logs the overrides of each job

USER_ERRORS = (ConfigError, FileNotFoundError)
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"  # absolute: main runs from harness.run, here or an installed script


def build_policy(cfg, tokenizer):
    """The policy model: a random ``model.tiny_config`` architecture or the loaded weights, in
    ``model.dtype``, with ``model.attn_implementation`` and ``model.gradient_checkpointing`` applied
    either way, and the ``lora`` option applied (:meth:`harness.model.lora.FullFineTuning.apply`).

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
    """Task, tokenizer, policy (train mode), critic (a :class:`harness.train.critic.Critic` when the
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
    """Startup checks and process settings of a run: :func:`harness.launch.validate.validate`, the torch
    seed (``seed``), the intra-op thread count (``train.threads``, 0 = leave as is), glibc's
    allocator thresholds (:func:`harness.runtime.alloc.tune_malloc`: where memory comes from, never a
    value) and, under ``torchrun``, joining the process group (:func:`harness.train.distributed.init`).

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


def train(cfg, on_eval=None, on_step=None, rerun_of: str | None = None, recorded: dict | None = None) -> float:
    """Run one job; returns the final eval accuracy (the sweep objective).

    A job that already finished (its final checkpoint in the folder, its MLflow run still in
    the store) is not trained again: it is reported, and ``on_eval`` is called once with its
    final eval's metrics (:func:`plan_job`, :func:`report_finished`). Rank 0 holds
    :func:`job_lock` on the checkpoint folder while the job runs.

    Args:
        cfg: a composed :class:`harness.launch.config.Config`.
        on_eval: optional ``fn(step, metrics)`` called after each eval (Optuna reporting and
            pruning: an exception raised there, e.g. ``optuna.TrialPruned``, ends the run as
            KILLED with a checkpoint and propagates).
        on_step: optional ``fn(record)`` called with each step's
            :class:`harness.train.trainer.StepRecord` (rewards, advantages, metrics).
        rerun_of, recorded: set by :mod:`harness.launch.rerun`: the MLflow run id this run repeats and
            that run's params (its provenance is compared with this process's).
    """
    with contextlib.ExitStack() as held:  # rank 0's lock on the job's folder, released when the job ends
        return _train(cfg, held, on_eval, on_step, rerun_of, recorded)


def _train(cfg, held: contextlib.ExitStack, on_eval, on_step, rerun_of, recorded) -> float:
    """:func:`train`'s steps, in order; ``held`` keeps :func:`job_lock` until the job ends."""
    prepare(cfg)
    job = _locate(cfg)
    _lock_and_plan(job, held)
    if job.plan["do"] == "report":
        return _report(job, on_eval)
    state = _checkpoint_state(job)
    built = _build(job, on_eval, on_step)
    _start_tracking(job, built, state, rerun_of, recorded)
    history = _fit(job, built)
    return _final_accuracy(job, history)


@dataclass
class _Job:
    """One job: where it lives and what rank 0 decided for it (every rank holds the same plan)."""

    cfg: Any
    world: World
    key: str  # config_key(cfg)
    output_dir: Path
    launch_dir: Path
    ckpt_dir: Path
    tracker: Any = field(default_factory=NullTracker)  # rank 0's Tracker; the other ranks log nothing
    plan: dict = field(default_factory=dict)  # plan_job's decision
    found: Optional[dict] = None  # the checkpoint rank 0 loaded while planning


@dataclass
class _Built:
    """The trained objects, and what the run's record needs from their building."""

    trainer: Trainer
    task: Any
    policy: Any  # as built, before the Trainer wraps or shards it
    backend: Any
    setup_times: dict
    weights_sha256: Optional[str]


def _locate(cfg) -> _Job:
    """The job's key and folders: Hydra's output folder, the launch folder, the checkpoint folder."""
    output_dir, launch_dir = _hydra_dirs(cfg)
    key = config_key(cfg)
    return _Job(cfg, world(), key, output_dir, launch_dir, Path(cfg.checkpoint.dir or launch_dir / "checkpoints" / key))


def _lock_and_plan(job: _Job, held: contextlib.ExitStack) -> None:
    """Rank 0 opens the tracking store, locks the job's folder and plans (:func:`plan_job`); every
    rank receives the plan. The store comes first: an unreachable one is an error before any
    compute, and it says whether a finished checkpoint's run is still there.

    Raises:
        ConfigError: on the other ranks, when rank 0 failed (its message is in rank 0's output).
    """
    w = job.world
    plan, found = None, None
    if w.is_main:
        try:
            job.tracker = _open_store(job)
            held.enter_context(job_lock(job.ckpt_dir))
            plan, found = plan_job(job.cfg, job.ckpt_dir, job.key, job.tracker)
        except BaseException as e:  # the other ranks must not wait for a decision that never comes
            w.broadcast_object({"error": f"{type(e).__name__} on rank 0"})
            raise
    job.plan, job.found = w.broadcast_object(plan), found
    if "error" in job.plan:
        raise ConfigError(f"stopped: {job.plan['error']} (its message is in rank 0's output)")


def _open_store(job: _Job) -> Tracker:
    """The ``tracking.uri`` store (a relative sqlite path is relative to the launch folder)."""
    uri = resolve_uri(job.cfg.tracking.uri)
    credentials.warn_inline("tracking.uri", uri)
    if uri.startswith("sqlite:///") and not Path(uri[10:]).is_absolute():
        uri = "sqlite:///" + str(job.launch_dir / uri[10:])
    return Tracker(uri, job.cfg.tracking.experiment)


def _report(job: _Job, on_eval) -> float:
    """A finished job: rank 0 reports it (:func:`report_finished`); nothing is trained."""
    if not job.world.is_main:
        return job.plan.get("accuracy", float("nan"))
    return report_finished(job.cfg, job.tracker, job.found, job.plan, job.ckpt_dir, on_eval)


def _checkpoint_state(job: _Job) -> Optional[dict]:
    """The checkpoint the plan resumes from (rank 0 loaded it while planning), or None."""
    if job.plan["path"] is None:
        return None
    if not job.world.is_main:
        return ckpt.load(job.plan["path"])
    log.info("resuming from %s (step %d)", job.plan["path"], job.found["step"])
    return job.found


def _build(job: _Job, on_eval, on_step) -> _Built:
    """The algorithm, the components (:func:`build_components`) and the :class:`Trainer`."""
    cfg = job.cfg
    # the process's age before its first model: interpreter, imports, composition (a multirun's later jobs: its earlier jobs too)
    setup_times = {"time/process_age_s": perf.process_age_s()}
    algo = build_algorithm(cfg)  # once, after prepare() has resolved train.precision=auto
    task, tokenizer, policy, critic, backend = build_components(cfg, algo, times=setup_times)
    weights_sha256 = None
    if job.world.is_main and cfg.train.sharding != "none":  # hashed whole, before the Trainer shards it
        weights_sha256 = provenance.state_dict_sha256(policy)
    trainer = Trainer(cfg, task, tokenizer, policy, backend, job.tracker, critic=critic, checkpoint_dir=job.ckpt_dir,
                      on_eval=on_eval, on_step=on_step, config_key=job.key, algorithm=algo)
    return _Built(trainer, task, policy, backend, setup_times, weights_sha256)


def _start_tracking(job: _Job, built: _Built, state: Optional[dict], rerun_of, recorded) -> None:
    """Open the job's MLflow run on rank 0 (:meth:`Tracker.open`: new, resumed, or adopted from a
    killed attempt). A resumed run loads the trainer's state; any other run records what it does
    not hold yet (:func:`_record_new_run`). Then the system metrics start, if asked for."""
    how = _open_run(job, state) if job.world.is_main else None
    if job.world.broadcast_object(how) == "resumed":
        built.trainer.load_state_dict(state)
    else:  # a new run, or one adopted from a killed attempt: what it already holds is not sent again
        _record_new_run(job, built, rerun_of, recorded)
    if job.cfg.tracking.system_metrics:
        job.tracker.start_system_metrics(job.cfg.tracking.system_metrics_interval_s)


def _open_run(job: _Job, state: Optional[dict]) -> str:
    """Rank 0 opens the run (how: ``new``, ``resumed``, ...) and tags its ``train.steps`` and, when
    the job trains longer, the steps it was extended from."""
    cfg, tracker, plan = job.cfg, job.tracker, job.plan
    how = tracker.open(job.ckpt_dir / "run.json", cfg.tracking.run_name or default_run_name(cfg),
                       resume_id=state["run_id"] if state else None, config_key=job.key)
    tracker.set_tags({"harness.train_steps": cfg.train.steps})  # MLflow params cannot change: see extend
    if plan.get("extend_from") is not None:
        log.info("training longer: train.steps %d -> %d in MLflow run %s", plan["extend_from"], cfg.train.steps,
                 tracker.run_id)
        tracker.set_tags({"harness.extended_from": ",".join(filter(None, (plan.get("extended_before"),
                                                                          str(plan["extend_from"]))))})
    return how


def _record_new_run(job: _Job, built: _Built, rerun_of, recorded) -> None:
    """A new run's params (the resolved config), tags, ``config/resolved.yaml``, provenance and
    step-0 metrics (data counts, setup times)."""
    cfg, tracker = job.cfg, job.tracker
    tracker.log_params(flatten(OmegaConf.to_container(cfg, resolve=True)))
    tracker.set_tags(_run_tags(job, built.policy))
    tracker.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config/resolved.yaml")
    if job.world.is_main:
        _record_provenance(tracker, cfg, built.task, built.policy, rerun_of, recorded, built.weights_sha256)
    tracker.log_metrics({"data/skipped_rows": built.task.skipped_rows,
                         "data/unparseable_golds": built.task.unparseable_golds,
                         **{k: v for k, v in built.setup_times.items() if v is not None}}, step=0)


def _run_tags(job: _Job, policy) -> dict:
    """The run's tags: its main choices, identity, layout and the process settings chosen at startup."""
    cfg, w = job.cfg, job.world
    return {
        "estimator": cfg.advantage.name, "group_size": cfg.group_size, "task": cfg.task.name,
        "model": cfg.model.name_or_path if not cfg.model.tiny_config else "tiny-random",
        "seed": cfg.seed, "config_key": job.key,
        "output_dir": str(job.output_dir), "world_size": w.world_size,
        "process_group": w.backend or "none",  # torchrun joins one even of one rank (harness.train.distributed.init)
        "device": str(next(policy.parameters()).device),  # where the models trained (model.device)
        "eval.decode": eval_decode(cfg.rollout, policy),  # what decoded the evals: backend and dtype
        **({f"precision.auto.{k}": v for k, v in precision.LAST_PROBE.items()} if precision.LAST_PROBE else {}),
        **{f"malloc.{k}": v for k, v in alloc.APPLIED.items()},  # allocator thresholds set at startup
        **({"sweep": cfg.tracking.sweep} if cfg.tracking.sweep else {}),
    }


def _fit(job: _Job, built: _Built) -> dict:
    """Train (:meth:`Trainer.fit`) and close the run with its status: FINISHED; KILLED when
    interrupted or pruned (after a checkpoint, on one process only: data-parallel, it needs every
    rank and another may be gone); FAILED otherwise. The rollout engine closes either way."""
    status = "FAILED"
    try:
        history = built.trainer.fit()
        status = "FINISHED"
    except BaseException as e:  # interrupted or pruned: keep what was computed
        if (isinstance(e, KeyboardInterrupt) or type(e).__name__ == "TrialPruned") and not job.world.distributed:
            built.trainer.save_checkpoint()
            job.tracker.flush()
            status = "KILLED"
        raise
    finally:
        job.tracker.end(status)
        if hasattr(built.backend, "close"):  # a vLLM engine, before the process group goes (run.main)
            built.backend.close()
    return history


def _final_accuracy(job: _Job, history: dict) -> float:
    """The final eval accuracy; rank 0 prints the summary (:func:`summarize`)."""
    if not job.world.is_main:
        return float(history[max(history)].get("eval/accuracy", float("nan"))) if history else float("nan")
    return summarize(history, job.tracker, job.output_dir, job.ckpt_dir)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
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
    overrides in clear (see :mod:`harness.launch.credentials`)."""
    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    files = list((out / (hc.output_subdir or ".hydra")).glob("*.yaml")) if hc.output_subdir else []
    if hc.mode is not None and hc.mode.name == "MULTIRUN":
        files.append(Path(hc.sweep.dir) / "multirun.yaml")
    for f in files:
        credentials.scrub_file(f)
