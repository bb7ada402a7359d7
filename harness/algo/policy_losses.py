"""Policy losses registered by name (``policy_loss=<name>``), each with its params dataclass.

Uniform signature::

    fn(logprobs, old_logprobs, advantages, mask, p, weights=None) -> (per_token_loss [B, T], stats)

``logprobs`` ``[B, T]`` require grad; ``old_logprobs`` ``[B, T]`` are the behaviour policy's
(``logprobs.detach()`` on-policy); ``advantages`` ``[B, T]`` (or ``[B, 1]`` / ``[B]``);
``mask`` ``[B, T]`` float; ``p`` the params dataclass (the Hydra schema of that option, and the
only place its defaults live); ``weights`` an optional detached ``[B, T]`` per-token importance
weight (rollout correction) that multiplies the per-token loss, as verl applies
``rollout_is_weights``. The per-token loss is 0 at masked positions and is aggregated by
``loss_agg`` afterwards; a loss whose paper prescribes an aggregation declares it
(``aggregation=...``) and startup warns when the run uses another one.

Each loss declares its ``ratio_params``: the params that act only through the ratio ``pi / pi_old``
(the clip ranges, gates and trust-region masks). On-policy at ``mu=1`` every ratio is exactly 1, so
they change no update there (as with TRL's ``num_iterations=1``); startup warns when a run sets one
away from its default at ``mu=1`` and ``rollout.staleness=0``.

Stats are detached 0-dim tensors, means over valid tokens: every loss reports ``ratio_mean``,
``approx_kl`` (k3 of the token ratio, ``KL(pi_old || pi)``) and ``clip_frac`` (the fraction of
tokens whose gradient the loss's clip or selection removes or bounds), plus its own.
Every loss also reports ``clip_frac_low`` and ``clip_frac_high``, the sides of ``clip_frac``
(``clip_frac = clip_frac_low + clip_frac_high``; TRL logs them as ``clip_ratio/low_mean`` and
``clip_ratio/high_mean``): for the PPO-style clip (ppo_clip, gspo, clip_cov) ``low`` counts
``r < 1 - eps_low`` with ``A < 0`` and ``high`` counts ``r > 1 + eps_high`` with ``A > 0`` (TRL's
``is_low_clipped`` / ``is_high_clipped``); cispo and gmpo count the weight (log-ratio) clamped
from below / from above whatever the sign of ``A``; sapo counts its gated tokens with ``r < 1`` /
``r > 1``; vespo counts the tokens whose weight fell below 1/2 with ``W < 1`` / ``W > 1``; kl_cov
and pg clip nothing (both 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from harness.registry import Registry
from .surrogate import policy_loss, token_advantages, token_log_ratio
from .utils import check_like, masked_mean, zero_masked

POLICY_LOSSES: Registry = Registry("policy loss")

# Invariances (tests/test_properties.py): "permutation": permuting the rows permutes the per-token
# loss; "scale_equivariant": c * A (c > 0) gives c * loss; "zero_advantage": A = 0 gives loss 0.
_LINEAR = ("permutation", "scale_equivariant", "zero_advantage")

Stats = Dict[str, Tensor]


def _weighted(loss: Tensor, weights: Optional[Tensor], mask: Tensor) -> Tensor:
    if weights is not None:
        check_like(loss, "per_token_loss", weights=weights)
        loss = loss * weights.detach()
    return zero_masked(loss, mask)


def _ratio_stats(logprobs, old_logprobs, mask) -> Stats:
    with torch.no_grad():
        lr = zero_masked(token_log_ratio(logprobs.detach(), old_logprobs, mask), mask)
        return {"ratio_mean": masked_mean(torch.exp(lr), mask), "approx_kl": masked_mean(torch.expm1(lr) - lr, mask)}


def _sided(low: Tensor, high: Tensor, mask: Tensor) -> Stats:
    """``clip_frac_low`` / ``clip_frac_high`` (means over valid tokens of the bool ``[B, T]``
    masks ``low`` / ``high``, which never overlap) and their sum ``clip_frac``."""
    low, high = low.detach().to(mask.dtype), high.detach().to(mask.dtype)
    return {"clip_frac_low": masked_mean(low, mask), "clip_frac_high": masked_mean(high, mask),
            "clip_frac": masked_mean(low + high, mask)}


def _check_eps(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or value < 0:
        raise ValueError(f"policy_loss.{name} must be >= 0, got {value}")


# --------------------------------------------------------------------------- PPO clip


@dataclass
class PPOClipParams:
    """``policy_loss=ppo_clip``: PPO's clipped surrogate, DAPO clip-higher, dual-clip."""

    name: str = "ppo_clip"
    epsilon: float = 0.2  # clip range; the low side, and the high side unless epsilon_high
    epsilon_high: Optional[float] = None  # DAPO clip-higher (0.28 there); None = epsilon
    dual_clip: Optional[float] = None  # dual-clip constant c > 1 for A < 0 (verl clip_ratio_c=3)
    # two-sided clipping: the unclipped term's ratio capped at delta > 1, any sign of A (INTELLECT-2, TRL delta)
    delta: Optional[float] = None


