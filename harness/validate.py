"""Startup checks of a resolved config: every error names the key and what was expected."""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid config value or combination; the message names the key(s)."""


def _choice(key: str, value, valid) -> None:
    valid = sorted(valid)
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not valid; expected one of {valid}")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate(cfg) -> None:
    """Raise :class:`ConfigError` for unknown names, out-of-range values and bad combinations."""
    from harness.algo import KL_ESTIMATORS, LOSS_AGGREGATIONS, TOKEN_ESTIMATORS, requires_groups
    from harness.rollout import BACKENDS
    from harness.tasks import TASKS

    _choice("task", cfg.task.name, TASKS)
    _choice("advantage", cfg.advantage.name, TOKEN_ESTIMATORS.names())
    _choice("kl.form", cfg.kl.form, KL_ESTIMATORS.names())
    _choice("kl.placement", cfg.kl.placement, ["loss", "reward", "none"])
    _choice("loss_agg", cfg.loss_agg, LOSS_AGGREGATIONS.names())
    _choice("ratio_level", cfg.ratio_level, ["token", "sequence"])
    _choice("rollout.backend", cfg.rollout.backend, BACKENDS)
    _choice("model.dtype", cfg.model.dtype, ["float32", "bfloat16", "float16"])
    _choice("train.lr_schedule", cfg.train.lr_schedule, ["constant", "linear", "cosine"])
    if requires_groups(cfg.advantage.name):
        _check(cfg.group_size >= 2, f"group_size={cfg.group_size} with advantage={cfg.advantage.name}: "
               "a group estimator needs group_size >= 2 (a singleton group has no baseline)")
    _check(cfg.group_size >= 1, f"group_size={cfg.group_size}: expected >= 1")
    _check(cfg.epsilon > 0, f"epsilon={cfg.epsilon}: expected > 0")
    _check(cfg.epsilon_high is None or cfg.epsilon_high > 0, f"epsilon_high={cfg.epsilon_high}: expected > 0 or null")
    _check(cfg.dual_clip is None or cfg.dual_clip > 1, f"dual_clip={cfg.dual_clip}: expected > 1 or null")
    _check(cfg.beta >= 0, f"beta={cfg.beta}: expected >= 0")
    _check(cfg.mu >= 1, f"mu={cfg.mu}: expected >= 1 policy iterations per batch")
    _check(cfg.rollout.temperature > 0, f"rollout.temperature={cfg.rollout.temperature}: training needs sampling (> 0)")
    _check(0 < cfg.rollout.top_p <= 1, f"rollout.top_p={cfg.rollout.top_p}: expected in (0, 1]")
    _check(cfg.rollout.max_new_tokens >= 1, f"rollout.max_new_tokens={cfg.rollout.max_new_tokens}: expected >= 1")
    for key in ("steps", "prompts_per_step", "micro_batch_size", "logprob_chunk", "max_bad_steps"):
        _check(cfg.train[key] >= 1, f"train.{key}={cfg.train[key]}: expected >= 1")
    _check(cfg.train.lr > 0, f"train.lr={cfg.train.lr}: expected > 0")
    _check(cfg.eval.num_samples >= 0, f"eval.num_samples={cfg.eval.num_samples}: expected >= 0")
    _check(cfg.overlong.buffer < cfg.rollout.max_new_tokens or cfg.overlong.buffer == 0,
           f"overlong.buffer={cfg.overlong.buffer} must be smaller than rollout.max_new_tokens={cfg.rollout.max_new_tokens}")
    if cfg.advantage.name == "ppo":
        _choice("advantage.critic_init", cfg.advantage.critic_init, ["policy", "random"])
    if cfg.kl.placement == "reward" and cfg.beta > 0:
        _check(cfg.advantage.name != "process", "kl.placement=reward is not defined for advantage=process")
