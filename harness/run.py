"""Entry point: ``python -m harness.run [overrides] [-m]``.

Builds everything from the Hydra config, validates it before any compute, and runs the
trainer. User errors (bad config, missing data, unreachable tracking store, bad model path)
print one clear line and exit with status 2, without a traceback.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from pathlib import Path

import hydra
import torch
from omegaconf import OmegaConf

from harness import credentials
from harness.config import register_configs
from harness.validate import ConfigError, validate

log = logging.getLogger("harness")
register_configs()
credentials.install()  # before Hydra's launcher logs the overrides of each job

USER_ERRORS = (ConfigError, FileNotFoundError)


def config_key(cfg) -> str:
    """A short hash of the run-defining config (tracking/checkpoint/resume/output excluded).

    Rerunning the same command gives the same key, hence the same checkpoint folder.
    """
    d = OmegaConf.to_container(cfg, resolve=True)
    for k in ("tracking", "checkpoint", "resume", "output_dir"):
        d.pop(k, None)
    return hashlib.sha1(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


def build_policy(cfg, tokenizer):
    """The policy model: a random ``model.tiny_config`` architecture or the loaded weights, in
    ``model.dtype``, with ``model.gradient_checkpointing`` applied either way."""
    from harness.models import dtype_of, keep_float64, load_causal_lm

    if cfg.model.tiny_config:
        from transformers import AutoConfig, AutoModelForCausalLM

        tiny = dict(cfg.model.tiny_config)
        mc = AutoConfig.for_model(tiny.pop("model_type", "llama"), vocab_size=len(tokenizer),
                                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **tiny)
        model = AutoModelForCausalLM.from_config(mc)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model = keep_float64(model.to(dtype_of(cfg.model.dtype)))
    else:
        model = load_causal_lm(cfg.model.name_or_path, cfg.model.dtype)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    from harness.distributed import train_device

    return model.to(train_device(cfg.model.device))


def build_components(cfg):
    """Task, tokenizer, policy (train mode), critic (a :class:`harness.critic.Critic` when the
    estimator needs values, else None) and rollout backend for ``cfg``.

    Shared by :func:`train` and the benchmarks, so both measure the same objects.

    Raises:
        FileNotFoundError, ConfigError: missing data or model files, unknown backend.
    """
    from harness.algo import TOKEN_ESTIMATORS
    from harness.critic import Critic
    from harness.models import load_tokenizer
    from harness.rollout import build_backend
    from harness.tasks import build_task

    task = build_task(cfg.task)
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    policy = build_policy(cfg, tokenizer)
    policy.train()
    critic = None
    if "values" in TOKEN_ESTIMATORS.spec(cfg.advantage.name).needs:
        critic = Critic.build(cfg, policy, lambda: build_policy(cfg, tokenizer))
    import dataclasses

    from harness.config import RolloutConfig

    common = {f.name for f in dataclasses.fields(RolloutConfig)}  # a backend's own keys go to it
    own = {k: v for k, v in cfg.rollout.items() if k not in common}
    backend = build_backend(cfg.rollout.backend, policy, tokenizer, batch_size=cfg.rollout.batch_size,
                            progress=cfg.rollout.progress, share_prefix=cfg.rollout.share_prefix, **own)
    return task, tokenizer, policy, critic, backend


def _hydra_dirs(cfg) -> tuple[Path, Path]:
    """(output dir, launch dir): Hydra's when running under ``@hydra.main``, else cwd-based."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        out = Path(cfg.output_dir or HydraConfig.get().runtime.output_dir)
        return out, Path(hydra.utils.get_original_cwd())
    return Path(cfg.output_dir or Path.cwd() / "outputs" / config_key(cfg)), Path.cwd()


def prepare(cfg) -> None:
    """Startup checks and process settings of a run: :func:`harness.validate.validate`, the torch
    seed (``seed``), the intra-op thread count (``train.threads``, 0 = leave as is) and, under
    ``torchrun``, joining the process group (:func:`harness.distributed.init`).

    Raises:
        ConfigError: naming the first invalid key.
    """
    from harness import distributed, precision

    validate(cfg)
    w = distributed.init()
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
    import shlex

    head = "python -m harness.run" if sys.argv and sys.argv[0].endswith(("run.py", "harness.run")) else \
        "python " + Path(sys.argv[0]).name if sys.argv else "python"
    return " ".join([head, *(shlex.quote(a) for a in sys.argv[1:])])


