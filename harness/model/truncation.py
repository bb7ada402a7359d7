"""Truncated sampling (``rollout.top_k``, ``rollout.top_p``): the keep set of one decoding step.

A top-k / top-p sampler draws token ``y`` from the distribution renormalised over its *keep set*
``K``: ``pi_K(y) = pi(y) / S`` for ``y`` in ``K``, with ``S = sum_{v in K} pi(v)`` the kept mass.
The trainer's log-probs (ratio, KL, entropy) must be over the same ``K``, renormalised; with the
full softmax instead, every ratio against the sampler carries the factor ``S`` (TRL #6789: the
mean importance ratio equals the kept mass). :func:`keep_set` recomputes ``K`` from logits, the
sampler (``rollout=hf``, :mod:`harness.rollout.hf`) and the trainer (:mod:`harness.model.logprobs`)
both call it, and :func:`truncate_logits` is the one step that puts logits on ``K``.

Convention (transformers' ``TopKLogitsWarper`` / ``TopPLogitsWarper`` in the order
``generate`` applies them, and vLLM 0.32's ``apply_top_k_top_p_pytorch``, which agree):

1. temperature first: the logits are ``l / T`` (top-k does not depend on ``T``, top-p does);
2. top-k: keep ``l_v >= l_(k)``, the k-th largest value: every token tied with the k-th is kept
   (so ``|K|`` may exceed k at a tie);
3. top-p on the top-k survivors, renormalised: sort ascending, cumulative probability ``c``; drop
   the tokens with ``c <= 1 - p``; the most probable token is always kept. Equivalently, in
   descending order a token is kept while the mass strictly before it is ``< p``.

At a tie on the top-p boundary, which of the tied tokens is kept depends on the sort's order of
equal values: here a stable ascending sort (the tied token with the lower id is dropped first);
transformers and vLLM use an unstable sort, so only exactly tied logits at the boundary can be
decided differently (and a cumulative sum within float rounding of ``1 - p``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingFilter:
    """The truncation of a sampler: ``top_k`` (0 = off) and ``top_p`` (1.0 = off)."""

    top_k: int = 0
    top_p: float = 1.0

    @property
    def active(self) -> bool:
        """True when the sampler draws from a strict subset of the vocabulary."""
        return self.top_k > 0 or self.top_p < 1.0


@torch.no_grad()
def keep_set(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """The tokens a top-k / top-p sampler may draw (module docstring: convention and ties).

    Args:
        logits: ``[..., V]`` logits *after* temperature (``l / T``), any float dtype.
        top_k: keep the ``top_k`` largest (and every token tied with the k-th); 0 = no top-k.
        top_p: keep the smallest head of the (top-k renormalised) distribution whose mass
            reaches ``top_p``; 1.0 = no top-p.
    Returns:
        ``[..., V]`` bool, True for the kept tokens (at least one per row).
    Raises:
        ValueError: ``top_k < 0`` or ``top_p`` outside ``(0, 1]``.
    """
    if top_k < 0 or not 0.0 < top_p <= 1.0:
        raise ValueError(f"expected top_k >= 0 and top_p in (0, 1], got top_k={top_k}, top_p={top_p}")
    keep = torch.ones_like(logits, dtype=torch.bool)
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        keep = logits >= kth
    if top_p < 1.0:
        masked = logits.masked_fill(~keep, float("-inf"))
        sorted_logits, order = torch.sort(masked, dim=-1, stable=True)  # ascending
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cum <= 1.0 - top_p
        drop[..., -1] = False  # the most probable token always stays
        keep = keep & ~torch.zeros_like(drop).scatter(-1, order, drop)
    return keep


def truncate_logits(logits: Tensor, f: SamplingFilter, targets: Tensor | None = None) -> Tensor:
    """``logits`` with every token outside the keep set set to ``-inf``: a log-softmax of the
    result is the log-probability renormalised over the keep set.

    Args:
        logits: ``[..., V]`` after temperature (gradient flows to the kept entries).
        f: the sampler's truncation; inactive: ``logits`` is returned unchanged.
        targets: ``[...]`` optional sampled token ids, always kept (prime-rl PR #2601 restores the
            label's logit the same way): a token the sampler drew was in its keep set, so a
            recomputed set that misses it (a boundary decided differently in another precision)
            is corrected towards the sampler's, and its log-prob stays finite.
    Returns:
        ``[..., V]``, same dtype.
    """
    if not f.active:
        return logits
    keep = keep_set(logits.detach(), f.top_k, f.top_p)
    if targets is not None:
        keep = keep.scatter(-1, targets.unsqueeze(-1), True)
    return logits.masked_fill(~keep, float("-inf"))


__all__ = ["SamplingFilter", "keep_set", "truncate_logits"]
