"""Rollout-training mismatch: its measurement and the corrections peers ship
(``rollout_correction=<name>``).

The sampler (vLLM, or ``generate`` with a KV cache and other batch shapes) and the trainer's
forward compute slightly different log-probabilities for the same tokens (kernels, dtype, batch
shapes), so the rollout is slightly off-policy even at ``mu=1``. With ``log_ratio_t =
log pi_trainer(y_t) - log pi_sampler(y_t)`` (the trainer's log-prob under the weights that
sampled: the first pass's, or the old-policy pass's when ``mu > 1``) and the token importance
ratio ``rho_t = exp(log_ratio_t)``, each variant returns a detached ``[B, T]`` weight that
multiplies the per-token policy loss (the policy-loss registry's ``weights`` input):

* ``none``: no weight (the mismatch is still measured and logged);
* ``token_truncate``: ``w_t = min(rho_t, C)`` (truncated importance sampling, TIS: Yao et al.
  2025, "Your efficient RL framework secretly brings you off-policy RL training"; TRL
  ``vllm_importance_sampling_mode="token_truncate"``, verl ``rollout_is`` token level);
* ``token_mask``: ``w_t = rho_t`` where ``rho_t <= C``, else 0 (TRL ``token_mask``; masked IS);
* ``sequence_truncate``: ``rho = exp(sum_t log_ratio_t)`` over the sequence's tokens,
  ``w_t = min(rho, C)`` on every token of it (TRL ``sequence_truncate``);
* ``sequence_mask``: ``w_t = rho`` where ``rho <= C``, else the whole sequence is dropped
  (TRL ``sequence_mask``, its default mode).

``C`` is ``cap`` (TRL ``vllm_importance_sampling_cap``, default 3.0). Signature
``fn(log_ratio [B, T], mask [B, T], p) -> weights [B, T] or None``; ``log_ratio`` is 0 at masked
positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .registry import Registry

ROLLOUT_CORRECTIONS: Registry = Registry("rollout correction")


@dataclass
class NoCorrectionParams:
    """``rollout_correction=none``: the mismatch is measured (``rollout/*`` metrics), not corrected.
    ``cap`` is the threshold the ``rollout/is_frac_past_cap`` metric counts against."""

    name: str = "none"
    cap: float = 3.0


@dataclass
class TokenTruncateParams:
    name: str = "token_truncate"
    cap: float = 3.0  # C


@dataclass
class TokenMaskParams:
    name: str = "token_mask"
    cap: float = 3.0


@dataclass
class SequenceTruncateParams:
    name: str = "sequence_truncate"
    cap: float = 3.0


@dataclass
class SequenceMaskParams:
    name: str = "sequence_mask"
    cap: float = 3.0


def _check(log_ratio: Tensor, mask: Tensor, cap: float) -> None:
    if log_ratio.shape != mask.shape or log_ratio.dim() != 2:
        raise ValueError(f"log_ratio {tuple(log_ratio.shape)} and mask {tuple(mask.shape)} must be the same [B, T]")
    if not cap > 0:
        raise ValueError(f"rollout_correction.cap must be > 0, got {cap}")


# Invariances (tests/test_properties.py): "permutation" of rows; "on_policy_ones": log_ratio = 0
# gives weight 1 on every valid token (None for "none"); "capped": no weight exceeds ``cap``.
@ROLLOUT_CORRECTIONS.register("none", params=NoCorrectionParams, invariances=("permutation", "on_policy_ones"))
def no_correction(log_ratio: Tensor, mask: Tensor, p: NoCorrectionParams):
    """No weight (returns None)."""
    _check(log_ratio, mask, p.cap)
    return None


@ROLLOUT_CORRECTIONS.register("token_truncate", params=TokenTruncateParams, invariances=("permutation", "on_policy_ones", "capped"))
def token_truncate(log_ratio: Tensor, mask: Tensor, p: TokenTruncateParams) -> Tensor:
    """``min(exp(log_ratio), C)`` per token, 0 at masked positions. Shapes ``[B, T]``."""
    _check(log_ratio, mask, p.cap)
    return torch.exp(log_ratio).clamp(max=p.cap) * mask


@ROLLOUT_CORRECTIONS.register("token_mask", params=TokenMaskParams, invariances=("permutation", "on_policy_ones", "capped"))
def token_mask(log_ratio: Tensor, mask: Tensor, p: TokenMaskParams) -> Tensor:
    """``exp(log_ratio)`` per token where it is <= C, else 0. Shapes ``[B, T]``."""
    _check(log_ratio, mask, p.cap)
    rho = torch.exp(log_ratio)
    return torch.where(rho <= p.cap, rho, torch.zeros_like(rho)) * mask


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """``[B]`` log of the sequence importance ratio: the sum of the token log-ratios."""
    return (log_ratio * mask).sum(dim=1)


@ROLLOUT_CORRECTIONS.register("sequence_truncate", params=SequenceTruncateParams, invariances=("permutation", "on_policy_ones", "capped"))
def sequence_truncate(log_ratio: Tensor, mask: Tensor, p: SequenceTruncateParams) -> Tensor:
    """``min(exp(sum_t log_ratio_t), C)`` on every token of the sequence. Shapes ``[B, T]``."""
    _check(log_ratio, mask, p.cap)
    rho = torch.exp(sequence_log_ratio(log_ratio, mask)).clamp(max=p.cap)
    return rho[:, None] * mask


@ROLLOUT_CORRECTIONS.register("sequence_mask", params=SequenceMaskParams, invariances=("permutation", "on_policy_ones", "capped"))
def sequence_mask(log_ratio: Tensor, mask: Tensor, p: SequenceMaskParams) -> Tensor:
    """``exp(sum_t log_ratio_t)`` on every token where it is <= C, else the sequence weighs 0."""
    _check(log_ratio, mask, p.cap)
    rho = torch.exp(sequence_log_ratio(log_ratio, mask))
    return torch.where(rho <= p.cap, rho, torch.zeros_like(rho))[:, None] * mask


def mismatch_stats(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, cap: float) -> dict:
    """Local sums / extremes of the rollout-training mismatch over the valid tokens of ``mask``.

    Args:
        trainer_logprobs, sampler_logprobs, mask: ``[B, T]`` (mask 0/1).
        cap: the threshold C of ``frac_past_cap``.
    Returns:
        ``{"tokens", "abs_diff_sum", "abs_diff_max", "ratio_sum", "ratio_min", "ratio_max",
        "past_cap"}``: token count, sum and max of ``|log pi_trainer - log pi_sampler|``, sum,
        min and max of ``rho = exp(log pi_trainer - log pi_sampler)``, and the number of tokens
        with ``rho > cap`` (python floats; min/max are +-inf without tokens), to be reduced over
        ranks (sums summed, min / max reduced) and turned into means by the caller.
    """
    m = mask.bool()
    d = (trainer_logprobs - sampler_logprobs)[m].double()
    if d.numel() == 0:
        return {"tokens": 0.0, "abs_diff_sum": 0.0, "abs_diff_max": float("-inf"), "ratio_sum": 0.0,
                "ratio_min": float("inf"), "ratio_max": float("-inf"), "past_cap": 0.0}
    rho = torch.exp(d)
    return {"tokens": float(d.numel()), "abs_diff_sum": float(d.abs().sum()), "abs_diff_max": float(d.abs().max()),
            "ratio_sum": float(rho.sum()), "ratio_min": float(rho.min()), "ratio_max": float(rho.max()),
            "past_cap": float((rho > cap).sum())}


__all__ = ["ROLLOUT_CORRECTIONS", "mismatch_stats", "sequence_log_ratio", "no_correction", "token_truncate",
           "token_mask", "sequence_truncate", "sequence_mask"]
