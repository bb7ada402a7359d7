"""Startup checks of a resolved config: every error names the key and what was expected."""

from __future__ import annotations

import dataclasses
import logging
import os

import torch

from harness.algo import (KL_CONTROLLERS, KL_ESTIMATORS, LOSS_AGGREGATIONS, OFFPOLICY_OBJECTIVES, POLICY_LOSSES,
                          TOKEN_ESTIMATORS, build_algorithm, dry_run)
from harness.algo.offpolicy import DecoupledParams
from harness.algo.kl import IMPORTANCE_CORRECTABLE
from harness.checkpoint import KEEP_FINAL
from harness.config import KLConfig
from harness.critic import CriticConfig
from harness.distributed import SHARDINGS
from harness.lora import ADAPTERS
from harness.errors import ConfigError  # defined there for harness.tracking; raised and re-exported here
from harness.rollout import BACKENDS
from harness.tasks import TASKS
from harness.tools import TOOLS

log = logging.getLogger(__name__)


def _choice(key: str, value, valid) -> None:
    valid = sorted(valid)
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not valid; expected one of {valid}")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _unread(node, prefix: str, schema, keys, why: str) -> None:
    """Refuse ``keys`` of ``node`` set away from their ``schema`` defaults: nothing would read them."""
    defaults = {f.name: f.default for f in dataclasses.fields(schema)}
    changed = [f"{prefix}.{k}={node[k]}" for k in keys if node[k] != defaults[k]]
    _check(not changed, f"{', '.join(changed)} is set, but {why}")


def _dry_run(cfg) -> None:
    """Build the run's algorithm (:func:`harness.algo.build_algorithm`) and run it once on a
    synthetic batch (:func:`harness.algo.dry_run`): every check a variant makes of its own
    params fails here, before any model is loaded, with the variant's own message."""
    try:
        dry_run(build_algorithm(cfg), cfg.group_size)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_staleness(cfg) -> None:
    """``rollout.staleness`` and ``offpolicy=`` (:mod:`harness.staleness`, :mod:`harness.algo.offpolicy`)."""
    k = cfg.rollout.staleness
    _check(k >= 0, f"rollout.staleness={k}: expected >= 0 (0 = on-policy)")
    _check(k == 0 or cfg.train.sharding == "none", f"rollout.staleness={k} with train.sharding={cfg.train.sharding}: "
           "the lagged weight versions are full copies, not shards; use train.sharding=none")
    _choice("offpolicy", cfg.offpolicy.name, OFFPOLICY_OBJECTIVES.names())
    if cfg.offpolicy.name == "decoupled" and cfg.rollout_correction.name != "none":
        _unread(cfg.offpolicy, "offpolicy", DecoupledParams, ["cap"],
                f"with rollout_correction={cfg.rollout_correction.name} the decoupled weight is capped by that "
                "correction (rollout_correction.cap)")


