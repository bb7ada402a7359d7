"""advantage_transform=: the registered transforms of the estimator's advantages (hand values),
chosen by config and applied by the Algorithm the run builds."""

from __future__ import annotations

import math

import pytest
import torch

from harness.algo import ADVANTAGE_TRANSFORMS, build_algorithm, dry_run
from harness.algo.adv_transforms import ClipBelowParams, clip_below
from harness.algo.estimators import AdvantageContext
from tests.conftest import compose

ADV = torch.tensor([[1.5, -0.5, 0.0, 0.0], [-2.0, 0.3, -1e-9, 0.0]], dtype=torch.float64)


def test_clip_below_raises_negative_advantages_to_the_floor_exactly():
    out = clip_below(ADV, ClipBelowParams())
    assert torch.equal(out, torch.tensor([[1.5, 0.0, 0.0, 0.0], [0.0, 0.3, 0.0, 0.0]], dtype=torch.float64))
    out = clip_below(ADV, ClipBelowParams(floor=-0.25))
    assert torch.equal(out, torch.tensor([[1.5, -0.25, 0.0, 0.0], [-0.25, 0.3, -1e-9, 0.0]], dtype=torch.float64))
    assert out.dtype == torch.float64
    with pytest.raises(ValueError, match="advantage_transform.floor must be <= 0, got 0.1"):
        clip_below(ADV, ClipBelowParams(floor=0.1))
    assert torch.equal(ADVANTAGE_TRANSFORMS.spec("none").fn(ADV, ADVANTAGE_TRANSFORMS.spec("none").build()), ADV)


def _algo(*overrides):
    return build_algorithm(compose(*overrides))


def test_the_config_choice_reaches_the_algorithm():
    """GRPO on one group with rewards 1, 0, 0, 1 gives z-scores +-0.5 / sd: (+0.866, -0.866, -0.866,
    +0.866) with the Bessel std 0.577; clip_below keeps the two positive ones and zeroes the others,
    the default leaves the negatives (the value a test of the knob would see differ when off)."""
    scores = torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(4, 2, dtype=torch.float64)
    token_rewards = torch.zeros(4, 2, dtype=torch.float64)
    token_rewards[:, -1] = scores.reshape(-1)
    ctx = AdvantageContext(scores=scores, token_rewards=token_rewards, mask=mask)
    z = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    plain = _algo("group_size=4")
    assert plain.advantage_transform.name == "none"
    adv = plain.advantage_transform(plain.estimator(ctx).advantages)
    assert adv[:, 0].tolist() == pytest.approx([z, -z, -z, z], abs=1e-12)
    clipped = _algo("group_size=4", "advantage_transform=clip_below")
    assert clipped.advantage_transform.params == ClipBelowParams(name="clip_below", floor=0.0)
    adv = clipped.advantage_transform(clipped.estimator(ctx).advantages)
    assert adv[:, 0].tolist() == pytest.approx([z, 0.0, 0.0, z], abs=1e-12)
    dry_run(clipped, 4)
    with pytest.raises(ValueError, match="floor must be <= 0"):
        dry_run(_algo("group_size=4", "advantage_transform=clip_below", "advantage_transform.floor=0.5"), 4)
