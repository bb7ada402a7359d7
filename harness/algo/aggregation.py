"""Loss aggregations registered by name (``loss_agg=<mode>``, verl ``loss_agg_mode`` names):
a ``[B, T]`` per-token loss -> the scalar that is back-propagated.

Each mode is ``fn(loss [B, T], mask [B, T], p, norm: Normalizers) -> 0-dim tensor`` with its
params dataclass (the Hydra schema of that option). Under micro-batching the normalisers are
the *whole* batch's, so summing over micro-batches gives the whole batch's value exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

import torch
from torch import Tensor

from harness.registry import Entry, Registry
from .utils import check_like, masked_sum

Number = Union[int, float, Tensor]

LOSS_AGGREGATIONS: Registry = Registry("loss aggregation mode")


# Each mode's params dataclass is the schema of ``loss_agg=<mode>`` (harness.launch.config) and its only
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

    ``params``: an instance or mapping of the mode's params dataclass; ``overrides`` replace
    single fields (``constant=10``). The trainer's path looks the mode up once
    (:class:`harness.algo.Algorithm`) and calls :func:`apply_aggregation`.
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
    return apply_aggregation(spec, spec.build(params, **overrides), per_token_loss, mask, num_tokens=num_tokens,
                             num_seqs=num_seqs, num_rows=num_rows, max_len=max_len)


def apply_aggregation(
    spec: Entry,
    params: Any,
    per_token_loss: Tensor,
    mask: Tensor,
    *,
    num_tokens: Optional[Number] = None,
    num_seqs: Optional[Number] = None,
    num_rows: Optional[Number] = None,
    max_len: Optional[Number] = None,
) -> Tensor:
    """:func:`aggregate_loss` for an already looked-up mode ``spec`` and built ``params`` instance.

    Shapes: ``per_token_loss``, ``mask``: ``[B, T]`` -> 0-dim tensor. Normalisers as
    :func:`aggregate_loss` (the local counts where None).

    Raises:
        ValueError: shape mismatch; a normaliser given as a number <= 0; the mode's own errors.
    """
    check_like(per_token_loss, "per_token_loss", mask=mask)
    local = aggregation_normalizers(mask)
    norm = Normalizers(
        num_tokens=_positive(num_tokens, "num_tokens") or local["num_tokens"],
        num_seqs=_positive(num_seqs, "num_seqs") or local["num_seqs"],
        num_rows=_positive(num_rows, "num_rows") or local["num_rows"],
        max_len=_positive(max_len, "max_len"),
    )
    return spec.fn(per_token_loss, mask, params, norm)


__all__ = [
    "LOSS_AGGREGATIONS",
    "aggregate_loss",
    "apply_aggregation",
    "aggregation_normalizers",
    "Normalizers",
    "TokenMeanParams",
    "SeqMeanTokenMeanParams",
    "SeqMeanTokenSumParams",
    "SeqMeanTokenSumNormParams",
]