def _record_provenance(tracker, cfg, task, policy, rerun_of=None, recorded=None, weights_sha256=None) -> dict:
    """Provenance params, MLflow's standard source tags and the data sets as dataset inputs;
    for a rerun, a warning (and a ``rerun.differs.<key>`` tag) for each provenance difference."""
    import getpass

    from harness import provenance

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
    from harness import checkpoint as ckpt
    from harness import precision
    from harness.distributed import world
    from harness.tracking import NullTracker, Tracker, flatten, resolve_uri
    from harness.trainer import Trainer

    prepare(cfg)
    w = world()
    output_dir, launch_dir = _hydra_dirs(cfg)
    key = config_key(cfg)
    ckpt_dir = Path(cfg.checkpoint.dir or launch_dir / "checkpoints" / key)
    # Rank 0 decides what to resume; every rank then reads that file (a shared filesystem).
    path = None
    if w.is_main:
        if cfg.resume:
            path = ckpt.latest(ckpt_dir) if cfg.resume == "auto" else Path(cfg.resume)
            path = path if path is not None else ckpt_dir  # load() names the missing folder
        elif ckpt.latest(ckpt_dir) is not None:
            path = ckpt.latest(ckpt_dir)
    path = w.broadcast_object(None if path is None else str(path))
    state = None
    if path is not None:
        found = ckpt.load(path)
        if not cfg.resume and found.get("config_key") not in (None, key):
            from harness.tracking import shared_folder_message

            raise ConfigError(shared_folder_message(ckpt_dir, found["config_key"], key))
        if cfg.resume or not found.get("finished"):
            state = found
            if w.is_main and not cfg.resume:
                log.info("resuming from %s (step %d)", path, found["step"])
    # Tracking first: an unreachable store is an error before any compute.
    tracker = NullTracker()
    if w.is_main:
        uri = resolve_uri(cfg.tracking.uri)
        credentials.warn_inline("tracking.uri", uri)
        if uri.startswith("sqlite:///") and not Path(uri[10:]).is_absolute():
            uri = "sqlite:///" + str(launch_dir / uri[10:])
        tracker = Tracker(uri, cfg.tracking.experiment)
    task, tokenizer, policy, critic, backend = build_components(cfg)
    weights_sha256 = None
    if w.is_main and cfg.train.sharding != "none":  # hashed whole, before the Trainer shards it
        from harness.provenance import state_dict_sha256

        weights_sha256 = state_dict_sha256(policy)
    trainer = Trainer(cfg, task, tokenizer, policy, backend, tracker, critic=critic, checkpoint_dir=ckpt_dir,
                      on_eval=on_eval, on_step=on_step, config_key=key)
    how = None
    if w.is_main:
        how = tracker.open(ckpt_dir / "run.json", cfg.tracking.run_name or default_run_name(cfg),
                           resume_id=state["run_id"] if state else None, config_key=key)
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
            "device": str(next(policy.parameters()).device),  # where the models trained (model.device)
            **({f"precision.auto.{k}": v for k, v in precision.LAST_PROBE.items()} if precision.LAST_PROBE else {}),
            **({"sweep": cfg.tracking.sweep} if cfg.tracking.sweep else {}),
        })
        tracker.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config/resolved.yaml")
        if w.is_main:
            _record_provenance(tracker, cfg, task, policy, rerun_of, recorded, weights_sha256)
        tracker.log_metrics({"data/skipped_rows": task.skipped_rows,
                             "data/unparseable_golds": task.unparseable_golds}, step=0)
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
              f"checkpoints   : {ckpt_dir}"]
    print(credentials.redact("\n".join(lines)), flush=True)
    return float(last.get("eval/accuracy", float("nan")))


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg) -> float:
    from harness.models import ModelLoadError
    from harness.tasks.data import DataError
    from harness.tracking import TrackingError

    from harness import distributed

    scrub_hydra_records()
    try:
        return train(cfg)
    except (*USER_ERRORS, DataError, ModelLoadError, TrackingError) as e:
        print(f"error: {credentials.redact(str(e))}", file=sys.stderr, flush=True)
        sys.exit(2)
    finally:
        distributed.shutdown()


def scrub_hydra_records() -> None:
    """Mask credentials in the files Hydra wrote for this job (``.hydra/{config,hydra,overrides}.yaml``
    in the job's folder, ``multirun.yaml`` in the sweep folder): they hold the command line's
    overrides in clear (see :mod:`harness.credentials`)."""
    from hydra.core.hydra_config import HydraConfig

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
