"""Group-centred outcome advantages with another scale than GRPO's std: ``[P, G] -> [P, G]``.

* ``max_rl``: divided by the group mean (MaxRL);
* ``gpg``: multiplied by the batch factor ``alpha = B / (B - M)`` that undoes the dilution of
  the gradient by zero-advantage groups (GPG).

Same conventions as :mod:`harness.algo.advantages` (registered with ``outcome_estimator``,
signature ``fn(rewards, valid, params, state)``, called in float64 by ``compute_advantages``;
invalid completions get 0 and leave every statistic; a degenerate group gets exactly 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch
from torch import Tensor

from .advantages import LOO_STD_ZERO_RTOL, _finalise, _group_stats
from .estimators import outcome_estimator
from .utils import masked_var


@dataclass
class MaxRLParams:
    """``advantage=max_rl``: mean-normalised group advantage (MaxRL, arXiv 2602.02710)."""

    name: str = "max_rl"


# A group mean at or below this fraction of the group's largest |reward| counts as zero (no success):
# the 8 float32 ulps of LOO_STD_ZERO_RTOL, so a mean that is zero up to rounding is not divided by.
MAX_RL_ZERO_RTOL = LOO_STD_ZERO_RTOL


@outcome_estimator("max_rl", params=MaxRLParams, grouped=True,
                             invariances=("permutation", "scale", "constant_zero"))
def max_rl_advantages(rewards: Tensor, valid: Tensor, p: MaxRLParams, state: Optional[Dict] = None) -> Tensor:
    """MaxRL advantage: the group-centred reward divided by the group mean.

    Shapes: ``rewards``, ``valid``: ``[P, G]`` -> ``[P, G]``.

    Formula (Tajwar et al. 2026, "Maximum Likelihood Reinforcement Learning", arXiv 2602.02710;
    prime-rl ``src/prime_rl/orchestrator/algo/max_rl.py``, ``MaxRLAlgorithm.score_group``):
    ``A_pg = (r_pg - mean_g r) / mean_g r``, and ``A = 0`` for the whole group where
    ``mean_g r <= 0`` (prime-rl: "a group with mean reward <= 0 carries no signal"). With 0/1
    rewards and pass rate ``p`` a success gets ``1/p - 1`` and a failure ``-1``: the gradient is
    that of the order-``G`` truncation of the maximum-likelihood objective ``log p`` (low-pass-rate
    prompts weigh ~``1/p``), where GRPO divides by the std.

    Convention: a mean at or below ``MAX_RL_ZERO_RTOL * max_g |r|`` (zero up to float32
    rounding at the group's scale) also counts as "no success", where prime-rl tests
    ``mean <= 0`` exactly; the two agree on every reward set whose mean is not within 8 float32
    ulps of 0. Designed for non-negative (canonically binary) rewards: a format reward or an
    overlong penalty that makes the mean small and positive makes the advantages large.

    Raises:
        Nothing beyond :func:`compute_advantages` validation.
    """
    _, mean, degenerate = _group_stats(rewards, valid)
    scale = torch.where(valid, rewards.abs(), torch.zeros_like(rewards)).amax(-1, keepdim=True)
    no_signal = mean <= MAX_RL_ZERO_RTOL * scale
    adv = (rewards - mean) / torch.where(no_signal, torch.ones_like(mean), mean)
    return _finalise(adv, valid, degenerate | no_signal)


@dataclass
class GPGParams:
    """``advantage=gpg``: Group Policy Gradient's advantage (Chu et al. 2025, arXiv 2504.02546)."""

    name: str = "gpg"
    # groups: alpha = B / (B - M), M the completions of zero-variance groups (paper, AMAP-ML/GPG);
    # nonzero: alpha = B / #(r != 0) (verl compute_gpg_outcome_advantage); none: alpha = 1
    alpha: str = "groups"
    scale: str = "none"  # F_norm: none (1, the paper's recipe) | group (the group's std + eps)
    eps: float = 1e-4  # added to the std under scale=group (AMAP-ML/GPG: std + 1e-4)


_GPG_ALPHAS = ("groups", "nonzero", "none")
_GPG_SCALES = ("none", "group")


def _gpg_invariances(p: "GPGParams"):
    out = {"permutation", "constant_zero", "scale_equivariant" if p.scale == "none" else "scale"}
    if p.alpha != "nonzero":  # which rewards are 0 changes under a shift
        out.add("shift")
    return out


@outcome_estimator("gpg", params=GPGParams, grouped=True, invariances=_gpg_invariances)
def gpg_advantages(rewards: Tensor, valid: Tensor, p: GPGParams, state: Optional[Dict] = None) -> Tensor:
    """GPG advantage: the group-centred reward, rescaled for the batch's zero-advantage groups.

    Shapes: ``rewards``, ``valid``: ``[P, G]`` -> ``[P, G]``.

    Formula (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv 2504.02546: ``alpha = B / (B - M)`` and ``F_norm``, as named in the ablation
    table of the authors' README; their code ``AMAP-ML/GPG``
    ``open-r1/src/open_r1/gpg_trainer.py``): ``A_pg = alpha (r_pg - mean_g r) / F_norm`` with
    ``F_norm = 1`` (``p.scale="none"``) or the group's Bessel-corrected std plus ``p.eps``
    (``p.scale="group"``), and, for ``p.alpha="groups"``, ``alpha = B / (B - M)``: ``B`` the
    batch's valid completions, ``M`` those in groups whose advantages are all 0 (equal rewards,
    or fewer than 2 valid members). Those groups carry no gradient but count in a token- or
    sequence-mean, so ``alpha`` restores the gradient's scale (the paper's "gradient estimation
    bias"); ``alpha = 1`` when every group is degenerate (all advantages are 0 then). The
    authors divide the loss by ``1 / alpha`` (``inverse_alpha``, the fraction of non-degenerate
    groups); with the policy loss linear in ``A`` (``policy_loss=pg``, no KL) that is the same
    gradient. ``p.alpha="nonzero"``: ``alpha = B / #{r != 0}`` as verl's
    ``compute_gpg_outcome_advantage`` (``core_algos.py``) counts it, which differs from the paper's
    as soon as a group mixes zero and non-zero rewards; ``p.alpha="none"``: ``alpha = 1``.
    ``alpha`` is a batch statistic: under torchrun the estimator runs on the gathered batch.

    Raises:
        ValueError: ``p.alpha`` not groups/nonzero/none, ``p.scale`` not none/group, ``p.eps < 0``.
    """
    if p.alpha not in _GPG_ALPHAS:
        raise ValueError(f"advantage.alpha must be one of {list(_GPG_ALPHAS)}; got {p.alpha!r}")
    if p.scale not in _GPG_SCALES:
        raise ValueError(f"advantage.scale must be one of {list(_GPG_SCALES)}; got {p.scale!r}")
    if p.eps < 0:
        raise ValueError(f"advantage.eps must be >= 0, got {p.eps}")
    _, mean, degenerate = _group_stats(rewards, valid)
    adv = rewards - mean
    if p.scale == "group":
        adv = adv / (masked_var(rewards, valid, unbiased=True, dim=-1, keepdim=True).sqrt() + p.eps)
    n_valid = valid.sum().to(rewards.dtype)
    informative = {"groups": (valid & ~degenerate).sum(), "nonzero": (valid & (rewards != 0)).sum(),
                   "none": n_valid}[p.alpha].to(rewards.dtype)
    alpha = n_valid / informative if informative > 0 else torch.ones((), dtype=rewards.dtype, device=rewards.device)
    return _finalise(alpha * adv, valid, degenerate)


__all__ = ["MaxRLParams", "max_rl_advantages", "GPGParams", "gpg_advantages", "MAX_RL_ZERO_RTOL"]