def validate(cfg) -> None:
    """Raise :class:`ConfigError` for unknown names, out-of-range values and bad combinations."""
    _choice("task", cfg.task.name, TASKS)
    _choice("advantage", cfg.advantage.name, TOKEN_ESTIMATORS.names())
    _choice("kl.form", cfg.kl.form, KL_ESTIMATORS.names())
    _choice("kl.placement", cfg.kl.placement, ["loss", "reward", "none"])
    _check(cfg.kl.clamp is None or cfg.kl.clamp > 0, f"kl.clamp={cfg.kl.clamp}: expected > 0 or null")
    if cfg.kl.importance_correct:
        _check(cfg.kl.placement == "loss", f"kl.importance_correct=true with kl.placement={cfg.kl.placement}: the "
               "correction multiplies the KL in the loss by pi_theta / pi_old (the reward's KL is taken at pi_old, "
               "where the ratio is 1); use kl.placement=loss")
        _check(cfg.kl.form in IMPORTANCE_CORRECTABLE, f"kl.importance_correct=true with kl.form={cfg.kl.form}: "
               f"the corrected estimate is unbiased for {list(IMPORTANCE_CORRECTABLE)} only (docs/knobs.md, KL)")
    _choice("kl.controller", cfg.kl.controller, KL_CONTROLLERS.names())
    reads = KL_CONTROLLERS.spec(cfg.kl.controller).needs  # the kl.* keys the controller reads
    _unread(cfg.kl, "kl", KLConfig, [k for k in ("target", "horizon") if k not in reads],
            f"kl.controller={cfg.kl.controller} does not read it (kl.controller=adaptive does)")
    _check(0 < cfg.top_entropy_quantile <= 1,
           f"top_entropy_quantile={cfg.top_entropy_quantile}: expected in (0, 1] (1 = every token)")
    _choice("loss_agg", cfg.loss_agg.name, LOSS_AGGREGATIONS.names())
    _choice("rollout.backend", cfg.rollout.backend, BACKENDS)
    schema = BACKENDS.spec(cfg.rollout.backend).params
    _check(schema is not None and set(cfg.rollout.keys()) == {f.name for f in dataclasses.fields(schema)},
           f"rollout.backend={cfg.rollout.backend}: choose the backend with rollout={cfg.rollout.backend} "
           "(the option brings its own keys), not by setting rollout.backend")
    # what a backend's schema declares about its keys (harness.rollout.vllm.VLLMRolloutConfig)
    for key, choices in getattr(schema, "CHOICES", {}).items():
        _choice(f"rollout.{key}", cfg.rollout[key], list(choices))
    gpu = torch.cuda.is_available()
    unread = list(getattr(schema, "CPU_ONLY" if gpu else "GPU_ONLY", ()))
    if unread:
        _unread(cfg.rollout, "rollout", schema, unread,
                "it is read on a CPU machine only and this one has a GPU" if gpu else
                "it is read on a GPU only and this machine has no GPU visible")
    _check(not getattr(schema, "OWN_BATCHES", False) or cfg.rollout.batch_size == 0,
           f"rollout.batch_size={cfg.rollout.batch_size} with rollout={cfg.rollout.backend}: that engine schedules "
           "its own batches; leave rollout.batch_size at 0")
    _choice("model.dtype", cfg.model.dtype, ["float32", "bfloat16", "float16", "float64"])
    _check(cfg.model.dtype != "float64" or not getattr(schema, "NO_FLOAT64", False),
           f"model.dtype=float64 with rollout={cfg.rollout.backend}: that engine has no float64 kernels; "
           "use rollout=hf (float64 is for exactness checks, see harness.precision) or model.dtype=float32")
    _choice("model.device", cfg.model.device, ["auto", "cpu", "cuda"])
    _check(cfg.model.device != "cuda" or gpu, "model.device=cuda: no CUDA device is visible on this machine "
           "(torch.cuda.is_available() is False); use model.device=auto or cpu")
    _choice("train.precision", cfg.train.precision, ["fp32", "bf16-autocast", "auto"])
    _check(cfg.train.precision == "fp32" or cfg.model.dtype == "float32",
           f"train.precision={cfg.train.precision} with model.dtype={cfg.model.dtype}: mixed precision keeps "
           "fp32 master weights; set model.dtype=float32 (or train.precision=fp32 to train in model.dtype)")
    _choice("train.sharding", cfg.train.sharding, list(SHARDINGS))
    if cfg.train.sharding == "fsdp2":
        ranks = int(os.environ.get("WORLD_SIZE", "1"))
        _check(ranks > 1, f"train.sharding=fsdp2 shards the model over torchrun's ranks and this run has {ranks}: "
               "launch it with torchrun --nproc_per_node=N (N >= 2), or use train.sharding=none")
        _check(getattr(schema, "SHARDABLE", True), f"train.sharding=fsdp2 with rollout={cfg.rollout.backend}: syncing "
               "sharded weights into that engine is not implemented; use rollout=hf")
    _choice("train.lr_schedule", cfg.train.lr_schedule, ["constant", "linear", "cosine"])
    _choice("checkpoint.keep_final", cfg.checkpoint.keep_final, KEEP_FINAL)
    estimator = TOKEN_ESTIMATORS.spec(cfg.advantage.name)
    if estimator.grouped:
        _check(cfg.group_size >= 2, f"group_size={cfg.group_size} with advantage={cfg.advantage.name}: "
               "a group estimator needs group_size >= 2 (a singleton group has no baseline)")
    _check(cfg.group_size >= 1, f"group_size={cfg.group_size}: expected >= 1")
    _check(cfg.beta >= 0, f"beta={cfg.beta}: expected >= 0")
    _check(cfg.mu >= 1, f"mu={cfg.mu}: expected >= 1 policy iterations per batch")
    _check(cfg.rollout.temperature > 0, f"rollout.temperature={cfg.rollout.temperature}: training needs sampling (> 0)")
    _check(0 < cfg.rollout.top_p <= 1, f"rollout.top_p={cfg.rollout.top_p}: expected in (0, 1] (1.0 = no nucleus)")
    _check(isinstance(cfg.rollout.top_k, int) and cfg.rollout.top_k >= 0,
           f"rollout.top_k={cfg.rollout.top_k}: expected an integer >= 0 (0 = no top-k)")
    _check(cfg.rollout.max_new_tokens >= 1, f"rollout.max_new_tokens={cfg.rollout.max_new_tokens}: expected >= 1")
    _choice("tools", cfg.tools.name, TOOLS.names())
    if cfg.tools.name == "none":  # episodes only run with a tool
        _unread(cfg.rollout, "rollout", schema, ["max_turns"], "tools=none rolls out one turn (tools=calculator or "
                "tools=search run episodes of up to rollout.max_turns turns)")
    _check(cfg.rollout.max_turns >= 1, f"rollout.max_turns={cfg.rollout.max_turns}: expected >= 1")
    for key in ("steps", "prompts_per_step", "micro_batch_size", "logprob_chunk", "max_bad_steps"):
        _check(cfg.train[key] >= 1, f"train.{key}={cfg.train[key]}: expected >= 1")
    _check(cfg.train.lr > 0, f"train.lr={cfg.train.lr}: expected > 0")
    if cfg.eval.size is not None and cfg.task.eval_size is not None:  # a larger eval.size would be cut silently
        _check(1 <= cfg.eval.size <= cfg.task.eval_size,
               f"eval.size={cfg.eval.size}: expected 1 <= eval.size <= task.eval_size={cfg.task.eval_size} (eval.size "
               "takes the first N of the task's eval set; raise task.eval_size for more problems)")
    _check(cfg.eval.num_samples >= 0, f"eval.num_samples={cfg.eval.num_samples}: expected >= 0")
    _check(cfg.overlong.buffer < cfg.rollout.max_new_tokens or cfg.overlong.buffer == 0,
           f"overlong.buffer={cfg.overlong.buffer} must be smaller than rollout.max_new_tokens={cfg.rollout.max_new_tokens}")
    _choice("policy_loss", cfg.policy_loss.name, POLICY_LOSSES.names())
    prescribed = POLICY_LOSSES.spec(cfg.policy_loss.name).aggregation
    if prescribed and prescribed != cfg.loss_agg.name:
        log.warning("policy_loss=%s prescribes loss_agg=%s (its paper's averaging); this run uses loss_agg=%s",
                    cfg.policy_loss.name, prescribed, cfg.loss_agg.name)
    _choice("critic.init", cfg.critic.init, ["policy", "random"])
    _check(cfg.critic.lr > 0, f"critic.lr={cfg.critic.lr}: expected > 0")
    if "values" not in estimator.needs:  # a critic knob with no critic would silently do nothing
        _unread(cfg.critic, "critic", CriticConfig, [f.name for f in dataclasses.fields(CriticConfig)],
                f"advantage={cfg.advantage.name} uses no critic (only estimators that need values, "
                "e.g. advantage=ppo, build one)")
    _check(cfg.tools.name == "none" or "step_rewards" not in estimator.needs,
           f"advantage={cfg.advantage.name} with tools={cfg.tools.name}: step rewards index the whole sequence, "
           "observations included, which the estimator does not see; use an outcome estimator or tools=none")
    if cfg.kl.placement == "reward" and cfg.beta > 0:
        _check("step_rewards" not in estimator.needs,
               f"kl.placement=reward is not defined for advantage={cfg.advantage.name} (step rewards)")
    _check_staleness(cfg)
    _lora(cfg)
    _dry_run(cfg)


