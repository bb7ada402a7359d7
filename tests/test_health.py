"""Degenerate runs say so: warnings naming the metric, its value and the knob, rate-limited,
and an MLflow tag on the run."""

import logging

from harness.runtime.health import HealthMonitor
from tests.conftest import run_job


def test_each_check_fires_names_metric_value_and_knob():
    h = HealthMonitor(every=10)
    bad = {"train/clipped_ratio": 1.0, "train/frac_reward_zero_std": 0.95, "train/kl": 3.0,
           "train/ratio_mean": 2.5, "train/grad_norm": 1e4, "train/skipped_updates": 1.0}
    out = {w.tag: w.message for w in h.check(1, bad)}
    assert set(out) == {f"health.{k}" for k in bad}
    assert "train/clipped_ratio=1" in out["health.train/clipped_ratio"]
    assert "rollout.max_new_tokens" in out["health.train/clipped_ratio"]
    assert "group_size" in out["health.train/frac_reward_zero_std"]
    assert "beta" in out["health.train/kl"] and "1e+04" in out["health.train/grad_norm"]
    good = {"train/clipped_ratio": 0.2, "train/frac_reward_zero_std": 0.5, "train/kl": 0.01,
            "train/ratio_mean": 1.0, "train/grad_norm": 3.0, "train/skipped_updates": 0.0}
    assert HealthMonitor().check(1, good) == []


def test_warnings_are_rate_limited_and_count_the_steps():
    h = HealthMonitor(every=10)
    fired = [s for s in range(1, 25) if h.check(s, {"train/clipped_ratio": 1.0})]
    assert fired == [1, 11, 21]
    assert "(25 steps so far)" in h.check(31, {"train/clipped_ratio": 1.0})[0].message


def test_a_truncated_run_warns_once_and_tags_the_mlflow_run(run_dir, caplog):
    """The tiny random model never emits EOS: every completion is truncated at 12 tokens."""
    with caplog.at_level(logging.WARNING, logger="harness.train.trainer"):
        _, run, history = run_job("train.steps=3")
    assert [v for _, v in history("train/clipped_ratio")] == [1.0, 1.0, 1.0]
    msgs = [r.getMessage() for r in caplog.records if "train/clipped_ratio" in r.getMessage()]
    assert len(msgs) == 1 and msgs[0].startswith("step 1: train/clipped_ratio=1 (>= 0.9)")
    tag = run.data.tags["health.train/clipped_ratio"]
    assert "rollout.max_new_tokens" in tag
