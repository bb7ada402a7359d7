"""advantage=gdpo (normalise each reward component in its group, then sum, then batch-normalise)
against hand values, float64."""

from __future__ import annotations

import math

import pytest
import torch

from harness.algo import TOKEN_ESTIMATORS, AdvantageContext

D = torch.float64


def _run(comps, weights, eps=0.0, lengths=None):
    comps = torch.tensor(comps, dtype=D)
    P, G, _ = comps.shape
    T = 3
    lengths = torch.full((P * G,), T) if lengths is None else torch.tensor(lengths)
    mask = (torch.arange(T)[None] < lengths[:, None]).to(D)
    scores = (comps * torch.tensor(weights, dtype=D)).sum(-1)
    ctx = AdvantageContext(scores=scores, token_rewards=torch.zeros(P * G, T, dtype=D), mask=mask,
                           reward_components=comps, reward_weights=torch.tensor(weights, dtype=D))
    spec = TOKEN_ESTIMATORS.spec("gdpo")
    return spec.fn(ctx, spec.build(eps=eps)).advantages, mask


def test_gdpo_hand_values_differ_from_grpo_on_the_summed_reward():
    # group 0: components (correct, format) [1, 0] and [0, 1]; group 1: [0, 3] and [2, 1]; weights 1, 0.5.
    # Every component has std sqrt(2) * |diff| / 2 in its group, so z = +-1/sqrt(2) and the weighted
    # sums are s = [a, -a, -a, a] with a = sqrt(2)/4; over the batch mean 0, Bessel std sqrt(4 a^2 / 3),
    # so A = +-sqrt(3)/2 on every token of the row.
    adv, mask = _run([[[1, 0], [0, 1]], [[0, 3], [2, 1]]], [1.0, 0.5])
    h = math.sqrt(3) / 2
    assert adv[:, 0].tolist() == pytest.approx([h, -h, -h, h], rel=1e-14)
    assert torch.equal(adv, adv[:, :1].expand_as(adv) * mask)
    # GRPO on the summed rewards [1, 0.5 | 1.5, 2.5] gives +-1/sqrt(2) instead
    grpo = TOKEN_ESTIMATORS.spec("grpo")
    total = torch.tensor([[1.0, 0.5], [1.5, 2.5]], dtype=D)
    g = grpo.fn(AdvantageContext(scores=total, token_rewards=torch.zeros(4, 3, dtype=D), mask=mask),
                grpo.build(eps=0.0)).advantages
    r = 1 / math.sqrt(2)
    assert g[:, 0].tolist() == pytest.approx([r, -r, -r, r], rel=1e-14)


def test_a_component_constant_in_its_group_contributes_nothing_there():
    # the second component is constant in group 0 (z = 0 there) and varies in group 1
    adv_both, _ = _run([[[1, 5], [0, 5]], [[1, 0], [0, 1]]], [1.0, 1.0], eps=1e-4)
    adv_first, _ = _run([[[1, 0], [0, 0]], [[1, 0], [0, 1]]], [1.0, 1.0], eps=1e-4)
    assert torch.allclose(adv_both, adv_first, rtol=0, atol=1e-12)


def test_bad_inputs_name_what_was_expected():
    spec = TOKEN_ESTIMATORS.spec("gdpo")
    ctx = AdvantageContext(scores=torch.zeros(1, 2, dtype=D), token_rewards=torch.zeros(2, 3, dtype=D),
                           mask=torch.ones(2, 3, dtype=D))
    with pytest.raises(ValueError, match=r"reward_components must be \[P, G, K\] = \[1, 2, K\]"):
        spec.fn(ctx, spec.build())
    assert "reward_components" in spec.needs and spec.grouped
