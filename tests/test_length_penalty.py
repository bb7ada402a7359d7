"""Length penalties (harness.algo.length_penalty) against hand-computed values, float64."""

from __future__ import annotations

import pytest
import torch

from harness.algo.length_penalty import LENGTH_PENALTIES, LinearLengthPenaltyParams, linear

D = torch.float64


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=D)


def test_linear_hand_values_and_a_group_that_never_solves_is_untouched():
    # group 0: pass rate 0.5, out / max = [1/4, 2/4, 3/4, 1], one shared prompt, one turn each:
    # frac = 0.25 * out/max + 0.1 + 0.1 = [0.2625, 0.325, 0.3875, 0.45]; r' = r - 0.5 * frac.
    rewards = _t([[1, 1, 0, 0], [0, 0, 0, 0]])
    out = _t([[10, 20, 30, 40], [7, 9, 11, 13]])
    inp = _t([[5, 5, 5, 5], [8, 8, 8, 8]])
    turns = torch.ones(2, 4, dtype=D)
    got = linear(rewards, out, inp, turns, LinearLengthPenaltyParams())
    want = _t([[0.86875, 0.8375, -0.19375, -0.225], [0, 0, 0, 0]])
    assert torch.allclose(got, want, rtol=0, atol=1e-12)


def test_linear_matches_prime_rls_own_test_case():
    # prime-rl tests/unit/orchestrator/test_advantage.py: rewards [1, 1, 1], lengths [10, 20, 30],
    # only the output term (0.25): advantages (reward minus the group mean) [1/12, 0, -1/12].
    p = LinearLengthPenaltyParams(num_output_tokens_weight=0.25, num_input_tokens_weight=0.0, num_turns_weight=0.0)
    shaped = linear(_t([[1, 1, 1]]), _t([[10, 20, 30]]), _t([[3, 3, 3]]), _t([[1, 1, 1]]), p)
    adv = shaped - shaped.mean(dim=1, keepdim=True)
    assert torch.allclose(adv, _t([[1 / 12, 0, -1 / 12]]), rtol=0, atol=1e-12)


def test_single_turn_input_and_turn_terms_are_a_group_constant_shift():
    rewards, out = _t([[1, 0, 1, 1]]), _t([[12, 40, 25, 3]])
    inp, turns = _t([[9, 9, 9, 9]]), torch.ones(1, 4, dtype=D)
    only_out = LinearLengthPenaltyParams(num_input_tokens_weight=0.0, num_turns_weight=0.0)
    full = linear(rewards, out, inp, turns, LinearLengthPenaltyParams())
    part = linear(rewards, out, inp, turns, only_out)
    assert torch.allclose(part - full, torch.full((1, 4), 0.75 * 0.2, dtype=D), rtol=0, atol=1e-12)
    assert not torch.allclose(full, rewards)  # the knob is on: rewards move


def test_none_is_the_identity_and_bad_input_names_the_key():
    rewards = _t([[1, 0]])
    spec = LENGTH_PENALTIES.spec("none")
    assert spec.fn(rewards, _t([[4, 5]]), _t([[1, 1]]), _t([[1, 1]]), spec.build()) is rewards
    with pytest.raises(ValueError, match="num_turns_weight must be >= 0"):
        linear(rewards, _t([[4, 5]]), _t([[1, 1]]), _t([[1, 1]]), LinearLengthPenaltyParams(num_turns_weight=-1))
    with pytest.raises(ValueError, match=r"must all be \[P, G\]"):
        linear(rewards, _t([4, 5]), _t([[1, 1]]), _t([[1, 1]]), LinearLengthPenaltyParams())
