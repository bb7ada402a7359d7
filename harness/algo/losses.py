"""Policy / value surrogate losses and loss aggregation over ``[B, T]`` token batches.

Conventions: ``B`` completions (group-major rows ``b = p * G + g``) padded to
``T`` tokens; ``mask[b, t] = 1`` at real completion tokens. Per-token losses are
returned as ``[B, T]`` tensors that are 0 at masked positions; the scalar that
is back-propagated comes from :func:`aggregate_loss`, whose mode is chosen by
name (verl ``loss_agg_mode`` names). Losses are to be *minimised*.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union

import torch
from torch import Tensor

from .registry import Registry
from .utils import masked_mean, masked_sum, shape_str

Number = Union[int, float, Tensor]

RATIO_LEVELS: Registry = Registry("importance-ratio level")
LOSS_AGGREGATIONS: Registry = Registry("loss aggregation mode")

# |log ratio| bound before exp(), as verl (avoids inf when policies diverge).
_LOG_RATIO_BOUND = 20.0


def _check_like(ref: Tensor, ref_name: str, **tensors: Tensor) -> None:
    if not isinstance(ref, Tensor) or ref.dim() != 2:
        got = shape_str(ref) if isinstance(ref, Tensor) else type(ref).__name__
        raise ValueError(f"{ref_name} must be a [B, T] tensor, got {got}")
    for name, t in tensors.items():
        if not isinstance(t, Tensor) or t.shape != ref.shape:
            got = shape_str(t) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(
                f"{name} must have the shape of {ref_name} {shape_str(ref)}, got {got}"
            )


def _zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask.to(torch.bool), x, torch.zeros_like(x))


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
    _check_like(logprobs, "logprobs", old_logprobs=old_logprobs, mask=mask)
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
    log_ratio = _zero_masked(log_ratio_fn(logprobs, old_logprobs, mask), mask)
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
    loss = _zero_masked(loss, mask)

    with torch.no_grad():
        r = ratio.detach()
        low = ((r < 1.0 - eps_low) & neg).to(r.dtype)
        high = ((r > 1.0 + eps_high) & (adv > 0)).to(r.dtype)
        tok_log_ratio = _zero_masked(token_log_ratio(logprobs.detach(), old_logprobs, mask), mask)
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


# --------------------------------------------------------------------------- value


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_range: Optional[float],
) -> Tuple[Tensor, Dict[str, Tensor]]:
    """PPO clipped value-function loss per token.

    Shapes: ``values`` (requires grad), ``old_values``, ``returns``, ``mask``:
    ``[B, T]`` -> ``(per_token_loss [B, T], stats)``; 0 at masked positions.

    Formula (OpenAI baselines ``ppo2`` / CleanRL ``clip_vloss``):
    ``v_clip = old + clip(v - old, -c, c)``,
    ``L = 0.5 * max((v - R)^2, (v_clip - R)^2)``; ``clip_range=None`` gives the
    unclipped ``0.5 * (v - R)^2``.
    Stats: ``vf_clip_frac`` -- fraction of valid tokens where the clipped term
    is strictly larger (verl ``vf_clipfrac``), detached 0-dim tensor.

    Raises:
        ValueError: shape mismatch or ``clip_range`` not None and < 0.
    """
    _check_like(values, "values", old_values=old_values, returns=returns, mask=mask)
    if clip_range is not None and clip_range < 0:
        raise ValueError(f"clip_range must be None or >= 0, got {clip_range}")
    loss_unclipped = (values - returns).square()
    if clip_range is None:
        loss_clipped = loss_unclipped
    else:
        v_clip = old_values + (values - old_values).clamp(-clip_range, clip_range)
        loss_clipped = (v_clip - returns).square()
    loss = _zero_masked(0.5 * torch.maximum(loss_unclipped, loss_clipped), mask)
    with torch.no_grad():
        frac = masked_mean((loss_clipped > loss_unclipped).to(loss.dtype), mask)
    return loss, {"vf_clip_frac": frac}


# --------------------------------------------------------------------------- aggregation
# Each mode's params dataclass is the schema of ``loss_agg=<mode>`` (harness.config) and its only
# declaration of defaults. The function gets the params and the batch-wide normalisers.


@dataclass
class TokenMeanParams:
    """``loss_agg=token-mean``: sum over all valid tokens / their count (DAPO, TRL ``dapo``/``bnpo``)."""

    name: str = "token-mean"


@dataclass
class SeqMeanTokenMeanParams:
    """``loss_agg=seq-mean-token-mean``: mean over sequences of each sequence's token mean (GRPO)."""

    name: str = "seq-mean-token-mean"
    # False: divide by the rows with >= 1 loss token (verl); True: by all B rows, fully masked
    # ones included (TRL loss_type="grpo": .mean() over the batch)
    count_masked_rows: bool = False