@POLICY_LOSSES.register("ppo_clip", params=PPOClipParams, invariances=_LINEAR,
                        ratio_params=("epsilon", "epsilon_high", "dual_clip", "delta"))
def ppo_clip(logprobs, old_logprobs, advantages, mask, p: PPOClipParams, weights=None) -> Tuple[Tensor, Stats]:
    """PPO clipped surrogate per token (Schulman et al. 2017, eq. 7), decoupled clip range
    (DAPO "Clip-Higher", Yu et al. 2025 sec. 3.1) and dual-clip (Ye et al. 2020 sec. 3.3):
    ``L = -min(r A, clip(r, 1 - eps, 1 + eps_high) A)``, and ``min(L, -c A)`` where ``A < 0``;
    two-sided clipping (INTELLECT-2, arXiv 2505.07291, delta in sec. 4.1; TRL ``delta``): the
    unclipped term's ``r`` capped at ``delta``. Formula and stats:
    :func:`harness.algo.surrogate.policy_loss` (token ratio).

    Raises:
        ValueError: shape mismatch, negative epsilon, ``dual_clip <= 1``, ``delta <= 1``.
    """
    loss, stats = policy_loss(logprobs, old_logprobs, advantages, mask, epsilon=p.epsilon,
                              epsilon_high=p.epsilon_high, dual_clip=p.dual_clip, ratio_level="token",
                              delta=p.delta)
    return _weighted(loss, weights, mask), stats


# --------------------------------------------------------------------------- GSPO


@dataclass
class GSPOParams:
    """``policy_loss=gspo``: Group Sequence Policy Optimization (Qwen, 2025)."""

    name: str = "gspo"
    epsilon: float = 3e-4  # GSPO paper sec. 5.1: left clip range 3e-4
    epsilon_high: float = 4e-4  # and right clip range 4e-4 (sequence ratios sit very near 1)


@POLICY_LOSSES.register("gspo", params=GSPOParams, aggregation="seq-mean-token-mean", invariances=_LINEAR,
                        ratio_params=("epsilon", "epsilon_high"))
