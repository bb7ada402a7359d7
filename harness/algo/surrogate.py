"""The PPO clipped surrogate and the importance ratios it clips, shared by the policy losses
``ppo_clip``, ``gspo`` and ``clip_cov`` (:mod:`harness.algo.policy_losses`, where every policy
loss is registered).

Conventions: ``B`` completions (group-major rows ``b = p * G + g``) padded to ``T`` tokens;
``mask[b, t] = 1`` at real completion tokens. Per-token losses are ``[B, T]`` tensors, 0 at
masked positions, to be *minimised*; the scalar comes from the aggregation
(:mod:`harness.algo.aggregation`).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from harness.registry import Registry
from .utils import check_like, masked_mean, shape_str, zero_masked

RATIO_LEVELS: Registry = Registry("importance-ratio level")

# |log ratio| bound before exp(), as verl (avoids inf when policies diverge).
_LOG_RATIO_BOUND = 20.0


# --------------------------------------------------------------------------- ratios


@RATIO_LEVELS.register("token")
def token_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """PPO per-token log importance ratio ``log pi_theta(y_t) - log pi_old(y_t)``, ``[B, T]``.

    Source: Schulman et al. 2017 (PPO) eq. 6; clamped to +-20 before exp (verl).
    """
    return (logprobs - old_logprobs).clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)


@RATIO_LEVELS.register("sequence")
def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """GSPO-token log ratio, ``[B, T]``: value ``log s_i`` at every token of row i.

    Source: Zheng et al. 2025, "Group Sequence Policy Optimization", sec. 4
    (sequence-level ratio) and the GSPO-token variant:
    ``s_i = exp(mean_{t valid} (log pi_theta - log pi_old))``
    and ``s_{i,t} = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)]``, so
    ``log s_{i,t} = sg[log s_i] + logp_t - sg[logp_t]``: equal to ``log s_i`` in
    value, gradient ``d/d logp_t = 1`` per token (as verl ``gspo``).
    Clamped to +-20 before exp.
    """
    seq = masked_mean((logprobs - old_logprobs).detach(), mask, dim=-1, keepdim=True)
    log_ratio = logprobs - logprobs.detach() + seq
    return log_ratio.clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)


# --------------------------------------------------------------------------- policy


def token_advantages(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Check the shapes of a policy-loss call and return the advantages as a detached ``[B, T]``.

    ``advantages`` may be ``[B, T]``, ``[B, 1]`` or ``[B]`` (broadcast over tokens).

    Raises:
        ValueError: ``logprobs`` not ``[B, T]``, another tensor of a different shape, or
            advantages of none of the accepted shapes.
    """
    check_like(logprobs, "logprobs", old_logprobs=old_logprobs, mask=mask)
    B, T = logprobs.shape
    if not isinstance(advantages, Tensor):
        raise ValueError(f"advantages must be a tensor, got {type(advantages).__name__}")
    if advantages.shape == (B,):
        advantages = advantages.unsqueeze(-1)
    if advantages.shape not in ((B, 1), (B, T)):
        raise ValueError(
            f"advantages must have shape [B, T]=[{B}, {T}], [B, 1] or [B], "
            f"got {shape_str(advantages)}"
        )
    return advantages.detach().to(logprobs.dtype).expand(B, T)



