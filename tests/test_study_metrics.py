"""The metrics the studies read (issue 25): completion length by outcome (train and eval) and the
clip fractions split by side, against hand counts on fixed batches."""

from __future__ import annotations

import pytest
import torch

from harness.algo import POLICY_LOSSES
from harness.train.evaluation import completion_len_by_outcome
from tests.conftest import run_job


def test_length_by_outcome_hand_values_and_recombination():
    lengths = [3, 5, 8, 2, 7]  # tokens up to and including EOS
    correct = [1, 0, 1, 0, 0]
    m = completion_len_by_outcome(lengths, correct, "train")
    assert m == {"train/completion_len_correct_mean": 5.5, "train/completion_len_incorrect_mean": 14 / 3}
    acc = 2 / 5
    recombined = acc * m["train/completion_len_correct_mean"] + (1 - acc) * m["train/completion_len_incorrect_mean"]
    assert recombined == pytest.approx(25 / 5)


def test_length_by_outcome_leaves_out_an_absent_outcome_never_zero():
    assert completion_len_by_outcome([4, 6], [False, False], "eval") == {"eval/completion_len_incorrect_mean": 5.0}
    assert completion_len_by_outcome([4, 6], [True, True], "eval") == {"eval/completion_len_correct_mean": 5.0}
    assert completion_len_by_outcome([], [], "eval") == {}
    with pytest.raises(ValueError, match="differ in size"):
        completion_len_by_outcome([1, 2], [True], "train")


def test_train_step_length_means_recombine_to_the_overall_mean(run_dir, dense_rewards):
    """Through train(): each step's correct / incorrect means are the hand means of that step's
    completion masks, and weighted by train/accuracy they give train/completion_len_mean."""
    records = []
    _, run, history = run_job(on_step=records.append)
    logged = {k: dict(history(f"train/{k}")) for k in
              ("completion_len_mean", "completion_len_correct_mean", "completion_len_incorrect_mean", "accuracy")}
    assert len(records) == 2
    for rec in records:
        lengths = rec.batch.completion_mask.sum(1).double()
        correct = rec.rewards.correct.bool()
        assert 0 < int(correct.sum()) < len(correct)  # the fixture gives both outcomes
        assert logged["completion_len_correct_mean"][rec.step] == pytest.approx(float(lengths[correct].mean()))
        assert logged["completion_len_incorrect_mean"][rec.step] == pytest.approx(float(lengths[~correct].mean()))
        acc = logged["accuracy"][rec.step]
        assert acc == pytest.approx(float(correct.double().mean()))
        recombined = acc * logged["completion_len_correct_mean"][rec.step] \
            + (1 - acc) * logged["completion_len_incorrect_mean"][rec.step]
        assert recombined == pytest.approx(logged["completion_len_mean"][rec.step], rel=1e-6)
    for step in (0, 1, 2):  # eval: greedy completions, before, every step and at the end
        m = {k: dict(history(f"eval/{k}")).get(step) for k in
             ("completion_len_mean", "completion_len_correct_mean", "completion_len_incorrect_mean", "accuracy")}
        assert m["completion_len_mean"] is not None and m["accuracy"] is not None
        parts = (m["accuracy"] * (m["completion_len_correct_mean"] or 0.0)
                 + (1 - m["accuracy"]) * (m["completion_len_incorrect_mean"] or 0.0))
        assert parts == pytest.approx(m["completion_len_mean"], rel=1e-6)


def test_a_step_with_no_correct_completion_logs_no_correct_mean(run_dir):
    """The random tiny model never answers an arith problem: no ..._correct_mean at any step
    (train or eval), while the incorrect mean is the overall mean."""
    records = []
    _, run, history = run_job(on_step=records.append)
    assert all(not bool(r.rewards.correct.any()) for r in records)
    assert history("train/completion_len_correct_mean") == []
    assert history("eval/completion_len_correct_mean") == []
    assert history("train/completion_len_incorrect_mean") == history("train/completion_len_mean")
    assert [s for s, _ in history("eval/completion_len_incorrect_mean")] == [0, 1, 2]


def _stats(name, ratios, advs, mask=None, **params):
    logp = torch.log(torch.tensor(ratios, dtype=torch.float64)).requires_grad_()
    old = torch.zeros_like(logp)
    adv = torch.tensor(advs, dtype=torch.float64)
    m = torch.ones_like(old) if mask is None else torch.tensor(mask, dtype=torch.float64)
    spec = POLICY_LOSSES.spec(name)
    return {k: float(v) for k, v in spec.fn(logp, old, adv, m, spec.build(**params))[1].items()}


