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

* ``geometric``: rejection by the geometric-mean sequence ratio
  ``rho_geo = exp(mean_t log_ratio_t)``: ``w_t = 1`` on the sequences with
  ``lower <= rho_geo <= upper``, else 0 (verl Geo-RS, ``rollout_rs="seq_mean_k1"``);
* ``off_policy_sequence_mask``: DeepSeek-V3.2's off-policy sequence masking (TRL
  ``off_policy_mask_threshold``): a sequence with ``A < 0`` whose mean per-token
  ``log pi_sampler - log pi_theta`` exceeds ``threshold`` weighs 0, every other 1.

``C`` is ``cap`` (TRL ``vllm_importance_sampling_cap``, default 3.0). Signature
``fn(log_ratio [B, T], mask [B, T], p, **inputs) -> weights [B, T] or None``; ``log_ratio`` is 0
at masked positions. ``inputs`` are what the variant declares it ``needs`` (registry), computed by
the update for each micro-batch and pass: ``advantages`` (``[B, T]``) and ``current_log_ratio``
(``log pi_theta - log pi_sampler`` ``[B, T]`` under the weights being updated, detached, 0 at
masked positions; at the first pass it is ``log_ratio``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from harness.registry import Registry

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


@dataclass
class GeometricParams:
    """``rollout_correction=geometric``: sequence rejection by the geometric-mean ratio (Geo-RS)."""

    name: str = "geometric"
    lower: float = 0.99  # keep rho_geo >= lower (SkyRL's recommended band; verl's preset 0.999)
    upper: float = 1.01  # keep rho_geo <= upper (verl's preset 1.001)
    cap: float = 3.0  # only the threshold of the rollout/is_frac_past_cap metric


@ROLLOUT_CORRECTIONS.register("geometric", params=GeometricParams, invariances=("permutation", "on_policy_ones", "capped"))
def geometric(log_ratio: Tensor, mask: Tensor, p: GeometricParams) -> Tensor:
    """Geometric-mean sequence rejection (Geo-RS; verl ``rollout_corr_helper.py``
    ``compute_rollout_rejection_mask`` with ``rollout_rs="seq_mean_k1"``, the
    ``decoupled_geo_rs`` preset; R. Li et al., "When Speed Kills Stability", part 3)::

        log rho_geo_i = (1 / |y_i|) sum_t log_ratio_it        (length-normalised, unlike sequence_*)
        w_it = 1 if log(lower) <= log rho_geo_i <= log(upper) else 0

    A pure mask: the kept sequences are not re-weighted. verl tests ``-log rho_geo`` against
    ``[log lower, log upper]``; for bounds symmetric in log space (``lower = 1 / upper``, verl's
    default when one bound is given) the two conventions agree. A sequence without valid tokens has
    ``rho_geo = 1``. Shapes ``[B, T]``.

    Raises:
        ValueError: shapes, ``cap``, or bounds not ``0 < lower <= 1 <= upper``.
    """
    _check(log_ratio, mask, p.cap)
    if not 0 < p.lower <= 1 <= p.upper:
        raise ValueError(f"rollout_correction.lower / upper must satisfy 0 < lower <= 1 <= upper, "
                         f"got lower={p.lower}, upper={p.upper}")
    mean = sequence_log_ratio(log_ratio, mask) / mask.sum(dim=1).clamp(min=1)
    keep = (mean >= math.log(p.lower)) & (mean <= math.log(p.upper))
    return keep[:, None].to(mask.dtype) * mask


@dataclass
class OffPolicySequenceMaskParams:
    """``rollout_correction=off_policy_sequence_mask``: DeepSeek-V3.2's off-policy sequence masking."""

    name: str = "off_policy_sequence_mask"
    threshold: float = 0.5  # delta of DeepSeek-V3.2 eq. 9 (TRL off_policy_mask_threshold; 0.5 its example)
    cap: float = 3.0  # only the threshold of the rollout/is_frac_past_cap metric


@ROLLOUT_CORRECTIONS.register("off_policy_sequence_mask", params=OffPolicySequenceMaskParams,
                              needs=("advantages", "current_log_ratio"), invariances=("permutation",))
def off_policy_sequence_mask(log_ratio: Tensor, mask: Tensor, p: OffPolicySequenceMaskParams, *,
                             advantages: Tensor, current_log_ratio: Tensor) -> Tensor:
    """Off-policy sequence masking (DeepSeek-V3.2, arXiv 2512.02556, sec. 3.1, eq. 9; TRL
    ``GRPOTrainer.get_off_policy_mask``)::

        D_i  = (1 / |y_i|) sum_t (log pi_sampler(y_it) - log pi_theta(y_it))   (= -mean current_log_ratio)
        w_it = 0 if A_it < 0 and D_i > threshold, else 1

    ``pi_theta`` is the policy being updated (detached), so the divergence counts both the
    sampler-trainer mismatch and the drift of the ``mu`` passes, as TRL computes it from the
    current log-probs against vLLM's; a sequence that is both off-policy and pushed down is
    dropped, positive-advantage ones are kept (``A >= 0`` keeps, as TRL). A pure mask; to also
    truncate the ratio, pair it with a policy loss that clips. Shapes ``[B, T]``;
    ``advantages`` ``[B, T]``, ``[B, 1]`` or ``[B]``.

    Raises:
        ValueError: shapes, ``cap``, or ``threshold < 0``.
    """
    _check(log_ratio, mask, p.cap)
    _check(current_log_ratio, mask, p.cap)
    if not p.threshold >= 0:
        raise ValueError(f"rollout_correction.threshold must be >= 0, got {p.threshold}")
    adv = advantages.reshape(mask.shape[0], -1).expand_as(mask)
    divergence = -sequence_log_ratio(current_log_ratio, mask) / mask.sum(dim=1).clamp(min=1)  # [B]
    drop = (adv < 0) & (divergence > p.threshold)[:, None]
    return (~drop).to(mask.dtype) * mask


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
           "token_mask", "sequence_truncate", "sequence_mask", "geometric", "off_policy_sequence_mask"]