def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon: float,
    epsilon_high: Optional[float] = None,
    dual_clip: Optional[float] = None,
    ratio_level: str = "token",
    delta: Optional[float] = None,
) -> Tuple[Tensor, Dict[str, Tensor]]:
    """Clipped surrogate policy loss per token (PPO / DAPO clip-higher / dual-clip / GSPO).

    Shapes: ``logprobs`` (requires grad), ``old_logprobs``, ``mask``: ``[B, T]``;
    ``advantages``: ``[B, T]``, ``[B, 1]`` or ``[B]`` (broadcast over tokens)
    -> ``(per_token_loss [B, T], stats)``; loss is 0 at masked positions.

    Formula, with ratio ``r`` from ``ratio_level`` (``"token"``: PPO,
    ``"sequence"``: GSPO-token, see :func:`sequence_log_ratio`):
    ``L = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)``
    (Schulman et al. 2017, PPO eq. 7; decoupled ``eps_low = epsilon``,
    ``eps_high = epsilon_high or epsilon``: DAPO "Clip-Higher", Yu et al. 2025
    sec. 3.1). Dual-clip (Ye et al. 2020, "Mastering Complex Control in MOBA
    Games with Deep Reinforcement Learning", sec. 3.3) bounds the objective
    from below by ``c * A`` when ``A < 0``:
    ``L = min(L, -c * A)`` for ``A < 0`` (``c = dual_clip > 1``), i.e. a huge
    ratio on a negative-advantage token cannot produce an unbounded loss.
    Two-sided clipping (INTELLECT-2, Prime Intellect 2025, arXiv 2505.07291, delta in sec. 4.1; TRL
    ``GRPOConfig.delta``, ``trl/trainer/grpo_trainer.py`` ``_compute_loss``) caps the ratio of
    the *unclipped* term at ``delta``, for either sign of ``A``, the clipped term keeping the
    raw ratio: ``L = -min(min(r, delta) * A, clip(r, 1 - eps_low, 1 + eps_high) * A)``. With
    ``delta >= 1 + eps_high`` this is dual-clip with ``c = delta`` in value and gradient (where
    ``A > 0`` the clipped term is the smaller one whenever ``r > delta``); with
    ``1 < delta < 1 + eps_high`` it also caps positive-advantage tokens at ``delta``.

    Stats (detached 0-dim tensors, means over valid tokens):
    ``clip_frac_low`` -- fraction with ``r < 1 - eps_low`` and ``A < 0``;
    ``clip_frac_high`` -- fraction with ``r > 1 + eps_high`` and ``A > 0``;
    ``clip_frac`` -- their sum (clipping active, zero gradient);
    ``dual_clip_frac`` -- fraction where the dual clip is active (``A < 0``,
    ``-c * A`` below the clipped loss); ``delta_clip_frac`` (only with ``delta``) --
    fraction with ``r > delta``, ``A != 0`` and the capped term selected (no gradient);
    ``ratio_mean`` -- mean of ``r``;
    ``approx_kl`` -- mean per-token k3 estimate ``(rho - 1) - log rho`` with the
    *token* ratio ``rho = pi_theta / pi_old``, an estimate of
    ``KL(pi_old || pi_theta)`` on samples from ``pi_old`` (Schulman 2020 blog).

    Raises:
        ValueError: shape mismatch; ``epsilon`` / ``epsilon_high`` < 0;
            ``dual_clip`` not None and <= 1; ``delta`` not None and <= 1; unknown
            ``ratio_level`` (lists valid names).
    """
    log_ratio_fn = RATIO_LEVELS.get(ratio_level)
    adv = token_advantages(logprobs, old_logprobs, advantages, mask)
    if epsilon is None or epsilon < 0:
        raise ValueError(f"policy_loss.epsilon must be >= 0, got {epsilon}")
    eps_low = float(epsilon)
    eps_high = eps_low if epsilon_high is None else float(epsilon_high)
    if eps_high < 0:
        raise ValueError(f"policy_loss.epsilon_high must be None or >= 0, got {epsilon_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"policy_loss.dual_clip must be None or > 1, got {dual_clip}")
    if delta is not None and not delta > 1.0:
        raise ValueError(f"policy_loss.delta must be None or > 1, got {delta}")

    # where() keeps NaN/inf padding out of both the values and the gradients.
    log_ratio = zero_masked(log_ratio_fn(logprobs, old_logprobs, mask), mask)
    ratio = torch.exp(log_ratio)
    capped = ratio if delta is None else ratio.clamp(max=delta)  # the clipped term keeps the raw ratio (TRL)
    loss_unclipped = -adv * capped
    loss_clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    neg = adv < 0
    dual_active = torch.zeros_like(neg)
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual_active = neg & (bound < loss)
        loss = torch.where(dual_active, bound, loss)
    loss = zero_masked(loss, mask)

    with torch.no_grad():
        r = ratio.detach()
        low = ((r < 1.0 - eps_low) & neg).to(r.dtype)
        high = ((r > 1.0 + eps_high) & (adv > 0)).to(r.dtype)
        tok_log_ratio = zero_masked(token_log_ratio(logprobs.detach(), old_logprobs, mask), mask)
        k3 = torch.expm1(tok_log_ratio) - tok_log_ratio
        stats = {
            "clip_frac_low": masked_mean(low, mask),
            "clip_frac_high": masked_mean(high, mask),
            "clip_frac": masked_mean(low + high, mask),
            "dual_clip_frac": masked_mean(dual_active.to(r.dtype), mask),
            "ratio_mean": masked_mean(r, mask),
            "approx_kl": masked_mean(k3, mask),
        }
        if delta is not None:
            delta_active = (r > delta) & (adv != 0) & (loss_unclipped >= loss_clipped)
            stats["delta_clip_frac"] = masked_mean(delta_active.to(r.dtype), mask)
    return loss, stats


__all__ = ["RATIO_LEVELS", "policy_loss", "token_advantages", "token_log_ratio", "sequence_log_ratio"]
