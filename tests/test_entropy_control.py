"""Entropy-bonus controllers (harness.algo.entropy) against hand values: Skywork-OR1 / TRL's
adaptive control and the fixed default."""

from __future__ import annotations

import math

import pytest

from harness.algo import ENTROPY_CONTROLLERS
from harness.algo.entropy import AdaptiveEntropyParams, FixedEntropyParams, adaptive, fixed


def test_fixed_keeps_the_coefficient_and_always_applies_it():
    p = FixedEntropyParams()
    assert fixed(0.3, 0.01, p) == 0.3 and fixed(0.3, 50.0, p) == 0.3
    assert p.applies(math.inf) and p.applies(0.0)


def test_adaptive_steps_towards_the_target_within_its_bounds():
    p = AdaptiveEntropyParams()  # TRL's defaults: target 0.2, delta 0.005, bounds [0, 1]
    assert adaptive(0.01, 0.15, p) == pytest.approx(0.015, abs=1e-15)  # entropy at or below target: up
    assert adaptive(0.01, 0.2, p) == pytest.approx(0.015, abs=1e-15)
    assert adaptive(0.01, 0.25, p) == pytest.approx(0.005, abs=1e-15)  # above: down
    assert adaptive(0.003, 0.25, p) == 0.0  # floored at coef_min
    assert adaptive(0.998, 0.1, p) == 1.0  # capped at coef_max
    bounded = AdaptiveEntropyParams(target=1.0, delta=0.5, coef_min=0.2, coef_max=0.6)
    assert adaptive(0.3, 2.0, bounded) == 0.2 and adaptive(0.3, 0.5, bounded) == 0.6
    # the bonus applies only after a step at or below the target; never before the first measurement
    assert not p.applies(math.inf) and not p.applies(0.21) and p.applies(0.2)


def test_a_run_of_steps_applies_the_coefficient_only_after_low_entropy():
    p, coef, last, applied = AdaptiveEntropyParams(), 0.0, math.inf, []
    for h in (0.5, 0.1, 0.1, 0.3, 0.3):  # the entropy each step measures
        applied.append(coef if p.applies(last) else 0.0)
        coef, last = adaptive(coef, h, p), h
    assert applied == pytest.approx([0.0, 0.0, 0.005, 0.01, 0.0], abs=1e-15)
    assert coef == pytest.approx(0.0, abs=1e-15)


def test_bad_params_name_the_key():
    spec = ENTROPY_CONTROLLERS.spec("adaptive")
    with pytest.raises(ValueError, match="entropy_control.target and entropy_control.delta must be > 0"):
        spec.fn(0.1, 0.1, spec.build(delta=0.0))
    with pytest.raises(ValueError, match=r"entropy_control.coef_min \(0.5\) must be <= entropy_control.coef_max"):
        spec.fn(0.1, 0.1, spec.build(coef_min=0.5, coef_max=0.1))
