"""Token-level return / advantage recursions over right-padded ``[B, T]`` batches.

Each row ``b`` holds a completion of ``L_b`` tokens left-aligned at positions
``0 .. L_b - 1`` followed by padding (``mask[b, t] = 1`` iff ``t < L_b``). The
episode ends after the last valid token: the value of the state after it is 0
(terminal), so no bootstrapping happens across padding. Outputs are 0 at masked
positions. Loops are written out in reverse time order for readability (as in
CleanRL's ``ppo.py``); T is a few thousand at most, so the Python loop over
time with vectorised batch ops is cheap.
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from .utils import right_padded_lengths, shape_str


def _check_inputs(mask: Tensor, gamma: float, lam: float = 1.0, **tensors: Tensor) -> Tensor:
    right_padded_lengths(mask)  # validates 2-D and right padding
    for name, t in tensors.items():
        if not isinstance(t, Tensor) or t.shape != mask.shape:
            got = shape_str(t) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must have the mask's shape {shape_str(mask)}, got {got}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    ref = next(iter(tensors.values()))
    dtype = ref.dtype if ref.is_floating_point() else torch.get_default_dtype()
    return mask.to(dtype)


@torch.no_grad()
def gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float
) -> Tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation over right-padded completions.

    Shapes: ``token_rewards``, ``values``, ``mask``: ``[B, T]`` ->
    ``(advantages [B, T], returns [B, T])``, both 0 at masked positions and
    computed without gradient.

    Formula (Schulman et al. 2016, "High-Dimensional Continuous Control Using
    Generalized Advantage Estimation", eqs. 11-16), for valid ``t``:
    ``delta_t = r_t + gamma * V_{t+1} - V_t`` and
    ``A_t = delta_t + gamma * lam * A_{t+1}``, where ``V_{t+1} = A_{t+1} = 0``
    after the last valid token (terminal state); ``returns = A + V`` (the
    TD(lambda) value targets). Values at masked positions are ignored.

    Raises:
        ValueError: if ``mask`` is not a right-padded ``[B, T]`` mask, shapes
            differ, or ``gamma`` / ``lam`` are outside ``[0, 1]``.
    """
    m = _check_inputs(mask, gamma, lam, token_rewards=token_rewards, values=values)
    rewards = torch.where(m > 0, token_rewards.to(m.dtype), torch.zeros_like(m))
    vals = torch.where(m > 0, values.to(m.dtype), torch.zeros_like(m))
    B, T = m.shape
    advantages = torch.zeros_like(m)
    next_value = torch.zeros(B, dtype=m.dtype, device=m.device)
    next_adv = torch.zeros(B, dtype=m.dtype, device=m.device)
    for t in reversed(range(T)):
        # next_value / next_adv are already 0 beyond the last valid token.
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        adv_t = (delta + gamma * lam * next_adv) * m[:, t]
        advantages[:, t] = adv_t
        next_value = vals[:, t]
        next_adv = adv_t
    returns = (advantages + vals) * m
    return advantages, returns


@torch.no_grad()
def reinforce_pp_returns(token_rewards: Tensor, mask: Tensor, *, gamma: float) -> Tensor:
    """Discounted return-to-go used by REINFORCE++.

    Shapes: ``token_rewards``, ``mask``: ``[B, T]`` -> returns ``[B, T]``, 0 at
    masked positions, computed without gradient.

    Formula (Hu 2025, "REINFORCE++", arXiv 2501.03262, sec. 3; OpenRLHF
    ``get_cumulative_returns``): ``G_t = r_t + gamma * G_{t+1}`` with
    ``G = 0`` after the last valid token; i.e. ``G_t = sum_{s >= t} gamma^(s-t) r_s``
    over valid ``s``.

    Raises:
        ValueError: if ``mask`` is not a right-padded ``[B, T]`` mask, shapes
            differ, or ``gamma`` is outside ``[0, 1]``.
    """
    m = _check_inputs(mask, gamma, token_rewards=token_rewards)
    rewards = torch.where(m > 0, token_rewards.to(m.dtype), torch.zeros_like(m))
    B, T = m.shape
    returns = torch.zeros_like(m)
    running = torch.zeros(B, dtype=m.dtype, device=m.device)
    for t in reversed(range(T)):
        running = (rewards[:, t] + gamma * running) * m[:, t]
        returns[:, t] = running
    return returns


__all__ = ["gae", "reinforce_pp_returns"]