def gspo(logprobs, old_logprobs, advantages, mask, p: GSPOParams, weights=None) -> Tuple[Tensor, Stats]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", eqs. 5-7, GSPO-token):
    the length-normalised sequence ratio ``s_i = exp(mean_t log(pi / pi_old))`` clipped to
    ``[1 - eps, 1 + eps_high]``, applied per token as ``s_it = sg[s_i] pi_t / sg[pi_t]`` (value
    ``s_i``, gradient ``s_i d log pi_t``), as verl ``compute_policy_loss_gspo``. The paper
    averages over sequences: aggregate with ``loss_agg=seq-mean-token-mean`` (``recipe=gspo``).
    """
    _check_eps("epsilon", p.epsilon)
    _check_eps("epsilon_high", p.epsilon_high)
    loss, stats = policy_loss(logprobs, old_logprobs, advantages, mask, epsilon=p.epsilon,
                              epsilon_high=p.epsilon_high, ratio_level="sequence")
    return _weighted(loss, weights, mask), stats


# --------------------------------------------------------------------------- CISPO


@dataclass
class CISPOParams:
    """``policy_loss=cispo``: clipped IS-weight policy optimization (MiniMax-M1, 2025)."""

    name: str = "cispo"
    epsilon_low: Optional[float] = None  # None: no lower bound on the IS weight (the paper's choice)
    epsilon_high: float = 4.0  # upper bound 1 + 4 = 5 (TRL's cispo caps the ratio at epsilon_high=5)


@POLICY_LOSSES.register("cispo", params=CISPOParams, invariances=_LINEAR, ratio_params=("epsilon_low", "epsilon_high"))
def cispo(logprobs, old_logprobs, advantages, mask, p: CISPOParams, weights=None) -> Tuple[Tensor, Stats]:
    """CISPO (MiniMax 2025, "MiniMax-M1", sec. 3.1, eq. 4): REINFORCE with a clipped,
    stop-gradient importance weight, so no token loses its gradient:
    ``L = -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi`` (verl ``cispo``; the lower
    bound is off by default, as in the paper). ``clip_frac``: tokens whose weight was clipped.
    """
    _check_eps("epsilon_low", p.epsilon_low, allow_none=True)
    _check_eps("epsilon_high", p.epsilon_high)
    adv = token_advantages(logprobs, old_logprobs, advantages, mask)
    ratio = torch.exp(token_log_ratio(logprobs, old_logprobs, mask)).detach()
    lo = 0.0 if p.epsilon_low is None else 1.0 - p.epsilon_low
    w = ratio.clamp(min=lo, max=1.0 + p.epsilon_high)
    loss = _weighted(-w * adv * logprobs, weights, mask)
    stats = _ratio_stats(logprobs, old_logprobs, mask)
    stats.update(_sided(ratio < w, ratio > w, mask))
    return loss, stats


# --------------------------------------------------------------------------- SAPO


@dataclass
class SAPOParams:
    """``policy_loss=sapo``: Soft Adaptive Policy Optimization (Qwen, 2025)."""

    name: str = "sapo"
    tau_pos: float = 1.0  # gate temperature for A > 0 (paper, TRL sapo_temperature_pos)
    tau_neg: float = 1.05  # for A <= 0: tau_neg > tau_pos decays negative-token gradients faster


# the gate f(r) = sigmoid(tau (r - 1)) 4 / tau has f'(1) = 1 for any tau: on-policy it is the plain gradient
@POLICY_LOSSES.register("sapo", params=SAPOParams, aggregation="seq-mean-token-mean", invariances=_LINEAR,
                        ratio_params=("tau_pos", "tau_neg"))
def sapo(logprobs, old_logprobs, advantages, mask, p: SAPOParams, weights=None) -> Tuple[Tensor, Stats]:
    """SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization"): a smooth gate replaces the
    hard clip, ``L = -f_tau(r) A`` with ``f_tau(r) = sigmoid(tau (r - 1)) * 4 / tau``, ``tau =
    tau_pos`` where ``A > 0`` else ``tau_neg`` (verl ``sapo``, TRL ``loss_type="sapo"``). The
    gradient weight ``4 sigma (1 - sigma) r`` is ``r`` at ``r = 1`` and decays smoothly off-policy.
    ``clip_frac``: tokens whose gate weight fell below 1/2 of its on-policy value.
    """
    if not (p.tau_pos > 0 and p.tau_neg > 0):
        raise ValueError(f"policy_loss.tau_pos and tau_neg must be > 0, got {p.tau_pos}, {p.tau_neg}")
    adv = token_advantages(logprobs, old_logprobs, advantages, mask)
    ratio = torch.exp(token_log_ratio(logprobs, old_logprobs, mask))
    tau = torch.where(adv > 0, torch.full_like(adv, p.tau_pos), torch.full_like(adv, p.tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss = _weighted(-gate * adv, weights, mask)
    stats = _ratio_stats(logprobs, old_logprobs, mask)
    with torch.no_grad():
        sig = torch.sigmoid(tau * (ratio - 1.0))
        gated = 4 * sig * (1 - sig) < 0.5
        stats.update(_sided(gated & (ratio < 1), gated & (ratio > 1), mask))
    return loss, stats


# --------------------------------------------------------------------------- GMPO


@dataclass
class GMPOParams:
    """``policy_loss=gmpo``: Geometric-Mean Policy Optimization (Zhao et al. 2025)."""

    name: str = "gmpo"
    epsilon: float = 0.4  # clip of the token log-ratio, low side: [-0.4, 0.4] in the paper
    epsilon_high: Optional[float] = None  # high side; None = epsilon


@POLICY_LOSSES.register("gmpo", params=GMPOParams, aggregation="seq-mean-token-mean", invariances=_LINEAR,
                        ratio_params=("epsilon", "epsilon_high"))
def gmpo(logprobs, old_logprobs, advantages, mask, p: GMPOParams, weights=None) -> Tuple[Tensor, Stats]:
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization", eq. 4): the sequence
    objective is the geometric mean of the clipped token ratios, clipped in log space,
    ``L_i = -A_i exp(mean_t sgn(A) min(sgn(A) log r_t, sgn(A) clip(log r_t, -eps, eps_high)))``
    (verl ``geo_mean``; ``A_i`` the row's mean advantage). Placed at each of the row's tokens in
    value, so ``loss_agg=seq-mean-token-mean`` gives the mean over sequences of ``L_i`` with its
    exact gradient. ``weights`` enter as their per-row geometric mean (verl).
    """
    _check_eps("epsilon", p.epsilon)
    hi = p.epsilon if p.epsilon_high is None else p.epsilon_high
    _check_eps("epsilon_high", hi)
    adv = token_advantages(logprobs, old_logprobs, advantages, mask)
    lr = zero_masked(logprobs - old_logprobs, mask)
    sgn = torch.sign(adv)
    clamped = lr.clamp(-p.epsilon, hi)
    lr_min = sgn * torch.minimum(sgn * lr, sgn * clamped)
    n = mask.sum(-1).clamp(min=1)
    seq_ratio = torch.exp((lr_min * mask).sum(-1) / n)  # [B]
    seq_adv = (adv * mask).sum(-1) / n
    seq_loss = -seq_adv * seq_ratio
    if weights is not None:
        seq_loss = seq_loss * torch.exp((torch.log(weights.detach() + 1e-10) * mask).sum(-1) / n)
    loss = zero_masked(seq_loss.unsqueeze(-1).expand_as(lr), mask)
    stats = _ratio_stats(logprobs, old_logprobs, mask)
    stats.update(_sided(lr < clamped, lr > clamped, mask))
    return loss, stats


