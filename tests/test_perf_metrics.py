"""Throughput metrics named as xtuner names them (issue 28): ``perf/rollout_tgs``,
``perf/training_tgs``, ``perf/effective_tgs`` and the weight-sync share of the step
(:func:`harness.train.step_metrics.throughput`), against hand values and against the token counts of real
steps."""

from __future__ import annotations

import pytest

from harness.train.step_metrics import throughput
from tests.conftest import run_job


def test_throughput_hand_values():
    m = {"perf/rollout_tokens": 120.0, "time/rollout_s": 2.0, "time/logprob_s": 1.0, "time/update_s": 3.0,
         "time/step_s": 8.0, "time/weight_sync_s": 0.4}
    assert throughput(m, trained_tokens=400.0, processes=2) == pytest.approx({
        "perf/rollout_tgs": 120 / 2 / 2, "perf/training_tgs": 400 / 4 / 2, "perf/effective_tgs": 400 / 8 / 2,
        "perf/weight_sync_frac": 0.05})


def test_a_phase_that_took_no_time_gives_no_rate():
    m = {"perf/rollout_tokens": 0.0, "time/rollout_s": 0.0, "time/logprob_s": 0.0, "time/update_s": 0.5,
         "time/step_s": 1.0, "time/weight_sync_s": 0.0}
    out = throughput(m, trained_tokens=10.0, processes=1)
    assert "perf/rollout_tgs" not in out and out["perf/training_tgs"] == 20.0 and out["perf/weight_sync_frac"] == 0.0


def _steps(*overrides):
    records = []
    _, _, history = run_job(*overrides, on_step=records.append)
    keys = ("perf/rollout_tokens", "perf/rollout_tgs", "perf/training_tgs", "perf/effective_tgs",
            "perf/weight_sync_frac", "time/rollout_s", "time/logprob_s", "time/update_s", "time/step_s",
            "time/weight_sync_s", "train/prompts_sampled")
    return records, {k: dict(history(k)) for k in keys}


def test_rates_are_the_step_token_counts_over_the_phase_times(run_dir):
    """Each step: rollout tokens = the batch's completion tokens (no filter); training and effective
    rates x their times = the rows' real prompt + completion tokens; the hf backend syncs nothing."""
    records, h = _steps()
    assert len(records) == 2
    for rec in records:
        s, b = rec.step, rec.batch
        completion, prompt = float(b.completion_mask.sum()), float(b.prompt_mask.sum())
        assert h["perf/rollout_tokens"][s] == completion
        assert h["perf/rollout_tgs"][s] * h["time/rollout_s"][s] == pytest.approx(completion, rel=1e-6)
        trained = prompt + completion
        assert h["perf/training_tgs"][s] * (h["time/logprob_s"][s] + h["time/update_s"][s]) == \
            pytest.approx(trained, rel=1e-6)
        assert h["perf/effective_tgs"][s] * h["time/step_s"][s] == pytest.approx(trained, rel=1e-6)
        assert h["perf/effective_tgs"][s] < h["perf/training_tgs"][s]  # the step includes the rollout
        assert 0 <= h["perf/weight_sync_frac"][s] < 0.01  # hf: the module is shared, nothing is copied


def test_rollout_tokens_count_the_groups_a_filter_dropped(run_dir):
    """DAPO's dynamic sampling: the random tiny model never answers, so every group has zero reward
    variance and is dropped; 3 rounds are drawn and the step trains on the last draw, so the
    rollout generated more tokens than the step trains on."""
    records, h = _steps("group_filter=dapo", "group_filter.max_rounds=3")
    for rec in records:
        assert h["train/prompts_sampled"][rec.step] == 6  # 3 rounds of 2 prompts
        assert h["perf/rollout_tokens"][rec.step] > float(rec.batch.completion_mask.sum())