# one fixed batch: 2 rows x 5 tokens, the last token of row 2 masked out (9 valid tokens)
RATIOS = [[0.5, 0.79, 1.0, 1.25, 1.3], [0.7, 1.21, 1.29, 0.81, 9.0]]
ADVS = [[-1.0, -1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, -1.0, 1.0]]
MASK = [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]


def test_clip_fractions_of_ppo_clip_equal_a_hand_count():
    """eps 0.2 / eps_high 0.28, TRL's rule: low = r < 0.8 and A < 0; high = r > 1.28 and A > 0.
    Low: (0.5, A-), (0.79, A-) -> 2; (0.7, A+) is not low-clipped. High: (1.3, A+), (1.29, A+) -> 2;
    (1.25, A+) and (1.21, A+) are inside; (9.0) is masked. 9 valid tokens."""
    s = _stats("ppo_clip", RATIOS, ADVS, MASK, epsilon=0.2, epsilon_high=0.28)
    assert s["clip_frac_low"] == pytest.approx(2 / 9)
    assert s["clip_frac_high"] == pytest.approx(2 / 9)
    assert s["clip_frac"] == pytest.approx(4 / 9)
    sym = _stats("ppo_clip", RATIOS, ADVS, MASK, epsilon=0.2)  # eps_high = 0.2: 1.25 and 1.21 clip too
    assert (sym["clip_frac_low"], sym["clip_frac_high"]) == pytest.approx((2 / 9, 4 / 9))


def test_clip_fractions_of_the_other_losses_equal_hand_counts():
    # cispo, weight clamped to [0.8, 1.28] whatever the sign of A: below 0.8: 0.5, 0.79, 0.7 -> 3;
    # above 1.28: 1.3, 1.29 -> 2
    s = _stats("cispo", RATIOS, ADVS, MASK, epsilon_low=0.2, epsilon_high=0.28)
    assert (s["clip_frac_low"], s["clip_frac_high"], s["clip_frac"]) == pytest.approx((3 / 9, 2 / 9, 5 / 9))
    # gmpo: log-ratio clamped to [-0.4, 0.4]: log 0.5 = -0.69 and log 0.7 = -0.36 -> 1 low; none high
    s = _stats("gmpo", RATIOS, ADVS, MASK, epsilon=0.4)
    assert (s["clip_frac_low"], s["clip_frac_high"]) == pytest.approx((1 / 9, 0.0))
    for name in ("pg", "kl_cov"):
        s = _stats(name, RATIOS, ADVS, MASK)
        assert (s["clip_frac_low"], s["clip_frac_high"], s["clip_frac"]) == (0.0, 0.0, 0.0)
    # sapo, tau 1: the gate weight 4 sig (1 - sig) falls below 1/2 only for |r - 1| > ln(5.83) = 1.76: r = 4.0
    s = _stats("sapo", [[0.5, 1.5, 4.0, 1.0]], [[1.0, 1.0, 1.0, -1.0]], tau_pos=1.0, tau_neg=1.0)
    assert (s["clip_frac_low"], s["clip_frac_high"]) == pytest.approx((0.0, 1 / 4))


def test_entropy_is_the_first_pass_of_each_step_with_mu_2(run_dir, monkeypatch):
    """With mu=2 the second pass sees the updated policy: train/entropy is the first pass's
    (the sampling distribution), the other statistics the mean over the passes. The real passes
    run; their entropy is replaced by the pass count 1, 2, 3, 4 to tell them apart."""
    import harness.train.trainer as trainer_mod

    real, calls, grad_norms = trainer_mod.policy_pass, [], []

    def counted(*args, **kw):
        s = real(*args, **kw)
        calls.append(len(calls) + 1)
        s["entropy"] = float(calls[-1])
        s["ratio_mean"] = float(calls[-1])
        return s

    monkeypatch.setattr(trainer_mod, "policy_pass", counted)
    _, run, history = run_job("mu=2")
    assert calls == [1, 2, 3, 4]
    assert history("train/entropy") == [(1, 1.0), (2, 3.0)]  # first pass of each step
    assert history("train/ratio_mean") == [(1, 1.5), (2, 3.5)]  # mean over the 2 passes