# --------------------------------------------------------------------------- Clip-Cov / KL-Cov


def _covariance(adv: Tensor, logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-token ``(A - mean A)(log pi - mean log pi)`` with means over the valid tokens.

    Computed in float64: the selections built on it (a window, a top-k) then pick the same
    tokens from a float32 batch as from its float64 image, however close the covariances lie.
    """
    a, lp, m = adv.detach().double(), logprobs.detach().double(), mask.double()
    return (a - masked_mean(a, m)) * (lp - masked_mean(lp, m))


@dataclass
class ClipCovParams:
    """``policy_loss=clip_cov``: Clip-Cov (Cui et al. 2025)."""

    name: str = "clip_cov"
    epsilon: float = 0.2
    epsilon_high: Optional[float] = None
    clip_cov_ratio: float = 2e-4  # fraction of valid tokens whose gradient is detached
    clip_cov_lb: float = 1.0  # tokens are drawn among covariances in (lb, ub)
    clip_cov_ub: float = 5.0


@POLICY_LOSSES.register("clip_cov", params=ClipCovParams, invariances=("zero_advantage",),
                        ratio_params=("epsilon", "epsilon_high"))
def clip_cov(logprobs, old_logprobs, advantages, mask, p: ClipCovParams, weights=None) -> Tuple[Tensor, Stats]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models", sec. 4, Alg. 1): the PPO-clip loss, with the gradient detached on
    ``max(1, floor(clip_cov_ratio * N))`` tokens drawn at random among those (not already
    clipped) whose covariance ``(A - mean A)(log pi - mean log pi)`` lies in ``(lb, ub)``
    (verl ``clip_cov``). The means are over the valid tokens of the batch passed in: a
    micro-batch, as in verl. ``cov_selected_frac``: the detached fraction.
    """
    if not p.clip_cov_ratio > 0:
        raise ValueError(f"policy_loss.clip_cov_ratio must be > 0, got {p.clip_cov_ratio}")
    adv = token_advantages(logprobs, old_logprobs, advantages, mask)
    loss, stats = policy_loss(logprobs, old_logprobs, adv, mask, epsilon=p.epsilon, epsilon_high=p.epsilon_high)
    with torch.no_grad():
        ratio = torch.exp(token_log_ratio(logprobs.detach(), old_logprobs, mask))
        hi = p.epsilon if p.epsilon_high is None else p.epsilon_high
        clipped = (-adv * ratio.clamp(1 - p.epsilon, 1 + hi) > -adv * ratio) & (mask > 0)
        cov = _covariance(adv, logprobs, mask)
        cand = ((cov > p.clip_cov_lb) & (cov < p.clip_cov_ub) & (mask > 0) & ~clipped).nonzero()
        k = max(int(p.clip_cov_ratio * float(mask.sum())), 1)
        # cpu: drawn by the CPU generator, so that a CUDA run picks the tokens a CPU run picks
        chosen = cand[torch.randperm(len(cand))[:k]] if len(cand) else cand
        keep = torch.ones_like(loss)
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
    loss = _weighted(loss * keep, weights, mask)
    stats["cov_selected_frac"] = masked_mean(1.0 - keep, mask)
    return loss, stats


@dataclass
class KLCovParams:
    """``policy_loss=kl_cov``: KL-Cov (Cui et al. 2025)."""

    name: str = "kl_cov"
    kl_cov_ratio: float = 2e-4  # fraction of valid tokens (largest covariance) that get the KL term
    ppo_kl_coef: float = 1.0  # coefficient of |log r| on those tokens


# |log r| has a zero gradient at r = 1 (torch's abs), so on-policy kl_cov is the plain surrogate
@POLICY_LOSSES.register("kl_cov", params=KLCovParams, invariances=(), ratio_params=("kl_cov_ratio", "ppo_kl_coef"))
def kl_cov(logprobs, old_logprobs, advantages, mask, p: KLCovParams, weights=None) -> Tuple[Tensor, Stats]:
    """KL-Cov (Cui et al. 2025, sec. 4, Alg. 2): the unclipped surrogate ``-r A``, plus
    ``ppo_kl_coef * |log r|`` on the ``max(1, floor(kl_cov_ratio * N))`` valid tokens with the
    largest covariance ``(A - mean A)(log pi - mean log pi)`` (verl ``kl_cov``; means over the
    batch passed in). ``cov_selected_frac``: the penalised fraction.
    """
    if not p.kl_cov_ratio > 0:
        raise ValueError(f"policy_loss.kl_cov_ratio must be > 0, got {p.kl_cov_ratio}")
    adv = token_advantages(logprobs, old_logprobs, advantages, mask)
    lr = zero_masked(token_log_ratio(logprobs, old_logprobs, mask), mask)
    loss = -adv * torch.exp(lr)
    with torch.no_grad():
        cov = _covariance(adv, logprobs, mask).masked_fill(mask == 0, -torch.inf)
        k = max(int(p.kl_cov_ratio * float(mask.sum())), 1)
        top = torch.topk(cov.flatten(), min(k, int(mask.sum()) or 1)).indices
        sel = torch.zeros_like(loss).flatten()
        sel[top] = 1.0
        sel = sel.view_as(loss) * (mask > 0)
    loss = _weighted(loss + sel * p.ppo_kl_coef * lr.abs(), weights, mask)
    stats = _ratio_stats(logprobs, old_logprobs, mask)
    stats.update({k: torch.zeros((), dtype=loss.dtype, device=loss.device)
                  for k in ("clip_frac", "clip_frac_low", "clip_frac_high")})
    stats["cov_selected_frac"] = masked_mean(sel, mask)
    return loss, stats


# --------------------------------------------------------------------------- vanilla PG


@dataclass
class PGParams:
    """``policy_loss=pg``: vanilla policy gradient, no ratio, no clip."""

    name: str = "pg"


@POLICY_LOSSES.register("pg", params=PGParams, invariances=_LINEAR)
def pg(logprobs, old_logprobs, advantages, mask, p: PGParams, weights=None) -> Tuple[Tensor, Stats]:
    """Vanilla policy gradient ``L = -A log pi`` (Williams 1992; GPG, Chu et al. 2025, "GPG: A
    Simple and Strong Reinforcement Learning Baseline", eq. 3; verl ``gpg``). Off-policy data
    (``mu > 1``) is not corrected: pass ``weights`` for that. ``clip_frac`` is 0.
    """
    adv = token_advantages(logprobs, old_logprobs, advantages, mask)
    loss = _weighted(-adv * logprobs, weights, mask)
    stats = _ratio_stats(logprobs, old_logprobs, mask)
    stats.update({k: torch.zeros((), dtype=loss.dtype, device=loss.device)
                  for k in ("clip_frac", "clip_frac_low", "clip_frac_high")})
    return loss, stats


# --------------------------------------------------------------------------- VESPO


@dataclass
class VESPOParams:
    """``policy_loss=vespo``: Variational Sequence-Level Soft Policy Optimization (2026)."""

    name: str = "vespo"
    k_pos: float = 2.0  # power on W for A >= 0 (TRL vespo_k_pos)
    lambda_pos: float = 3.0  # exponential decay for A >= 0 (TRL vespo_lambda_pos)
    k_neg: float = 3.0  # for A < 0 (TRL vespo_k_neg)
    lambda_neg: float = 2.0  # for A < 0 (TRL vespo_lambda_neg)


_LOG_W_MIN, _LOG_W_MAX = math.log(1e-8), 20.0  # TRL get_gamma_weights' clamps of log W


@POLICY_LOSSES.register("vespo", params=VESPOParams, aggregation="token-mean", invariances=_LINEAR,
                        ratio_params=("k_pos", "lambda_pos", "k_neg", "lambda_neg"))
def vespo(logprobs, old_logprobs, advantages, mask, p: VESPOParams, weights=None) -> Tuple[Tensor, Stats]:
    """VESPO (arXiv 2602.10693; TRL ``loss_type="vespo"``, ``GRPOTrainer.get_gamma_weights``):
    REINFORCE with a detached, smooth Gamma-shaped weight of the sequence importance ratio

        W_i   = prod_t pi(y_it) / pi_old(y_it)          (not length-normalised, unlike GSPO)
        phi_i = W_i^k exp(lambda (1 - W_i))             (phi(1) = 1: on-policy it is plain PG)
        L_it  = -sg(phi_i) A_it log pi(y_it)

    with ``(k, lambda) = (k_pos, lambda_pos)`` where ``A >= 0`` and ``(k_neg, lambda_neg)`` where
    ``A < 0`` (per token, so per sequence with outcome advantages). As in TRL, each token
    log-ratio is clamped to [-20, 20] before the sum and ``log W`` to [log 1e-8, 20]; a
    non-finite phi becomes 0. TRL normalises by the batch's token count: ``loss_agg=token-mean``.

    Differs from TRL: with a rollout correction (``weights``), TRL folds the sampler ratio into
    ``W`` instead of multiplying the loss; here ``weights`` multiply the per-token loss as for
    every other loss. ``clip_frac``: tokens whose weight phi fell below 1/2 (``low``: ``W < 1``,
    ``high``: ``W > 1``).

    Raises:
        ValueError: a negative ``k`` or a ``lambda`` <= 0 (names the field).
    """
    for key in ("k_pos", "k_neg"):
        if getattr(p, key) < 0:
            raise ValueError(f"policy_loss.{key} must be >= 0, got {getattr(p, key)}")
    for key in ("lambda_pos", "lambda_neg"):
        if not getattr(p, key) > 0:
            raise ValueError(f"policy_loss.{key} must be > 0, got {getattr(p, key)}")
    adv = token_advantages(logprobs, old_logprobs, advantages, mask)
    with torch.no_grad():
        lr = zero_masked(token_log_ratio(logprobs.detach(), old_logprobs, mask).clamp(-20.0, 20.0), mask)
        log_w = lr.sum(dim=1, keepdim=True).clamp(_LOG_W_MIN, _LOG_W_MAX)  # [B, 1]
        pos = adv >= 0
        k = torch.where(pos, torch.full_like(adv, p.k_pos), torch.full_like(adv, p.k_neg))
        lam = torch.where(pos, torch.full_like(adv, p.lambda_pos), torch.full_like(adv, p.lambda_neg))
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    loss = _weighted(-phi * adv * logprobs, weights, mask)
    stats = _ratio_stats(logprobs, old_logprobs, mask)
    with torch.no_grad():
        w = torch.exp(log_w).expand_as(adv)
        stats.update(_sided((phi < 0.5) & (w < 1), (phi < 0.5) & (w > 1), mask))
    return loss, stats


# --------------------------------------------------------------------------- DPPO


@dataclass
class DPPOParams:
    """``policy_loss=dppo``: DPPO's divergence (probability-difference) trust region, Binary-TV form."""

    name: str = "dppo"
    mask_low: float = 0.2  # A < 0: drop the token when pi - pi_old < -mask_low (prime-rl dppo_mask_low)
    mask_high: float = 0.2  # A > 0: drop the token when pi - pi_old > mask_high (prime-rl dppo_mask_high)
    kl_coef: float = 0.0  # + kl_coef * (log pi - log pi_old)^2 on every token; prime-rl's default loss: 1e-3


@POLICY_LOSSES.register("dppo", params=DPPOParams, ratio_params=("mask_low", "mask_high", "kl_coef"),
                        invariances=lambda p: _LINEAR if p.kl_coef == 0 else ("permutation",))
def dppo(logprobs, old_logprobs, advantages, mask, p: DPPOParams, weights=None) -> Tuple[Tensor, Stats]:
    """DPPO, Binary-TV trust region (arXiv 2602.04879; prime-rl's default loss,
    ``prime_rl/trainer/rl/loss.py`` ``default_loss_fn``): the unclipped importance-weighted
    policy gradient, with the tokens whose *probability* (not ratio) moved past the trust region
    in the direction the advantage pushes masked out::

        r_t = pi(y_t) / pi_old(y_t),   d_t = pi(y_t) - pi_old(y_t)              (d_t detached)
        drop_t = (A_t > 0 and d_t > mask_high) or (A_t < 0 and d_t < -mask_low)
        L_t = -(1 - drop_t) A_t r_t + kl_coef * (log r_t)^2

    A token of a rare continuation (small pi_old) can change its ratio a lot while its
    probability barely moves: the mask bounds the total-variation step, not the ratio. The
    gradient of kept tokens is ``-A_t r_t grad log pi`` (through the ratio, no clip). prime-rl
    takes ``pi_old`` to be the inference engine's probabilities and adds Kimi-K2.5's
    ``kl_tau * (log r)^2`` with ``kl_tau = 1e-3`` (set ``kl_coef=1e-3`` for that loss); here
    ``pi_old`` is the behaviour policy as the trainer computes it, and the sampler's deviation is the
    rollout correction's (``weights``). ``clip_frac_low`` / ``clip_frac_high``: the dropped tokens
    with ``A < 0`` / ``A > 0``.

    Raises:
        ValueError: a negative ``mask_low``, ``mask_high`` or ``kl_coef`` (names the field).
    """
    for key in ("mask_low", "mask_high", "kl_coef"):
        _check_eps(key, getattr(p, key))
    adv = token_advantages(logprobs, old_logprobs, advantages, mask)
    log_ratio = token_log_ratio(logprobs, old_logprobs, mask)
    with torch.no_grad():
        d = torch.exp(logprobs.detach()) - torch.exp(old_logprobs)
        drop_high, drop_low = (adv > 0) & (d > p.mask_high), (adv < 0) & (d < -p.mask_low)
        keep = ~(drop_high | drop_low)
    loss = -keep.to(adv.dtype) * adv * torch.exp(log_ratio)
    if p.kl_coef:
        loss = loss + p.kl_coef * log_ratio.square()
    loss = _weighted(loss, weights, mask)
    stats = _ratio_stats(logprobs, old_logprobs, mask)
    stats.update(_sided(drop_low, drop_high, mask))
    return loss, stats


__all__ = ["POLICY_LOSSES", "ppo_clip", "gspo", "cispo", "sapo", "gmpo", "clip_cov", "kl_cov", "pg", "vespo", "dppo"]
