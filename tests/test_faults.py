"""Faults inside a run: non-finite updates, a tracking store that drops, verifier failures."""

import math

import pytest
import torch

from tests.conftest import run_job


def test_nonfinite_updates_are_skipped_then_the_run_stops_with_a_checkpoint(run_dir, monkeypatch):
    import harness.train.trainer as trainer_mod
    from harness.train.trainer import TrainingStopped

    real = trainer_mod.policy_pass
    calls = {"n": 0}

    def flaky(policy, batch, s, mb, **kw):
        stats = real(policy, batch, s, mb, **kw)
        calls["n"] += 1
        if calls["n"] >= 2:  # the first update is fine, every later one is NaN
            stats["loss"] = float("nan")
        return stats

    monkeypatch.setattr(trainer_mod, "policy_pass", flaky)
    with pytest.raises(TrainingStopped, match="3 consecutive non-finite steps"):
        run_job("train.steps=10", "train.max_bad_steps=3", f"checkpoint.dir={run_dir}/ck")
    saved = sorted((run_dir / "ck").glob("step_*.pt"))
    assert saved, "a checkpoint is written before stopping"
    state = torch.load(saved[-1], weights_only=False)
    assert state["skipped"] == 3 and state["step"] == 3


def test_skipped_update_leaves_weights_unchanged(run_dir, monkeypatch):
    import harness.train.trainer as trainer_mod

    real = trainer_mod.policy_pass

    def nan_once(policy, batch, s, mb, **kw):
        stats = real(policy, batch, s, mb, **kw)
        stats["grad_norm_probe"] = 0.0
        stats["loss"] = float("nan")
        return stats

    monkeypatch.setattr(trainer_mod, "policy_pass", nan_once)
    _, run, history = run_job("train.steps=1", "train.max_bad_steps=5")
    assert history("train/skipped_updates") == [(1, 1.0)]


class _FlakyClient:
    """Wraps an MlflowClient: log_batch fails while ``down`` is True."""

    def __init__(self, client):
        self.client, self.down = client, False

    def __getattr__(self, name):
        return getattr(self.client, name)

    def log_batch(self, *a, **kw):
        if self.down:
            raise ConnectionError("tracking server unreachable")
        return self.client.log_batch(*a, **kw)


def test_tracking_drop_mid_run_buffers_and_flushes(run_dir):
    import os

    from harness.launch.tracking import Tracker

    t = Tracker(os.environ["MLFLOW_TRACKING_URI"], "faults")
    t.start("flaky")
    t.client = _FlakyClient(t.client)
    t.log_metrics({"train/loss": 1.0}, step=1)
    t.client.down = True
    t.log_metrics({"train/loss": 2.0}, step=2)  # must not raise
    t.log_metrics({"train/loss": float("nan"), "train/x": 3.0}, step=3)
    assert len(t.pending) == 2  # NaN dropped, two values buffered
    t.client.down = False
    assert t.flush() and not t.pending
    assert t.metric_history("train/loss") == [(1, 1.0), (2, 2.0)]
    assert t.metric_history("train/x") == [(3, 3.0)]


def test_verifier_failure_scores_zero_and_is_counted(run_dir, monkeypatch):
    from harness.tasks.base import Task
    from harness.verifiers import Verdict

    def broken(self, completions, golds):
        return [Verdict(False, False, None, "timeout") for _ in completions]

    monkeypatch.setattr(Task, "score", broken)
    _, run, history = run_job("train.steps=1")
    assert run.data.metrics["verifier/timeouts"] == 8.0  # 2 prompts x 4 samples
    assert run.data.metrics["train/reward_mean"] == 0.0 and math.isfinite(run.data.metrics["train/loss"])


def test_empty_completions_are_handled(run_dir):
    """max_new_tokens=1 gives one-token completions, many of them EOS-only or empty text."""
    _, run, _ = run_job("rollout.max_new_tokens=1", "train.steps=1")
    assert run.info.status == "FINISHED" and math.isfinite(run.data.metrics["train/loss"])
