"""analysis.noise: summary spreads and the eval-noise split, against values worked by hand."""
import math

import numpy as np
import pytest

from analysis import stats as st
from analysis.ablation import RunRecord
from analysis.noise import Design, SeedCost, at_step, frontier, paired_table, sd_at_size, summary_value


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


def test_at_step_keeps_the_evals_up_to_the_step_and_refuses_a_step_without_one():
    r = _rec(1, [[0, 0], [1, 0], [1, 1]], steps=(0, 4, 8))
    cut = at_step(r, 4)
    assert cut.eval_steps == [0, 4] and cut.correct.tolist() == [[0, 0], [1, 0]]
    assert r.eval_steps == [0, 4, 8]  # the record itself is untouched
    with pytest.raises(ValueError, match="no eval at step 6"):
        at_step(r, 6)


def test_sd_at_size_scales_only_the_eval_share():
    t = {"train_sd": 0.03, "eval_sd": 0.04, "problems": 250}
    assert sd_at_size(t, 250) == pytest.approx(0.05, abs=1e-15)
    # 1000 problems: eval variance 0.04^2 / 4 = 4e-4; sqrt(9e-4 + 4e-4)
    assert sd_at_size(t, 1000) == pytest.approx(math.sqrt(13e-4), abs=1e-15)


def test_seed_hours_and_frontier_by_hand():
    cost = SeedCost(overhead_s=10.0, eval_s_per_problem=0.2, step_s={4: 20.0, 8: 35.0},
                    arm_ratio={"ctl": 1.0, "big": 2.0})
    ref, long, wide = Design(8, 4, 250), Design(16, 4, 250), Design(8, 8, 250)
    # ctl: 10 + 8 * 20 + 50 = 220 s; big: 10 + 8 * 40 + 50 = 380 s; two jobs: 300 s a seed
    assert cost.seed_hours(ref) == pytest.approx(300 / 3600, abs=1e-15)
    assert cost.seed_hours(long) == pytest.approx((380 + 700) / 2 / 3600, abs=1e-15)
    assert cost.seed_hours(wide) == pytest.approx((340 + 620) / 2 / 3600, abs=1e-15)
    with pytest.raises(KeyError):
        cost.seed_hours(Design(8, 16, 250))
    test = {"kind": "equivalence", "margin": 0.05, "alpha": 0.05}
    rows = {r["design"]: r for r in frontier({ref: 0.06, long: 0.03, wide: 0.06}, ref, 0.07, cost, test)}
    assert rows[ref]["sd"] == pytest.approx(0.07, abs=1e-15) and rows[ref]["gain"] == pytest.approx(1.0, abs=1e-12)
    assert rows[long]["sd"] == pytest.approx(0.035, abs=1e-15)  # half the pilot's sd: half the reference's
    # a quarter of the variance at 540 / 300 of the cost
    assert rows[long]["gain"] == pytest.approx(4 * 300 / 540, rel=1e-12)
    assert rows[wide]["gain"] == pytest.approx(300 / 480, rel=1e-12)
    assert rows[ref]["seeds"] == st.seeds_for_power(test, 0.07)
    assert rows[ref]["hours"] == pytest.approx(rows[ref]["seeds"] * 300 / 3600, rel=1e-12)
    assert rows[long]["seeds"] < rows[ref]["seeds"]
