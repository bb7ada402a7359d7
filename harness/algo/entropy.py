"""Entropy-bonus controllers registered by name (``entropy_control=<name>``): how the coefficient
of the entropy bonus ``- entropy_coef * H`` (:func:`harness.train.update.token_objective`) moves from
step to step. ``entropy_coef`` is the starting coefficient.

Signature ``fn(coef, entropy, p) -> next coef``, with ``entropy`` the step's mean per-token
entropy (``train/entropy``, nats); the params' ``applies(last_entropy)`` says whether a step
whose previous step measured ``last_entropy`` applies the coefficient at all (the trainer passes
``inf`` before the first measurement). The trainer keeps ``(coef, last_entropy)`` in its
checkpoints and logs the coefficient as ``train/entropy_coef`` (TRL's ``entropy_coef``) and
whether the step applied it as ``train/entropy_bonus_applied``.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.registry import Registry

ENTROPY_CONTROLLERS: Registry = Registry("entropy controller")


@dataclass
class FixedEntropyParams:
    """``entropy_control=fixed``: the bonus is ``entropy_coef`` at every step."""

    name: str = "fixed"

    def applies(self, last_entropy: float) -> bool:
        """Always."""
        return True


@ENTROPY_CONTROLLERS.register("fixed", params=FixedEntropyParams)
def fixed(coef: float, entropy: float, p: FixedEntropyParams) -> float:
    """The coefficient stays ``entropy_coef``."""
    return coef


@dataclass
class AdaptiveEntropyParams:
    """``entropy_control=adaptive``: Skywork-OR1's adaptive entropy control, as TRL implements it
    (``use_adaptive_entropy``; its ``entropy_target``, ``entropy_coef_delta``,
    ``entropy_coef_min`` / ``_max`` and their defaults)."""

    name: str = "adaptive"
    target: float = 0.2  # nats per token (TRL entropy_target)
    delta: float = 0.005  # step of the coefficient (TRL entropy_coef_delta)
    coef_min: float = 0.0
    coef_max: float = 1.0

    def applies(self, last_entropy: float) -> bool:
        """Only when the previous step's entropy was at or below ``target`` (never before the
        first measurement: TRL starts from ``inf``)."""
        return last_entropy <= self.target


@ENTROPY_CONTROLLERS.register("adaptive", params=AdaptiveEntropyParams)
def adaptive(coef: float, entropy: float, p: AdaptiveEntropyParams) -> float:
    """Skywork-OR1 (He et al. 2025, "Skywork Open Reasoner 1 Technical Report", arXiv 2505.22312,
    adaptive entropy control; TRL ``GRPOTrainer``, ``use_adaptive_entropy=True``):

        c_{k+1} = min(c_k + delta, coef_max)   if H_k <= target
                  max(c_k - delta, coef_min)   otherwise

    and step ``k + 1`` applies ``c_{k+1}`` only if ``H_k <= target`` (else 0), so the bonus acts
    only once the entropy has fallen to the target. ``H_k``: the step's mean per-token entropy.
    TRL updates at every optimizer step; here at every training step (with ``mu > 1`` its passes
    share one coefficient, and ``H`` is the mean over the passes).

    Raises:
        ValueError: ``target`` or ``delta`` not > 0, or ``coef_min > coef_max`` (names the key).
    """
    if not (p.target > 0 and p.delta > 0):
        raise ValueError(f"entropy_control.target and entropy_control.delta must be > 0, got {p.target}, {p.delta}")
    if p.coef_min > p.coef_max:
        raise ValueError(f"entropy_control.coef_min ({p.coef_min}) must be <= entropy_control.coef_max ({p.coef_max})")
    if entropy <= p.target:
        return min(coef + p.delta, p.coef_max)
    return max(coef - p.delta, p.coef_min)


__all__ = ["ENTROPY_CONTROLLERS", "fixed", "adaptive", "FixedEntropyParams", "AdaptiveEntropyParams"]
