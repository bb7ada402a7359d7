"""A step's metrics (:mod:`harness.train.step_metrics`) against hand values, one process. That the
two-rank metrics equal the one-process ones is tests/test_distributed.py's."""

from __future__ import annotations

import pytest
import torch

from harness.train.distributed import World
from harness.train.rewards import RewardOutput
from harness.rollout import RolloutBatch
from harness.train.step_metrics import STEP_TIMES, StepOutputs, step_metrics

TIMES = dict(zip(STEP_TIMES, (1.0, 0.5, 0.3, 0.2, 2.0, 5.0, 0.5)))
INFO = {"train/groups_kept": 2, "time/rollout_s": 1.5, "time/reward_s": 0.5, "train/prompts_sampled": 2,
        "perf/rollout_tokens": 12.0}
MISMATCH = {"tokens": 4.0, "abs_diff_sum": 0.4, "abs_diff_max": 0.2, "ratio_sum": 4.2, "ratio_min": 0.9,
            "ratio_max": 1.3, "past_cap": 1.0}


def outputs(shaped=None, mismatch=None) -> StepOutputs:
    """2 groups of G=2: lengths 3, 1, 2, 3 (9 tokens), prompts of 2 tokens (8), advantage 2 everywhere."""
    lengths = torch.tensor([3, 1, 2, 3])
    mask = (torch.arange(3)[None] < lengths[:, None]).long()
    batch = RolloutBatch(torch.ones(4, 2, dtype=torch.long), torch.ones(4, 2, dtype=torch.long),
                         torch.ones(4, 3, dtype=torch.long), mask, torch.tensor([True, False, False, True]),
                         ["a", "b", "c", "d"], 2)
    rew = RewardOutput(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([1.0, 0.0, 1.0, 0.0]),
                       torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0.0, 0.0, 0.0, -0.5]),
                       {"verifier/timeouts": 1, "verifier/errors": 0})
    return StepOutputs(batch, rew, rew.rewards if shaped is None else shaped, mask, torch.full((4, 3), -2.0),
                       dict(INFO), {"loss": 0.25}, {"train/lr": 1e-3}, dict(TIMES), elapsed_s=60.0,
                       padding_waste=0.1, param_frac=1.0, mismatch=mismatch)


def test_step_metrics_hand_values():
    m = step_metrics(outputs(shaped=torch.tensor([0.9, 0.0, 0.8, 1.0]), mismatch=MISMATCH), World())
    assert m == pytest.approx({
        "train/reward_mean": 0.75, "train/reward_std": 0.5, "train/accuracy": 0.5, "train/format_rate": 0.75,
        "train/overlong_penalty": -0.125, "train/length_penalty": -0.075,
        "train/frac_reward_zero_std": 0.5,  # the second group's rewards are equal
        "train/completion_len_mean": 2.25, "train/completion_len_max": 3.0,
        "train/completion_len_correct_mean": 2.5, "train/completion_len_incorrect_mean": 2.0,
        "train/clipped_ratio": 0.5, "train/advantage_abs_mean": 2.0, "train/lr": 1e-3,
        **TIMES, "time/elapsed_s": 60.0,
        "perf/tokens_per_s": 9 / 5.0, "perf/completion_tokens": 9.0, "perf/param_shard_frac": 1.0,
        "perf/padding_waste": 0.1, **INFO, "train/loss": 0.25, "verifier/timeouts": 1.0, "verifier/errors": 0.0,
        "rollout/logprob_diff_mean": 0.1, "rollout/logprob_diff_max": 0.2, "rollout/is_ratio_mean": 1.05,
        "rollout/is_ratio_min": 0.9, "rollout/is_ratio_max": 1.3, "rollout/is_frac_past_cap": 0.25,
        "perf/weight_sync_frac": 0.1, "perf/rollout_tgs": 12 / 1.5, "perf/training_tgs": 17 / 3.0,
        "perf/effective_tgs": 17 / 5.0,
    })


def test_what_is_left_out():
    """No ``train/length_penalty`` when the penalty is the identity (the same tensor object), no
    ``rollout/*`` without sampler tokens or when not measured."""
    empty = {**MISMATCH, "tokens": 0.0}
    for m in (step_metrics(outputs(mismatch=empty), World()), step_metrics(outputs(), World())):
        assert "train/length_penalty" not in m and not any(k.startswith("rollout/") for k in m)
        assert m["train/reward_mean"] == 0.75
