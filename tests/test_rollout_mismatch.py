"""Rollout-training mismatch: the corrections against hand-computed weights, the hf backend's
sampler log-probs against the trainer's, and the correction entering the loss."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import run_job, tiny_llama
from harness.algo import ROLLOUT_CORRECTIONS, mismatch_stats

# two sequences: row 0 has 3 valid tokens, row 1 has 2 (its last column is padding)
LOG_RATIO = torch.tensor([[math.log(0.5), math.log(2.0), math.log(4.0)],
                          [math.log(1.5), math.log(3.5), 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def _weights(name, cap=3.0):
    spec = ROLLOUT_CORRECTIONS.spec(name)
    return spec.fn(LOG_RATIO, MASK, spec.build(cap=cap))


def test_token_level_corrections_by_hand():
    assert _weights("none") is None
    torch.testing.assert_close(_weights("token_truncate"), torch.tensor([[0.5, 2.0, 3.0], [1.5, 3.0, 0.0]]))
    torch.testing.assert_close(_weights("token_mask"), torch.tensor([[0.5, 2.0, 0.0], [1.5, 0.0, 0.0]]))
    torch.testing.assert_close(_weights("token_truncate", cap=1.0), torch.tensor([[0.5, 1.0, 1.0], [1.0, 1.0, 0.0]]))


def test_sequence_level_corrections_by_hand():
    # rho_seq: row 0 = 0.5 * 2 * 4 = 4.0, row 1 = 1.5 * 3.5 = 5.25
    torch.testing.assert_close(_weights("sequence_truncate", cap=4.5), torch.tensor([[4.0] * 3, [4.5, 4.5, 0.0]]))
    torch.testing.assert_close(_weights("sequence_mask", cap=4.5), torch.tensor([[4.0] * 3, [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(_weights("sequence_mask", cap=3.0), torch.zeros(2, 3))


def test_bad_cap_is_refused():
    with pytest.raises(ValueError, match="cap must be > 0"):
        _weights("token_truncate", cap=0.0)


def test_mismatch_stats_by_hand():
    trainer = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]])
    sampler = torch.tensor([[-1.5, -1.0], [-0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    s = mismatch_stats(trainer, sampler, mask, cap=1.5)
    # diffs over valid tokens: 0.5, -1.0, 0.0
    assert s["tokens"] == 3 and s["abs_diff_sum"] == pytest.approx(1.5) and s["abs_diff_max"] == pytest.approx(1.0)
    assert s["ratio_sum"] == pytest.approx(math.exp(0.5) + math.exp(-1.0) + 1.0)
    assert s["ratio_min"] == pytest.approx(math.exp(-1.0)) and s["ratio_max"] == pytest.approx(math.exp(0.5))
    assert s["past_cap"] == 1  # exp(0.5) = 1.65 > 1.5


@pytest.mark.parametrize("seed", [None, 3])
def test_hf_sampler_logprobs_are_the_trainers(tokenizer, seed):
    """The hf backend's recorded log-prob of each sampled token = log_softmax(logits / T) of a full
    forward, seeded (Gumbel-max) or not (transformers' sampler)."""
    from harness.model.logprobs import token_logprobs
    from harness.rollout import SamplingParams, build_backend

    model = tiny_llama(tokenizer, seed=2)
    prompts = ["a b c", "the quick brown fox jumps"]
    batch = build_backend("hf", model, tokenizer, progress=False).generate(
        prompts, 3, SamplingParams(temperature=0.7, max_new_tokens=10, seed=seed))
    trainer = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask,
                             temperature=0.7)[0].detach()
    m = batch.completion_mask.bool()
    assert float((batch.sampler_logprobs - trainer)[m].abs().max()) < 1e-4
    assert float(trainer[m].std()) > 0.1 and (batch.sampler_logprobs[~m] == 0).all()


def test_correction_enters_the_loss_and_metrics_are_logged(run_dir):
    """token_mask with a cap below every ratio gives every token weight 0, token_truncate weights
    ~1 (hf: sampler = trainer to float rounding); the mismatch metrics are logged each step. (That
    the weights change the loss is the rollout_correction rows of tests/test_knobs.py, with rewards
    that vary.)"""
    _, run, history = run_job("rollout_correction=token_mask", "rollout_correction.cap=0.5", "beta=0")
    assert [v for _, v in history("train/rollout_is_weight_mean")] == [0.0, 0.0]
    assert all(v == 0.0 for _, v in history("train/loss"))
    _, run, history = run_job("rollout_correction=token_truncate", "beta=0")
    for key in ("rollout/logprob_diff_mean", "rollout/logprob_diff_max", "rollout/is_ratio_min",
                "rollout/is_ratio_max", "rollout/is_frac_past_cap"):
        vals = history(key)
        assert [s for s, _ in vals] == [1, 2], key
    assert all(0 <= v < 1e-4 for _, v in history("rollout/logprob_diff_max"))  # hf: one module, fp32
    assert all(abs(v - 1) < 1e-3 for _, v in history("train/rollout_is_weight_mean"))


