"""The PPO critic's clipped value loss per token (the critic component: :mod:`harness.train.critic`)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from .utils import check_like, masked_mean, zero_masked


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
    check_like(values, "values", old_values=old_values, returns=returns, mask=mask)
    if clip_range is not None and clip_range < 0:
        raise ValueError(f"clip_range must be None or >= 0, got {clip_range}")
    loss_unclipped = (values - returns).square()
    if clip_range is None:
        loss_clipped = loss_unclipped
    else:
        v_clip = old_values + (values - old_values).clamp(-clip_range, clip_range)
        loss_clipped = (v_clip - returns).square()
    loss = zero_masked(0.5 * torch.maximum(loss_unclipped, loss_clipped), mask)
    with torch.no_grad():
        frac = masked_mean((loss_clipped > loss_unclipped).to(loss.dtype), mask)
    return loss, {"vf_clip_frac": frac}


__all__ = ["value_loss"]