def _lora(cfg) -> None:
    """The ``lora`` option's ranges and the combinations it cannot serve (reasons in the messages)."""
    node = cfg.get("lora")
    if node is None or node.name == "none":
        if "lora_sync" in cfg.rollout:  # rollout=vllm: how the adapters reach the engine; none to send
            _unread(cfg.rollout, "rollout", BACKENDS.spec(cfg.rollout.backend).params, ["lora_sync"],
                    "lora=none has no adapters to sync (lora=peft has)")
        return
    _choice("lora", node.name, ADAPTERS.names())
    _check(int(node.r) >= 1, f"lora.r={node.r}: expected >= 1 (the adapters' rank)")
    _check(float(node.alpha) > 0, f"lora.alpha={node.alpha}: expected > 0 (the update is scaled by alpha / r)")
    _check(0 <= float(node.dropout) < 1, f"lora.dropout={node.dropout}: expected in [0, 1)")
    targets = list(node.target_modules or [])
    _check(bool(targets) and all(isinstance(t, str) and t for t in targets),
           f"lora.target_modules={targets}: expected a non-empty list of module names (q_proj, ..., down_proj)")
    _check(cfg.rollout.get("lora_sync", "merged") != "adapter" or int(node.r) <= 512,
           f"rollout.lora_sync=adapter with lora.r={node.r}: vLLM serves LoRA ranks up to 512; use rollout.lora_sync=merged")
    _check(cfg.train.sharding == "none", f"train.sharding={cfg.train.sharding} with lora={node.name}: not implemented; "
           "the sharded checkpoint and optimizer-state path (harness.distributed.full_state) indexes every parameter "
           "of the policy, and the optimizer holds only the adapters. The adapters are small: use data-parallel "
           "torchrun (train.sharding=none), which reduces only their gradients")
    _check(not cfg.kl.ref_refresh_steps, f"kl.ref_refresh_steps={cfg.kl.ref_refresh_steps} with lora={node.name}: "
           "the reference is the base model (the adapters off); refreshing it would mean merging the adapters into "
           "the frozen base. Use kl.ref_refresh_steps=0")
    if "values" in TOKEN_ESTIMATORS.spec(cfg.advantage.name).needs:
        _check(cfg.critic.init == "policy", f"critic.init={cfg.critic.init} with lora={node.name}: the critic's "
               "body trains only its adapters, so a re-initialised (random) frozen body would stay random; "
               "use critic.init=policy")
