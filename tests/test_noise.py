"""analysis.noise: summary spreads and the eval-noise split, against values worked by hand."""
import math

import numpy as np
import pytest

from analysis.ablation import RunRecord
from analysis.noise import paired_table, summary_value


def _rec(seed, rows, steps=(0, 4, 8)):
    return RunRecord(f"r{seed}", "x", seed, list(steps), np.asarray(rows, dtype=float), {}, 1.0, 1.0)


def test_summaries_by_hand():
    correct = np.array([[0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]])  # accuracies 0, 0.25, 0.75 at steps 0, 4, 8
    assert summary_value([0, 4, 8], correct, "final") == 0.75
    assert summary_value([0, 4, 8], correct, "last2") == 0.5
    # trapezoid: (4 * (0 + 0.25) / 2 + 4 * (0.25 + 0.75) / 2) / 8 = (0.5 + 2) / 8
    assert summary_value([0, 4, 8], correct, "auc") == pytest.approx(0.3125, abs=1e-15)
    with pytest.raises(ValueError, match="summary 'best'"):
        summary_value([0, 4, 8], correct, "best")


def test_paired_table_by_hand():
    zero = [[0, 0, 0, 0]] * 3
    # seed 1: final difference +0.5 (x = 1, 1, 0, 0); seed 2: 0 (x = 1, -1, 0, 0)
    ctl = {1: _rec(1, zero), 2: _rec(2, [[0] * 4, [0] * 4, [0, 1, 0, 0]])}
    trt = {1: _rec(1, [[0] * 4, [0] * 4, [1, 1, 0, 0]]), 2: _rec(2, [[0] * 4, [0] * 4, [1, 0, 0, 0]])}
    t = paired_table(ctl, trt)
    assert (t["seeds"], t["problems"], t["evals"]) == (2, 4, 3)
    assert t["final"]["mean"] == 0.25
    assert t["final"]["sd"] == pytest.approx(math.sqrt(0.125), abs=1e-15)  # values 0.5 and 0
    # per-seed eval variance: (mean x^2 - mean(x)^2) / n = (0.5 - 0.25) / 4 and (0.5 - 0) / 4
    eval_var = (0.0625 + 0.125) / 2
    assert t["eval_sd"] == pytest.approx(math.sqrt(eval_var), abs=1e-15)
    train_var = 0.125 - eval_var
    assert t["train_sd"] == pytest.approx(math.sqrt(train_var), abs=1e-15)
    assert t["n_equal"] == pytest.approx(4 * eval_var / train_var, rel=1e-12)
    assert t["last2"]["mean"] == 0.125  # half the final difference: the step-4 evals agree


def test_paired_table_refuses_one_seed_and_mixed_evals():
    a = _rec(1, [[0, 1]] * 3)
    with pytest.raises(ValueError, match="2 paired seeds"):
        paired_table({1: a}, {1: a})
    with pytest.raises(ValueError, match="differ in eval steps"):
        paired_table({1: a, 2: _rec(2, [[0, 1]] * 2, (0, 8))}, {1: a, 2: a})
