"""Advantage transforms registered by name (``advantage_transform=<name>``): applied to the
estimator's advantages ``[B, T]`` before the policy loss sees them (the critic's returns are left
as they are). ``none`` (the default) returns them unchanged.

Signature ``fn(advantages [B, T], p) -> advantages [B, T]`` (same dtype).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from harness.registry import Registry

ADVANTAGE_TRANSFORMS: Registry = Registry("advantage transform")


@dataclass
class NoTransformParams:
    """``advantage_transform=none``: the estimator's advantages reach the policy loss unchanged."""

    name: str = "none"


@ADVANTAGE_TRANSFORMS.register("none", params=NoTransformParams)
def no_transform(advantages: Tensor, p: NoTransformParams) -> Tensor:
    """The advantages unchanged. Shapes: ``[B, T]`` -> ``[B, T]``."""
    return advantages


@dataclass
class ClipBelowParams:
    """``advantage_transform=clip_below``: advantages below ``floor`` are raised to it."""

    name: str = "clip_below"
    floor: float = 0.0  # 0: train only on completions at or above the group baseline (no negative samples)


@ADVANTAGE_TRANSFORMS.register("clip_below", params=ClipBelowParams)
def clip_below(advantages: Tensor, p: ClipBelowParams) -> Tensor:
    """``max(A, floor)`` per token. With ``floor = 0`` only the completions above the group baseline
    carry a gradient from the policy loss: Carrino et al. 2026, "Are complicated loss functions
    necessary for teaching LLMs to reason?" (arXiv 2603.18756), finding 1 (advantages clipped at 0
    from below learn less than GRPO with both signs). The tokens of a clipped completion stay in
    the loss aggregation's denominators and in the KL term.

    Shapes: ``[B, T]`` -> ``[B, T]``; padded positions (advantage 0) stay 0.

    Raises:
        ValueError: ``floor > 0`` (it would give padded and zero-advantage tokens a positive
            advantage).
    """
    if p.floor > 0:
        raise ValueError(f"advantage_transform.floor must be <= 0, got {p.floor}")
    return advantages.clamp(min=p.floor)


__all__ = ["ADVANTAGE_TRANSFORMS", "no_transform", "clip_below", "NoTransformParams", "ClipBelowParams"]
