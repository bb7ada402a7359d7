"""Outcome-level advantage estimators: sequence rewards ``[P, G]`` -> advantages ``[P, G]``.

``P`` prompts, each with a group of ``G`` sampled completions; ``rewards[p, g]``
is the scalar reward of completion ``g`` of prompt ``p``. Flattened batches are
group-major: row ``b = p * G + g``.

Each estimator is a small function with the signature
``fn(rewards, valid, params, state) -> [P, G]``, registered by name in the one estimator
registry with its params dataclass (:func:`harness.algo.estimators.outcome_estimator`, which
also registers its token-level form);
:func:`harness.algo.estimators.compute_advantages` validates inputs and dispatches by config string.

Rules shared by all estimators:

* ``valid[p, g] = False`` (e.g. an empty completion) excludes that completion
  from every statistic; its advantage is 0.
* Group estimators (``requires_groups``): a group whose valid rewards are all
  equal (zero variance) gets exactly 0 (never NaN), as does a group with fewer
  than 2 valid members; ``G < 2`` raises ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch
from torch import Tensor

from .estimators import outcome_estimator
from .utils import masked_mean, masked_var


# --------------------------------------------------------------------------- helpers


def _group_stats(rewards: Tensor, valid: Tensor):
    """Per-group valid count ``n``, mean and "degenerate" flag, each ``[P, 1]``.

    Degenerate = fewer than 2 valid members or all valid rewards equal. The
    equality test is exact (max == min), so zero-variance groups map to exactly
    0 even when floating-point ``mean`` differs from the shared value.
    """
    n = valid.sum(dim=-1, keepdim=True)
    mean = masked_mean(rewards, valid, dim=-1, keepdim=True)
    big = torch.finfo(rewards.dtype).max
    hi = torch.where(valid, rewards, torch.full_like(rewards, -big)).amax(dim=-1, keepdim=True)
    lo = torch.where(valid, rewards, torch.full_like(rewards, big)).amin(dim=-1, keepdim=True)
    degenerate = (n < 2) | (hi == lo)
    return n, mean, degenerate


def _finalise(adv: Tensor, valid: Tensor, degenerate: Optional[Tensor] = None) -> Tensor:
    keep = valid if degenerate is None else valid & ~degenerate
    return torch.where(keep, adv, torch.zeros_like(adv))


# --------------------------------------------------------------------------- params
# Each dataclass is the estimator's only declaration of its parameters: the defaults live here,
# it is the Hydra schema of ``advantage=<name>``, and the function receives the whole instance.


@dataclass
class GRPOParams:
    """``advantage=grpo``: group z-score (DeepSeekMath sec. 4.1.2)."""

    name: str = "grpo"
    eps: float = 1e-6  # added to the std (TRL 1e-4, OpenRLHF 1e-9, verl 1e-6)
    scale: str = "group"  # group | batch | none: which std divides (r - mean_group)
    unbiased: bool = True  # Bessel-corrected std (torch.std, as TRL/verl/OpenRLHF)


@dataclass
class MeanOnlyParams:
    """``advantage=mean_only``: Dr. GRPO, group-mean baseline without std scaling."""

    name: str = "mean_only"


@dataclass
class RLOOParams:
    """``advantage=rloo``: leave-one-out baseline (Kool et al. 2019, Ahmadian et al. 2024)."""

    name: str = "rloo"
    # none: A = r - mean(others); loo_std: also divided by the std of the others where it is not
    # zero (NeMo-RL use_leave_one_out_baseline + normalize_rewards)
    scale: str = "none"
    eps: float = 0.0  # added to the leave-one-out std under scale=loo_std (NeMo-RL: 0 before PR #1423, 1e-6 from it)
    # loo_std's variance of the others: population (/ (n-1), NeMo-RL before PR #1423) or
    # Bessel-corrected (/ (n-2), NeMo-RL from PR #1423; recipe: unbiased=true eps=1e-6)
    unbiased: bool = False


@dataclass
class ReinforceParams:
    """``advantage=reinforce``: REINFORCE with a scalar baseline (Williams 1992)."""

    name: str = "reinforce"
    baseline: str = "batch_mean"  # none | batch_mean | ema
    ema_decay: float = 0.9  # used by baseline=ema


# --------------------------------------------------------------------------- estimators

# GRPO denominators by ``scale``: fn(rewards, valid, unbiased, eps) -> [P, 1] or 0-dim.
_GRPO_SCALES: Dict[str, Callable[[Tensor, Tensor, bool, float], Tensor]] = {
    "group": lambda r, v, unbiased, eps: masked_var(
        r, v, unbiased=unbiased, dim=-1, keepdim=True
    ).sqrt()
    + eps,
    "batch": lambda r, v, unbiased, eps: masked_var(r, v, unbiased=unbiased).sqrt() + eps,
    "none": lambda r, v, unbiased, eps: torch.ones((), dtype=r.dtype, device=r.device),
}


# The invariances each estimator promises (checked by tests/test_properties.py): "permutation" of
# a group's members permutes its advantages; "shift": r + c gives the same advantages; "scale":
# c * r (c > 0) gives the same advantages (up to the eps added to a std); "scale_equivariant": c * r
# gives c * A; "constant_zero": a group whose valid rewards are all equal gets exactly 0.
_GROUP_BASE = ("permutation", "shift", "constant_zero")


def _grpo_invariances(p: "GRPOParams"):
    return {*_GROUP_BASE, "scale_equivariant" if p.scale == "none" else "scale"}


@outcome_estimator("grpo", params=GRPOParams, grouped=True, invariances=_grpo_invariances)
def grpo_advantages(rewards: Tensor, valid: Tensor, p: GRPOParams, state: Optional[Dict] = None) -> Tensor:
    """GRPO group-normalised advantage.

    Shapes: ``rewards``, ``valid``: ``[P, G]`` -> ``[P, G]``.

    Formula (Shao et al. 2024, DeepSeekMath, sec. 4.1.2 "outcome supervision"):
    ``A_pg = (r_pg - mean_g r) / (std + p.eps)`` where ``std`` is
    ``p.scale="group"``: the std of the group's valid rewards (Bessel-corrected if
    ``p.unbiased``, like ``torch.std`` / verl / TRL);
    ``p.scale="batch"``: the std of all valid rewards of the batch (the
    "local mean, global std" variant, e.g. TRL ``scale_rewards="batch"``);
    ``p.scale="none"``: no division (identical to ``mean_only``).

    Raises:
        ValueError: if ``p.scale`` is not one of group/batch/none or ``p.eps < 0``.
    """
    if p.scale not in _GRPO_SCALES:
        raise ValueError(f"advantage.scale must be one of {sorted(_GRPO_SCALES)}; got {p.scale!r}")
    if p.eps < 0:
        raise ValueError(f"advantage.eps must be >= 0, got {p.eps}")
    _, mean, degenerate = _group_stats(rewards, valid)
    adv = (rewards - mean) / _GRPO_SCALES[p.scale](rewards, valid, p.unbiased, p.eps)
    return _finalise(adv, valid, degenerate)


@outcome_estimator("mean_only", params=MeanOnlyParams, grouped=True,
                             invariances=(*_GROUP_BASE, "scale_equivariant"))
def mean_only_advantages(rewards: Tensor, valid: Tensor, p: MeanOnlyParams, state: Optional[Dict] = None) -> Tensor:
    """Dr. GRPO advantage: group-mean baseline without std normalisation.

    Shapes: ``rewards``, ``valid``: ``[P, G]`` -> ``[P, G]``.

    Formula (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical
    Perspective", Dr. GRPO objective): ``A_pg = r_pg - mean_g r``.

    Raises:
        Nothing beyond :func:`compute_advantages` validation.
    """
    _, mean, degenerate = _group_stats(rewards, valid)
    return _finalise(rewards - mean, valid, degenerate)


_RLOO_SCALES = ("none", "loo_std")

# A leave-one-out std at or below this fraction of the group's largest |reward| counts as zero.
# Rewards reach the estimators as float32: a spread of a few float32 ulps (eps = 1.2e-7) at the
# group's scale cannot be told from rounding, and dividing by it would amplify rounding ~1e6-fold.
# 8 ulps; the same threshold for every input dtype, so float32 and float64 inputs decide alike.
LOO_STD_ZERO_RTOL = 8 * torch.finfo(torch.float32).eps


def leave_one_out_stats(rewards: Tensor, valid: Tensor, unbiased: bool = False):
    """Leave-one-out baseline and std of each member's group, in float64.

    Shapes: ``rewards``, ``valid``: ``[P, G]`` -> ``(baseline, std, zero)``, each ``[P, G]``
    float64 (``zero`` bool).

    Formula: over the ``m = n - 1`` other valid members ``j != i`` of the group,
    ``b_i = 1/m sum_j r_j`` and ``s_i^2 = sum_j (r_j - b_i)^2 / d`` with ``d = m`` (population)
    or ``d = m - 1`` (``unbiased``, Bessel); ``s_i = 0`` where ``d < 1``. The variance is taken
    from the deviations, in float64, never as ``mean(r^2) - b^2``: that form cancels
    catastrophically in float32 (it left a std of ~4e-4 for seven equal rewards 0.95, and an
    advantage of -2247 instead of -0.95). ``zero`` marks ``s_i <= LOO_STD_ZERO_RTOL * max_j |r_j|``
    (the group's scale), i.e. the others agree up to float32 rounding.
    """
    r = rewards.to(torch.float64)
    P, G = r.shape
    off_diag = ~torch.eye(G, dtype=torch.bool, device=r.device)
    others = valid.unsqueeze(1) & off_diag.unsqueeze(0)  # [P, i, j]: j is another valid member of i's group
    m = others.sum(-1).to(torch.float64)  # [P, G]
    zeros = torch.zeros((), dtype=torch.float64, device=r.device)
    r_j = r.unsqueeze(1).expand(P, G, G)
    baseline = torch.where(others, r_j, zeros).sum(-1) / m.clamp(min=1)
    dev = torch.where(others, r_j - baseline.unsqueeze(-1), zeros)
    d = m - 1 if unbiased else m
    var = torch.where(d >= 1, dev.square().sum(-1) / d.clamp(min=1), zeros)
    std = var.sqrt()
    scale = torch.where(valid, r.abs(), zeros).amax(-1, keepdim=True)
    return baseline, std, std <= LOO_STD_ZERO_RTOL * scale


# loo_std is neither scale-invariant nor equivariant: a member whose others agree keeps r - b unscaled
@outcome_estimator("rloo", params=RLOOParams, grouped=True, invariances=lambda p: {
    *_GROUP_BASE, *(() if p.scale == "loo_std" else ("scale_equivariant",))})
def rloo_advantages(rewards: Tensor, valid: Tensor, p: RLOOParams, state: Optional[Dict] = None) -> Tensor:
    """REINFORCE leave-one-out advantage, optionally scaled by the leave-one-out std.

    Shapes: ``rewards``, ``valid``: ``[P, G]`` -> ``[P, G]`` in ``rewards``' dtype (computed in
    float64).

    Formula (Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for
    Free!"; Ahmadian et al. 2024, "Back to Basics", eq. for RLOO), over the ``n``
    valid members of the group: ``b_i = 1/(n-1) sum_{j != i} r_j`` and
    ``A_i = r_i - b_i = n/(n-1) (r_i - mean)``.

    ``p.scale="loo_std"`` follows NeMo-RL (``grpo.use_leave_one_out_baseline`` with
    ``grpo.normalize_rewards``, ``calculate_baseline_and_std_per_prompt``): ``s_i`` is the std
    of the others (:func:`leave_one_out_stats`: population with ``p.unbiased=False``, NeMo-RL
    before PR #1423; Bessel-corrected with ``p.unbiased=True``, NeMo-RL from that PR, which also uses
    ``eps=1e-6``) and ``A_i = (r_i - b_i) / (s_i + p.eps)``. Where the others agree
    (``s_i`` zero up to float32 rounding, see ``LOO_STD_ZERO_RTOL``) ``A_i = r_i - b_i`` is
    left unscaled, so the advantage stays bounded by the reward range (NeMo-RL's
    "don't sharpen the ones with no variation"). Convention: the statistics are computed in
    float64 from deviations, so a float32 batch gives the float64 result to float32 rounding.

    Raises:
        ValueError: ``p.scale`` not none/loo_std, or ``p.eps < 0``.
    """
    if p.scale not in _RLOO_SCALES:
        raise ValueError(f"advantage.scale must be one of {list(_RLOO_SCALES)}; got {p.scale!r}")
    if p.eps < 0:
        raise ValueError(f"advantage.eps must be >= 0, got {p.eps}")
    _, _, degenerate = _group_stats(rewards, valid)
    baseline, loo_std, zero = leave_one_out_stats(rewards, valid, unbiased=p.unbiased)
    adv = rewards.to(torch.float64) - baseline
    if p.scale == "loo_std":
        adv = torch.where(zero, adv, adv / (loo_std + p.eps))
    return _finalise(adv.to(rewards.dtype), valid, degenerate)


def _ema_baseline(rewards: Tensor, valid: Tensor, ema_decay: float, state) -> Tensor:
    if not isinstance(state, dict):
        raise ValueError("state must be a dict when baseline='ema' (holds the EMA baseline)")
    if not 0.0 <= ema_decay <= 1.0:
        raise ValueError(f"advantage.ema_decay must be in [0, 1], got {ema_decay}")
    batch_mean = float(masked_mean(rewards, valid))
    prev = state.get("ema")
    b = batch_mean if prev is None else float(prev)
    if bool(valid.any()):
        state["ema"] = ema_decay * b + (1.0 - ema_decay) * batch_mean
    return torch.tensor(b, dtype=rewards.dtype, device=rewards.device)


# REINFORCE baselines by name: fn(rewards, valid, ema_decay, state) -> 0-dim baseline.
_REINFORCE_BASELINES: Dict[str, Callable] = {
    "none": lambda r, v, d, s: torch.zeros((), dtype=r.dtype, device=r.device),
    "batch_mean": lambda r, v, d, s: masked_mean(r, v),
    "ema": _ema_baseline,
}


@outcome_estimator("reinforce", params=ReinforceParams, grouped=False, invariances=lambda p: {
    "none": ("permutation", "scale_equivariant"), "batch_mean": ("permutation", "shift", "scale_equivariant"),
    "ema": ("permutation",)}[p.baseline])
def reinforce_advantages(rewards: Tensor, valid: Tensor, p: ReinforceParams, state: Optional[Dict] = None) -> Tensor:
    """Vanilla REINFORCE advantage with a scalar baseline.

    Shapes: ``rewards``, ``valid``: ``[P, G]`` -> ``[P, G]`` (works for ``G = 1``).

    Formula (Williams 1992): ``A = r - b`` with
    ``p.baseline="none"``: ``b = 0``;
    ``p.baseline="batch_mean"`` (default): ``b`` = mean of the batch's valid rewards;
    ``p.baseline="ema"``: ``b = state["ema"]`` (the value *before* this call's
    update; on the first call, when ``"ema"`` is absent, ``b`` = batch mean).
    After use, ``state["ema"] = p.ema_decay * b + (1 - p.ema_decay) * batch_mean``
    (a python float). A batch with no valid reward leaves the state unchanged.

    Raises:
        ValueError: if ``p.baseline`` is unknown, ``baseline="ema"`` without a
            ``state`` dict, or ``p.ema_decay`` not in ``[0, 1]``.
    """
    if p.baseline not in _REINFORCE_BASELINES:
        raise ValueError(
            f"advantage.baseline must be one of {sorted(_REINFORCE_BASELINES)}; got {p.baseline!r}"
        )
    b = _REINFORCE_BASELINES[p.baseline](rewards, valid, p.ema_decay, state)
    return _finalise(rewards - b, valid)


@dataclass
class GRPOPassKParams:
    """``advantage=grpo_passk``: pass@k-oriented group advantage (verl ``grpo_passk``)."""

    name: str = "grpo_passk"
    eps: float = 1e-6
    scale: bool = True  # divide by the group's std (verl norm_adv_by_std_in_grpo)


@outcome_estimator("grpo_passk", params=GRPOPassKParams, grouped=True, invariances=lambda p: {
    *_GROUP_BASE, "scale" if p.scale else "scale_equivariant"})
def grpo_passk_advantages(rewards: Tensor, valid: Tensor, p: GRPOPassKParams, state: Optional[Dict] = None) -> Tensor:
    """Pass@k advantage: only the group's best completion is credited.

    Shapes: ``rewards``, ``valid``: ``[P, G]`` -> ``[P, G]``.

    Formula (verl ``compute_grpo_passk_outcome_advantage``, after arXiv 2503.19595): in each
    group the top valid completion gets ``A = (r_max - r_second) / (std + eps)`` (``std`` the
    Bessel-corrected std of the group's valid rewards; no division with ``scale=false``), every
    other completion 0. A tie at the top gives 0. Optimises the best of k samples rather than
    the mean.

    Raises:
        ValueError: ``p.eps < 0``.
    """
    if p.eps < 0:
        raise ValueError(f"advantage.eps must be >= 0, got {p.eps}")
    n, _, degenerate = _group_stats(rewards, valid)
    low = torch.finfo(rewards.dtype).min
    masked = torch.where(valid, rewards, torch.full_like(rewards, low))
    top2 = masked.topk(2, dim=-1)
    gap = top2.values[:, :1] - top2.values[:, 1:2]
    if p.scale:
        gap = gap / (masked_var(rewards, valid, unbiased=True, dim=-1, keepdim=True).sqrt() + p.eps)
    adv = torch.zeros_like(rewards).scatter(-1, top2.indices[:, :1], gap)
    return _finalise(adv, valid, degenerate)


__all__ = [
    "grpo_advantages",
    "mean_only_advantages",
    "rloo_advantages",
    "reinforce_advantages",
    "GRPOParams",
    "MeanOnlyParams",
    "RLOOParams",
    "ReinforceParams",
    "GRPOPassKParams",
]
