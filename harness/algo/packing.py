"""Advantage estimation over the model's tokens only, when tool observations sit between them.

An episode's loss mask (:attr:`harness.rollout.RolloutBatch.loss_mask`) has holes where the
tool's observations are. The estimators take right-padded masks (a row's first ``L`` tokens):
:func:`estimate_on_model_tokens` packs each row's model tokens to the left, in order, runs the
estimator on the packed ``[B, T]`` tensors and scatters its outputs back. An estimator thus sees
an episode as the sequence of its model tokens, observations removed: returns and GAE run over
model tokens only (gamma and lambda discount per model token), as verl's multi-turn GAE skips
masked positions, and token statistics (whitening) count model tokens only.
"""

from __future__ import annotations

import dataclasses

import torch

from harness.algo.estimators import AdvantageContext, AdvantageOutput


def left_pack_order(mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` long: per row, the positions of its mask's 1s in order, then those of its 0s.

    ``x.gather(1, order)`` packs a row's masked tokens to the left (right-padded mask);
    ``out.scatter_(1, order, y)`` puts packed values back in place.
    """
    return torch.argsort((mask == 0).long(), dim=1, stable=True)


def estimate_on_model_tokens(estimator, ctx: AdvantageContext) -> AdvantageOutput:
    """``estimator(ctx)``, with ``ctx``'s token tensors left-packed when its mask has holes.

    Args:
        estimator: the run's estimator (``algo.estimator``), called with an :class:`AdvantageContext`.
        ctx: the context; ``mask`` ``[N, T]`` the loss mask (model tokens), ``token_rewards`` and
            ``values`` ``[N, T]`` aligned with it.
    Returns:
        the estimator's output with ``advantages`` / ``returns`` ``[N, T]`` in the original
        positions, 0 where the mask is 0. A right-padded mask is passed through untouched (the
        same call, the same tensors).
    Raises:
        ValueError: step rewards (``process``) with a mask that has holes: their token indices
            are positions of the whole sequence, which packing would move.
    """
    m = ctx.mask.bool()
    if m.shape[1] < 2 or not bool((m[:, 1:] & ~m[:, :-1]).any()):
        return estimator(ctx)
    if ctx.step_rewards is not None:
        raise ValueError("step rewards (advantage=process) with tool observations are not supported: use tools=none "
                         "or an outcome estimator")
    order = left_pack_order(ctx.mask)

    def pack(x):
        return None if x is None else x.gather(1, order)

    def unpack(y):
        if y is None:
            return None
        out = torch.zeros_like(y)
        out.scatter_(1, order, y)
        return out * ctx.mask.to(out.dtype)

    out = estimator(dataclasses.replace(ctx, token_rewards=pack(ctx.token_rewards), mask=pack(ctx.mask),
                                        values=pack(ctx.values)))
    return AdvantageOutput(advantages=unpack(out.advantages), returns=unpack(out.returns))