@dataclass
class SeqMeanTokenSumParams:
    """``loss_agg=seq-mean-token-sum``: mean over sequences of each sequence's token sum."""

    name: str = "seq-mean-token-sum"
    count_masked_rows: bool = False


@dataclass
class SeqMeanTokenSumNormParams:
    """``loss_agg=seq-mean-token-sum-norm``: Dr. GRPO's constant length normaliser."""

    name: str = "seq-mean-token-sum-norm"
    constant: Optional[float] = None  # the divisor C; None = the generation cap (rollout.max_new_tokens)
    # True: also divide by the number of sequences (Dr. GRPO paper, TRL dr_grpo); False: verl
    divide_by_seqs: bool = True
    count_masked_rows: bool = False  # with divide_by_seqs: count fully masked rows (TRL dr_grpo)


@dataclass(frozen=True)
class Normalizers:
    """Batch-wide counts an aggregation divides by (the *whole* batch's under micro-batching).

    ``num_tokens``: valid tokens; ``num_seqs``: rows with >= 1 valid token; ``num_rows``: all
    rows; ``max_len``: the generation cap in tokens (None when unknown).
    """

    num_tokens: Number
    num_seqs: Number
    num_rows: Number
    max_len: Optional[Number] = None


# Invariances (tests/test_properties.py): "permutation" of rows, "scale_equivariant" (c * loss gives
# c * the aggregate), "micro_batch_additive" (with the whole batch's normalisers, the sum over
# micro-batches of rows equals the whole batch's value).
_AGG_INVARIANCES = ("permutation", "scale_equivariant", "micro_batch_additive")


def _seq_count(p, norm: Normalizers) -> Number:
    return norm.num_rows if p.count_masked_rows else norm.num_seqs


@LOSS_AGGREGATIONS.register("token-mean", params=TokenMeanParams, invariances=_AGG_INVARIANCES)
def _token_mean(loss, mask, p: TokenMeanParams, norm: Normalizers) -> Tensor:
    return masked_sum(loss, mask) / norm.num_tokens


@LOSS_AGGREGATIONS.register("seq-mean-token-mean", params=SeqMeanTokenMeanParams, invariances=_AGG_INVARIANCES)
def _seq_mean_token_mean(loss, mask, p: SeqMeanTokenMeanParams, norm: Normalizers) -> Tensor:
    lengths = mask.to(loss.dtype).sum(dim=-1)
    per_seq = _row_sums(loss, mask) / torch.where(lengths > 0, lengths, torch.ones_like(lengths))
    return per_seq.sum() / _seq_count(p, norm)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum", params=SeqMeanTokenSumParams, invariances=_AGG_INVARIANCES)
def _seq_mean_token_sum(loss, mask, p: SeqMeanTokenSumParams, norm: Normalizers) -> Tensor:
    return _row_sums(loss, mask).sum() / _seq_count(p, norm)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm", params=SeqMeanTokenSumNormParams, invariances=_AGG_INVARIANCES)
def _seq_mean_token_sum_norm(loss, mask, p: SeqMeanTokenSumNormParams, norm: Normalizers) -> Tensor:
    constant = p.constant if p.constant is not None else norm.max_len
    if constant is None:
        raise ValueError(
            "loss_agg.constant must be given for loss aggregation 'seq-mean-token-sum-norm' "
            "(Dr. GRPO normaliser, e.g. the max generation length)"
        )
    _positive(constant, "loss_agg.constant")
    total = _row_sums(loss, mask).sum() / constant
    return total / _seq_count(p, norm) if p.divide_by_seqs else total


def _row_sums(loss: Tensor, mask: Tensor) -> Tensor:
    return masked_sum(loss, mask, dim=-1)


