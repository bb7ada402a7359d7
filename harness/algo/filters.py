"""Group filters registered by name (``group_filter=<name>``): which sampled groups a step keeps.

Signature ``fn(rewards [P, G], p) -> keep [P] bool``; the params dataclass also declares how
many rounds of sampling a step may take (``max_rounds``) to refill the dropped groups. The
trainer samples, scores, filters, and samples again while fewer than ``train.prompts_per_step``
groups are kept and rounds remain.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harness.registry import Registry

GROUP_FILTERS: Registry = Registry("group filter")


@dataclass
class NoFilterParams:
    """``group_filter=none``: every group is kept, one round of sampling per step."""

    name: str = "none"

    @property
    def max_rounds(self) -> int:
        return 1


@GROUP_FILTERS.register("none", params=NoFilterParams)
def keep_all(rewards: Tensor, p: NoFilterParams) -> Tensor:
    """Keep every group. Shapes: ``rewards`` ``[P, G]`` -> ``[P]`` all True."""
    return torch.ones(rewards.shape[0], dtype=torch.bool, device=rewards.device)


@dataclass
class DAPOFilterParams:
    """``group_filter=dapo``: DAPO dynamic sampling (Yu et al. 2025, sec. 3.2)."""

    name: str = "dapo"
    max_rounds: int = 3  # sampling rounds per step at most (verl bounds this with max_num_gen_batches)


@GROUP_FILTERS.register("dapo", params=DAPOFilterParams)
def dapo(rewards: Tensor, p: DAPOFilterParams) -> Tensor:
    """Keep groups whose rewards are not all equal (``max > min``, exact): a group where every
    completion scores the same carries no group-relative signal (DAPO eq. 11, the constraint
    ``0 < |{o_i correct}| < G``; verl-recipe ``dapo/dapo_ray_trainer.py`` ``RayDAPOTrainer.fit``,
    ``np.std(metric) > 0``). Shapes: ``[P, G]`` -> ``[P]``.

    Not ``std > 0``: the float32 std of a constant group of non-dyadic rewards need not be 0
    (``torch.full((1, 8), 0.1).std(dim=1)`` is 8e-9, from the rounding of the mean; the kernel,
    and so the result, depends on the batch's shape), so a group of 8 equally formatted wrong
    answers under ``task.format_reward=0.1`` was kept when filtered alone.

    Raises:
        ValueError: ``p.max_rounds < 1``.
    """
    if p.max_rounds < 1:
        raise ValueError(f"group_filter.max_rounds must be >= 1, got {p.max_rounds}")
    return rewards.amax(dim=1) > rewards.amin(dim=1)


__all__ = ["GROUP_FILTERS", "keep_all", "dapo", "NoFilterParams", "DAPOFilterParams"]
