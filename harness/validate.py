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


# Why rollout.top_p < 1 is refused (see docs/knobs.md, "Sampling"): the hf sampler draws from the
# renormalised nucleus, while every trainer log-prob (old, reference, current) is a log-softmax
# over the full vocabulary, so the on-policy ratio pi/pi_old is computed for a distribution that
# did not sample the tokens, and nothing would say so.
TOP_P_REFUSED = (
    "rollout.top_p={}: expected 1.0. Sampling from a top-p nucleus draws from the renormalised "
    "truncated distribution, but the trainer's log-probs (ratio, KL, entropy) use the full softmax, "
    "so the update would be biased; the harness refuses the setting instead of training on it"
)


def _dry_run(cfg) -> None:
    """Run the configured estimator and aggregation once on a 2-prompt synthetic batch.

    Every check a variant makes of its own params (``advantage.scale=global``,
    ``advantage.baseline=median``, ...) then fails here, before any model is loaded, with the
    variant's own message; the valid values are written down once, in the variant.
    """
    import torch

    from harness.algo import TOKEN_ESTIMATORS, AdvantageContext, aggregate_loss

    G = max(int(cfg.group_size), 1)
    spec = TOKEN_ESTIMATORS.spec(cfg.advantage.name)
    mask = torch.ones(2 * G, 3)
    scores = torch.arange(2 * G, dtype=torch.float32).view(2, G) % 2
    token_rewards = torch.zeros(2 * G, 3)
    token_rewards[:, -1] = scores.reshape(-1)
    ctx = AdvantageContext(scores=scores, token_rewards=token_rewards, mask=mask,
                           values=torch.zeros(2 * G, 3) if "values" in spec.needs else None,
                           step_rewards=[[(2, 1.0)]] * (2 * G) if "step_rewards" in spec.needs else None)
    try:
        spec.fn(ctx, spec.build(cfg.advantage))
        aggregate_loss(torch.ones(2 * G, 3), mask, cfg.loss_agg.name, cfg.loss_agg,
                       max_len=cfg.rollout.max_new_tokens)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def validate(cfg) -> None:
    """Raise :class:`ConfigError` for unknown names, out-of-range values and bad combinations."""
    from harness.algo import KL_ESTIMATORS, LOSS_AGGREGATIONS, TOKEN_ESTIMATORS, requires_groups
    from harness.rollout import BACKENDS
    from harness.tasks import TASKS

    _choice("task", cfg.task.name, TASKS)
    _choice("advantage", cfg.advantage.name, TOKEN_ESTIMATORS.names())
    _choice("kl.form", cfg.kl.form, KL_ESTIMATORS.names())
    _choice("kl.placement", cfg.kl.placement, ["loss", "reward", "none"])
    _check(cfg.kl.clamp is None or cfg.kl.clamp > 0, f"kl.clamp={cfg.kl.clamp}: expected > 0 or null")
    _choice("loss_agg", cfg.loss_agg.name, LOSS_AGGREGATIONS.names())
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
    _check(cfg.rollout.top_p == 1.0, TOP_P_REFUSED.format(cfg.rollout.top_p))
    _check(cfg.rollout.max_new_tokens >= 1, f"rollout.max_new_tokens={cfg.rollout.max_new_tokens}: expected >= 1")
    for key in ("steps", "prompts_per_step", "micro_batch_size", "logprob_chunk", "max_bad_steps"):
        _check(cfg.train[key] >= 1, f"train.{key}={cfg.train[key]}: expected >= 1")
    _check(cfg.train.lr > 0, f"train.lr={cfg.train.lr}: expected > 0")
    _check(cfg.eval.num_samples >= 0, f"eval.num_samples={cfg.eval.num_samples}: expected >= 0")
    _check(cfg.overlong.buffer < cfg.rollout.max_new_tokens or cfg.overlong.buffer == 0,
           f"overlong.buffer={cfg.overlong.buffer} must be smaller than rollout.max_new_tokens={cfg.rollout.max_new_tokens}")
    spec = TOKEN_ESTIMATORS.spec(cfg.advantage.name)
    if "values" in spec.needs:
        _choice("advantage.critic_init", cfg.advantage.critic_init, ["policy", "random"])
    if cfg.kl.placement == "reward" and cfg.beta > 0:
        _check("step_rewards" not in spec.needs,
               f"kl.placement=reward is not defined for advantage={cfg.advantage.name} (step rewards)")
    _dry_run(cfg)
