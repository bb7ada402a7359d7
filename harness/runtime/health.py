"""Degenerate-run warnings: a step whose numbers say the run cannot learn, or is diverging.

Each check reads one logged metric of a step, compares it with a fixed bound, and names the
knob to change. A check that fires warns at once, then at most once every ``every`` steps while
it keeps firing (the message counts the steps so far), and the trainer sets the MLflow tag
``health.<metric>`` to the latest message, so a finished run's record says what went wrong.

Bounds (per step):

| metric | fires when | what it means |
|---|---|---|
| ``train/clipped_ratio`` | >= 0.9 | (almost) every completion hit ``rollout.max_new_tokens`` |
| ``train/frac_reward_zero_std`` | >= 0.9 | (almost) every group has equal rewards: group baselines give 0 advantage |
| ``train/kl`` | > 1.0 nats/token | the policy is far from the reference |
| ``train/ratio_mean`` | outside [0.5, 2.0] | the importance ratio left the trust region (mu > 1) |
| ``train/grad_norm`` | > 100 (before clipping) | the update is exploding |
| ``train/skipped_updates`` | > 0 | a non-finite loss or gradient skipped an update |
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Check:
    """One bound on one metric; ``knob`` names what to change, ``meaning`` says why it matters."""

    metric: str
    fires: Callable[[float], bool]
    bound: str
    knob: str
    meaning: str


CHECKS = (
    Check("train/clipped_ratio", lambda v: v >= 0.9, ">= 0.9", "rollout.max_new_tokens",
          "almost every completion was truncated, so rewards score unfinished answers"),
    Check("train/frac_reward_zero_std", lambda v: v >= 0.9, ">= 0.9",
          "task / rollout.temperature / group_size",
          "almost every group has equal rewards: a group baseline (grpo, rloo, dr_grpo, ...) gives those groups 0 "
          "advantage, so such an estimator learns nearly nothing from the step (a critic's or a batch baseline still moves)"),
    Check("train/kl", lambda v: v > 1.0, "> 1.0", "beta / train.lr",
          "the policy has moved far from the reference"),
    Check("train/ratio_mean", lambda v: not 0.5 <= v <= 2.0, "outside [0.5, 2.0]", "train.lr / mu / policy_loss.epsilon",
          "the importance ratio left the trust region"),
    Check("train/grad_norm", lambda v: v > 100.0, "> 100", "train.lr / train.max_grad_norm",
          "the gradient norm (before clipping) is exploding"),
    Check("train/skipped_updates", lambda v: v > 0, "> 0", "train.lr / model.dtype",
          "a non-finite loss or gradient skipped an update"),
)


@dataclass(frozen=True)
class Warning_:
    """A warning to print and to set as an MLflow tag."""

    tag: str
    message: str


class HealthMonitor:
    """Checks each step's metrics against :data:`CHECKS`, rate-limited per metric.

    Args:
        every: after a check first fires, it warns again only ``every`` steps later (while it
            keeps firing); the count of firing steps is always kept.
    """

    def __init__(self, every: int = 10, checks=CHECKS):
        self.every, self.checks = every, checks
        self.count: dict[str, int] = {}
        self.last_warned: dict[str, int] = {}

    def check(self, step: int, metrics: dict) -> list[Warning_]:
        """The warnings due at ``step`` (empty when nothing fires or all are rate-limited)."""
        out = []
        for c in self.checks:
            v = metrics.get(c.metric)
            if v is None or not math.isfinite(float(v)) or not c.fires(float(v)):
                continue
            self.count[c.metric] = self.count.get(c.metric, 0) + 1
            last = self.last_warned.get(c.metric)
            if last is not None and step - last < self.every:
                continue
            self.last_warned[c.metric] = step
            n = self.count[c.metric]
            out.append(Warning_(
                f"health.{c.metric}",
                f"step {step}: {c.metric}={float(v):.4g} ({c.bound}): {c.meaning}; "
                f"change {c.knob} ({n} step{'s' if n > 1 else ''} so far)",
            ))
        return out