def _positive(value: Optional[Number], name: str) -> Optional[Number]:
    if value is None or isinstance(value, Tensor):
        return value
    if not value > 0:
        raise ValueError(f"{name} must be > 0 when given, got {value}")
    return value


def aggregation_normalizers(mask: Tensor) -> Dict[str, int]:
    """Global normalisers of a full batch for micro-batched :func:`aggregate_loss`.

    Shapes: ``mask`` ``[B, T]`` of the *whole* batch -> ``{"num_tokens": valid
    token count, "num_seqs": rows with >= 1 valid token, "num_rows": B}`` (python
    ints, each at least 1), the counts ``aggregate_loss`` uses locally.

    Raises:
        ValueError: if ``mask`` is not 2-D.
    """
    if not isinstance(mask, Tensor) or mask.dim() != 2:
        raise ValueError("mask must be a [B, T] tensor")
    m = mask.to(torch.bool)
    return {"num_tokens": max(int(m.sum()), 1), "num_seqs": max(int((m.sum(-1) > 0).sum()), 1),
            "num_rows": max(int(m.shape[0]), 1)}


def aggregate_loss(
    per_token_loss: Tensor,
    mask: Tensor,
    mode: str,
    params=None,
    *,
    num_tokens: Optional[Number] = None,
    num_seqs: Optional[Number] = None,
    num_rows: Optional[Number] = None,
    max_len: Optional[Number] = None,
    **overrides,
) -> Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar, mode chosen by name.

    Shapes: ``per_token_loss``, ``mask``: ``[B, T]`` -> 0-dim tensor.

    Modes (verl ``agg_loss`` / ``loss_agg_mode`` names), with ``m`` the mask,
    ``L_b = sum_t m_bt``, ``N_tok`` the valid tokens and ``N_seq`` the rows with
    ``L_b > 0`` (or all ``B`` rows with ``count_masked_rows``):

    * ``token-mean``: ``sum_bt m l / N_tok`` (DAPO token-level policy-gradient loss).
    * ``seq-mean-token-mean``: ``sum_{b} (sum_t m l / L_b) / N_seq`` (GRPO as
      in DeepSeekMath eq. 3).
    * ``seq-mean-token-sum``: ``sum_{b} (sum_t m l) / N_seq``.
    * ``seq-mean-token-sum-norm``: ``sum_{b} (sum_t m l / C) / N_seq`` (Dr. GRPO,
      Liu et al. 2025: constant normaliser ``C``, default ``max_len``); with
      ``divide_by_seqs=False`` the ``1/N_seq`` factor is dropped, as verl does.

    ``params``: an instance or mapping of the mode's params dataclass (the trainer passes
    ``cfg.loss_agg``); ``overrides`` replace single fields (``constant=10``).
    ``num_tokens`` / ``num_seqs`` / ``num_rows`` default to the local counts. For gradient
    accumulation pass the *whole batch's* counts (:func:`aggregation_normalizers`): then
    summing this function over micro-batches equals the full-batch value exactly, for every
    mode.

    Raises:
        ValueError: unknown ``mode`` (lists valid names); a parameter that is not a field of
            the mode's params; shape mismatch; no ``constant`` and no ``max_len`` for
            ``seq-mean-token-sum-norm``; a normaliser given as a number <= 0.
    """
    spec = LOSS_AGGREGATIONS.spec(mode)
    p = spec.build(params, **overrides)
    _check_like(per_token_loss, "per_token_loss", mask=mask)
    local = aggregation_normalizers(mask)
    norm = Normalizers(
        num_tokens=_positive(num_tokens, "num_tokens") or local["num_tokens"],
        num_seqs=_positive(num_seqs, "num_seqs") or local["num_seqs"],
        num_rows=_positive(num_rows, "num_rows") or local["num_rows"],
        max_len=_positive(max_len, "max_len"),
    )
    return spec.fn(per_token_loss, mask, p, norm)


__all__ = [
    "RATIO_LEVELS",
    "LOSS_AGGREGATIONS",
    "policy_loss",
    "value_loss",
    "aggregate_loss",
    "aggregation_normalizers",
    "Normalizers",
    "TokenMeanParams",
    "SeqMeanTokenMeanParams",
    "SeqMeanTokenSumParams",
    "SeqMeanTokenSumNormParams",
    "token_log_ratio",
    "sequence_log_ratio",
]