def test_geometric_rejection_by_hand():
    # rho_geo = exp(mean log ratio): row 0 = (0.5 * 2 * 4)^(1/3) = 4^(1/3) = 1.587; row 1 =
    # (1.5 * 3.5)^(1/2) = 5.25^(1/2) = 2.291 (its padding column does not count)
    spec = ROLLOUT_CORRECTIONS.spec("geometric")
    w = spec.fn(LOG_RATIO, MASK, spec.build(lower=0.5, upper=2.0))
    assert torch.equal(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))  # 2.291 > 2: rejected
    assert torch.equal(spec.fn(LOG_RATIO, MASK, spec.build(lower=0.5, upper=3.0)), MASK)  # both inside: weight 1
    # the default band [0.99, 1.01] (SkyRL): (1.005 * 0.999)^(1/2) = 1.001996 kept; (1.02 * 1.01)^(1/2)
    # = 1.0150 rejected; (0.98 * 0.995)^(1/2) = 0.98747 rejected from below
    near = torch.tensor([[1.005, 0.999], [1.02, 1.01], [0.98, 0.995]], dtype=torch.float64).log()
    w = spec.fn(near, torch.ones(3, 2, dtype=torch.float64), spec.build())
    assert torch.equal(w, torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="lower <= 1 <= upper"):
        spec.fn(LOG_RATIO, MASK, spec.build(lower=1.1))


def test_off_policy_sequence_mask_by_hand():
    # current_log_ratio = log pi_theta - log pi_sampler; D = -mean over valid tokens
    current = torch.tensor([[-1.0, -0.5, -0.3],     # D = 1.8 / 3 = 0.6
                            [-1.0, -0.5, -0.3],     # D = 0.6
                            [-0.4, -0.5, -9.0],     # D = 0.9 / 2 = 0.45 (the -9 is padding)
                            [0.2, -1.4, -0.6]], dtype=torch.float64)  # D = 1.8 / 3 = 0.6
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.float64)
    adv = torch.tensor([-1.0, 1.0, -1.0, 0.0], dtype=torch.float64)
    spec = ROLLOUT_CORRECTIONS.spec("off_policy_sequence_mask")
    assert spec.needs == {"advantages", "current_log_ratio"}
    w = spec.fn(torch.zeros_like(current), mask, spec.build(threshold=0.5), advantages=adv, current_log_ratio=current * mask)
    # row 0: A < 0 and D = 0.6 > 0.5: dropped; row 1: A > 0 kept; row 2: D = 0.45 <= 0.5 kept; row 3: A = 0 kept
    assert torch.equal(w, torch.tensor([[0.0, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.float64))
    w = spec.fn(torch.zeros_like(current), mask, spec.build(threshold=0.7), advantages=adv[:, None],
                current_log_ratio=current * mask)
    assert torch.equal(w, mask)  # 0.6 <= 0.7: nothing dropped
    w = spec.fn(torch.zeros_like(current), mask, spec.build(threshold=0.4), advantages=adv, current_log_ratio=current * mask)
    assert torch.equal(w[:, 0], torch.tensor([0.0, 1, 0, 1], dtype=torch.float64))  # now row 2 (0.45) too
    with pytest.raises(ValueError, match="threshold must be >= 0"):
        spec.fn(current, mask, spec.build(threshold=-1.0), advantages=adv, current_log_ratio=current)


def test_off_policy_sequence_mask_reads_the_current_policy_in_the_update(run_dir, dense_rewards):
    """In a run with mu = 2 (the second pass moves the policy away from the sampler) and threshold 0,
    the correction drops sequences (mean IS weight < 1); logged as train/rollout_is_weight_mean."""
    _, run, history = run_job("rollout_correction=off_policy_sequence_mask", "rollout_correction.threshold=0",
                              "beta=0", "mu=2", "train.lr=0.05")
    means = [v for _, v in history("train/rollout_is_weight_mean")]
    assert len(means) == 2 and all(0 < v < 1 for v in means), means
